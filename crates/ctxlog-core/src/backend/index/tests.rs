//! The index's own tests: random histories against the reference model, one pass against
//! the parallel applies, and an apply that fails or panics.

use super::*;
use crate::entry::{Entry, OrderKey};
use crate::ids::WriterId;
use crate::record::{Body, Kind, Record};
use crate::testing::model;
use proptest::prelude::*;

/// Random histories, including stale epochs, gaps and corrupt entries, give the same
/// projection and conflicts through the index/checker as through the reference model.
/// Summaries (a fifth of the entries) cover a random prefix of the three shards, so some
/// are trusted, some cover what the store does not hold, and some cover themselves.
pub(crate) fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
    let covers = proptest::collection::vec((0u8..3, 0u64..9), 0..3);
    let one = (
        0u8..3,
        1u64..8,
        1u64..3,
        0u64..20,
        0u8..6,
        0u8..3,
        0u8..10,
        0u8..2,
        covers,
    );
    proptest::collection::vec(one, 0..40).prop_map(|raw| {
        raw.into_iter()
            .map(|(w, seq, epoch, hlc, id, text, op, sess, covers)| {
                let shard = WriterId::new(format!("w{w}")).unwrap().shard_id();
                let mut record = Record::text(format!("id{id}"), "bot", format!("s{sess}"), "user", format!("t{text}"));
                if op == 0 {
                    record.kind = Kind::Tombstone;
                }
                if op == 4 {
                    // An embedding (rule 27): no value, in no view, held for the checks.
                    let v = [f32::from(text)];
                    record = Record::embedding(
                        format!("id{id}"),
                        "bot",
                        format!("s{sess}"),
                        "m",
                        crate::Metric::Dot,
                        &v,
                    );
                }
                if op >= 8 {
                    let mut c = crate::ids::Checkpoint::default();
                    for (w, seq) in covers {
                        c.advance(WriterId::new(format!("w{w}")).unwrap().shard_id(), seq);
                    }
                    record = Record::summary(format!("id{id}"), "bot", format!("s{sess}"), format!("t{text}"), c);
                }
                let mut content_hash = record.content_hash();
                if op == 1 && text == 0 {
                    // a corrupt entry: stored hash of other content
                    content_hash = Record::text("other", "b", "s", "r", "x").content_hash();
                }
                if op == 2 {
                    record.body = Body::Bytes(vec![text; 3]);
                    content_hash = record.content_hash();
                }
                // A damaged clock: far past the plausible horizon, still ordered.
                let hlc = if op == 3 { Hlc(u64::MAX - hlc) } else { Hlc(hlc) };
                Entry {
                    shard,
                    seq,
                    epoch,
                    hlc,
                    record,
                    content_hash,
                    purged: false,
                }
            })
            .collect()
    })
}

/// The first entry at each position (backends never store two at one).
pub(crate) fn unique_positions(entries: Vec<Entry>) -> Vec<Entry> {
    let mut seen = std::collections::HashSet::new();
    entries
        .into_iter()
        .filter(|e| seen.insert((e.shard, e.seq, e.epoch)))
        .collect()
}

pub(crate) fn index_of(entries: &[Entry]) -> ProjectionIndex {
    let mut idx = ProjectionIndex::new();
    for e in entries {
        idx.apply(IndexRow::of(e));
    }
    idx
}

/// `n` puts, entry `i` of id `id{i % ids}` in session `s{i % sessions}`, in one of three
/// shards at seq `i + 1`.
fn puts(n: u64, ids: u64, sessions: u64) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            let record = Record::text(
                format!("id{}", i % ids),
                "bot",
                format!("s{}", i % sessions),
                "user",
                "t",
            );
            Entry {
                shard: WriterId::new(format!("w{}", i % 3)).unwrap().shard_id(),
                seq: i + 1,
                epoch: 1,
                hlc: Hlc(i),
                content_hash: record.content_hash(),
                record,
                purged: false,
            }
        })
        .collect()
}

/// The context view the index gives for `session` (rule 21): its live keys and which are
/// summaries, with the coverage read from `entries` and each shard held up to its highest
/// seq, as the reference model holds them.
fn context_keys(idx: &mut ProjectionIndex, entries: &[Entry], session: &str) -> crate::context::ContextKeys {
    let s = idx.session_with_summaries("bot", session);
    let live: Vec<OrderKey> = s.keys.iter().map(|k| k.0).collect();
    let held = |shard| model::held(entries, shard);
    let covers = |k: &OrderKey| {
        Ok::<_, ()>(
            entries
                .iter()
                .find(|e| e.key() == *k)
                .and_then(|e| e.record.covers.clone()),
        )
    };
    crate::context::select(&live, |k| s.is_summary(k), held, covers)
        .unwrap()
        .0
}

/// The reference model's context view of `session`, as keys.
fn model_context_keys(entries: &[Entry], session: &str) -> crate::context::ContextKeys {
    let view = model::context_view(entries, "bot", session);
    crate::context::ContextKeys {
        summary: view.summary,
        keys: view.entries.iter().map(Entry::key).collect(),
        covered: view.covered,
    }
}

/// `idx` answers as one thread applying `entries` in order would.
fn answers_as_one_pass(idx: &mut ProjectionIndex, entries: &[Entry], sessions: u64) {
    let mut whole = index_of(entries);
    assert_eq!(idx.projection().canonical_json(), whole.projection().canonical_json());
    for s in 0..sessions {
        let session = format!("s{s}");
        assert_eq!(idx.session_keys("bot", &session), whole.session_keys("bot", &session));
    }
}

/// An error on one thread stops the apply and is returned; what was applied until then
/// is merged whole: the rest applied afterwards gives the index of everything.
#[test]
fn an_apply_that_fails_leaves_a_whole_index() {
    let entries = puts(400, 150, 23);
    for threads in [1, 2, 4] {
        let mut idx = ProjectionIndex::with_parts(4, IdScope::Bot);
        let batches: Vec<&[Entry]> = entries.chunks(10).collect();
        let (counts, result) = idx.apply_in_parallel(threads, batches, |b, a| {
            if b[0].seq > 200 {
                return Err(b[0].seq);
            }
            b.iter().for_each(|e| a.apply(IndexRow::of(e)));
            Ok(())
        });
        assert_eq!(result, Err(201), "{threads} threads");
        assert_eq!(counts.applied, 200, "{threads} threads");
        assert_eq!(idx.entries(), 200);
        for e in &entries {
            idx.apply(IndexRow::of(e));
        }
        answers_as_one_pass(&mut idx, &entries, 23);
    }
}

/// A panic on an applying thread reaches the caller, and the index it leaves is empty,
/// not torn: applying everything again gives the index of everything.
#[test]
fn a_panic_while_applying_leaves_an_empty_index() {
    let entries = puts(300, 110, 17);
    for threads in [1, 3] {
        let mut idx = ProjectionIndex::with_parts(3, IdScope::Bot);
        for e in &entries[..50] {
            idx.apply(IndexRow::of(e));
        }
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            idx.apply_in_parallel(threads, entries[50..].chunks(25), |b, a| {
                assert!(b[0].seq <= 200, "a bug on an applying thread");
                b.iter().for_each(|e| a.apply(IndexRow::of(e)));
                Ok::<(), ()>(())
            })
        }));
        assert!(panicked.is_err(), "{threads} threads");
        assert_eq!(idx.entries(), 0, "{threads} threads");
        assert_eq!(idx.parts(), 3);
        for e in &entries {
            idx.apply(IndexRow::of(e));
        }
        answers_as_one_pass(&mut idx, &entries, 17);
    }
}

proptest! {
    #[test]
    fn index_matches_reference_model(entries in arb_entries()) {
        // The model keeps the first of repeated positions; the index must too, so feed
        // unique positions only (backends never store two entries at one position).
        let entries = unique_positions(entries);
        let mut idx = index_of(&entries);
        let model = model::project(&entries);
        prop_assert_eq!(idx.projection().canonical_json(), model.canonical_json());

        let mut reversed = entries.clone();
        reversed.reverse();
        prop_assert_eq!(index_of(&reversed).projection().canonical_json(), model.canonical_json());

        for (bot, session) in [("bot", "s0"), ("bot", "s1")] {
            let view: Vec<OrderKey> = model::session_view(&entries, bot, session).iter().map(|e| e.key()).collect();
            let keys: Vec<OrderKey> = idx.session_keys(bot, session).into_iter().map(|k| k.0).collect();
            prop_assert_eq!(keys, view);
            prop_assert_eq!(context_keys(&mut idx, &entries, session), model_context_keys(&entries, session));
        }
    }

    /// Invariant 3: applying an entry the index holds changes nothing (backends may
    /// read an entry twice: from a generation and again from the WAL).
    #[test]
    fn applying_an_entry_again_changes_nothing(entries in arb_entries()) {
        let entries = unique_positions(entries);
        let once = index_of(&entries);
        let mut twice = index_of(&entries);
        for e in entries.iter().rev() {
            prop_assert!(!twice.apply(IndexRow::of(e)), "an entry held was applied again");
        }
        prop_assert_eq!(twice.projection().canonical_json(), once.projection().canonical_json());
        prop_assert_eq!(twice.entries(), once.entries());
    }

    /// Rows applied in parallel, one thread per part, in batches of any size, onto an
    /// index that already holds some (so some sessions are known and some are found by
    /// several threads at once): the same index as one thread applying them in order.
    #[test]
    fn applying_in_parallel_equals_one_pass(
        entries in arb_entries(),
        sessions in proptest::collection::vec(0u8..6, 40),
        split in 0usize..40,
        parts in 1usize..5,
        threads in 1usize..5,
        batch in 1usize..6,
        routed in any::<bool>(),
    ) {
        // More sessions than the shared strategy draws, so that threads find new ones.
        let mut entries = unique_positions(entries);
        for (e, s) in entries.iter_mut().zip(&sessions) {
            e.record.session_id = format!("s{s}");
        }
        let split = split.min(entries.len());
        let mut one = index_of(&entries);
        let mut parallel = ProjectionIndex::with_parts(parts, IdScope::Bot);
        for e in &entries[..split] {
            parallel.apply(IndexRow::of(e));
        }
        let (counts, result) = if routed {
            // Each row sent to its thread's queue.
            let router = parallel.router(threads);
            let (sends, queues): (Vec<_>, Vec<_>) =
                (0..router.threads()).map(|_| std::sync::mpsc::channel::<Vec<&Entry>>()).unzip();
            for b in entries[split..].chunks(batch) {
                let mut routed = vec![Vec::new(); router.threads()];
                b.iter().for_each(|e| routed[router.thread_of(&e.record.bot_id, &e.record.id)].push(e));
                routed.into_iter().zip(&sends).for_each(|(r, s)| s.send(r).unwrap());
            }
            drop(sends);
            parallel.apply_routed(queues, |b, a| {
                b.into_iter().for_each(|e| a.apply_routed(IndexRow::of(e)));
                Ok::<(), ()>(())
            })
        } else {
            let rest: Vec<&[Entry]> = entries[split..].chunks(batch).collect();
            parallel.apply_in_parallel(threads, rest, |b, a| {
                b.iter().for_each(|e| a.apply(IndexRow::of(e)));
                Ok::<(), ()>(())
            })
        };
        prop_assert_eq!(result, Ok(()));
        prop_assert_eq!(counts.read, (entries.len() - split) as u64);
        prop_assert_eq!(counts.applied, (entries.len() - split) as u64);
        prop_assert_eq!(parallel.projection().canonical_json(), one.projection().canonical_json());
        prop_assert_eq!(parallel.stats(), one.stats());
        prop_assert_eq!(parallel.checkpoint(), one.checkpoint());
        prop_assert_eq!(parallel.entries(), one.entries());
        for s in 0..6 {
            let session = format!("s{s}");
            prop_assert_eq!(parallel.session_keys("bot", &session), one.session_keys("bot", &session));
            prop_assert_eq!(
                parallel.session_with_summaries("bot", &session).summaries,
                one.session_with_summaries("bot", &session).summaries
            );
            prop_assert_eq!(context_keys(&mut parallel, &entries, &session), model_context_keys(&entries, &session));
        }
        prop_assert_eq!(parallel.sessions("bot"), one.sessions("bot"));
        let conflicts = |i: &ProjectionIndex| crate::projection::canonical_conflicts(i.id_conflicts());
        prop_assert_eq!(conflicts(&parallel), conflicts(&one));
        // Nothing applies twice afterwards, on either path.
        for e in &entries {
            prop_assert!(!parallel.apply(IndexRow::of(e)));
        }
    }

    #[test]
    fn incremental_application_equals_one_pass(entries in arb_entries(), split in 0usize..40) {
        let entries = unique_positions(entries);
        let split = split.min(entries.len());
        let mut idx = index_of(&entries[..split]);
        let _ = idx.projection();
        for e in &entries[split..] {
            idx.apply(IndexRow::of(e));
        }
        prop_assert_eq!(idx.projection().canonical_json(), index_of(&entries).projection().canonical_json());
    }
}
