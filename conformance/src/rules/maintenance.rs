//! Rule 14: maintenance (compaction) never fences, blocks or fails a live writer or reader;
//! an interrupted pass changes nothing a reader sees; no entry is lost or duplicated.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 14: maintenance beside live writers and readers";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(compaction_never_fences_or_blocks_a_live_writer),
        case!(abandoned_compaction_changes_nothing),
    ]
}

/// Passes of compaction run while a writer appends: every append succeeds within its
/// deadline, under the epoch it started with, and every record is there once afterwards.
pub async fn compaction_never_fences_or_blocks_a_live_writer(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("live")).await?;
    let epoch = shard.epoch();
    let mut appended = Vec::new();
    for b in 0..3 {
        let batch = recs(&format!("before{b}"), "s", 5);
        shard.append(batch.clone()).await.context("append before compaction")?;
        appended.extend(ids_of(&batch));
    }
    let compactor = {
        let store = ctx.store().await?;
        tokio::spawn(async move {
            let mut passes = 0;
            for _ in 0..6 {
                store.compact(&CompactOptions::default()).await?;
                passes += 1;
            }
            anyhow::Ok(passes)
        })
    };
    let mut n = 0;
    while n < 20 || !compactor.is_finished() {
        appended.extend(append_beside(&ctx, shard.as_mut(), "compaction", n).await?);
        n += 1;
        ensure!(n < 10_000, "compaction never finished");
    }
    let passes = bounded("compaction", ctx.backend.op_timeout * 6, compactor).await???;
    ensure!(passes == 6, "expected 6 passes, got {passes}");
    shard.close().await.context("close after compaction")?;

    let store = ctx.store().await?;
    let view = ids(&store.projector().session("bot", "s").await?);
    ensure!(
        view == appended,
        "expected every appended record once, in order ({} of them), got {} ({} distinct)",
        appended.len(),
        view.len(),
        view.iter().collect::<BTreeSet<_>>().len()
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "expected no conflicts, got {conflicts:?}");
    for s in store.shards().await? {
        ensure!(
            s.epoch == epoch,
            "expected epoch {epoch} after compaction, got {}",
            s.epoch
        );
    }
    Ok(())
}

/// Compaction passes abandoned at many points (their futures dropped) change nothing a
/// reader sees; a full pass afterwards converges to the same view, and a reader that
/// scanned before compaction catches up to it.
pub async fn abandoned_compaction_changes_nothing(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    for name in ["a", "b"] {
        let mut shard = store.open_shard(&w(name)).await?;
        for b in 0..6 {
            shard.append(recs(&format!("{name}{b}"), "s", 10)).await?;
        }
        let mut t = Record::tombstone(format!("{name}0-3"), "bot", "s");
        t.session_id = "s".into();
        shard.append(vec![t]).await?;
        shard.close().await?;
    }
    let canonical = |store: Arc<dyn Store>| async move {
        let mut p = store.projector();
        p.refresh().await?;
        let conflicts = store.conflict_discovery().conflicts(None).await?;
        anyhow::Ok((p.projection().canonical_json(), ctxlog_core::conflicts_json(&conflicts)))
    };
    let before = canonical(ctx.store().await?).await?;
    let mut early = store.projector();
    early.refresh().await?;

    for round in 0..12u64 {
        let head_start = Duration::from_micros(300 * round * round);
        let _ = tokio::time::timeout(head_start, store.compact(&CompactOptions::default())).await;
        ensure!(
            canonical(ctx.store().await?).await? == before,
            "a compaction abandoned after {head_start:?} changed what readers see"
        );
    }
    let mut converged = false;
    for _ in 0..64 {
        if store.compact(&CompactOptions::default()).await?.generations_remaining == 0 {
            converged = true;
            break;
        }
    }
    ensure!(converged, "compaction did not converge in 64 passes");
    ensure!(
        canonical(ctx.store().await?).await? == before,
        "compaction changed what readers see"
    );
    early.refresh().await?;
    ensure!(
        early.projection().canonical_json() == before.0,
        "a reader that scanned before compaction does not catch up to the same view"
    );
    Ok(())
}
