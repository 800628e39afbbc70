//! Rule 1 for readers: refresh and first scan.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 1 for readers: refresh and first scan";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(refresh_reads_only_new_entries),
        case!(abandoned_refresh_leaves_reads_complete),
        case!(a_shard_reads_in_pages_from_any_position),
    ]
}

/// After the first scan, a refresh reads only what is new.
pub async fn refresh_reads_only_new_entries(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut s1 = store.open_shard(&w("w1")).await?;
    let mut s2 = store.open_shard(&w("w2")).await?;
    s1.append(recs("a", "s", 50)).await?;
    s2.append(recs("b", "s", 30)).await?;
    let mut p = store.projector();
    let first = p.refresh().await?;
    // A first scan may read an entry twice where storage tiers overlap; it applies each once.
    ensure!(
        first.first_scan && first.entries_read >= 80 && first.new_entries == 80,
        "{first:?}"
    );
    let idle = p.refresh().await?;
    ensure!(
        !idle.first_scan && idle.entries_read == 0,
        "an idle refresh reads nothing: {idle:?}"
    );
    s2.append(recs("c", "s", 7)).await?;
    s1.append(recs("d", "s", 2)).await?;
    let next = p.refresh().await?;
    ensure!(
        next.entries_read == 9 && next.new_entries == 9,
        "a refresh reads only new entries: {next:?}"
    );
    ensure!(p.stats().entries == 89);
    Ok(())
}

/// A refresh that fails or is abandoned mid-way never leaves the projector answering from
/// a partial (or emptied) index: the next read scans again and sees everything.
pub async fn abandoned_refresh_leaves_reads_complete(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    shard.append(recs("a", "s", 40)).await?;
    let mut p = store.projector();
    p.refresh().await?;
    for round in 0..20u64 {
        shard.append(recs(&format!("r{round}"), "s", 5)).await?;
        // Abandon refreshes at different points.
        let _ = tokio::time::timeout(Duration::from_micros(100 * round), p.refresh()).await;
        let view = p.session("bot", "s").await?;
        let expected = 40 + 5 * (round as usize + 1);
        ensure!(
            view.len() == expected,
            "round {round}: {} of {expected} visible",
            view.len()
        );
        ensure!(p.stats().entries == expected as u64, "round {round}: {:?}", p.stats());
    }
    shard.close().await?;
    Ok(())
}

/// A shard read past any seq is exactly the shard's entries past it, up to the limit,
/// wherever they are stored (on Lance: the base table after compaction, flushed
/// generations, the WAL tail) and in whatever order the positions come: forward by small
/// pages as a watch reads, then back from the end, whole and by one. Read again after the
/// store changed under what earlier reads learned: the tail flushed into a new generation,
/// then everything compacted into the base table beside another shard's overlapping seqs.
pub async fn a_shard_reads_in_pages_from_any_position(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    // Three closed rounds (each a flushed generation on Lance), the first then compacted,
    // and a last one left in the open writer; another writer's shard between rounds.
    for round in 0..3 {
        let mut s = store.open_shard(&w("w1")).await?;
        s.append(recs(&format!("r{round}"), "s", 6)).await?;
        s.append(recs(&format!("q{round}"), "s", 3)).await?;
        s.close().await?;
        let mut other = store.open_shard(&w("w2")).await?;
        other.append(recs(&format!("o{round}"), "s", 2)).await?;
        other.close().await?;
        if round == 0 {
            store.compact(&CompactOptions::default()).await?;
        }
    }
    let mut open = store.open_shard(&w("w1")).await?;
    open.append(recs("tail", "s", 4)).await?;
    let shard = open.shard_id();
    let key = |e: &Entry| (e.seq, e.epoch, e.record.id.clone());
    let all: Vec<_> = store.read_shard(shard, 0, usize::MAX).await?.iter().map(key).collect();
    ensure!(all.len() == 31, "31 entries stored, {} read", all.len());
    ensure!(all.windows(2).all(|p| p[0] < p[1]), "by (seq, epoch): {all:?}");
    let expect =
        |after: u64, limit: usize| -> Vec<_> { all.iter().filter(|k| k.0 > after).take(limit).cloned().collect() };
    let check = async |stage: &str, whole: bool| -> anyhow::Result<()> {
        let (mut after, mut paged) = (0, Vec::new());
        loop {
            let page: Vec<_> = store.read_shard(shard, after, 4).await?.iter().map(key).collect();
            ensure!(
                page == expect(after, 4),
                "{stage}: a page of 4 after seq {after}: {page:?}"
            );
            let Some(last) = page.last() else { break };
            after = last.0;
            paged.extend(page);
        }
        ensure!(paged == all, "{stage}: pages of 4 read every entry once: {paged:?}");
        for after in (0..=all[30].0).rev() {
            if whole {
                let read = store.read_shard(shard, after, usize::MAX).await?;
                let read: Vec<_> = read.iter().map(key).collect();
                ensure!(
                    read == expect(after, usize::MAX),
                    "{stage}: after seq {after}: {read:?}"
                );
            }
            let one: Vec<_> = store.read_shard(shard, after, 1).await?.iter().map(key).collect();
            ensure!(one == expect(after, 1), "{stage}: one after seq {after}: {one:?}");
        }
        Ok(())
    };
    check("open tail", true).await?;
    open.close().await?;
    check("tail closed", false).await?;
    store.compact(&CompactOptions::default()).await?;
    check("all compacted", false).await?;
    Ok(())
}
