//! Rule 26's derived data: a search index saved beside the store. A cold searcher starts
//! from the newest saved index that passes every check and reads only the entries past it,
//! answering exactly as one built from the whole log; a damaged, foreign or unknown-format
//! saved index is passed over (the searcher builds from the log); every purge deletes the
//! saved indexes (the byte scan of `reclaim` checks their files).

use ctxlog_core::search::saved::{self, Saved};
use ctxlog_core::search::{Ask, Deadline, Filter, Nearest, Query, Searcher, persist};
use ctxlog_core::{Metric, PurgeOptions};

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 26: saved search indexes";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(a_cold_searcher_loads_the_saved_index_and_reads_only_what_is_past_it),
        case!(a_damaged_foreign_or_unknown_saved_index_is_passed_over),
    ]
}

/// Two writers' records with embeddings, across two sessions.
async fn history(store: &dyn Store) -> anyhow::Result<()> {
    let emb = |id: &str, session: &str, v: &[f32]| Record::embedding(id, "bot", session, "mini", Metric::Cosine, v);
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    a.append(vec![rec("a", "s", "refund my order"), emb("a", "s", &[1.0, 0.0])])
        .await?;
    b.append(vec![rec("b", "t", "refund refund order"), emb("b", "t", &[0.6, 0.8])])
        .await?;
    a.append(vec![rec("c", "s", "the weather is fine"), emb("c", "s", &[0.0, 1.0])])
        .await?;
    Ok(())
}

/// Every answer the cases compare: text, vector and hybrid searches, whole and in a session,
/// ids with their scores' bits.
fn answers(s: &Searcher) -> anyhow::Result<Vec<Vec<(String, u64)>>> {
    let text = Query::parse("refund order")?;
    let near = Nearest::new("mini", vec![1.0, 0.2])?;
    let mut out = Vec::new();
    for ask in [Ask::Text(&text), Ask::Vector(&near), Ask::Hybrid(&text, &near)] {
        for session in [None, Some("s".to_string())] {
            let filter = Filter {
                session,
                ..Filter::default()
            };
            let (hits, _) = s.index().find_by("bot", ask, &filter, None, 100, &Deadline::never())?;
            out.push(hits.into_iter().map(|h| (h.id, h.score.to_bits())).collect());
        }
    }
    Ok(out)
}

/// A searcher caught up with what a fresh reader of `store` holds: how many entries it read.
async fn caught_up(store: &dyn Store) -> anyhow::Result<(Searcher, usize)> {
    let mut p = store.projector();
    p.refresh().await?;
    let mut s = Searcher::new();
    let fed = s.catch_up(store, &p.checkpoint()).await?;
    Ok((s, fed))
}

/// A searcher saves its index; more is appended (a tombstone too); a cold searcher of a fresh
/// handle loads the saved index and reads only the three entries past it, and answers to the
/// bit as one built from the whole log (snapshots and saved indexes not read). A purge
/// deletes every saved index, and the next cold searcher reads the whole log.
pub async fn a_cold_searcher_loads_the_saved_index_and_reads_only_what_is_past_it(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let indexes = store
        .saved_indexes()
        .context("every backend keeps saved search indexes")?;
    history(store.as_ref()).await?;
    let (mut first, fed) = caught_up(store.as_ref()).await?;
    ensure!(fed == 6, "a first searcher read {fed} entries, not 6");
    let put = saved::save(&mut first, store.as_ref()).await?;
    ensure!(matches!(put, Saved::Put { .. }), "saved: {put:?}");
    let mut a = store.open_shard(&w("a")).await?;
    a.append(vec![
        rec("d", "s", "order a refund"),
        Record::tombstone("b", "bot", "t"),
    ])
    .await?;
    a.append(vec![Record::embedding(
        "d",
        "bot",
        "s",
        "mini",
        Metric::Cosine,
        &[0.9, 0.1],
    )])
    .await?;
    let fresh = ctx.store().await?;
    let (cold, fed) = caught_up(fresh.as_ref()).await?;
    ensure!(
        fed == 3,
        "a cold searcher read {fed} entries: it did not start from the saved index"
    );
    let whole = ctx.open(&ctx.uri, ctx.options().with_read_snapshots(false)).await?;
    let (scratch, fed) = caught_up(whole.as_ref()).await?;
    ensure!(
        fed == 9,
        "a searcher that reads no saved index read {fed} entries, not 9"
    );
    ensure!(
        answers(&cold)? == answers(&scratch)?,
        "loaded: {:?}\nfrom the log: {:?}",
        answers(&cold)?,
        answers(&scratch)?
    );
    // By hand: `b` is gone; `a` and `d` hold each word once in three (equal scores: the
    // earlier first), `c` neither.
    let (hits, _) = cold
        .index()
        .search("bot", &Query::parse("refund order")?, &Filter::default(), None, 10);
    let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    ensure!(ids == ["a", "d"], "hits {ids:?}");
    // A purge deletes every saved index (they may hold what it erases).
    store.purge(&PurgeOptions::default()).await?;
    ensure!(indexes.names().await?.is_empty(), "a saved index outlived a purge");
    let (_, fed) = caught_up(ctx.store().await?.as_ref()).await?;
    ensure!(
        fed == 9,
        "after a purge a cold searcher read {fed} entries, not the whole log"
    );
    Ok(())
}

/// Saved indexes that must not be used, each put as the newest: one with a byte flipped, one
/// of another format, one of another store. A cold searcher passes over each: to the good
/// one beside it (reading nothing past it), or, alone, to the whole log; it answers the same
/// either way.
pub async fn a_damaged_foreign_or_unknown_saved_index_is_passed_over(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let indexes = store
        .saved_indexes()
        .context("every backend keeps saved search indexes")?;
    history(store.as_ref()).await?;
    let (mut first, _) = caught_up(store.as_ref()).await?;
    let want = answers(&first)?;
    let Saved::Put { name, .. } = saved::save(&mut first, store.as_ref()).await? else {
        bail!("the index was not saved");
    };
    let good = indexes.read(&name).await?.context("the saved index reads back")?;
    // Another store's saved index of the same history.
    let other = ctx.open(&ctx.other_uri("other"), ctx.options()).await?;
    history(other.as_ref()).await?;
    let (mut theirs, _) = caught_up(other.as_ref()).await?;
    let Saved::Put { name: their_name, .. } = saved::save(&mut theirs, other.as_ref()).await? else {
        bail!("the other store's index was not saved");
    };
    let foreign = other
        .saved_indexes()
        .context("saved indexes")?
        .read(&their_name)
        .await?
        .context("the other index reads back")?;
    let mut flipped = good.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x20;
    let mut next_format = good.clone();
    next_format[8..12].copy_from_slice(&(persist::FORMAT + 1).to_le_bytes());
    // Put by hand under the current purge mark's tag, as a save would.
    let tag = saved::tag(indexes.mark().await?.as_deref());
    let bad = [
        ("a flipped byte", flipped),
        ("another format", next_format),
        ("another store's", foreign),
    ];
    // Newest, beside the good one: passed over for it (nothing read past it).
    for (what, bytes) in &bad {
        let put = indexes.put(bytes.clone(), &tag).await?;
        let (cold, fed) = caught_up(ctx.store().await?.as_ref()).await?;
        ensure!(
            fed == 0,
            "{what}: the cold searcher read {fed} entries, not none past the good index"
        );
        ensure!(answers(&cold)? == want, "{what}: the loaded index answers otherwise");
        indexes.delete(&put).await?;
    }
    // Alone: passed over, the whole log read.
    indexes.delete(&name).await?;
    for (what, bytes) in bad {
        let put = indexes.put(bytes, &tag).await?;
        let (cold, fed) = caught_up(ctx.store().await?.as_ref()).await?;
        ensure!(
            fed == 6,
            "{what}: the cold searcher read {fed} entries, not the whole log"
        );
        ensure!(answers(&cold)? == want, "{what}: the rebuilt index answers otherwise");
        indexes.delete(&put).await?;
    }
    indexes.put(good, &tag).await?;
    let (_, fed) = caught_up(ctx.store().await?.as_ref()).await?;
    ensure!(fed == 0, "with the good index back, a cold searcher read {fed} entries");
    Ok(())
}
