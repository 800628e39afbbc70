//! Rule 1 for readers: refresh and first scan.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 1 for readers: refresh and first scan";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(refresh_reads_only_new_entries),
        case!(abandoned_refresh_leaves_reads_complete),
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
