//! What only the Lance backend has: compaction of flushed generations, MemWAL fencing inside
//! `close`, WAL replay after a crash. Each case has a fresh root and a deadline.

mod common;

use common::run;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use ctxlog_conformance::w;
use ctxlog_conformance::{Ctx, recs};
use ctxlog_core::{CompactOptions, Error, Store};
use ctxlog_lance::testing::{StopPoint, base_keys, compact_interrupted, compact_overtaken};
use ctxlog_lance::{LanceStore, WriterTuning};

/// Small memtables: a generation every few appends.
fn small() -> WriterTuning {
    WriterTuning {
        max_memtable_rows: 60,
        max_memtable_batches: 6,
        ..WriterTuning::default()
    }
}

async fn store(ctx: &Ctx, tuning: WriterTuning) -> anyhow::Result<Arc<dyn Store>> {
    let mut options = ctx.options();
    // A batch must fit one memtable.
    options.limits.max_batch_records = tuning.max_memtable_rows;
    Ok(Arc::new(
        LanceStore::open_store(&ctx.uri, options).await?.with_tuning(tuning),
    ))
}

/// Fold everything: passes until no generation is left.
async fn compact_all(store: &dyn Store) -> anyhow::Result<u64> {
    let mut merged = 0;
    for _ in 0..64 {
        let r = store.compact(&CompactOptions::default()).await?;
        merged += r.generations_merged;
        if r.generations_remaining == 0 {
            return Ok(merged);
        }
    }
    anyhow::bail!("compaction did not converge in 64 passes")
}

async fn canonical(ctx: &Ctx) -> anyhow::Result<(String, String)> {
    let store = ctx.store().await?;
    let mut p = store.projector();
    p.refresh().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    Ok((p.projection().canonical_json(), ctxlog_core::conflicts_json(&conflicts)))
}

#[test]
fn compaction_while_four_writers_append() {
    run("compaction_while_four_writers_append", |ctx| {
        Box::pin(async move {
            const WRITERS: usize = 4;
            const BATCHES: usize = 24;
            const SIZE: usize = 10;
            let (compacted_tx, compacted_rx) = tokio::sync::watch::channel(false);
            let mut writers = Vec::new();
            for i in 0..WRITERS {
                let store = store(&ctx, small()).await?;
                let mut rx = compacted_rx.clone();
                writers.push(tokio::spawn(async move {
                    let mut shard = store.open_shard(&w(&format!("replica-{i}"))).await?;
                    let epoch = shard.epoch();
                    let mut acked = Vec::new();
                    for b in 0..BATCHES {
                        if b == BATCHES / 2 {
                            // Go on only once a compaction pass has folded something, so
                            // that appends and compaction provably overlap.
                            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|done| *done))
                                .await
                                .context("no compaction pass folded anything")??;
                        }
                        let ack = shard.append(recs(&format!("r{i}b{b}"), "shared", SIZE)).await?;
                        ensure!(ack.epoch == epoch, "the writer was re-claimed");
                        acked.extend(ack.ids);
                    }
                    shard.close().await?;
                    anyhow::Ok(acked)
                }));
            }
            let compactor = ctx.store().await?;
            let mut folded_while_live = 0;
            while !writers.iter().all(|t| t.is_finished()) {
                let r = compactor
                    .compact(&CompactOptions::default().with_max_generations(3))
                    .await?;
                folded_while_live += r.generations_merged;
                if folded_while_live > 0 {
                    compacted_tx.send_replace(true);
                }
                tokio::task::yield_now().await;
            }
            let mut acked = Vec::new();
            for t in writers {
                acked.extend(t.await?.context("a writer failed while compaction ran")?);
            }
            ensure!(folded_while_live > 0);
            compact_all(compactor.as_ref()).await?;

            let total = WRITERS * BATCHES * SIZE;
            ensure!(acked.len() == total);
            let store = ctx.store().await?;
            let view = store.projector().session("bot", "shared").await?;
            let seen: BTreeSet<&str> = view.iter().map(|e| e.record.id.as_str()).collect();
            ensure!(
                view.len() == total && seen.len() == total,
                "{} of {total} visible",
                view.len()
            );
            ensure!(
                acked.iter().all(|id| seen.contains(id.as_str())),
                "an acked record is missing"
            );
            ensure!(store.conflict_discovery().conflicts(None).await?.is_empty());
            for s in store.shards().await? {
                ensure!(s.epoch == 1, "compaction fenced {}: epoch {}", s.writer, s.epoch);
            }
            let keys = base_keys(&ctx.uri).await?;
            let distinct: BTreeSet<_> = keys.iter().collect();
            ensure!(keys.len() == distinct.len(), "compaction folded a row twice");
            ensure!(keys.len() == total, "{} rows folded of {total}", keys.len());
            Ok(())
        })
    });
}

/// A store whose writers `a` and `b` each flushed several generations: 240 records.
async fn two_writers_of_generations(ctx: &Ctx) -> anyhow::Result<Arc<dyn Store>> {
    let s = store(ctx, small()).await?;
    for name in ["a", "b"] {
        let mut shard = s.open_shard(&w(name)).await?;
        for b in 0..12 {
            shard.append(recs(&format!("{name}{b}"), "s", 10)).await?;
        }
        shard.close().await?;
    }
    Ok(s)
}

/// Replicas compact one store: a pass another pass overtook (it folded the same generations
/// and committed first) is not a failure — it plans again and folds what is left, and no
/// row is folded twice.
#[test]
fn overtaken_compaction_plans_again() {
    run("overtaken_compaction_plans_again", |ctx| {
        Box::pin(async move {
            let s = two_writers_of_generations(&ctx).await?;
            let before = canonical(&ctx).await?;
            // Each pass folds two generations: the overtaken one has more left to fold.
            let opts = CompactOptions::default().with_max_generations(2);
            let (mine, theirs) = compact_overtaken(&ctx.uri, ctx.options(), &opts).await?;
            ensure!(theirs.generations_merged == 2, "the overtaking pass: {theirs:?}");
            ensure!(
                mine.generations_merged == 2,
                "the overtaken pass, planned again: {mine:?}"
            );
            compact_all(s.as_ref()).await?;
            ensure!(canonical(&ctx).await? == before, "compaction changed the view");
            let keys = base_keys(&ctx.uri).await?;
            ensure!(keys.len() == 240 && keys.iter().collect::<BTreeSet<_>>().len() == 240);
            Ok(())
        })
    });
}

#[test]
fn interrupted_compaction_converges() {
    run("interrupted_compaction_converges", |ctx| {
        Box::pin(async move {
            let s = two_writers_of_generations(&ctx).await?;
            let before = canonical(&ctx).await?;
            let opts = CompactOptions::default();
            for stop in [StopPoint::AfterRead, StopPoint::BeforeCommit] {
                compact_interrupted(&ctx.uri, ctx.options(), &opts, stop).await?;
                ensure!(
                    canonical(&ctx).await? == before,
                    "a pass stopped at {stop:?} changed the view"
                );
                ensure!(
                    base_keys(&ctx.uri).await?.is_empty(),
                    "a pass stopped at {stop:?} folded rows"
                );
            }
            let merged = compact_all(s.as_ref()).await?;
            ensure!(merged >= 4, "expected several generations, folded {merged}");
            ensure!(canonical(&ctx).await? == before, "compaction changed the view");
            let keys = base_keys(&ctx.uri).await?;
            ensure!(keys.len() == 240 && keys.iter().collect::<BTreeSet<_>>().len() == 240);
            let again = s.compact(&opts).await?;
            ensure!(
                again.generations_merged == 0 && again.generations_remaining == 0,
                "{again:?}"
            );
            // Readers no longer need the folded generations: hide them, and a fresh reader
            // still sees exactly the same log (from the base table and the WAL tail).
            let dir = ctxlog_lance::testing::local_dir(&ctx.uri)?;
            let mut hidden = 0;
            for shard in std::fs::read_dir(dir.join("_mem_wal"))? {
                for g in std::fs::read_dir(shard?.path())? {
                    let g = g?.path();
                    if g.file_name().is_some_and(|n| n.to_string_lossy().contains("_gen_")) {
                        std::fs::rename(&g, g.with_extension("folded"))?;
                        hidden += 1;
                    }
                }
            }
            ensure!(hidden >= 4, "{hidden} generations on disk");
            ensure!(
                canonical(&ctx).await? == before,
                "readers still depend on folded generations"
            );
            Ok(())
        })
    });
}

#[test]
fn fenced_during_close_returns_within_deadline() {
    run("fenced_during_close_returns_within_deadline", |ctx| {
        Box::pin(async move {
            let deadline = Duration::from_secs(10);
            let options = ctx.options().with_timeout(deadline);
            let baseline = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            for round in 0..4u64 {
                let a_store = ctxlog_lance::LanceStore::open(&ctx.uri, options.clone()).await?;
                let b_store = ctxlog_lance::LanceStore::open(&ctx.uri, options.clone()).await?;
                let mut a = a_store.open_shard(&w("same")).await?;
                // Rows in the memtable, so that close has a generation to flush.
                a.append(recs(&format!("a{round}"), "s", 40 * (round as usize + 1)))
                    .await?;
                let closing = tokio::spawn(async move {
                    let started = Instant::now();
                    let r = a.close().await;
                    (r, started.elapsed())
                });
                // The successor claims the shard while A is inside close.
                let mut b = b_store.open_shard(&w("same")).await?;
                let (closed, took) = tokio::time::timeout(deadline * 2, closing)
                    .await
                    .context("close of a fenced writer hung")??;
                ensure!(took < deadline + Duration::from_secs(1), "close took {took:?}");
                if let Err(e) = closed {
                    ensure!(
                        matches!(e, Error::Fenced { .. } | Error::Timeout { .. } | Error::Backend { .. }),
                        "{e}"
                    );
                }
                b.append(recs(&format!("b{round}"), "s", 5)).await?;
                b.close().await?;
            }
            // Fenced before close, too: close returns a typed Fenced error, fast.
            let store = ctx.store().await?;
            let mut a = store.open_shard(&w("other")).await?;
            a.append(recs("x", "t", 30)).await?;
            let b = ctx.store().await?.open_shard(&w("other")).await?;
            let started = Instant::now();
            let r = tokio::time::timeout(deadline * 2, a.close())
                .await
                .context("close hung")?;
            ensure!(matches!(r, Err(Error::Fenced { .. })), "expected Fenced, got {r:?}");
            ensure!(started.elapsed() < deadline);
            b.close().await?;
            drop(store);
            // Nothing left spinning: every writer's background tasks are gone.
            let alive = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            ensure!(
                alive <= baseline,
                "{alive} tasks alive after every writer closed, {baseline} before"
            );
            // Everything acknowledged is there.
            let view = ctx.store().await?.projector().session("bot", "s").await?;
            ensure!(
                view.len() == (1..=4).map(|r| 40 * r + 5).sum::<usize>(),
                "{} records",
                view.len()
            );
            Ok(())
        })
    });
}

#[test]
fn memory_uri_is_one_store_per_process() {
    run("memory_uri_is_one_store_per_process", |ctx| {
        Box::pin(async move {
            // Unique per case: the reference stores live as long as the process.
            let name = ctx
                .root
                .file_name()
                .context("root name")?
                .to_string_lossy()
                .into_owned();
            let uri = format!("memory://{name}");
            let writer_side = ctxlog_lance::LanceStore::open(&uri, ctx.options()).await?;
            let mut shard = writer_side.open_shard(&w("mem")).await?;
            shard.append(recs("m", "s", 5)).await?;
            // Another handle on the same URI is the same store, before and after close.
            let reader_side = ctxlog_lance::LanceStore::open(&uri, ctx.options()).await?;
            ensure!(reader_side.projector().session("bot", "s").await?.len() == 5);
            shard.close().await?;
            ensure!(reader_side.projector().session("bot", "s").await?.len() == 5);
            let other = ctxlog_lance::LanceStore::open(&format!("{uri}-other"), ctx.options()).await?;
            ensure!(
                other.projector().session("bot", "s").await?.is_empty(),
                "another name is another store"
            );
            Ok(())
        })
    });
}

/// A writer that goes on appending while a successor takes its shard over learns it is
/// fenced from the successor's claim, before the successor reaches the WAL tip: here the
/// successor is held just before its WAL sentinel, and the old writer's next append is
/// refused as fenced with nothing written. (Without the epoch check the append lands,
/// and a successor probing for the tip chases such a writer for as long as it appends.)
#[test]
fn a_writer_learns_of_a_claim_before_the_successor_reaches_the_wal() {
    use ctxlog_lance::faults::{Action, Faults, Gate, Op, Rule, Verdict};
    run(
        "a_writer_learns_of_a_claim_before_the_successor_reaches_the_wal",
        |ctx| {
            Box::pin(async move {
                let tuning = WriterTuning {
                    fence_check_interval: Duration::ZERO,
                    ..WriterTuning::default()
                };
                let a_store = store(&ctx, tuning).await?;
                let mut a = a_store.open_shard(&w("w1")).await?;
                a.append(recs("before", "s", 2)).await?;

                let gate = Gate::new();
                let faults = Faults::new(1);
                faults.add(Rule::new(&[Op::PutIfAbsent], Action::Pause(gate.clone())).path("/wal/"));
                let b_store = LanceStore::open_with_faults(&ctx.uri, ctx.options(), Some(faults)).await?;
                let claim = tokio::spawn(async move { b_store.open_shard(&w("w1")).await });
                ensure!(
                    gate.arrivals(1, Duration::from_secs(30)).await,
                    "the successor never reached its WAL sentinel"
                );
                // The successor's epoch is claimed; its sentinel is not written yet.
                match a.append(recs("after", "s", 2)).await {
                    Err(Error::Fenced { written, .. }) => {
                        ensure!(
                            written == ctxlog_core::Written::Nothing,
                            "a refused append wrote {written:?}"
                        )
                    }
                    other => anyhow::bail!("expected the old writer to be fenced, got {other:?}"),
                }
                gate.release(Verdict::Proceed);
                let mut b = tokio::time::timeout(Duration::from_secs(30), claim)
                    .await
                    .context("the successor's claim did not finish")???;
                b.append(recs("successor", "s", 1)).await?;
                b.close().await?;
                let view = ctxlog_conformance::ids(&ctx.store().await?.projector().session("bot", "s").await?);
                ensure!(
                    view == ["before-0", "before-1", "successor-0"],
                    "expected the old writer's first batch and the successor's, got {view:?}"
                );
                Ok(())
            })
        },
    );
}

/// A writer freezes its memtable every `max_wal_tail` appends, so the WAL a successor
/// replays stays short however long the writer lives; and a reopened writer, which
/// recovers its seqs from the newest tiers only, goes on after the last seq.
#[test]
fn the_wal_tail_a_takeover_replays_is_bounded() {
    run("the_wal_tail_a_takeover_replays_is_bounded", |ctx| {
        Box::pin(async move {
            let tuning = WriterTuning {
                max_wal_tail: 4,
                ..WriterTuning::default()
            };
            let s = store(&ctx, tuning.clone()).await?;
            let mut shard = s.open_shard(&w("w1")).await?;
            for b in 0..10 {
                shard.append(recs(&format!("b{b}"), "s", 1)).await?;
            }
            // Close waits for every flush outstanding: the two frozen by the bound, then
            // the rest.
            shard.close().await?;
            let generations = ctxlog_lance::testing::generation_dirs(&ctx.uri)?;
            ensure!(
                generations.len() == 3,
                "expected 3 generations (appends 1-4, 5-8, 9-10), got {}",
                generations.len()
            );
            let s = store(&ctx, tuning).await?;
            let mut reopened = s.open_shard(&w("w1")).await?;
            let ack = reopened.append(recs("next", "s", 1)).await?;
            ensure!(ack.first_seq == 11, "expected seq 11 after 10, got {}", ack.first_seq);
            reopened.close().await?;
            let conflicts = s.conflict_discovery().conflicts(None).await?;
            ensure!(conflicts.is_empty(), "expected no conflicts, got {conflicts:?}");
            Ok(())
        })
    });
}

/// Writers replaced before they freeze (killed: dropped, never closed) leave a WAL tail
/// longer than any one of them wrote. The open that replays it counts it against its own
/// budget, so its first append freezes and the tail stays bounded across restarts;
/// unbounded, it grew until no open fit the deadline (a writer id of the serve soak could
/// never claim again).
#[test]
fn a_tail_left_by_replaced_writers_is_frozen_after_the_next_open() {
    run("a_tail_left_by_replaced_writers_is_frozen_after_the_next_open", |ctx| {
        Box::pin(async move {
            let tuning = WriterTuning {
                max_wal_tail: 4,
                ..WriterTuning::default()
            };
            let s = store(&ctx, tuning).await?;
            for round in 0..3 {
                let mut shard = s.open_shard(&w("w1")).await?;
                for b in 0..3 {
                    shard.append(recs(&format!("r{round}b{b}"), "s", 1)).await?;
                }
                // Fewer appends than the bound: this handle alone never freezes.
                drop(shard);
            }
            let mut last = s.open_shard(&w("w1")).await?;
            let ack = last.append(recs("last", "s", 1)).await?;
            ensure!(ack.first_seq == 10, "expected seq 10 after 9, got {}", ack.first_seq);
            last.append(recs("after", "s", 1)).await?;
            // Close flushes what is outstanding as one generation: a second one is the
            // replayed tail, frozen by the first append after the open.
            last.close().await?;
            let generations = ctxlog_lance::testing::generation_dirs(&ctx.uri)?;
            ensure!(
                generations.len() >= 2,
                "the replayed tail was frozen: expected 2 generations or more, got {}",
                generations.len()
            );
            let view = s.projector().session("bot", "s").await?;
            ensure!(
                view.len() == 11,
                "every acknowledged record is read, got {}",
                view.len()
            );
            Ok(())
        })
    });
}

/// A writer whose flushes fall behind (here: a generation's writes held at a gate) is
/// refused, nothing written, the append that makes the next freeze due, until the last
/// freeze's flush lands; so the tail a successor replays stays bounded.
#[test]
fn appends_wait_for_the_flushes_of_the_last_freeze() {
    use ctxlog_lance::faults::{Action, Faults, Gate, Op, Rule, Verdict};
    run("appends_wait_for_the_flushes_of_the_last_freeze", |ctx| {
        Box::pin(async move {
            let tuning = WriterTuning {
                max_wal_tail: 2,
                ..WriterTuning::default()
            };
            let faults = Faults::new(1);
            let held = Gate::new();
            faults
                .add(Rule::new(&[Op::Put, Op::PutIfAbsent, Op::Multipart], Action::Pause(held.clone())).path("_gen_"));
            let mut options = ctx.options().with_timeout(Duration::from_secs(2));
            options.limits.max_batch_records = tuning.max_memtable_rows;
            let s = LanceStore::open_with_faults(&ctx.uri, options, Some(faults.clone()))
                .await?
                .with_tuning(tuning);
            let mut shard = s.open_shard(&w("w1")).await?;
            shard.append(recs("a", "s", 1)).await?;
            // The second append freezes the memtable; its flush waits at the gate.
            shard.append(recs("b", "s", 1)).await?;
            ensure!(
                held.arrivals(1, Duration::from_secs(30)).await,
                "the frozen memtable's flush never started"
            );
            // The third fills the next memtable's budget but one: the fourth makes the next
            // freeze due, and waits for the first one's flush.
            shard.append(recs("c", "s", 1)).await?;
            match shard.append(recs("d", "s", 1)).await {
                Err(Error::Timeout {
                    written: ctxlog_core::Written::Nothing,
                    ..
                }) => {}
                other => anyhow::bail!("expected a timeout with nothing written, got {other:?}"),
            }
            held.release(Verdict::Proceed);
            shard.append(recs("e", "s", 1)).await?;
            shard.close().await?;
            let view = ctxlog_conformance::ids(&s.projector().session("bot", "s").await?);
            ensure!(
                view == ["a-0", "b-0", "c-0", "e-0"],
                "expected a, b, c and e, got {view:?}"
            );
            Ok(())
        })
    });
}

/// A refresh reads a window of WAL positions at once, so its reads are no snapshot: here
/// the read of the next position answers "missing", the writer then puts that entry and
/// the one after, and the read of the position after sees it. The refresh must not take
/// the first for a hole and skip it for good.
#[test]
fn a_refresh_racing_the_writer_never_skips_a_wal_entry() {
    use ctxlog_lance::faults::{Action, Faults, Gate, Op, Rule, Verdict};
    run("a_refresh_racing_the_writer_never_skips_a_wal_entry", |ctx| {
        Box::pin(async move {
            const WAIT: Duration = Duration::from_secs(30);
            let writer_store = store(&ctx, WriterTuning::default()).await?;
            let mut shard = writer_store.open_shard(&w("w1")).await?;
            shard.append(recs("b0", "s0", 3)).await?;
            let faults = Faults::new(1);
            let reader = LanceStore::open_with_faults(&ctx.uri, ctx.options(), Some(faults.clone())).await?;
            let mut p = reader.projector();
            p.refresh().await?;
            ensure!(p.stats().live == 3, "the warm reader sees the first batch");

            // The next two positions the writer will put.
            let id = w("w1").shard_id();
            let next = (1..)
                .find(|&pos| ctxlog_lance::testing::wal_entry_file(&ctx.uri, id, pos).is_ok_and(|f| !f.exists()))
                .expect("a free position");
            let name = |pos| -> anyhow::Result<String> {
                let f = ctxlog_lance::testing::wal_entry_file(&ctx.uri, id, pos)?;
                Ok(f.file_name().context("a file name")?.to_string_lossy().into_owned())
            };
            let answered = Gate::new(); // holds the answer "missing" for `next`
            let asked = Gate::new(); // holds the read of `next + 1` before it is made
            faults.add(Rule::new(&[Op::Get], Action::PauseAfter(answered.clone())).path(&name(next)?));
            faults.add(Rule::new(&[Op::Get], Action::Pause(asked.clone())).path(&name(next + 1)?));

            let refresh = tokio::spawn(async move {
                let done = p.refresh().await;
                (p, done)
            });
            ensure!(
                answered.arrivals(1, WAIT).await,
                "the refresh never read position {next}"
            );
            ensure!(
                asked.arrivals(1, WAIT).await,
                "the refresh never read position {}",
                next + 1
            );
            shard.append(recs("b1", "s1", 3)).await?;
            shard.append(recs("b2", "s2", 3)).await?;
            asked.release(Verdict::Proceed);
            answered.release(Verdict::Proceed);
            let (mut p, done) = tokio::time::timeout(WAIT, refresh)
                .await
                .context("the refresh did not finish")??;
            done?;
            p.refresh().await?;
            ensure!(
                p.stats().live == 9,
                "expected all three batches (9 records) after the writer's acks, got {}",
                p.stats().live
            );
            shard.close().await?;
            Ok(())
        })
    });
}

/// Rule 22 across releases: a process of an earlier release (which reads formats up to 4)
/// moves the marker from 3 to 4 without a condition, as Lance's moves are, after this
/// release moved it to 5 and wrote embeddings. This handle's next fence check finds the
/// marker below what it moved it to and moves it back up; an append with an embedding
/// through a fresh handle then finds it at 5, never at 4.
#[test]
fn a_format_marker_moved_down_by_an_earlier_release_is_moved_back_up() {
    run(
        "a_format_marker_moved_down_by_an_earlier_release_is_moved_back_up",
        |ctx| {
            Box::pin(async move {
                let tuning = WriterTuning {
                    fence_check_interval: Duration::ZERO,
                    ..WriterTuning::default()
                };
                let marker = std::path::Path::new(&ctx.uri).join("_ctxlog/format");
                let s = store(&ctx, tuning).await?;
                let mut a = s.open_shard(&w("w1")).await?;
                a.append(recs("plain", "s", 1)).await?;
                ensure!(std::fs::read_to_string(&marker)? == "3");
                let vector =
                    ctxlog_core::Record::embedding("plain-0", "bot", "s", "m", ctxlog_core::Metric::Dot, &[1.0]);
                a.append(vec![vector]).await?;
                ensure!(std::fs::read_to_string(&marker)? == "5");
                // An earlier release's link writer, which read 3 before this one moved it.
                std::fs::write(&marker, "4")?;
                a.append(recs("later", "s", 1)).await?;
                ensure!(
                    std::fs::read_to_string(&marker)? == "5",
                    "the marker stays below the entries the store holds"
                );
                Ok(())
            })
        },
    );
}
