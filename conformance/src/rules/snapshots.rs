//! Rule 17: a projection snapshot is an optimisation, never a source of truth. A first scan
//! from a snapshot reads only what is past it and answers exactly as a full scan; a damaged
//! or foreign snapshot is never used; compaction and gc after a snapshot change no answer.

use ctxlog_core::{GcOptions, Projector};

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 17: projection snapshots";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(a_first_scan_from_a_snapshot_reads_only_the_delta_and_answers_as_a_full_scan),
        case!(a_damaged_or_foreign_snapshot_is_never_used),
        case!(compaction_and_gc_after_a_snapshot_change_no_answer),
    ]
}

/// A history with what a projection resolves: two writers, two sessions, a retry, a
/// divergent put and a tombstone. Returns how many entries it wrote.
async fn history(store: &dyn Store, tag: &str) -> anyhow::Result<u64> {
    let mut n = 0;
    for writer in ["a", "b"] {
        let mut shard = store.open_shard(&w(&format!("{writer}{tag}"))).await?;
        for (b, session) in ["s", "t", "s"].iter().enumerate() {
            let batch = recs(&format!("{writer}{tag}{b}"), session, 3);
            n += batch.len() as u64;
            shard.append(batch).await?;
        }
        // A retry (same content), a divergent put and a tombstone of earlier ids.
        let mut divergent = rec(format!("{writer}{tag}1-0"), "t", "other content");
        divergent.metadata = Some(serde_json::json!({"why": "divergent"}));
        let batch = vec![
            recs(&format!("{writer}{tag}0"), "s", 1).remove(0),
            divergent,
            Record::tombstone(format!("{writer}{tag}2-1"), "bot", "s"),
        ];
        n += batch.len() as u64;
        shard.append(batch).await?;
        shard.close().await?;
    }
    Ok(n)
}

/// A projector that never starts from a snapshot (the reference a snapshot is held to).
async fn full_scan(ctx: &Ctx) -> anyhow::Result<Box<dyn Projector>> {
    let store = ctx.store_with(ctx.options().with_read_snapshots(false)).await?;
    let mut p = store.projector();
    let r = p.refresh().await?;
    ensure!(
        r.from_snapshot.is_none(),
        "read_snapshots = false still used a snapshot"
    );
    Ok(p)
}

/// Every answer of `got` equals `want`'s: the canonical projection, each session list and
/// view (with bodies), each record by id.
async fn same_answers(got: &mut dyn Projector, want: &mut dyn Projector, what: &str) -> anyhow::Result<()> {
    let (g, w) = (got.projection(), want.projection());
    ensure!(
        g.canonical_json() == w.canonical_json(),
        "{what}: projection differs from a full scan's:\n got  {}\n want {}",
        g.canonical_json(),
        w.canonical_json()
    );
    ensure!(
        got.sessions("bot").await? == want.sessions("bot").await?,
        "{what}: session lists differ"
    );
    for s in ["s", "t", "u"] {
        let (g, w) = (got.session("bot", s).await?, want.session("bot", s).await?);
        ensure!(
            g == w,
            "{what}: session {s} differs: got {:?}, want {:?}",
            ids(&g),
            ids(&w)
        );
    }
    for r in &w.records {
        ensure!(
            got.get(&r.bot_id, &r.id).await? == want.get(&r.bot_id, &r.id).await?,
            "{what}: record {} differs",
            r.id
        );
    }
    Ok(())
}

/// A snapshot taken, then more appends (to a known shard and a new one, a tombstone of an
/// id the snapshot holds live): a new reader starts from the snapshot, reads exactly the
/// entries written since, and answers as a full scan and as the reference model do.
pub async fn a_first_scan_from_a_snapshot_reads_only_the_delta_and_answers_as_a_full_scan(
    ctx: Ctx,
) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let before = history(store.as_ref(), "").await?;
    let mut saver = store.projector();
    let saved = saver.save_snapshot().await?;
    ensure!(
        saved.entries == before,
        "the snapshot holds {} entries, {before} were written",
        saved.entries
    );

    let mut delta = 0u64;
    let mut a = store.open_shard(&w("a")).await?;
    for batch in [recs("late", "u", 3), vec![Record::tombstone("b0-0", "bot", "s")]] {
        delta += batch.len() as u64;
        a.append(batch).await?;
    }
    a.close().await?;
    let mut c = store.open_shard(&w("c")).await?;
    let batch = recs("new-shard", "t", 2);
    delta += batch.len() as u64;
    c.append(batch).await?;
    c.close().await?;

    let mut from = ctx.store().await?.projector();
    let r = from.refresh().await?;
    ensure!(
        r.from_snapshot == Some(saved.taken_millis),
        "the first scan did not start from the snapshot: {r:?}"
    );
    ensure!(
        r.entries_read == delta,
        "a first scan from the snapshot read {} entries; {delta} were written after it",
        r.entries_read
    );
    let mut full = full_scan(&ctx).await?;
    same_answers(from.as_mut(), full.as_mut(), "snapshot + delta").await?;
    let entries = all_entries(store.as_ref()).await?;
    ensure!(
        from.projection() == model::project(&entries),
        "snapshot + delta differs from the reference model"
    );
    // And it goes on refreshing like any projector.
    let mut d = store.open_shard(&w("d")).await?;
    d.append(recs("later", "s", 2)).await?;
    d.close().await?;
    let r = from.refresh().await?;
    ensure!(r.new_entries == 2, "a refresh after the snapshot's scan: {r:?}");
    let mut full = full_scan(&ctx).await?;
    same_answers(from.as_mut(), full.as_mut(), "snapshot + delta + refresh").await
}

/// Each way a stored snapshot can be wrong — a flipped byte, truncated, another format,
/// not a snapshot at all, another store's — is refused: the first scan is a full scan
/// (from_snapshot is none) and answers as one.
pub async fn a_damaged_or_foreign_snapshot_is_never_used(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    history(store.as_ref(), "").await?;
    // Another store's snapshot, to pass off as this one's.
    let other_uri = ctx.other_uri("other");
    let other = ctx.open(&other_uri, ctx.options()).await?;
    history(other.as_ref(), "x").await?;
    other.projector().save_snapshot().await?;
    let foreign = (ctx.backend.tamper_snapshots)(other_uri, None).await?;
    ensure!(!foreign.is_empty(), "the other store has no snapshot to read");

    for damage in [
        SnapshotDamage::FlipByte,
        SnapshotDamage::Truncate,
        SnapshotDamage::OtherFormat,
        SnapshotDamage::NotASnapshot,
        SnapshotDamage::Replace(foreign[0].clone()),
    ] {
        let what = format!("{damage:?}").chars().take(40).collect::<String>();
        store.projector().save_snapshot().await?;
        let damaged = (ctx.backend.tamper_snapshots)(ctx.uri.clone(), Some(damage)).await?;
        ensure!(!damaged.is_empty(), "{what}: no snapshot to damage");
        let mut from = ctx.store().await?.projector();
        let r = from.refresh().await?;
        ensure!(r.from_snapshot.is_none(), "{what}: a damaged snapshot was used: {r:?}");
        let mut full = full_scan(&ctx).await?;
        same_answers(from.as_mut(), full.as_mut(), &what).await?;
    }
    Ok(())
}

/// A snapshot, more appends, then compaction and gc with no grace period (which may remove
/// what the snapshot names): a new reader answers as a full scan does, whether it could
/// start from the snapshot or had to scan in full.
pub async fn compaction_and_gc_after_a_snapshot_change_no_answer(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    history(store.as_ref(), "").await?;
    store.projector().save_snapshot().await?;
    history(store.as_ref(), "2").await?;
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
        store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    }
    let mut from = ctx.store().await?.projector();
    from.refresh().await?;
    let mut full = full_scan(&ctx).await?;
    same_answers(from.as_mut(), full.as_mut(), "after compaction and gc").await
}
