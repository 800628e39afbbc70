//! The history checker's tests: checks after a checkpoint against full checks, content
//! checked on other threads, stored metadata, missing bodies, the clock horizon.

use super::checker::BATCH;
use super::*;
use crate::backend::index::tests::arb_entries;
use crate::hlc::Hlc;
use crate::ids::WriterId;
use crate::record::{Kind, Record};
use crate::testing::model;
use proptest::prelude::*;

/// A history source over a reference store that lets another writer append once between a
/// check's refresh and its reads past the checkpoint: the race no backend can exclude.
struct AppendsInBetween {
    store: crate::testing::ReferenceStore,
    late: tokio::sync::Mutex<Option<Box<dyn crate::traits::Shard>>>,
}

#[async_trait]
impl HistorySource for AppendsInBetween {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
        self.store.visit_all(checker).await
    }

    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>> {
        if let Some(mut late) = self.late.lock().await.take() {
            late.append(vec![Record::text("x", "bot", "s", "user", "other text")])
                .await?;
            late.append(vec![Record::text("y", "bot", "s", "user", "late")]).await?;
        }
        self.store.read_after(after, quiet).await
    }

    fn timeout(&self) -> Duration {
        HistorySource::timeout(&self.store)
    }
}

/// Entries appended after a check's refresh are added to its index before id conflicts
/// are taken from it: another writer's puts of `x` and `y` in that window diverge from
/// winners the index held (`x` at the checkpoint, `y` past it), and both are reported.
#[tokio::test]
async fn entries_appended_during_a_check_after_a_checkpoint_are_checked_together() {
    use crate::traits::Store;
    let options = crate::options::StoreOptions {
        create_if_missing: true,
        ..Default::default()
    };
    let store = crate::testing::ReferenceStore::open(&format!("race-{}", uuid::Uuid::new_v4()), options).unwrap();
    let mut first = store.open_shard(&WriterId::new("a").unwrap()).await.unwrap();
    first
        .append(vec![Record::text("x", "bot", "s", "user", "first text")])
        .await
        .unwrap();
    let mut reader = store.projector();
    reader.refresh().await.unwrap();
    let cp = reader.checkpoint();
    first
        .append(vec![Record::text("y", "bot", "s", "user", "early")])
        .await
        .unwrap();
    let late = store.open_shard(&WriterId::new("b").unwrap()).await.unwrap();
    let source = AppendsInBetween {
        store: store.clone(),
        late: tokio::sync::Mutex::new(Some(late)),
    };
    let mut discovery = HistoryConflicts::new(Arc::new(source), Arc::new(store.clone()));
    // The check's refresh sees `y` (early) but not what `b` writes next.
    let found = discovery.conflicts(Some(&cp)).await.unwrap();
    let mut divergent: Vec<&str> = found
        .iter()
        .filter_map(|c| match c {
            Conflict::DivergentPut { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    divergent.sort_unstable();
    assert_eq!(
        divergent,
        ["x", "y"],
        "expected divergent puts of x and y, got {found:?}"
    );
}

proptest! {
    /// The checker reports exactly what the reference model does, whatever the order
    /// and repeats of the entries it is shown.
    #[test]
    fn checker_matches_reference_model(entries in arb_entries()) {
        let mut seen = std::collections::HashSet::new();
        let entries: Vec<Entry> = entries.into_iter().filter(|e| seen.insert((e.shard, e.seq, e.epoch))).collect();
        let mut checker = HistoryChecker::new();
        for e in entries.iter().rev().chain(entries.iter()) {
            checker.visit(e.clone());
        }
        prop_assert_eq!(checker.finish(None), model::conflicts(&entries));
    }

    /// The same with rows without a body among them — of ids with a tombstone (what a
    /// purge leaves) and without (damage) — in a full check, and in a check after a
    /// checkpoint (the full check's conflicts that involve an entry past it).
    #[test]
    fn checker_matches_reference_model_with_missing_bodies(
        entries in arb_entries(),
        erase in proptest::collection::vec(any::<bool>(), 40),
        below in 0u64..8,
    ) {
        let mut entries = crate::backend::index::tests::unique_positions(entries);
        for (e, erase) in entries.iter_mut().zip(erase) {
            // Not summaries: for a summary without its body and without a tombstone (damage)
            // the checker and the model report different actual hashes (found 2026-12-03
            // when `arb_entries` began to make summaries; open in issue 33's note).
            if erase && e.record.kind != crate::record::Kind::Summary {
                e.purge();
            }
        }
        let expected = model::conflicts(&entries);
        let mut checker = HistoryChecker::new();
        for e in entries.iter().rev().chain(entries.iter()) {
            checker.visit(e.clone());
        }
        prop_assert_eq!(checker.finish(None), expected.clone());

        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = runtime.block_on(async {
            let options = crate::options::StoreOptions {
                create_if_missing: true,
                ..Default::default()
            };
            let store = crate::testing::ReferenceStore::open(&format!("bodiless-{}", uuid::Uuid::new_v4()), options)?;
            let mut cp = Checkpoint::default();
            for e in &entries {
                store.inject_raw_entry(e.clone());
                cp.advance(e.shard, below);
            }
            let mut discovery = crate::traits::Store::conflict_discovery(&store);
            Ok::<_, crate::Error>((discovery.conflicts(Some(&cp)).await?, cp))
        });
        let (got, cp) = got.unwrap();
        let want: Vec<Conflict> = expected.into_iter().filter(|c| c.involves_entries_after(&cp)).collect();
        prop_assert_eq!(got, want);
    }
}

/// Enough entries that content is checked on the hashing threads, corrupt ones spread
/// over many batches (and one in the last, partial batch): every one is reported.
#[test]
fn content_checked_on_other_threads_is_all_reported() {
    let s = WriterId::new("w").unwrap().shard_id();
    let entries: Vec<Entry> = (1..=BATCH as u64 * 5 + 3)
        .map(|seq| {
            let record = Record::text(format!("id{seq}"), "b", "s", "r", "text");
            let mut content_hash = record.content_hash();
            if seq % 97 == 0 || seq == BATCH as u64 * 5 + 2 {
                content_hash = Record::text("other", "b", "s", "r", "x").content_hash();
            }
            Entry {
                shard: s,
                seq,
                epoch: 1,
                hlc: Hlc(seq),
                record,
                content_hash,
                purged: false,
            }
        })
        .collect();
    let mut checker = HistoryChecker::new();
    for e in &entries {
        checker.visit(e.clone());
    }
    let found = checker.finish(None);
    assert_eq!(found.len(), (BATCH * 5 + 3) / 97 + 1);
    assert_eq!(found, model::conflicts(&entries));
}

/// A full check hashes stored metadata text as it is; text that is not canonical but
/// means the same object (what a reader would parse) is not corrupt, changed text is,
/// and so is text that is not JSON at all — in a batch of one and on the hashing threads.
#[test]
fn stored_metadata_is_checked_as_a_reader_would_read_it() {
    let s = WriterId::new("w").unwrap().shard_id();
    let mut record = Record::text("id", "b", "s", "r", "body");
    record.metadata = Some(serde_json::json!({"a": 1, "b": [true, "x"]}));
    let entry = Entry {
        shard: s,
        seq: 1,
        epoch: 1,
        hlc: Hlc(1),
        content_hash: record.content_hash(),
        record,
        purged: false,
    };
    let stored = [
        (r#"{"a":1,"b":[true,"x"]}"#, false),
        (r#"{ "b": [true, "x"], "a": 1 }"#, false),
        (r#"{"a":2,"b":[true,"x"]}"#, true),
        (r#"{"a":1,"b":[true,"x"]"#, true),
    ];
    for many in [1, BATCH * 3] {
        for (text, corrupt) in stored {
            let mut checker = HistoryChecker::new();
            for seq in 1..=many as u64 {
                let mut e = entry.clone();
                e.seq = seq;
                checker.visit_row(StoredRow::of(&e, Some(text), &e.record.body));
            }
            let found = checker.finish(None);
            assert_eq!(
                found.len(),
                if corrupt { many } else { 0 },
                "{text} in batches of {many}"
            );
            assert!(
                found.iter().all(|c| c.kind() == crate::ConflictKind::Corrupt),
                "{found:?}"
            );
        }
    }
    // A purged row (its id has a tombstone, seen after it) has no content to check: not
    // corrupt, whatever its metadata text.
    let mut checker = HistoryChecker::new();
    let stored = entry.record.stored_body();
    let mut row = StoredRow::of(&entry, Some("not json"), &stored);
    row.body = StoredBody::Purged;
    checker.visit_row(row);
    let tombstone = Record::tombstone("id", "b", "s");
    let mut tombstone = Entry {
        shard: s,
        seq: 2,
        epoch: 1,
        hlc: Hlc(2),
        content_hash: tombstone.content_hash(),
        record: tombstone,
        purged: false,
    };
    tombstone.purge();
    checker.visit(tombstone);
    assert_eq!(checker.finish(None), Vec::new());
}

/// Entries of `id`: puts in shard `a` (seqs from 1), one tombstone in shard `b`, each
/// `(id, tombstoned)` pair's put without a body (as a purge leaves it, or as damage does).
fn bodiless_history(ids: &[(&str, bool)]) -> Vec<Entry> {
    let (a, b) = (
        WriterId::new("a").unwrap().shard_id(),
        WriterId::new("b").unwrap().shard_id(),
    );
    let mut out = Vec::new();
    let mut tombstones = 0;
    for (n, &(id, tombstoned)) in ids.iter().enumerate() {
        let record = Record::text(id, "bot", "s", "user", format!("the body of {id}"));
        let mut put = Entry {
            shard: a,
            seq: n as u64 + 1,
            epoch: 1,
            hlc: Hlc(n as u64 + 1),
            content_hash: record.content_hash(),
            record,
            purged: false,
        };
        put.purge();
        out.push(put);
        if tombstoned {
            tombstones += 1;
            let record = Record::tombstone(id, "bot", "s");
            let mut t = Entry {
                shard: b,
                seq: tombstones,
                epoch: 1,
                hlc: Hlc(1_000 + tombstones),
                content_hash: record.content_hash(),
                record,
                purged: false,
            };
            t.purge();
            out.push(t);
        }
    }
    out
}

/// A row without a body is what a purge leaves only where its id has a tombstone (here
/// in another shard, seen before or after it, in one batch or on the hashing threads);
/// anywhere else it is `Corrupt`, with the hash of what a reader serves (empty text).
#[test]
fn a_missing_body_is_corrupt_unless_its_id_has_a_tombstone() {
    for many in [1, BATCH * 3] {
        let ids: Vec<(String, bool)> = (0..many).map(|n| (format!("gone{n}"), true)).collect();
        let mut ids: Vec<(&str, bool)> = ids.iter().map(|(i, t)| (i.as_str(), *t)).collect();
        ids.push(("live", false));
        let entries = bodiless_history(&ids);
        let live = entries.iter().find(|e| e.record.id == "live").unwrap();
        let expected = vec![Conflict::Corrupt {
            shard: live.shard,
            seq: live.seq,
            epoch: live.epoch,
            bot_id: live.record.bot_id.clone(),
            id: "live".into(),
            stored_hash: live.content_hash,
            actual_hash: live.record.content_hash(),
        }];
        assert_ne!(live.content_hash, live.record.content_hash());
        assert_eq!(model::conflicts(&entries), expected, "the model, {many} rows");
        for order in [entries.clone(), entries.iter().rev().cloned().collect()] {
            let mut checker = HistoryChecker::new();
            for e in order {
                checker.visit(e);
            }
            assert_eq!(checker.finish(None), expected, "{many} rows");
        }
    }
}

/// A missing body is corrupt even where what a reader serves, empty text, is what the
/// stored hash covers: the body stored was not missing.
#[test]
fn a_missing_empty_body_is_corrupt_too() {
    let record = Record::text("empty", "bot", "s", "user", "");
    let mut e = Entry {
        shard: WriterId::new("a").unwrap().shard_id(),
        seq: 1,
        epoch: 1,
        hlc: Hlc(1),
        content_hash: record.content_hash(),
        record,
        purged: false,
    };
    e.purge();
    let mut checker = HistoryChecker::new();
    checker.visit(e.clone());
    let found = checker.finish(None);
    assert!(matches!(&found[..], [Conflict::Corrupt { .. }]), "{found:?}");
    assert_eq!(found, model::conflicts(&[e]));
}

/// A check after a checkpoint answers "has this id a tombstone" for a row without a body
/// past it from its index: the tombstone may lie below the checkpoint, in another shard.
/// A row of a live id without a body past the checkpoint is `Corrupt`; the answer is the
/// full check's, restricted.
#[tokio::test]
async fn a_check_after_a_checkpoint_finds_tombstones_below_it() {
    use crate::traits::Store;
    let options = crate::options::StoreOptions {
        create_if_missing: true,
        ..Default::default()
    };
    let store = crate::testing::ReferenceStore::open(&format!("bodiless-{}", uuid::Uuid::new_v4()), options).unwrap();
    // Tombstones first (shard b), then the puts (shard a), both without bodies.
    let entries = bodiless_history(&[("gone", true), ("live", false), ("also-gone", true)]);
    let (tombstones, puts): (Vec<Entry>, Vec<Entry>) =
        entries.into_iter().partition(|e| e.record.kind == Kind::Tombstone);
    for e in &tombstones {
        store.inject_raw_entry(e.clone());
    }
    let mut reader = store.projector();
    reader.refresh().await.unwrap();
    let cp = reader.checkpoint();
    for e in &puts {
        store.inject_raw_entry(e.clone());
    }
    let all: Vec<Entry> = tombstones.iter().chain(&puts).cloned().collect();
    let full = model::conflicts(&all);
    assert_eq!(
        full.iter().map(Conflict::kind).collect::<Vec<_>>(),
        [crate::ConflictKind::Corrupt]
    );
    assert_eq!(store.conflict_discovery().conflicts(None).await.unwrap(), full);
    let want: Vec<Conflict> = full.iter().filter(|c| c.involves_entries_after(&cp)).cloned().collect();
    assert_eq!(want, full);
    let mut discovery = store.conflict_discovery();
    assert_eq!(discovery.conflicts(Some(&cp)).await.unwrap(), want, "after {cp:?}");
    // Past every entry: nothing.
    reader.refresh().await.unwrap();
    assert_eq!(
        discovery.conflicts(Some(&reader.checkpoint())).await.unwrap(),
        Vec::new()
    );
}

/// The plausible horizon is the last plausible millisecond: at it, no conflict; one past
/// it, `ImplausibleHlc` (the model's boundary too).
#[test]
fn the_clock_horizon_is_inclusive() {
    let s = WriterId::new("w").unwrap().shard_id();
    let at = |seq: u64, millis: u64| {
        let record = Record::text(format!("id{seq}"), "b", "s", "r", "text");
        Entry {
            shard: s,
            seq,
            epoch: 1,
            hlc: Hlc::from_parts(millis, 0),
            content_hash: record.content_hash(),
            record,
            purged: false,
        }
    };
    let entries = [at(1, Hlc::PLAUSIBLE_MILLIS), at(2, Hlc::PLAUSIBLE_MILLIS + 1)];
    let mut checker = HistoryChecker::new();
    for e in &entries {
        checker.visit(e.clone());
    }
    let found = checker.finish(None);
    assert!(
        matches!(&found[..], [Conflict::ImplausibleHlc { seq: 2, .. }]),
        "{found:?}"
    );
    assert_eq!(found, model::conflicts(&entries));
}

#[test]
fn checkpoint_filter_keeps_conflicts_involving_new_entries() {
    let s = WriterId::new("w").unwrap().shard_id();
    let mk = |seq: u64, hlc: u64, text: &str| {
        let record = Record::text("x", "b", "s", "r", text);
        Entry {
            shard: s,
            seq,
            epoch: 1,
            hlc: Hlc(hlc),
            content_hash: record.content_hash(),
            record,
            purged: false,
        }
    };
    let mut c = HistoryChecker::new();
    c.visit(mk(1, 1, "a"));
    c.visit(mk(2, 2, "b"));
    let mut cp = Checkpoint::default();
    cp.advance(s, 1);
    let mut c2 = HistoryChecker::new();
    c2.visit(mk(1, 1, "a"));
    c2.visit(mk(2, 2, "b"));
    assert_eq!(c.finish(Some(&cp)).len(), 1);
    cp.advance(s, 2);
    assert!(c2.finish(Some(&cp)).is_empty());
}
