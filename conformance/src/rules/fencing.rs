//! Rules 3–4: fencing, definite and indeterminate errors.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 3–4: fencing, definite and indeterminate errors";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(fencing_epochs_strictly_increase),
        case!(fencing_stale_handle_fails_definitely),
        case!(fencing_close_of_fenced_handle_returns),
        case!(fencing_reopen_never_claims_back),
        case!(indeterminate_error_poisons_until_reopen),
        case!(cancelled_append_never_reuses_seqs),
    ]
}

// ---- Rule 3: fencing -----------------------------------------------------------------

/// Every claim of a writer's shard gets a larger epoch, across store instances.
pub async fn fencing_epochs_strictly_increase(ctx: Ctx) -> anyhow::Result<()> {
    let a = ctx.store().await?;
    let b = ctx.store().await?;
    let mut last = 0;
    for (i, store) in [&a, &b, &a, &b].into_iter().enumerate() {
        let shard = store.open_shard(&w("w1")).await?;
        ensure!(
            shard.epoch() > last,
            "claim {i}: epoch {} not above {last}",
            shard.epoch()
        );
        ensure!(
            shard.shard_id() == w("w1").shard_id(),
            "the shard id is a function of the writer"
        );
        last = shard.epoch();
        let _ = shard.close().await;
    }
    let shards = a.shards().await?;
    ensure!(shards.len() == 1 && shards[0].epoch == last, "{shards:?}");
    Ok(())
}

/// After a newer claim, an append through the older handle fails with `Fenced`, fast; a
/// definite `Fenced` leaves nothing visible; the successor continues the seqs.
pub async fn fencing_stale_handle_fails_definitely(ctx: Ctx) -> anyhow::Result<()> {
    let replica1 = ctx.store().await?;
    let replica2 = ctx.store().await?;
    let mut old = replica1.open_shard(&w("w1")).await?;
    let a = old.append(recs("a", "s", 3)).await?;
    let mut new = replica2.open_shard(&w("w1")).await?;
    ensure!(new.epoch() > old.epoch());

    let started = Instant::now();
    let err = bounded("fenced append", ctx.backend.op_timeout, old.append(recs("b", "s", 3)))
        .await?
        .err()
        .context("an append through a fenced handle must fail")?;
    ensure!(
        started.elapsed() < ctx.backend.op_timeout,
        "the stale writer learns within its deadline"
    );
    let definite = match &err {
        Error::Fenced {
            epoch,
            current,
            written,
            ..
        } => {
            ensure!(*epoch == old.epoch(), "the error names the stale epoch");
            if let Some(c) = current {
                ensure!(*c >= new.epoch(), "the error names the newer epoch");
            }
            *written == Written::Nothing
        }
        other => bail!("expected Fenced, got {other}"),
    };
    // Later appends through the stale handle keep failing, never hang.
    let again = bounded(
        "second fenced append",
        ctx.backend.op_timeout,
        old.append(recs("c", "s", 1)),
    )
    .await?;
    ensure!(again.is_err(), "a fenced handle stays fenced");

    let c = new.append(recs("d", "s", 2)).await?;
    ensure!(
        c.first_seq == a.last_seq + 1,
        "the successor recovered the next seq: {c:?}"
    );
    let mut p = replica2.projector();
    let visible: BTreeSet<String> = ids(&p.session("bot", "s").await?).into_iter().collect();
    let leaked: Vec<&String> = visible
        .iter()
        .filter(|id| id.starts_with("b-") || id.starts_with("c-"))
        .collect();
    if definite {
        ensure!(leaked.is_empty(), "a definite Fenced error wrote {leaked:?}");
    } else if !leaked.is_empty() {
        // The backend said it could not know; whatever slipped through must be reported.
        let conflicts = replica2.conflict_discovery().conflicts(None).await?;
        ensure!(
            kinds(&conflicts).contains(&ConflictKind::StaleEpoch),
            "stale writes {leaked:?} landed but the history checker did not report them"
        );
    }
    let closed = bounded("close of a fenced handle", ctx.backend.op_timeout, old.close()).await?;
    ensure!(
        matches!(closed, Err(Error::Fenced { .. })),
        "close of a fenced handle: {closed:?}"
    );
    new.close().await?;
    Ok(())
}

/// Closing a handle while a successor claims the shard returns within the deadline, and
/// every acknowledged entry of the old handle survives.
pub async fn fencing_close_of_fenced_handle_returns(ctx: Ctx) -> anyhow::Result<()> {
    let replica1 = ctx.store().await?;
    let replica2 = ctx.store().await?;
    let mut old = replica1.open_shard(&w("w1")).await?;
    let acked = old.append(recs("a", "s", 20)).await?;
    // The fence and the close race; neither may hang.
    let claim = tokio::spawn(async move { replica2.open_shard(&w("w1")).await });
    let close = bounded("close racing a claim", ctx.backend.op_timeout, old.close()).await?;
    let new = bounded("claim racing a close", ctx.backend.op_timeout, claim).await???;
    // A close that lost the race may fail, but only with a typed error.
    if let Err(e) = close {
        ensure!(
            matches!(e, Error::Fenced { .. } | Error::Timeout { .. } | Error::Backend { .. }),
            "unexpected close error: {e}"
        );
    }
    // A handle fenced *before* close: close returns within the deadline too.
    let mut again = ctx.store().await?.open_shard(&w("w2")).await?;
    again.append(recs("b", "s", 5)).await?;
    let successor = ctx.store().await?.open_shard(&w("w2")).await?;
    let closed = bounded("close of a fenced handle", ctx.backend.op_timeout, again.close()).await?;
    ensure!(
        matches!(closed, Err(Error::Fenced { .. })),
        "close says the handle was fenced: {closed:?}"
    );

    let mut p = ctx.store().await?.projector();
    let visible: BTreeSet<String> = ids(&p.session("bot", "s").await?).into_iter().collect();
    for id in &acked.ids {
        ensure!(visible.contains(id), "acked {id} lost across a fenced close");
    }
    ensure!(visible.iter().filter(|i| i.starts_with("b-")).count() == 5);
    new.close().await?;
    successor.close().await?;
    Ok(())
}

/// A reopen claims only while the shard's newest claim is the one the caller held: after a
/// successor's claim it fails with a definite `Fenced` naming the held epoch and claims
/// nothing (the successor keeps writing); while nobody came between, it claims a new epoch
/// and continues the seqs.
pub async fn fencing_reopen_never_claims_back(ctx: Ctx) -> anyhow::Result<()> {
    let replica1 = ctx.store().await?;
    let replica2 = ctx.store().await?;
    let mut old = replica1.open_shard(&w("w1")).await?;
    let a = old.append(recs("a", "s", 2)).await?;
    let held = old.epoch();
    let mut successor = replica2.open_shard(&w("w1")).await?;
    let refused = bounded(
        "reopen after a takeover",
        ctx.backend.op_timeout,
        replica1.reopen_shard(&w("w1"), held),
    )
    .await?;
    match refused {
        Err(Error::Fenced {
            epoch,
            current,
            written,
            ..
        }) => {
            ensure!(epoch == held, "the error names the held epoch {held}, not {epoch}");
            ensure!(written == Written::Nothing, "a refused reopen claimed nothing");
            if let Some(c) = current {
                ensure!(c == successor.epoch(), "the error names the successor's epoch {c}");
            }
        }
        Err(other) => bail!("a reopen after a takeover must fail with Fenced, got {other}"),
        Ok(s) => bail!(
            "a reopen after a takeover claimed epoch {} and fenced its successor",
            s.epoch()
        ),
    }
    let shards = replica2.shards().await?;
    ensure!(
        shards.len() == 1 && shards[0].epoch == successor.epoch(),
        "the refused reopen took no epoch: {shards:?}"
    );
    let b = successor.append(recs("b", "s", 2)).await?;
    ensure!(b.first_seq == a.last_seq + 1, "the successor writes on: {b:?}");

    // Nobody came between: the holder of the newest claim reopens and continues.
    let current = successor.epoch();
    let _ = bounded("close", ctx.backend.op_timeout, old.close()).await?;
    let mut reopened = replica2.reopen_shard(&w("w1"), current).await?;
    ensure!(reopened.epoch() > current, "a reopen claims a new epoch");
    let c = reopened.append(recs("c", "s", 1)).await?;
    ensure!(
        c.first_seq == b.last_seq + 1,
        "the reopened handle continues the seqs: {c:?}"
    );
    let stale = bounded(
        "fenced append",
        ctx.backend.op_timeout,
        successor.append(recs("d", "s", 1)),
    )
    .await?;
    ensure!(
        matches!(stale, Err(Error::Fenced { .. })),
        "the reopen fenced the handle it replaced: {stale:?}"
    );
    let _ = bounded("close", ctx.backend.op_timeout, successor.close()).await?;
    reopened.close().await?;
    Ok(())
}

// ---- Rule 4: definite and indeterminate errors --------------------------------------

/// An indeterminate failure poisons the handle; reopening and retrying the same ids yields
/// each record exactly once, with no seq gap.
pub async fn indeterminate_error_poisons_until_reopen(ctx: Ctx) -> anyhow::Result<()> {
    let short = ctx.options().with_timeout(Duration::from_secs(2));
    let store = ctx.store_with(short).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    shard.append(recs("a", "s", 3)).await?;

    let retry = recs("b", "s", 3);
    let fault = (ctx.backend.stall_writes)(ctx.uri.clone()).await?;
    let err = bounded(
        "append during a fault",
        Duration::from_secs(30),
        shard.append(retry.clone()),
    )
    .await?
    .err()
    .context("an append must fail while storage is faulted")?;
    ensure!(
        err.written() == Written::Unknown,
        "a write that may have landed must say so: {err}"
    );
    match shard.append(recs("c", "s", 1)).await {
        Err(Error::Poisoned { shard: s }) => ensure!(s == w("w1").shard_id()),
        other => bail!("expected Poisoned after an indeterminate error, got {other:?}"),
    }
    drop(fault);
    let _ = bounded("close of a poisoned handle", ctx.backend.op_timeout, shard.close()).await?;

    let store = ctx.store().await?;
    let mut reopened = store.open_shard(&w("w1")).await?;
    reopened.append(retry).await?;
    let mut p = store.projector();
    let view = ids(&p.session("bot", "s").await?);
    let expected: Vec<String> = ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2"].map(String::from).to_vec();
    ensure!(view == expected, "each record exactly once, in order: {view:?}");
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts.is_empty(),
        "a retry creates no conflict and no gap: {conflicts:?}"
    );
    reopened.close().await?;
    Ok(())
}

/// An append the caller abandons (drops its future) must not let a later append reuse its
/// seqs: every acknowledged record reads back as itself, and the log stays gap- and
/// conflict-free once the caller reopens and retries.
pub async fn cancelled_append_never_reuses_seqs(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let mut acked: Vec<Record> = Vec::new();
    for round in 0..24u64 {
        let batch = recs(&format!("c{round}"), "s", 5);
        // Cancel after a growing head start, to land at different points of the append.
        let head_start = Duration::from_micros(200 * round);
        match tokio::time::timeout(head_start, shard.append(batch.clone())).await {
            Ok(Ok(_)) => acked.extend(batch),
            // Abandoned: it may or may not land. The same handle goes on.
            Err(_) => {}
            // The handle refuses after an abandoned or indeterminate append: reopen, retry.
            Ok(Err(e)) if matches!(e, Error::Poisoned { .. }) || !e.is_definite() => {
                shard = store.open_shard(&w("w1")).await?;
                shard.append(batch.clone()).await?;
                acked.extend(batch);
            }
            Ok(Err(e)) => bail!("round {round}: {e}"),
        }
    }
    let mut p = store.projector();
    for r in &acked {
        let got = p
            .get(&r.bot_id, &r.id)
            .await?
            .with_context(|| format!("acked {} is not live", r.id))?;
        ensure!(got.record == *r, "{} reads back as {:?}", r.id, got.record.id);
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "{conflicts:?}");
    shard.close().await?;
    Ok(())
}
