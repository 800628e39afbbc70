//! The differential property test: random histories of puts, duplicates, divergent puts,
//! tombstones, embeddings, reopens, observations, projection snapshots and compaction with gc over
//! several writers, written through the public API, must read back exactly as written and
//! give the same canonical projection, session views and conflict list as the reference
//! model — from a full scan and from the newest snapshot plus what came after it; and the
//! conflicts after earlier checkpoints must be the model's conflicts involving newer entries.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, ensure};
use ctxlog_core::search::Deadline;
use ctxlog_core::testing::model;
use ctxlog_core::{AppendAck, Checkpoint, Projector, Record, Shard, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::{Ctx, w};

const WRITERS: u8 = 3;

/// One step of a history.
#[derive(Clone, Debug)]
pub enum Step {
    /// Append records `(id, variant)` or tombstones (`variant == None`).
    Append {
        /// Which of the writers.
        writer: u8,
        /// The records: an id, and which content (none: a tombstone).
        records: Vec<(u8, Option<u8>)>,
    },
    /// Close the writer's shard and claim it again (a new epoch).
    Reopen {
        /// Which of the writers.
        writer: u8,
    },
    /// The writer reads the log and moves its clock past it.
    Observe {
        /// Which of the writers.
        writer: u8,
    },
    /// The writer appends an embedding of an id (rule 27), after a put of it or not.
    Embed {
        /// Which of the writers.
        writer: u8,
        /// The id embedded.
        id: u8,
        /// Model `n` (else `m`).
        model: bool,
        /// Which vector.
        value: u8,
        /// With a put of the id (this variant) in the same batch.
        with_put: Option<u8>,
    },
    /// The observer saves a projection snapshot (rule 17).
    Snapshot,
    /// Compaction, purge, then gc with no grace period (rules 15, 16).
    Maintain,
    /// The writer appends a summary of id `id`'s session covering a view its own observer
    /// read: a fresh one (mostly), or one it read earlier plus the writer's own appends since
    /// (what a replica knows of itself), so summaries of different writers cover views that
    /// are incomparable; having observed that view's clock or not (then it may cover records
    /// with later clocks: implausible).
    Summarise {
        /// Which of the writers.
        writer: u8,
        /// The summary's record id (its session is the id's): its own (`IDS..`) mostly,
        /// sometimes a put's.
        id: u8,
        /// `None`: a view read now; `Some(v)`: the `v`-th (modulo) its observer read so far.
        view: Option<u8>,
        /// Whether the coverage also names the writer's own newest entry.
        own: bool,
        /// Whether the writer observes the view's clock first (rule 8).
        observe: bool,
        /// A coverage that claims `ahead` more seqs of writer `past`'s shard than the view
        /// held (a buggy or forged summary: positions no reader holds yet, its own entry, or
        /// records written after it). Mostly 0.
        ahead: u8,
        /// Whose shard `ahead` applies to.
        past: u8,
    },
    /// The writer appends a link (rule 25) of id `id` (in `LINK_IDS`): a fork of another
    /// session as of a view its observer read (now or earlier), having observed its clock;
    /// or a hide of put id `target`. Retried and tombstoned like any id (`Append` does not
    /// write link ids; a later `Link` of the same id with other content diverges).
    Link {
        /// Which of the writers.
        writer: u8,
        /// The link's record id.
        id: u8,
        /// A fork (of session `s{(id + 1 + target) % 3}`) or a hide (of `id{target}`).
        fork: bool,
        /// The put id a hide names, or which other session a fork continues.
        target: u8,
        /// `None`: a view read now; `Some(v)`: the `v`-th (modulo) its observer read so far.
        view: Option<u8>,
        /// Whether a tombstone of the link follows in the same step's next batch.
        forget: bool,
    },
}

/// An embedding (rule 27) of `id{id}` in its session: under model `m` (cosine, 2
/// dimensions, sometimes 3: a vector its model's declaration leaves out) or `n` (L2), of few
/// values (equal similarities tie), appended alone or in one batch with a put of the id.
fn embedding(id: u8, model: bool, value: u8) -> Record {
    let v = [f32::from(value % 4), f32::from(value / 4 % 4) - 1.5, 1.0];
    let (name, metric, dims) = match (model, value % 7) {
        (false, 0) => ("m", ctxlog_core::Metric::Cosine, 3),
        (false, _) => ("m", ctxlog_core::Metric::Cosine, 2),
        (true, _) => ("n", ctxlog_core::Metric::L2, 3),
    };
    Record::embedding(
        format!("id{id}"),
        "bot",
        format!("s{}", id % 3),
        name,
        metric,
        &v[..dims],
    )
}

/// Record ids of links (rule 25): `id20..id25`, each in session `s{id % 3}` (two per
/// session, so that a session can hold a fork and a hide).
const LINK_IDS: std::ops::Range<u8> = 20..26;

fn step() -> impl Strategy<Value = Step> {
    let record = (0u8..IDS, prop_oneof![4 => (0u8..3).prop_map(Some), 1 => Just(None)]);
    prop_oneof![
        8 => (0..WRITERS, proptest::collection::vec(record, 1..5))
            // One id once per batch: a batch that writes an id twice differently is refused
            // (rule 6); across batches and writers ids repeat freely.
            .prop_map(|(writer, mut records)| {
                let mut seen = std::collections::HashSet::new();
                records.retain(|(id, _)| seen.insert(*id));
                Step::Append { writer, records }
            }),
        1 => (0..WRITERS).prop_map(|writer| Step::Reopen { writer }),
        1 => (0..WRITERS).prop_map(|writer| Step::Observe { writer }),
        1 => Just(Step::Snapshot),
        1 => Just(Step::Maintain),
        3 => (0..WRITERS, 0u8..IDS, any::<bool>(), any::<u8>(), prop_oneof![2 => Just(None), 1 => (0u8..3).prop_map(Some)])
            .prop_map(|(writer, id, model, value, with_put)| Step::Embed { writer, id, model, value, with_put }),
        4 => (
            (0..WRITERS, prop_oneof![3 => IDS..IDS + SUMMARY_IDS, 1 => 0..IDS]),
            (prop_oneof![1 => Just(None), 1 => any::<u8>().prop_map(Some)], prop_oneof![3 => Just(true), 1 => Just(false)]),
            (prop_oneof![3 => Just(true), 1 => Just(false)], prop_oneof![3 => Just(0u8), 1 => 1u8..4], 0..WRITERS)
        )
            .prop_map(|((writer, id), (view, own), (observe, ahead, past))| summarise(
                writer, id, view, own, observe, ahead, past
            )),
        3 => (
            (0..WRITERS, LINK_IDS, prop_oneof![2 => Just(true), 1 => Just(false)], 0u8..IDS),
            (prop_oneof![1 => Just(None), 1 => any::<u8>().prop_map(Some)], prop_oneof![5 => Just(false), 1 => Just(true)]),
        )
            .prop_map(|((writer, id, fork, target), (view, forget))| Step::Link {
                writer,
                id,
                fork,
                target,
                view,
                forget,
            }),
    ]
}

/// A [`Step::Summarise`] of these fields, in their order.
fn summarise(writer: u8, id: u8, view: Option<u8>, own: bool, observe: bool, ahead: u8, past: u8) -> Step {
    Step::Summarise {
        writer,
        id,
        view,
        own,
        observe,
        ahead,
        past,
    }
}

/// Record ids `id0..id11` of puts and tombstones; summaries mostly take their own
/// (`id12..id17`), sometimes a put's, so that puts, tombstones and summaries of one id meet.
const IDS: u8 = 12;
const SUMMARY_IDS: u8 = 3;

/// Random histories of 4 to 31 steps.
pub fn histories() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 4..32)
}

/// The record for `(id, variant)`: the session is a function of the id, so equal variants
/// are duplicates and different variants are divergent puts. `created_at` (not hashed)
/// varies with the step, so retries differ in it.
fn record(id: u8, variant: Option<u8>, step: usize) -> Record {
    let session = format!("s{}", id % 3);
    match variant {
        Some(v) => {
            let mut r = Record::text(format!("id{id}"), "bot", session, "assistant", format!("variant {v}"));
            r.metadata = Some(serde_json::json!({"variant": v}));
            r.created_at = chrono::DateTime::from_timestamp(1_780_000_000 + step as i64, 0);
            r
        }
        None => Record::tombstone(format!("id{id}"), "bot", session),
    }
}

/// A view writer `o` reads: a fresh one (`None`, kept in `views`), or the `v`-th (modulo)
/// of those it read so far.
async fn read_view(
    o: &mut dyn Projector,
    views: &mut Vec<(Checkpoint, ctxlog_core::Hlc)>,
    view: Option<u8>,
) -> anyhow::Result<(Checkpoint, ctxlog_core::Hlc)> {
    Ok(match view {
        None => {
            o.refresh().await?;
            views.push((o.checkpoint(), o.max_hlc()));
            (o.checkpoint(), o.max_hlc())
        }
        Some(v) => views[v as usize % views.len()].clone(),
    })
}

/// What a history wrote: each acknowledged batch with its records.
pub type Written = Vec<(AppendAck, Vec<Record>)>;

/// Write `history` through the public API: writers `w0..`, one shard handle and one
/// observer (the projector it reads) each; `observer` is writer `w0`'s, the others' are
/// opened here.
pub async fn write_history(
    store: &dyn Store,
    history: &[Step],
    observer: &mut dyn Projector,
) -> anyhow::Result<Written> {
    let mut shards: Vec<Box<dyn Shard>> = Vec::new();
    for i in 0..WRITERS {
        shards.push(store.open_shard(&w(&format!("w{i}"))).await?);
    }
    let mut others: Vec<Box<dyn Projector>> = (1..WRITERS).map(|_| store.projector()).collect();
    let mut acked: Written = Vec::new();
    // Per writer, every view its observer read: its checkpoint and clock.
    let mut views: Vec<Vec<(Checkpoint, ctxlog_core::Hlc)>> =
        vec![vec![(Checkpoint::default(), ctxlog_core::Hlc::ZERO)]; WRITERS as usize];
    // Per writer, its newest acknowledged seq.
    let mut newest: Vec<Option<(ctxlog_core::ShardId, u64)>> = vec![None; WRITERS as usize];
    for (n, step) in history.iter().enumerate() {
        match step {
            Step::Append { writer, records } => {
                let batch: Vec<Record> = records.iter().map(|&(id, v)| record(id, v, n)).collect();
                let ack = shards[*writer as usize].append(batch.clone()).await?;
                newest[*writer as usize] = Some((ack.shard, ack.first_seq + batch.len() as u64 - 1));
                acked.push((ack, batch));
            }
            Step::Reopen { writer } => {
                let i = *writer as usize;
                let fresh = store.open_shard(&w(&format!("w{i}"))).await?;
                let old = std::mem::replace(&mut shards[i], fresh);
                old.close().await.ok();
            }
            Step::Observe { writer } => {
                let i = *writer as usize;
                let o = if i == 0 { &mut *observer } else { others[i - 1].as_mut() };
                o.refresh().await?;
                views[i].push((o.checkpoint(), o.max_hlc()));
                shards[i].observe(o.max_hlc())?;
            }
            Step::Summarise {
                writer,
                id,
                view,
                own,
                observe,
                ahead,
                past,
            } => {
                let i = *writer as usize;
                let o = if i == 0 { &mut *observer } else { others[i - 1].as_mut() };
                let (mut covers, hlc) = read_view(o, &mut views[i], *view).await?;
                if let (true, Some((shard, seq))) = (*own, newest[i]) {
                    covers.advance(shard, seq);
                }
                if *ahead > 0 {
                    let shard = w(&format!("w{past}")).shard_id();
                    covers.advance(shard, covers.get(shard) + u64::from(*ahead));
                }
                let shard = &mut shards[*writer as usize];
                if *observe {
                    shard.observe(hlc)?;
                }
                let session = format!("s{}", id % 3);
                let summary = Record::summary(format!("id{id}"), "bot", session, format!("summary {n}"), covers);
                let ack = shard.append(vec![summary.clone()]).await?;
                newest[i] = Some((ack.shard, ack.first_seq));
                acked.push((ack, vec![summary]));
            }
            Step::Link {
                writer,
                id,
                fork,
                target,
                view,
                forget,
            } => {
                let i = *writer as usize;
                let session = format!("s{}", id % 3);
                let link = if *fork {
                    let o = if i == 0 { &mut *observer } else { others[i - 1].as_mut() };
                    let (at, hlc) = read_view(o, &mut views[i], *view).await?;
                    shards[i].observe(hlc)?;
                    let from = format!("s{}", (id + 1 + target % 2) % 3);
                    Record::fork(format!("id{id}"), "bot", session.clone(), from, at)
                } else {
                    Record::hide(format!("id{id}"), "bot", session.clone(), format!("id{target}"))
                };
                let ack = shards[i].append(vec![link.clone()]).await?;
                newest[i] = Some((ack.shard, ack.first_seq));
                acked.push((ack, vec![link]));
                if *forget {
                    let tomb = Record::tombstone(format!("id{id}"), "bot", session);
                    let ack = shards[i].append(vec![tomb.clone()]).await?;
                    newest[i] = Some((ack.shard, ack.first_seq));
                    acked.push((ack, vec![tomb]));
                }
            }
            Step::Embed {
                writer,
                id,
                model,
                value,
                with_put,
            } => {
                let i = *writer as usize;
                let mut batch: Vec<Record> = with_put.iter().map(|&v| record(*id, Some(v), n)).collect();
                batch.push(embedding(*id, *model, *value));
                let ack = shards[i].append(batch.clone()).await?;
                newest[i] = Some((ack.shard, ack.first_seq + batch.len() as u64 - 1));
                acked.push((ack, batch));
            }
            Step::Snapshot => {
                observer.refresh().await?;
                views[0].push((observer.checkpoint(), observer.max_hlc()));
                observer.save_snapshot().await?;
            }
            Step::Maintain => {
                store.compact(&ctxlog_core::CompactOptions::default()).await?;
                // Purge erases tombstoned ids (summaries too) and changes no view (rule 16).
                store.purge(&ctxlog_core::PurgeOptions::default()).await?;
                let now = ctxlog_core::GcOptions::default().with_grace(std::time::Duration::ZERO);
                store.gc(&now).await?;
            }
        }
    }
    for s in shards {
        s.close().await.ok();
    }
    Ok(acked)
}

/// Write `history` to a fresh store and check it against the model. The observers'
/// projector refreshes along the way, so incremental refresh is checked too. `full` is
/// another handle on the same store that never reads snapshots.
pub async fn check_history(store: &dyn Store, full: &dyn Store, history: &[Step]) -> anyhow::Result<()> {
    let mut incremental = store.projector();
    incremental.refresh().await?;
    // A discovery kept from before the writes: its later checks catch up, as a projector does.
    let mut kept = store.conflict_discovery();
    ensure!(kept.conflicts(Some(&Checkpoint::default())).await?.is_empty());
    let acked = write_history(store, history, incremental.as_mut()).await?;
    incremental.refresh().await?;

    let entries = crate::all_entries(store).await?;
    // Read back exactly as written: every acked record at its acked position.
    for (ack, batch) in &acked {
        for (i, r) in batch.iter().enumerate() {
            let seq = ack.first_seq + i as u64;
            let e = entries
                .iter()
                .find(|e| e.shard == ack.shard && e.seq == seq && e.epoch == ack.epoch)
                .with_context(|| format!("acked entry {} seq {seq} is missing", ack.shard))?;
            let purged_header = e.purged && e.record.id == r.id && e.record.kind == r.kind;
            ensure!(
                &e.record == r || purged_header,
                "entry {} seq {seq} reads back changed",
                ack.shard
            );
        }
    }
    let written: usize = acked.iter().map(|(_, b)| b.len()).sum();
    ensure!(
        entries.len() == written,
        "{} entries stored for {written} written",
        entries.len()
    );

    let expected = model::project(&entries);
    let mut first = full.projector();
    first.refresh().await?;
    ensure!(first.projection() == expected, "first scan differs from the model");
    // A first scan that may start from the newest snapshot answers the same (rule 17).
    let mut from_snapshot = store.projector();
    let report = from_snapshot.refresh().await?;
    ensure!(
        from_snapshot.projection() == expected,
        "a first scan from a snapshot ({:?}) differs from the model",
        report.from_snapshot
    );
    ensure!(
        incremental.projection() == expected,
        "incremental refresh differs from the model"
    );
    ensure!(
        first.projection().canonical_json() == expected.canonical_json(),
        "canonical JSON differs"
    );
    let listed = model::sessions(&entries, "bot");
    ensure!(
        first.sessions("bot").await? == listed,
        "the session list differs from the model"
    );
    ensure!(
        from_snapshot.sessions("bot").await? == listed,
        "the session list from a snapshot differs from the model"
    );
    // Rule 26: a searcher fed from the store answers as the brute-force reference, scores
    // to the bit, whatever the history's divergent puts, tombstones and purges.
    let mut searcher = ctxlog_core::search::Searcher::new();
    searcher.catch_up(store, &first.checkpoint()).await?;
    let variant_2 = ctxlog_core::search::Filter {
        metadata: [("variant".to_string(), serde_json::json!(2))].into(),
        ..Default::default()
    };
    for (q, filter) in [
        ("variant", Default::default()),
        ("variant 3", Default::default()),
        ("\"variant 1\" 0", Default::default()),
        ("var*", variant_2),
    ] {
        let query = ctxlog_core::search::Query::parse(q)?;
        let (hits, _) = searcher.index().search("bot", &query, &filter, None, usize::MAX);
        let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
        let want = model::search(&entries, "bot", &query, &filter);
        ensure!(got == want, "search `{q}`: {got:?}, the model {want:?}");
    }
    // Rule 27: vector and hybrid searches likewise, whatever the embeddings' order, models,
    // replacements, tombstones and purges; by the cells every replica searches with, and by
    // cells so small that a few vectors are split and the probe leaves some out.
    let variant = ctxlog_core::search::Query::parse("variant 1")?;
    let small = ctxlog_core::search::Cells {
        sample: 2,
        probe: 1,
        candidates: 2,
        exact: 3,
    };
    let mut small_cells = ctxlog_core::search::Searcher::with_cells(small);
    small_cells.catch_up(store, &first.checkpoint()).await?;
    for ((model, v), (searcher, cells)) in [
        ("m", vec![1.0f32, 0.5]),
        ("n", vec![0.0, 1.0, 1.0]),
        ("m", vec![1.0, 0.0, 0.0]),
        ("m", vec![-1.0, 0.25]),
    ]
    .into_iter()
    .flat_map(|q| {
        [
            (q.clone(), (&searcher, ctxlog_core::search::CELLS)),
            (q, (&small_cells, small)),
        ]
    }) {
        let near = ctxlog_core::search::Nearest {
            model: model.into(),
            vector: v,
        };
        for ask in [
            ctxlog_core::search::Ask::Vector(&near),
            ctxlog_core::search::Ask::Hybrid(&variant, &near),
        ] {
            let text = matches!(ask, ctxlog_core::search::Ask::Hybrid(..)).then_some(&variant);
            let want = model::find(&entries, "bot", text, Some(&near), &Default::default(), &cells);
            let got = searcher
                .index()
                .find_by("bot", ask, &Default::default(), None, usize::MAX, &Deadline::never());
            match (got, want) {
                (Ok((hits, _)), Some(want)) => {
                    let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
                    ensure!(got == want, "{ask:?}: {got:?}, the model {want:?}");
                }
                (Err(ctxlog_core::Error::InvalidInput { field: "vector", .. }), None) => {}
                (got, want) => anyhow::bail!("{ask:?}: {got:?}, the model {want:?}"),
            }
        }
    }
    let sessions: BTreeSet<String> = entries.iter().map(|e| e.record.session_id.clone()).collect();
    for s in sessions {
        let want = model::session_view(&entries, "bot", &s);
        ensure!(
            first.session("bot", &s).await? == want,
            "session {s} differs from the model"
        );
        ensure!(
            from_snapshot.session("bot", &s).await? == want,
            "session {s} from a snapshot differs from the model"
        );
        // Rule 21: the context view, from every reader.
        let want = model::context_view(&entries, "bot", &s);
        for (reader, p) in [
            ("a first scan", &mut first),
            ("a first scan from a snapshot", &mut from_snapshot),
            ("an incremental refresh", &mut incremental),
        ] {
            let got = p.context("bot", &s).await?;
            ensure!(
                got == want,
                "the context view of session {s} through {reader} differs from the model: expected {want:?}, got {got:?}"
            );
        }
    }
    // Rule 24: every view as of an earlier position, from every reader, equals the model's
    // view of the entries at or below it (tombstones wherever they are).
    let sessions: BTreeSet<String> = entries.iter().map(|e| e.record.session_id.clone()).collect();
    for cp in earlier_checkpoints(&acked) {
        let listed = model::sessions_at(&entries, "bot", &cp);
        for (reader, p) in [
            ("a first scan", &mut first),
            ("a first scan from a snapshot", &mut from_snapshot),
            ("an incremental refresh", &mut incremental),
        ] {
            let got = p.sessions_at("bot", &cp).await?;
            ensure!(
                got == listed,
                "the session list as of {cp:?} through {reader} differs from the model"
            );
            for s in &sessions {
                let want = model::session_view_at(&entries, "bot", s, &cp);
                let (got, more) = p.session_page_at("bot", s, &cp, None, usize::MAX).await?;
                ensure!(
                    got == want && !more,
                    "session {s} as of {cp:?} through {reader} differs from the model"
                );
                let want = model::context_view_at(&entries, "bot", s, &cp);
                let got = p.context_at("bot", s, &cp).await?;
                ensure!(
                    got == want,
                    "the context view of session {s} as of {cp:?} through {reader} differs from the model: expected {want:?}, got {got:?}"
                );
            }
        }
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let all = model::conflicts(&entries);
    ensure!(conflicts == all, "conflicts differ from the model");
    // What a reader that had seen the first k acknowledged batches is told is new: the
    // model's conflicts involving an entry past that point — through the discovery kept
    // since before the writes, through a fresh one that never reads snapshots, and through
    // a fresh one that starts from the newest snapshot (then reads only what is new).
    for cp in earlier_checkpoints(&acked) {
        let want: Vec<_> = all.iter().filter(|c| c.involves_entries_after(&cp)).cloned().collect();
        let got = kept.conflicts(Some(&cp)).await?;
        ensure!(
            got == want,
            "conflicts after {cp:?}: expected {want:?}, got {got:?} (a discovery kept across the writes)"
        );
        let got = full.conflict_discovery().conflicts(Some(&cp)).await?;
        ensure!(
            got == want,
            "conflicts after {cp:?}: expected {want:?}, got {got:?} (a fresh discovery)"
        );
        let got = store.conflict_discovery().conflicts(Some(&cp)).await?;
        ensure!(
            got == want,
            "conflicts after {cp:?}: expected {want:?}, got {got:?} (a fresh discovery from the newest snapshot)"
        );
    }
    Ok(())
}

/// The checkpoints of a reader that had seen the first k acknowledged batches, for a few k
/// (none, a third, two thirds, all but the last).
fn earlier_checkpoints(acked: &Written) -> Vec<Checkpoint> {
    let n = acked.len();
    let mut ks = vec![0, n / 3, 2 * n / 3, n.saturating_sub(1)];
    ks.dedup();
    ks.into_iter()
        .map(|k| {
            let mut cp = Checkpoint::default();
            for (ack, batch) in &acked[..k] {
                cp.advance(ack.shard, ack.first_seq + batch.len() as u64 - 1);
            }
            cp
        })
        .collect()
}

/// The summary cases rule 21 distinguishes, and whether every run of
/// [`CASES_EVERY_RUN`] random histories or more must make it (see
/// [`differential_against_reference_model`]). Measured on SQLite and the reference store
/// (2026-12-03, ten runs of 32): the required ones occur in 13 to 23 histories of 32; the
/// others in 0 to 11 (incomparable coverage and a passed-over summary in 0 to 2), so
/// requiring them of the random histories would fail runs at random. [`scenario`] makes
/// every one of them in every run.
pub const CASES: [(&str, bool); 7] = [
    ("a governing summary that covers something", true),
    ("two trusted summaries of incomparable coverage", false),
    ("a trusted summary superseded by a later trusted one", false),
    ("an implausible summary", false),
    ("a summary covering what no reader holds", false),
    ("an untrusted summary passed over for an earlier trusted one", false),
    ("a summary sharing a put's id", true),
];

/// Which of [`CASES`] the history that wrote `entries` holds, by the reference model.
pub fn cases_of(entries: &[ctxlog_core::Entry]) -> [bool; CASES.len()] {
    use ctxlog_core::context::{implausible, trusted};
    use ctxlog_core::{Kind, OrderKey};
    let mut has = [false; CASES.len()];
    let held = |shard| model::held(entries, shard);
    let holds = |c: &Checkpoint| c.0.iter().all(|(shard, seq)| *seq <= held(*shard));
    let sessions: BTreeSet<&str> = entries.iter().map(|e| e.record.session_id.as_str()).collect();
    for s in sessions {
        let view = model::context_view(entries, "bot", s);
        has[0] |= view.summary.is_some() && view.covered > 0;
        let live = model::session_view(entries, "bot", s);
        let keys: Vec<OrderKey> = live.iter().map(|e| e.key()).collect();
        let summaries: Vec<(OrderKey, &Checkpoint)> = live
            .iter()
            .filter(|e| e.record.kind == Kind::Summary)
            .filter_map(|e| e.record.covers.as_ref().map(|c| (e.key(), c)))
            .collect();
        let trusted: Vec<&(OrderKey, &Checkpoint)> =
            summaries.iter().filter(|(k, c)| trusted(k, c, held, &keys)).collect();
        let le = |a: &Checkpoint, b: &Checkpoint| a.0.iter().all(|(shard, seq)| *seq <= b.get(*shard));
        for (i, (_, a)) in trusted.iter().enumerate() {
            for (_, b) in &trusted[i + 1..] {
                has[1] |= !le(a, b) && !le(b, a);
            }
        }
        has[2] |= trusted.len() >= 2;
        has[3] |= summaries.iter().any(|(k, c)| implausible(k, c, &keys).is_some());
        has[4] |= summaries.iter().any(|(_, c)| !holds(c));
        has[5] |= matches!((summaries.last(), view.summary), (Some((last, _)), Some(g)) if *last != g);
    }
    has[6] = entries.iter().any(|s| {
        s.record.kind == Kind::Summary
            && entries
                .iter()
                .any(|p| p.record.kind == Kind::Put && p.record.id == s.record.id)
    });
    has
}

/// A chain of forks that comes back to its session (found by the random histories): `s0`
/// continues `s1`, which then continues `s0`; a summary of `s1` stands for a record `s1`
/// inherits from `s0`, whose own view as of the first fork holds that summary again, a step
/// deeper. The record met again keeps its first step, so the summary still reaches it.
pub fn fork_cycle() -> Vec<Step> {
    vec![
        Step::Append {
            writer: 0,
            records: vec![(3, Some(0))],
        },
        summarise(0, 13, None, true, true, 0, 0),
        Step::Link {
            writer: 0,
            id: 24,
            fork: true,
            target: 2,
            view: None,
            forget: false,
        },
        summarise(2, 12, None, true, true, 0, 0),
        Step::Observe { writer: 2 },
        Step::Link {
            writer: 2,
            id: 22,
            fork: true,
            target: 1,
            view: Some(142),
            forget: false,
        },
    ]
}

/// A history that makes every one of [`CASES`] (checked on every run): in session `s0`,
/// two writers summarise what each appended, unread by the other (incomparable trusted
/// coverages, one superseding the other); a third summarises with the id of a put of its
/// own, then, having read everything, names positions no reader holds (passed over for an
/// earlier trusted one); in `s1`, a summary that covers itself. (`id15` is no id of the
/// random histories: in them a session has one summary id of its own.)
pub fn scenario() -> Vec<Step> {
    vec![
        Step::Append {
            writer: 2,
            records: vec![(6, Some(0))],
        },
        Step::Append {
            writer: 0,
            records: vec![(0, Some(0))],
        },
        Step::Append {
            writer: 1,
            records: vec![(3, Some(0))],
        },
        // Each covers only its own append: the view it read was empty.
        summarise(0, IDS, Some(0), true, false, 0, 0),
        summarise(1, 9, Some(0), true, false, 0, 0),
        Step::Snapshot,
        summarise(2, 6, Some(0), true, false, 3, 1),
        // Reads everything, and names three seqs of w1's shard beyond it.
        summarise(2, 15, None, false, true, 3, 1),
        summarise(0, IDS + 1, None, true, true, 1, 0),
        Step::Maintain,
    ]
}

/// [`scenario`], then random histories, on fresh stores, compared with the reference model
/// (rules 6–9, 21). The scenario must make every one of [`CASES`]; with at least
/// [`CASES_EVERY_RUN`] random histories, the required ones must occur among them too (a
/// generator that stopped making one would leave its rule barely tested); the count of
/// each among the random ones is printed.
pub async fn differential_against_reference_model(ctx: Ctx) -> anyhow::Result<()> {
    let handle = tokio::runtime::Handle::current();
    let cases = ctx.backend.proptest_cases;
    let counter = std::sync::Arc::new(AtomicUsize::new(0));
    let made = counter.clone();
    let seen: std::sync::Arc<[AtomicUsize; CASES.len()]> = std::sync::Arc::new(Default::default());
    let tally = seen.clone();
    let uri = ctx.other_uri("scenario");
    let store = ctx.open(&uri, ctx.options()).await?;
    let full = ctx.open(&uri, ctx.options().with_read_snapshots(false)).await?;
    let cycle = ctx.other_uri("fork-cycle");
    check_history(
        ctx.open(&cycle, ctx.options()).await?.as_ref(),
        ctx.open(&cycle, ctx.options().with_read_snapshots(false))
            .await?
            .as_ref(),
        &fork_cycle(),
    )
    .await
    .context("a chain of forks back to its session")?;
    check_history(store.as_ref(), full.as_ref(), &scenario())
        .await
        .context("the scenario of every summary case")?;
    let has = cases_of(&crate::all_entries(store.as_ref()).await?);
    for ((case, _), h) in CASES.iter().zip(has) {
        ensure!(h, "the scenario of every summary case does not make {case:?}");
    }
    drop((store, full));
    let ctx = std::sync::Arc::new(ctx);
    let result = tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(Config {
            cases,
            max_shrink_iters: 64,
            failure_persistence: None,
            ..Config::default()
        });
        runner.run(&histories(), |history| {
            let uri = ctx.other_uri(&format!("case-{}", counter.fetch_add(1, Ordering::Relaxed)));
            handle
                .block_on(async {
                    let store = ctx.open(&uri, ctx.options()).await?;
                    let full = ctx.open(&uri, ctx.options().with_read_snapshots(false)).await?;
                    check_history(store.as_ref(), full.as_ref(), &history).await?;
                    let has = cases_of(&crate::all_entries(store.as_ref()).await?);
                    for (n, h) in tally.iter().zip(has) {
                        n.fetch_add(usize::from(h), Ordering::Relaxed);
                    }
                    anyhow::Ok(())
                })
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))
        })
    })
    .await?;
    result.map_err(|e| anyhow::anyhow!("{e}"))?;
    let histories = made.load(Ordering::Relaxed);
    let report: Vec<String> = CASES
        .iter()
        .zip(seen.iter())
        .map(|((case, _), n)| format!("{case}: {}", n.load(Ordering::Relaxed)))
        .collect();
    eprintln!(
        "differential: the scenario made every case; {histories} random histories: {}",
        report.join("; ")
    );
    if cases >= CASES_EVERY_RUN {
        for ((case, _), n) in CASES.iter().zip(seen.iter()).filter(|((_, required), _)| *required) {
            ensure!(
                n.load(Ordering::Relaxed) > 0,
                "no history of {histories} made {case:?}: the generator must make every case in every run"
            );
        }
    }
    Ok(())
}

/// The fewest histories a run must have for every case to be required of it.
pub const CASES_EVERY_RUN: u32 = 32;
