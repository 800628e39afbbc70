//! Rule 18: the faults object stores really have — a request that fails before reaching
//! storage, one that lands but whose answer is lost, a stall, throttling, flaky writes and
//! conditional writes — are survived: the errors say what is known, the handle is poisoned
//! when the outcome is unknown, a retry with the same ids counts once, a read is whole or a
//! typed error, and nothing hangs. For backends with an object store to fault
//! ([`crate::Backend::faults`]).

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 18: object-store faults are survived";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(append_failing_before_storage_is_survived, needs Faults),
        case!(append_landing_unanswered_is_indeterminate, needs Faults),
        case!(stalled_append_ends_at_its_deadline, needs Faults),
        case!(throttled_reads_give_a_whole_view_or_an_error, needs Faults),
        case!(compaction_under_failing_writes_converges, needs Faults),
        case!(creation_and_claims_under_flaky_conditional_writes, needs Faults),
    ]
}

/// Put `fault` in place on the case's store until the guard drops.
async fn inject(ctx: &Ctx, fault: Fault) -> anyhow::Result<crate::FaultGuard> {
    let hook = ctx
        .backend
        .faults
        .context("a fault case runs only on a backend with an object store to fault")?;
    hook(ctx.uri.clone(), fault).await
}

/// A short deadline, so that faulted operations end quickly.
fn short(ctx: &Ctx) -> StoreOptions {
    ctx.options().with_timeout(Duration::from_secs(5))
}

/// After a failed append: either it was definite and nothing of it is visible, or it was
/// indeterminate, the handle is poisoned, and reopening and retrying the same ids makes
/// every record visible exactly once, without a conflict.
async fn settle_failed_append(
    ctx: &Ctx,
    err: Error,
    shard: &mut Box<dyn ctxlog_core::Shard>,
    batch: Vec<Record>,
    before: Vec<String>,
) -> anyhow::Result<()> {
    if err.is_definite() {
        let after = ids(&ctx.store().await?.projector().session("bot", "s").await?);
        ensure!(
            after == before,
            "a definite error ({err}) left records visible: expected {before:?}, got {after:?}"
        );
    } else {
        match shard.append(recs("next", "s", 1)).await {
            Err(Error::Poisoned { .. }) => {}
            other => bail!("after an indeterminate error ({err}) the handle must be poisoned, got {other:?}"),
        }
    }
    retry_counts_once(ctx, batch, before).await
}

/// An append whose writes fail before reaching storage fails within its deadline; what
/// its error says holds (definite: nothing visible; indeterminate: poisoned, and a retry
/// counts once).
pub async fn append_failing_before_storage_is_survived(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store_with(short(&ctx)).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    shard.append(recs("a", "s", 2)).await?;
    let before = ids(&store.projector().session("bot", "s").await?);
    let batch = recs("b", "s", 3);
    let guard = inject(&ctx, Fault::AppendFailsBefore).await?;
    let err = bounded(
        "an append whose writes fail",
        Duration::from_secs(30),
        shard.append(batch.clone()),
    )
    .await?
    .err()
    .context("an append whose every write fails must fail")?;
    drop(guard);
    settle_failed_append(&ctx, err, &mut shard, batch, before).await
}

/// An append whose write lands but whose answer is lost cannot claim that nothing was
/// written: its error is indeterminate (or the backend proves it landed and acknowledges).
pub async fn append_landing_unanswered_is_indeterminate(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store_with(short(&ctx)).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    shard.append(recs("a", "s", 2)).await?;
    let before = ids(&store.projector().session("bot", "s").await?);
    let batch = recs("b", "s", 3);
    let guard = inject(&ctx, Fault::AppendLandsUnanswered).await?;
    let outcome = bounded(
        "an append whose answer is lost",
        Duration::from_secs(30),
        shard.append(batch.clone()),
    )
    .await?;
    drop(guard);
    match outcome {
        // Proven to have landed: it must be visible, exactly once.
        Ok(_) => {
            let mut expected = before;
            expected.extend(ids_of(&batch));
            let view = ids(&ctx.store().await?.projector().session("bot", "s").await?);
            ensure!(
                view == expected,
                "an acknowledged append must be visible: expected {expected:?}, got {view:?}"
            );
            Ok(())
        }
        Err(e) => {
            ensure!(
                e.written() == Written::Unknown,
                "the write landed, so the error must not claim nothing was written: {e}"
            );
            settle_failed_append(&ctx, e, &mut shard, batch, before).await
        }
    }
}

/// An append whose write never answers ends at its deadline, indeterminate; once the stall
/// ends, the handle's tasks stop and a reopened writer goes on.
pub async fn stalled_append_ends_at_its_deadline(ctx: Ctx) -> anyhow::Result<()> {
    let options = ctx.options().with_timeout(Duration::from_secs(2));
    let store = ctx.store_with(options).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    shard.append(recs("a", "s", 2)).await?;
    let before = ids(&store.projector().session("bot", "s").await?);
    let batch = recs("b", "s", 3);
    let guard = inject(&ctx, Fault::AppendStalls).await?;
    let started = Instant::now();
    let err = bounded("a stalled append", Duration::from_secs(30), shard.append(batch.clone()))
        .await?
        .err()
        .context("an append whose write never answers must fail")?;
    let took = started.elapsed();
    ensure!(
        matches!(err, Error::Timeout { .. }) && err.written() == Written::Unknown,
        "expected an indeterminate Timeout, got {err}"
    );
    ensure!(
        took < Duration::from_secs(2) + Duration::from_secs(2),
        "expected the stall to end at the 2 s deadline, it took {took:?}"
    );
    drop(guard);
    let closed = bounded("close after a stall", ctx.backend.op_timeout, shard.close()).await?;
    let _ = closed; // a poisoned handle's close may report what it could not flush
    retry_counts_once(&ctx, batch, before).await
}

/// After a failed or stalled append: a reopened writer retries the same ids, and each
/// record is visible once, after `before`, without a conflict.
async fn retry_counts_once(ctx: &Ctx, batch: Vec<Record>, before: Vec<String>) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut reopened = store.open_shard(&w("w1")).await.context("reopen after the fault")?;
    reopened
        .append(batch.clone())
        .await
        .context("retry with the same ids")?;
    let mut expected = before;
    expected.extend(ids_of(&batch));
    let view = ids(&store.projector().session("bot", "s").await?);
    ensure!(
        view == expected,
        "expected each record once, {expected:?}, got {view:?}"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts.is_empty(),
        "expected no conflict after the retry, got {conflicts:?}"
    );
    reopened.close().await?;
    Ok(())
}

/// While reads are throttled, every first scan and session read either gives the whole
/// view — exactly the view without faults — or a typed error; never a partial view.
pub async fn throttled_reads_give_a_whole_view_or_an_error(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    // w1 closes (its records are flushed); w2 stays open, so its records are read from
    // its log of appends (on Lance, the WAL): reads of both tiers are throttled.
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    for b in 0..4 {
        w1.append(recs(&format!("w1-{b}"), "s", 5)).await?;
        w2.append(recs(&format!("w2-{b}"), "s", 5)).await?;
    }
    w1.close().await?;
    let mut whole = store.projector();
    whole.refresh().await?;
    let expected = whole.projection().canonical_json();
    let expected_view = ids(&whole.session("bot", "s").await?);

    let guard = inject(&ctx, Fault::ReadsThrottled).await?;
    let (mut whole_views, mut errors) = (0, 0);
    for round in 0..16 {
        let attempt = async {
            let reader = ctx.store_with(short(&ctx)).await?;
            let mut p = reader.projector();
            p.refresh().await?;
            let view = p.session("bot", "s").await?;
            anyhow::Ok((p.projection().canonical_json(), ids(&view)))
        };
        match attempt.await {
            Ok((projection, view)) => {
                ensure!(
                    projection == expected && view == expected_view,
                    "round {round}: a read under throttling returned a partial view"
                );
                whole_views += 1;
            }
            Err(e) => {
                let e = e
                    .downcast::<Error>()
                    .map_err(|e| anyhow!("round {round}: an untyped error: {e:#}"))?;
                ensure!(e.is_definite(), "round {round}: a read error must be definite: {e}");
                errors += 1;
            }
        }
    }
    drop(guard);
    w2.close().await?;
    ensure!(
        whole_views > 0 && errors > 0,
        "expected throttling to fail some reads and not others (whole views {whole_views}, errors {errors})"
    );
    Ok(())
}

/// Compaction passes whose writes fail often leave the view unchanged; once the faults end,
/// passes converge, and nothing is lost or duplicated.
pub async fn compaction_under_failing_writes_converges(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    for name in ["w1", "w2"] {
        let mut shard = store.open_shard(&w(name)).await?;
        for b in 0..5 {
            shard.append(recs(&format!("{name}-{b}"), "s", 8)).await?;
        }
        shard.close().await?;
    }
    let view = |store: Arc<dyn Store>| async move {
        let mut p = store.projector();
        p.refresh().await?;
        anyhow::Ok(p.projection().canonical_json())
    };
    let before = view(ctx.store().await?).await?;
    let faulted = ctx.store_with(short(&ctx)).await?;
    let guard = inject(&ctx, Fault::WritesFailOften).await?;
    for _ in 0..6 {
        let _ = bounded(
            "a compaction pass under faults",
            Duration::from_secs(30),
            faulted.compact(&CompactOptions::default()),
        )
        .await?;
    }
    drop(guard);
    ensure!(
        view(ctx.store().await?).await? == before,
        "failed compaction passes changed the view"
    );
    let mut converged = false;
    for _ in 0..64 {
        if faulted.compact(&CompactOptions::default()).await?.generations_remaining == 0 {
            converged = true;
            break;
        }
    }
    ensure!(converged, "compaction did not converge once the faults ended");
    // Converged means a fixed point: what was folded is known to be folded.
    let again = faulted.compact(&CompactOptions::default()).await?;
    ensure!(
        again.generations_merged == 0 && again.generations_remaining == 0,
        "a pass after convergence folded again: {again:?}"
    );
    let store = ctx.store().await?;
    ensure!(
        view(store.clone()).await? == before,
        "compaction after faults changed the view"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "expected no conflicts, got {conflicts:?}");
    Ok(())
}

/// While conditional writes are flaky, concurrent creators and then concurrent claimants
/// (retrying, as clients do) get a store and shards or typed errors, never a hang; afterwards
/// the store is one store, epochs only grow, every superseded handle refuses to append, and
/// what each append's answer said holds: an acknowledged record is visible exactly once, a
/// definite failure left nothing visible, an indeterminate one all of its batch or none.
pub async fn creation_and_claims_under_flaky_conditional_writes(ctx: Ctx) -> anyhow::Result<()> {
    let guard = inject(&ctx, Fault::ConditionalWritesFlaky).await?;
    /// What one attempt's append was answered.
    enum Appended {
        Acked(Vec<String>),
        Failed { ids: Vec<String>, err: Error },
    }
    let contend = |i: usize| {
        let (uri, options, open) = (ctx.uri.clone(), short(&ctx), ctx.backend.open);
        tokio::spawn(async move {
            // Every attempt's error (to be checked, not swallowed) and append's answer.
            let (mut errors, mut appends): (Vec<Error>, Vec<Appended>) = (Vec::new(), Vec::new());
            for attempt in 0..5 {
                let store = match open(uri.clone(), options.clone()).await {
                    Ok(s) => s,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
                let mut shard = match store.open_shard(&w("contended")).await {
                    Ok(s) => s,
                    Err(e) => {
                        errors.push(e);
                        continue;
                    }
                };
                // Ids of their own per attempt: what each answer says can be checked apart.
                let batch = recs(&format!("c{i}-a{attempt}"), "s", 2);
                let ids = ids_of(&batch);
                match shard.append(batch).await {
                    Ok(_) => appends.push(Appended::Acked(ids)),
                    Err(err) => appends.push(Appended::Failed { ids, err }),
                }
                return (Some((shard.epoch(), shard)), errors, appends);
            }
            (None, errors, appends)
        })
    };
    let tasks: Vec<_> = (0..4).map(contend).collect();
    let (mut handles, mut errors, mut appends) = (Vec::new(), Vec::new(), Vec::new());
    for t in tasks {
        // Under faults any typed error may come back; what matters is that none hangs and
        // what holds afterwards.
        let (handle, errs, apps) = bounded("a contender under flaky writes", Duration::from_secs(120), t).await??;
        handles.extend(handle);
        errors.extend(errs);
        appends.extend(apps);
    }
    // Opening and claiming write nothing a reader sees: whatever they say, no error of
    // theirs is a storage error without a kind the contract names.
    for e in &errors {
        ensure!(
            !matches!(e, Error::Poisoned { .. }),
            "a fresh open or claim cannot be poisoned: {e:?}"
        );
    }
    drop(guard);
    ensure!(
        !handles.is_empty(),
        "expected some contender to get through five attempts each"
    );
    // Without faults: one store, and a new claim is past every earlier one.
    let store = ctx.store_with(short(&ctx)).await?;
    let mut newest = store.open_shard(&w("contended")).await?;
    for (epoch, _) in &handles {
        ensure!(
            newest.epoch() > *epoch,
            "expected a new claim past every earlier epoch ({epoch}), got {}",
            newest.epoch()
        );
    }
    for (_, mut old) in handles {
        match old.append(recs("late", "s", 1)).await {
            Err(Error::Fenced { .. } | Error::Poisoned { .. }) => {}
            other => bail!("a superseded handle must refuse to append, got {other:?}"),
        }
    }
    newest.append(recs("final", "s", 1)).await?;
    newest.close().await?;
    // Every answer holds: acknowledged exactly once, definite nothing, indeterminate all or
    // nothing of its batch (rules 1, 2, 4).
    let view = ids(&store.projector().session("bot", "s").await?);
    let count = |id: &String| view.iter().filter(|v| *v == id).count();
    ensure!(
        count(&"final-0".to_string()) == 1,
        "the final record is not visible once: {view:?}"
    );
    for a in &appends {
        match a {
            Appended::Acked(ids) => {
                for id in ids {
                    ensure!(
                        count(id) == 1,
                        "acknowledged {id} is visible {} times: {view:?}",
                        count(id)
                    );
                }
            }
            Appended::Failed { ids, err } if err.is_definite() => {
                for id in ids {
                    ensure!(count(id) == 0, "{id} is visible after a definite error ({err:?})");
                }
            }
            Appended::Failed { ids, err } => {
                let seen: Vec<usize> = ids.iter().map(count).collect();
                ensure!(
                    seen.iter().all(|n| *n == seen[0]) && seen[0] <= 1,
                    "after an indeterminate error ({err:?}) a batch must be visible whole once or not at all: {seen:?}"
                );
            }
        }
    }
    ensure!(
        view.len() == 1 + view.iter().filter(|v| v.starts_with('c')).count(),
        "records no contender wrote are visible: {view:?}"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts
            .iter()
            .all(|c| matches!(c, ctxlog_core::Conflict::StaleEpoch { .. })),
        "expected no conflicts but stale epochs a fenced writer may leave, got {conflicts:?}"
    );
    Ok(())
}
