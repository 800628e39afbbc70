//! Rules 6–7: idempotency, first writer wins, final tombstones.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 6–7: idempotency, first writer wins, final tombstones";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(idempotent_retry_counts_once),
        case!(first_writer_wins_divergent_put),
        case!(tombstone_is_final),
    ]
}

// ---- Rule 6: idempotency and first writer wins --------------------------------------

/// A retried batch — same ids, same content, any `created_at`, any shard — counts once.
pub async fn idempotent_retry_counts_once(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let batch = recs("r", "s", 3);
    let first = w1.append(batch.clone()).await?;
    let mut retried = batch.clone();
    for r in &mut retried {
        r.created_at = chrono::DateTime::from_timestamp(1_780_000_000, 0);
    }
    w1.append(retried.clone()).await?;
    w2.observe(first.last_hlc)?;
    w2.append(retried).await?;
    let mut p = store.projector();
    let view = p.session("bot", "s").await?;
    ensure!(ids(&view) == ids_of(&batch), "one copy each: {:?}", ids(&view));
    ensure!(
        view.iter().all(|e| e.shard == w1.shard_id() && e.seq <= 3),
        "the first copies win"
    );
    let stats = p.stats();
    ensure!(
        stats.entries == 9 && stats.live == 3 && stats.duplicates == 6,
        "{stats:?}"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "duplicates are not conflicts: {conflicts:?}");
    Ok(())
}

/// A later put of an id with other content is a `DivergentPut`; the earliest put stands.
pub async fn first_writer_wins_divergent_put(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let first = w1.append(vec![rec("k", "s", "first answer")]).await?;
    w2.observe(first.last_hlc)?;
    let second = w2.append(vec![rec("k", "s", "second answer")]).await?;
    ensure!(second.first_hlc > first.last_hlc, "observe orders w2 after w1");
    let got = store.projector().get("k").await?.context("k is live")?;
    ensure!(
        got.record.body == Body::Text("first answer".into()),
        "the first writer wins"
    );
    ensure!(got.shard == w1.shard_id());
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    match &conflicts[..] {
        [Conflict::DivergentPut { id, winner, entry, .. }] => {
            ensure!(id == "k" && winner.shard == w1.shard_id() && entry.shard == w2.shard_id());
        }
        other => bail!("expected one DivergentPut, got {other:?}"),
    }
    Ok(())
}

// ---- Rule 7: tombstones are final ----------------------------------------------------

/// A tombstone hides its id for good; a later put of the id is a write after delete.
pub async fn tombstone_is_final(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let a = w1
        .append(vec![rec("t", "s", "secret"), rec("keep", "s", "kept")])
        .await?;
    w2.observe(a.last_hlc)?;
    let t = w2.append(vec![Record::tombstone("t", "bot", "s")]).await?;
    w1.observe(t.last_hlc)?;
    let resurrect = w1.append(vec![rec("t", "s", "secret")]).await?;
    ensure!(resurrect.first_hlc > t.last_hlc);
    let mut p = store.projector();
    ensure!(p.get("t").await?.is_none(), "a tombstoned id stays hidden");
    ensure!(ids(&p.session("bot", "s").await?) == vec!["keep".to_string()]);
    let proj = p.projection();
    ensure!(proj.tombstoned == vec!["t".to_string()], "{:?}", proj.tombstoned);
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    match &conflicts[..] {
        [Conflict::WriteAfterDelete { id, tombstone, entry }] => {
            ensure!(id == "t" && tombstone.shard == w2.shard_id() && entry.hlc == resurrect.first_hlc);
        }
        other => bail!("expected one WriteAfterDelete, got {other:?}"),
    }
    Ok(())
}
