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
        case!(ids_are_scoped_by_bot),
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
    let got = store.projector().get("bot", "k").await?.context("k is live")?;
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
    ensure!(p.get("bot", "t").await?.is_none(), "a tombstoned id stays hidden");
    ensure!(ids(&p.session("bot", "s").await?) == vec!["keep".to_string()]);
    let proj = p.projection();
    ensure!(
        proj.tombstoned
            .iter()
            .map(|t| (t.bot_id.as_str(), t.id.as_str()))
            .collect::<Vec<_>>()
            == [("bot", "t")],
        "{:?}",
        proj.tombstoned
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    match &conflicts[..] {
        [
            Conflict::WriteAfterDelete {
                id, tombstone, entry, ..
            },
        ] => {
            ensure!(id == "t" && tombstone.shard == w2.shard_id() && entry.hlc == resurrect.first_hlc);
        }
        other => bail!("expected one WriteAfterDelete, got {other:?}"),
    }
    Ok(())
}

// ---- Rule 6: ids are scoped by bot ---------------------------------------------------

/// A record is `(bot_id, id)`: nothing one bot writes changes, hides, pre-empts or reveals
/// another bot's record of the same id — not a tombstone, not an earlier put, not a purge —
/// and a conflict names its bot.
pub async fn ids_are_scoped_by_bot(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut alpha = store.open_shard(&w("alpha-writer")).await?;
    let mut beta = store.open_shard(&w("beta-writer")).await?;
    let of = |bot: &str, id: &str, text: &str| Record::text(id, bot, "s", "user", text);
    // Beta writes `m3` first: it pre-empts nothing of alpha's, which writes it later.
    let squat = beta.append(vec![of("beta", "m3", "beta's m3")]).await?;
    alpha.observe(squat.last_hlc)?;
    let wrote = alpha
        .append(vec![
            of("alpha", "m1", "alpha's m1"),
            of("alpha", "m2", "alpha's m2"),
            of("alpha", "m3", "alpha's m3"),
        ])
        .await?;
    // Beta tombstones `m2` (which it never wrote) and puts `m1` twice, differently.
    beta.observe(wrote.last_hlc)?;
    beta.append(vec![Record::tombstone("m2", "beta", "s"), of("beta", "m1", "one")])
        .await?;
    beta.append(vec![of("beta", "m1", "two")]).await?;
    let mut p = store.projector();
    let alpha_view = p.session("alpha", "s").await?;
    ensure!(
        ids(&alpha_view) == ["m1", "m2", "m3"],
        "alpha's session: {:?}",
        ids(&alpha_view)
    );
    ensure!(
        alpha_view.iter().all(|e| e.record.bot_id == "alpha"),
        "another bot's record in alpha's view"
    );
    let beta_view = p.session("beta", "s").await?;
    ensure!(ids(&beta_view) == ["m3", "m1"], "beta's session: {:?}", ids(&beta_view));
    for id in ["m1", "m2", "m3"] {
        let got = p
            .get("alpha", id)
            .await?
            .with_context(|| format!("alpha's {id} is live"))?;
        ensure!(got.record.body == Body::Text(format!("alpha's {id}")), "{got:?}");
    }
    ensure!(p.get("beta", "m2").await?.is_none(), "beta's m2 is tombstoned");
    ensure!(p.get("gamma", "m1").await?.is_none(), "no bot gamma");
    let projection = p.projection();
    let tombstoned: Vec<(&str, &str)> = projection
        .tombstoned
        .iter()
        .map(|t| (t.bot_id.as_str(), t.id.as_str()))
        .collect();
    ensure!(tombstoned == [("beta", "m2")], "tombstoned: {tombstoned:?}");
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        matches!(&conflicts[..], [Conflict::DivergentPut { bot_id, id, .. }] if bot_id == "beta" && id == "m1"),
        "one divergent put, beta's: {conflicts:?}"
    );
    // A purge erases beta's tombstoned m2 only: alpha's m2 keeps its body.
    store.purge(&ctxlog_core::PurgeOptions::default()).await?;
    let mut fresh = store.projector();
    let m2 = fresh.get("alpha", "m2").await?.context("alpha's m2 is live")?;
    ensure!(
        !m2.purged && m2.record.body == Body::Text("alpha's m2".into()),
        "purged by another bot's tombstone: {m2:?}"
    );
    ensure!(
        store.conflict_discovery().conflicts(None).await? == conflicts,
        "a purge changed the conflicts"
    );
    Ok(())
}
