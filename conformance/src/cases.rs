//! The cases, one public async function each, grouped by contract rule. Each gets a fresh
//! [`Ctx`]; each returns an error or panics when the backend breaks the rule.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use ctxlog::model;
use ctxlog::{
    Body, Conflict, ConflictKind, Entry, Error, Hlc, Record, SkewedClock, Store, StoreOptions, WriterId, Written,
};

use crate::{Ctx, all_entries, rec, recs};

pub use crate::differential::differential_against_reference_model;
pub use crate::process::{
    multiprocess_concurrent_create, multiprocess_same_writer_fences_older, multiprocess_sigkill_keeps_acked,
    multiprocess_writers_exactly_once,
};

pub fn w(name: &str) -> WriterId {
    WriterId::new(name).expect("valid writer id")
}

fn ids(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.record.id.clone()).collect()
}

fn kinds(conflicts: &[Conflict]) -> Vec<ConflictKind> {
    conflicts.iter().map(Conflict::kind).collect()
}

/// Run `fut` under `after`, naming `what` when it hangs (rule 13).
async fn bounded<T>(what: &str, after: Duration, fut: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(after, fut)
        .await
        .map_err(|_| anyhow!("{what} hung past {after:?}"))
}

// ---- Rule 1: durable ack -------------------------------------------------------------

/// An acknowledged append is visible to a projector that refreshes and to a store opened
/// afterwards, with every field intact.
pub async fn durable_ack_visible_to_new_readers(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut reader = store.projector();
    reader.refresh().await?;
    ensure!(reader.stats().entries == 0, "a new store is empty");

    let mut batch = recs("a", "s1", 9);
    let mut binary = rec("a-bin", "s1", "");
    binary.body = Body::Bytes(vec![0, 159, 146, 150, 255]);
    binary.content_type = "application/octet-stream".into();
    binary.metadata = Some(serde_json::json!({"tool": "camera", "n": [1, 2.5, null]}));
    binary.created_at = Some(chrono::DateTime::from_timestamp_nanos(1_780_000_000_123_456_789));
    batch.push(binary);
    let mut shard = store.open_shard(&w("w1")).await?;
    let ack = shard.append(batch.clone()).await?;
    ensure!(
        ack.first_seq == 1 && ack.last_seq == 10,
        "seqs start at 1 and are dense: {ack:?}"
    );
    ensure!(ack.ids == ids_of(&batch), "the ack lists the ids in order");

    reader.refresh().await?;
    let view = reader.session("bot", "s1").await?;
    ensure!(view.len() == 10, "a refreshing reader sees the ack: {}", view.len());

    let other = ctx.store().await?;
    let view = other.projector().session("bot", "s1").await?;
    let got: Vec<Record> = view.iter().map(|e| e.record.clone()).collect();
    ensure!(got == batch, "a new reader sees exactly what was appended");
    for e in &view {
        ensure!(e.content_hash == e.record.content_hash(), "stored hash matches content");
        ensure!(e.epoch == shard.epoch(), "entries carry the writer's epoch");
    }
    shard.close().await?;
    Ok(())
}

fn ids_of(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| r.id.clone()).collect()
}

// ---- Rule 2: atomic batch ------------------------------------------------------------

/// A batch with one bad record writes nothing, and consumes no seq.
pub async fn atomic_batch_all_or_nothing(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let mut batch = recs("x", "s1", 6);
    batch[3].session_id.clear();
    match shard.append(batch).await {
        Err(Error::InvalidInput {
            field: "session_id",
            index: Some(3),
            ..
        }) => {}
        other => bail!("expected InvalidInput on session_id of record 3, got {other:?}"),
    }
    let mut p = store.projector();
    p.refresh().await?;
    ensure!(p.stats().entries == 0, "nothing of the bad batch is visible");
    let ack = shard.append(recs("y", "s1", 4)).await?;
    ensure!(ack.first_seq == 1, "the rejected batch consumed no seq: {ack:?}");
    p.refresh().await?;
    ensure!(p.stats().entries == 4);
    Ok(())
}

/// A reader refreshing while batches land sees each batch entirely or not at all.
pub async fn atomic_batch_never_half_visible(ctx: Ctx) -> anyhow::Result<()> {
    const BATCHES: usize = 12;
    const SIZE: usize = 40;
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let mut p = store.projector();
    p.refresh().await?; // the reader is open and warm before the first batch
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut refreshes = 0u64;
        loop {
            let finished = *done_rx.borrow_and_update();
            p.refresh().await?;
            refreshes += 1;
            for s in p.sessions("bot").await? {
                ensure!(
                    s.records == SIZE as u64,
                    "session {} is half visible: {} of {SIZE}",
                    s.session_id,
                    s.records
                );
            }
            if finished {
                return anyhow::Ok((refreshes, p.stats().live));
            }
            tokio::task::yield_now().await;
        }
    });
    for b in 0..BATCHES {
        shard
            .append(recs(&format!("b{b}"), &format!("batch-{b}"), SIZE))
            .await?;
    }
    done_tx.send(true)?;
    let (refreshes, live) = reader.await??;
    ensure!(
        live == (BATCHES * SIZE) as u64,
        "all batches visible at the end: {live}"
    );
    ensure!(refreshes > 1, "the reader ran while batches landed");
    Ok(())
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

// ---- Rule 4: definite and indeterminate errors --------------------------------------

/// An indeterminate failure poisons the handle; reopening and retrying the same ids yields
/// each record exactly once, with no seq gap.
pub async fn indeterminate_error_poisons_until_reopen(ctx: Ctx) -> anyhow::Result<()> {
    let short = StoreOptions {
        timeout: Duration::from_secs(2),
        ..ctx.options()
    };
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
            .get(&r.id)
            .await?
            .with_context(|| format!("acked {} is not live", r.id))?;
        ensure!(got.record == *r, "{} reads back as {:?}", r.id, got.record.id);
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "{conflicts:?}");
    shard.close().await?;
    Ok(())
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
        r.created_at = Some(chrono::Utc::now());
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

// ---- Rule 8: order -------------------------------------------------------------------

/// A writer whose clock is an hour behind still orders after what it has read.
pub async fn session_order_follows_hlc_across_skew(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let behind = ctx
        .store_with(StoreOptions {
            clock: SkewedClock::new(-3_600_000),
            ..ctx.options()
        })
        .await?;
    let mut a = store.open_shard(&w("fast")).await?;
    let mut b = behind.open_shard(&w("slow")).await?;
    a.append(vec![rec("1", "s", "question")]).await?;
    // B reads the session before answering, and moves its clock past what it read.
    let mut p = behind.projector();
    p.refresh().await?;
    b.observe(p.max_hlc())?;
    let b_ack = b
        .append(vec![rec("2", "s", "answer"), rec("3", "s", "follow-up")])
        .await?;
    a.observe(b_ack.last_hlc)?;
    a.append(vec![rec("4", "s", "thanks")]).await?;
    // A writer that does not observe is ordered by its (skewed) clock: first.
    let mut c = behind.open_shard(&w("unaware")).await?;
    c.append(vec![rec("0", "s", "early by its clock")]).await?;

    let view = store.projector().session("bot", "s").await?;
    ensure!(ids(&view) == ["0", "1", "2", "3", "4"], "{:?}", ids(&view));
    for pair in view.windows(2) {
        ensure!(
            pair[0].key() < pair[1].key(),
            "strictly in (hlc, shard, seq, epoch) order"
        );
    }
    Ok(())
}

/// A writer's HLC never goes backwards, also across a reopen with a clock in the past.
pub async fn hlc_never_goes_backwards_across_reopen(ctx: Ctx) -> anyhow::Result<()> {
    let ahead = ctx
        .store_with(StoreOptions {
            clock: SkewedClock::new(3_600_000),
            ..ctx.options()
        })
        .await?;
    let mut s = ahead.open_shard(&w("w1")).await?;
    let before = s.append(recs("a", "s", 5)).await?;
    s.close().await?;
    let behind = ctx
        .store_with(StoreOptions {
            clock: SkewedClock::new(-3_600_000),
            ..ctx.options()
        })
        .await?;
    let mut s = behind.open_shard(&w("w1")).await?;
    let after = s.append(recs("b", "s", 5)).await?;
    ensure!(
        after.first_hlc > before.last_hlc,
        "{:?} then {:?}",
        before.last_hlc,
        after.first_hlc
    );
    ensure!(after.first_seq == before.last_seq + 1);
    let view = behind.projector().session("bot", "s").await?;
    ensure!(
        view.windows(2).all(|p| p[0].hlc < p[1].hlc),
        "hlc increases along the shard"
    );
    s.close().await?;
    Ok(())
}

// ---- Rule 9: determinism -------------------------------------------------------------

/// The same entries give the same canonical projection and conflicts, whether scanned at
/// once or caught up incrementally, and the same as the reference model.
pub async fn determinism_across_read_orders(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut incremental = store.projector();
    let mut shards = Vec::new();
    for name in ["w3", "w1", "w2"] {
        shards.push(store.open_shard(&w(name)).await?);
    }
    for round in 0..6 {
        for (i, shard) in shards.iter_mut().enumerate() {
            let mut batch = recs(&format!("r{round}w{i}"), &format!("s{}", (round + i) % 3), 3);
            if round % 2 == 1 {
                // a divergent put and a duplicate of ids another shard wrote
                batch.push(rec(format!("r{}w{}-0", round - 1, (i + 1) % 3), "s0", "other"));
                batch.push(rec(
                    format!("r{}w{}-1", round - 1, i),
                    "s1",
                    format!("message 1 of r{}w{i}", round - 1),
                ));
            }
            if round == 4 {
                batch.push(Record::tombstone(format!("r0w{i}-2"), "bot", "s2"));
            }
            shard.append(batch).await?;
            incremental.refresh().await?;
        }
    }
    let mut once = store.projector();
    once.refresh().await?;
    let entries = all_entries(store.as_ref()).await?;
    let model = model::project(&entries).canonical_json();
    ensure!(
        once.projection().canonical_json() == model,
        "first scan differs from the model"
    );
    ensure!(
        incremental.projection().canonical_json() == model,
        "incremental refresh differs from the model"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts == model::conflicts(&entries),
        "conflicts differ from the model"
    );
    ensure!(!conflicts.is_empty(), "the history has conflicts to compare");
    Ok(())
}

// ---- Rule 10: history checks ---------------------------------------------------------

/// Stale epochs, seq gaps and corrupt entries — injected below the write path — are all
/// reported, exactly as the reference model reports them.
pub async fn history_checks_find_stale_gap_corrupt(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    store.open_shard(&w("w1")).await?.close().await?;
    let mut s = store.open_shard(&w("w1")).await?;
    let epoch = s.epoch();
    ensure!(epoch >= 2);
    let ack = s.append(recs("a", "s", 3)).await?;
    s.close().await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    w2.append(recs("z", "s", 1)).await?;
    w2.close().await?;
    ensure!(
        store.conflict_discovery().conflicts(None).await?.is_empty(),
        "a clean log has no conflicts"
    );

    let shard = w("w1").shard_id();
    let entry = |seq, epoch, record: Record| {
        let content_hash = record.content_hash();
        Entry {
            shard,
            seq,
            epoch,
            hlc: Hlc(ack.last_hlc.0 + seq),
            record,
            content_hash,
        }
    };
    // A fenced writer's write that landed: epoch below the one at this seq.
    let stale = entry(3, epoch - 1, rec("stale", "s", "late write"));
    // A hole: seqs 4 and 5 missing.
    let after_gap = entry(6, epoch, rec("gap", "s", "after the hole"));
    // Content that does not match its stored hash.
    let mut corrupt = entry(7, epoch, rec("corrupt", "s", "original"));
    corrupt.record.body = Body::Text("tampered".into());
    // A clock far past any plausible time (a damaged HLC).
    let mut far = entry(8, epoch, rec("far", "s", "from the future"));
    far.hlc = Hlc(u64::MAX - 7);
    for e in [stale, after_gap, corrupt, far] {
        (ctx.backend.inject_raw_entry)(ctx.uri.clone(), e).await?;
    }

    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let entries = all_entries(store.as_ref()).await?;
    ensure!(
        conflicts == model::conflicts(&entries),
        "the checker differs from the model"
    );
    ensure!(
        kinds(&conflicts)
            == vec![
                ConflictKind::StaleEpoch,
                ConflictKind::SeqGap,
                ConflictKind::Corrupt,
                ConflictKind::ImplausibleHlc
            ],
        "expected stale_epoch, seq_gap, corrupt, implausible_hlc; got {conflicts:?}"
    );
    // A writer that reads the damaged clock refuses to be dragged to it.
    let mut p = store.projector();
    p.refresh().await?;
    let mut w3 = store.open_shard(&w("w3")).await?;
    match w3.observe(p.max_hlc()) {
        Err(Error::InvalidInput { field: "hlc", .. }) => {}
        other => bail!("observing an HLC far in the future: expected InvalidInput, got {other:?}"),
    }
    let next = w3.append(recs("now", "s", 1)).await?;
    ensure!(next.last_hlc.millis() <= Hlc::PLAUSIBLE_MILLIS, "{next:?}");
    w3.close().await?;
    match &conflicts[1] {
        Conflict::SeqGap {
            missing_from,
            missing_to,
            ..
        } => ensure!((*missing_from, *missing_to) == (4, 5)),
        other => bail!("{other:?}"),
    }
    Ok(())
}

/// With a checkpoint, only conflicts involving entries past it are reported.
pub async fn conflicts_after_checkpoint(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let a = w1.append(vec![rec("k", "s", "one")]).await?;
    w2.observe(a.last_hlc)?;
    w2.append(vec![rec("k", "s", "two")]).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let checkpoint = p.checkpoint();
    ensure!(
        checkpoint.get(w1.shard_id()) == 1 && checkpoint.get(w2.shard_id()) == 1,
        "{checkpoint:?}"
    );
    let t = w1
        .append(vec![Record::tombstone("j", "bot", "s"), rec("m", "s", "x")])
        .await?;
    w2.observe(t.last_hlc)?;
    w2.append(vec![rec("j", "s", "after delete")]).await?;
    let mut cd = store.conflict_discovery();
    ensure!(kinds(&cd.conflicts(None).await?) == vec![ConflictKind::DivergentPut, ConflictKind::WriteAfterDelete]);
    ensure!(kinds(&cd.conflicts(Some(&checkpoint)).await?) == vec![ConflictKind::WriteAfterDelete]);
    p.refresh().await?;
    ensure!(cd.conflicts(Some(&p.checkpoint())).await?.is_empty());
    Ok(())
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

// ---- Rule 11: bad input --------------------------------------------------------------

/// Every kind of bad input is rejected, names its field and record, and writes nothing.
pub async fn bad_input_rejected_before_write(ctx: Ctx) -> anyhow::Result<()> {
    let mut options = ctx.options();
    options.limits.max_body_bytes = 1024;
    options.limits.max_metadata_bytes = 256;
    options.limits.max_record_bytes = 2048;
    options.limits.max_batch_records = 8;
    options.limits.max_batch_bytes = 4096;
    let store = ctx.store_with(options).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let good = shard.append(recs("ok", "s", 2)).await?;
    let snapshot = |store: Arc<dyn Store>| async move {
        let mut p = store.projector();
        p.refresh().await?;
        anyhow::Ok((
            p.projection().canonical_json(),
            all_entries(store.as_ref()).await?.len(),
        ))
    };
    let before = snapshot(store.clone()).await?;

    type Spoil = fn(&mut Record);
    let cases: Vec<(&str, Spoil)> = vec![
        ("id", |r| r.id.clear()),
        ("id", |r| r.id = "x".repeat(513)),
        ("bot_id", |r| r.bot_id.clear()),
        ("bot_id", |r| r.bot_id = "b".repeat(513)),
        ("session_id", |r| r.session_id.clear()),
        ("metadata", |r| {
            r.metadata = Some(serde_json::json!(["not", "an", "object"]))
        }),
        ("metadata", |r| r.metadata = Some(serde_json::json!("text"))),
        ("role", |r| r.role = "r".repeat(513)),
        ("content_type", |r| r.content_type = "c".repeat(513)),
        ("metadata", |r| {
            r.metadata = Some(serde_json::json!({"k": "v".repeat(300)}))
        }),
        ("body", |r| r.body = Body::Text("x".repeat(1025))),
        ("body", |r| r.body = Body::Bytes(vec![7; 1025])),
        // Every part within its limit, the record over its own.
        ("record", |r| {
            r.body = Body::Text("x".repeat(1000));
            r.metadata = Some(serde_json::json!({"k": "v".repeat(240)}));
            r.id = "i".repeat(500);
            r.bot_id = "b".repeat(500);
        }),
        ("created_at", |r| {
            r.created_at = chrono::DateTime::from_timestamp(-20_000_000_000, 0)
        }),
    ];
    for (field, spoil) in cases {
        let mut batch = recs("bad", "s", 3);
        spoil(&mut batch[2]);
        match shard.append(batch).await {
            Err(Error::InvalidInput {
                field: f,
                index: Some(2),
                ..
            }) if f == field => {}
            other => bail!("spoiled {field}: expected InvalidInput naming it, got {other:?}"),
        }
    }
    match shard.append(Vec::new()).await {
        Err(e @ Error::InvalidInput { field: "records", .. }) => ensure!(e.is_definite()),
        other => bail!("an empty batch: {other:?}"),
    }
    match shard.append(recs("many", "s", 9)).await {
        Err(e @ Error::InvalidInput { field: "records", .. }) => ensure!(e.is_definite()),
        other => bail!("9 records over a limit of 8: expected InvalidInput, got {other:?}"),
    }
    // Each record fits; together they pass the batch's byte limit (4096) at the fifth.
    let mut big = recs("big", "s", 5);
    for r in &mut big {
        r.body = Body::Bytes(vec![3; 1000]);
    }
    match shard.append(big).await {
        Err(
            e @ Error::InvalidInput {
                field: "records",
                index: Some(4),
                ..
            },
        ) => ensure!(e.is_definite()),
        other => bail!("a batch over its byte limit: expected InvalidInput at record 4, got {other:?}"),
    }
    ensure!(WriterId::new("").is_err(), "an empty writer id is rejected");
    match WriterId::new("w".repeat(513)) {
        Err(Error::InvalidInput { field: "writer", .. }) => {}
        other => bail!("a writer id over 512 bytes: expected InvalidInput, got {other:?}"),
    }
    ensure!(WriterId::new("w".repeat(512)).is_ok());
    ensure!(snapshot(store.clone()).await? == before, "bad input changed the store");
    let next = shard.append(recs("after", "s", 1)).await?;
    ensure!(next.first_seq == good.last_seq + 1, "no seq was consumed");
    // Exactly at the limit is fine.
    let mut edge = rec("edge", "s", "");
    edge.body = Body::Bytes(vec![1; 1024]);
    edge.id = "e".repeat(512);
    shard.append(vec![edge]).await?;
    Ok(())
}

/// URIs naming no known scheme, or no backend, fail before anything is written.
pub async fn bad_uri_rejected(ctx: Ctx) -> anyhow::Result<()> {
    let opts = ctx.options();
    match ctxlog::open("ftp://example.com/log", opts.clone()).await {
        Err(e @ Error::UnknownScheme { .. }) => ensure!(e.is_definite() && e.is_invalid_input()),
        other => bail!("ftp:// must be an unknown scheme, got {:?}", other.err()),
    }
    let nameless = ctx.root.join("no-extension");
    match ctxlog::open(&nameless.to_string_lossy(), opts.clone()).await {
        Err(Error::InvalidInput { field: "uri", .. }) => {}
        other => bail!("a path naming no backend: {:?}", other.err()),
    }
    ensure!(!nameless.exists(), "nothing was created");
    let location = ctxlog::Location::parse(&ctx.uri)?;
    match ctxlog::check_compiled(&location, &ctx.uri, &[]) {
        Err(Error::BackendNotCompiled { feature, .. }) => ensure!(feature == ctx.backend.name),
        other => bail!("a backend missing from the build: {other:?}"),
    }
    // Opening a missing store without create fails with NotFound and creates nothing.
    let missing = ctx.other_uri("missing");
    let err = ctxlog::open(
        &missing,
        StoreOptions {
            create_if_missing: false,
            ..opts
        },
    )
    .await
    .err()
    .context("opening a missing store without create must fail")?;
    ensure!(matches!(err, Error::NotFound { .. }), "{err}");
    Ok(())
}

// ---- Rule 12: concurrent create ------------------------------------------------------

/// Many tasks creating the same missing store at once all succeed and share it.
pub async fn concurrent_create_in_process(ctx: Ctx) -> anyhow::Result<()> {
    const N: usize = 6;
    let mut tasks = Vec::new();
    for i in 0..N {
        let (uri, opts) = (ctx.uri.clone(), ctx.options());
        tasks.push(tokio::spawn(async move {
            let store = ctxlog::open(&uri, opts).await?;
            let mut s = store.open_shard(&w(&format!("creator-{i}"))).await?;
            s.append(vec![rec(format!("c{i}"), "s", "hello")]).await?;
            s.close().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let store = ctx.store().await?;
    ensure!(store.shards().await?.len() == N, "one store, every writer in it");
    ensure!(store.projector().session("bot", "s").await?.len() == N);
    Ok(())
}
