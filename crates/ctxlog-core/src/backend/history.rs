//! The history checker (rules 6, 7, 10) generic over how a backend reads its entries: the
//! backend streams stored entries ([`HistorySource`]) and feeds a projection index
//! ([`IndexSource`]); the checks live here, once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::index::{IndexRow, ProjectionIndex};
use crate::backend::projector::{IndexSource, IndexedProjector};
use crate::entry::{Checkpoint, Entry};
use crate::error::{Result, Written, with_deadline};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::{Epoch, Seq, ShardId};
use crate::projection::{Conflict, canonical_conflicts};
use crate::traits::ConflictDiscovery;
use crate::traits::Projector;

/// Entries handed to a hashing thread at once.
const BATCH: usize = 256;

/// Collects what the history checks need while a backend streams every entry past it.
/// Checking content (hashing every body) is most of a full check's work: it runs on
/// threads of its own, one per core but the caller's, while the caller reads on.
#[derive(Default)]
pub struct HistoryChecker {
    index: ProjectionIndex,
    positions: HashMap<ShardId, Vec<(Seq, Epoch)>>,
    corrupt: Vec<Conflict>,
    batch: Vec<Entry>,
    hashers: Option<Hashers>,
}

/// The threads that check content. Dropping them (a cancelled check) closes their queues:
/// each ends after the batch in hand.
struct Hashers {
    queues: Vec<std::sync::mpsc::SyncSender<Vec<Entry>>>,
    threads: Vec<std::thread::JoinHandle<Vec<Conflict>>>,
    next: usize,
}

impl Hashers {
    fn start() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1));
        let (mut queues, mut threads) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Entry>>(2);
            let spawned = std::thread::Builder::new().name("ctxlog-hash".into()).spawn(move || {
                let mut out = Vec::new();
                for batch in rx {
                    for e in &batch {
                        entry_conflicts(e, &mut out);
                    }
                }
                out
            });
            // No thread to be had: check content on the caller's thread (`send` fails).
            if let Ok(t) = spawned {
                queues.push(tx);
                threads.push(t);
            }
        }
        Hashers {
            queues,
            threads,
            next: 0,
        }
    }

    /// Queue `batch` on the next thread (round robin); it comes back if that thread is gone.
    fn send(&mut self, batch: Vec<Entry>) -> std::result::Result<(), Vec<Entry>> {
        if self.queues.is_empty() {
            return Err(batch);
        }
        let i = self.next % self.queues.len();
        self.next += 1;
        self.queues[i].send(batch).map_err(|e| e.0)
    }

    /// Close the queues and collect every thread's findings.
    fn finish(self) -> Vec<Conflict> {
        drop(self.queues);
        let mut out = Vec::new();
        for t in self.threads {
            match t.join() {
                Ok(found) => out.extend(found),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    }
}

impl HistoryChecker {
    /// An empty checker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Visit one stored entry (any order, repeats allowed).
    pub fn visit(&mut self, e: Entry) {
        if !self.index.apply(IndexRow::of(&e)) {
            return;
        }
        self.positions.entry(e.shard).or_default().push((e.seq, e.epoch));
        self.batch.push(e);
        if self.batch.len() >= BATCH {
            let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
            if let Err(back) = self.hashers.get_or_insert_with(Hashers::start).send(batch) {
                for e in &back {
                    entry_conflicts(e, &mut self.corrupt);
                }
            }
        }
    }

    /// Every conflict, canonical order; with `after`, only those past that checkpoint.
    pub fn finish(mut self, after: Option<&Checkpoint>) -> Vec<Conflict> {
        let mut out = self.index.id_conflicts();
        for e in &self.batch {
            entry_conflicts(e, &mut out);
        }
        if let Some(h) = self.hashers.take() {
            out.extend(h.finish());
        }
        out.extend(self.corrupt);
        for (shard, positions) in self.positions {
            position_conflicts(shard, positions, &mut out);
        }
        let out = match after {
            Some(cp) => out.into_iter().filter(|c| c.involves_entries_after(cp)).collect(),
            None => out,
        };
        canonical_conflicts(out)
    }
}

/// What one entry's own content says (rule 10): a clock past the plausible horizon, or a
/// stored hash that is not its content's.
fn entry_conflicts(e: &Entry, out: &mut Vec<Conflict>) {
    if e.hlc.millis() > Hlc::PLAUSIBLE_MILLIS {
        out.push(Conflict::ImplausibleHlc {
            shard: e.shard,
            seq: e.seq,
            epoch: e.epoch,
            hlc: e.hlc,
        });
    }
    // A purged entry's content is gone (rule 16): nothing to check it against.
    if e.purged {
        return;
    }
    let actual = ContentHash::of(&e.record);
    if actual != e.content_hash {
        out.push(Conflict::Corrupt {
            shard: e.shard,
            seq: e.seq,
            epoch: e.epoch,
            id: e.record.id.clone(),
            stored_hash: e.content_hash,
            actual_hash: actual,
        });
    }
}

/// Stale epochs and seq gaps of one shard, from the positions `(seq, epoch)` of all its
/// entries (any order).
fn position_conflicts(shard: ShardId, mut positions: Vec<(Seq, Epoch)>, out: &mut Vec<Conflict>) {
    positions.sort_unstable();
    // Stale epoch: an entry whose epoch is below the highest epoch at its seq or any lower
    // seq. Walk seqs upwards, one seq group at a time.
    let mut newest: Epoch = 0;
    let mut expected: Seq = 1;
    let mut i = 0;
    while i < positions.len() {
        let seq = positions[i].0;
        let group_end = positions[i..]
            .iter()
            .position(|p| p.0 != seq)
            .map_or(positions.len(), |n| i + n);
        let group = &positions[i..group_end];
        newest = newest.max(group.iter().map(|p| p.1).max().unwrap_or(0));
        for &(_, epoch) in group {
            if epoch < newest {
                out.push(Conflict::StaleEpoch {
                    shard,
                    seq,
                    epoch,
                    superseded_by: newest,
                });
            }
        }
        if seq > expected {
            out.push(Conflict::SeqGap {
                shard,
                missing_from: expected,
                missing_to: seq - 1,
            });
        }
        expected = seq + 1;
        i = group_end;
    }
}

/// How a backend feeds its history checker: stored entries, full content.
#[async_trait]
pub trait HistorySource: Send + Sync + 'static {
    /// Show every stored entry to `checker` (any order, repeats allowed).
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()>;

    /// Every stored entry past `after` — its seq above `after`'s position for its shard,
    /// every entry of a shard `after` does not name — in any order, repeats allowed, except
    /// in the shards `quiet` names: shards of `after` in which the caller knew of no entry
    /// past it, which the source may skip. It may return older entries too (they are
    /// ignored), but reads should cost what is past `after`, not the whole log.
    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>>;

    /// The deadline of one pass.
    fn timeout(&self) -> Duration;
}

/// A [`ConflictDiscovery`] over a backend's [`HistorySource`] and [`IndexSource`].
///
/// A full check (no `after`) reads every entry with its content, in one pass. A check
/// `after` a checkpoint reads with content only the entries past it: what it must know of
/// older entries — the other entries of the ids the new ones touch (a winner's hash, a
/// tombstone), the positions of their shards — comes from a projection index that it keeps
/// as a projector does (from a usable snapshot, then only what is new; kept between calls).
/// Its answer is the full check's, restricted to conflicts involving entries past `after`.
/// Under concurrent appends, it is the full check of the entries its index held at its
/// refresh together with the entries past `after` it read next, in every shard but those in
/// which its index held nothing past `after`: an entry landing in between at or below
/// `after` (a fenced writer's late write), or in such a shard, is seen by the next call.
pub struct HistoryConflicts<H: HistorySource, I: IndexSource> {
    history: Arc<H>,
    projector: IndexedProjector<I>,
}

impl<H: HistorySource, I: IndexSource> HistoryConflicts<H, I> {
    /// A history checker reading entries through `history` and its index through `index`.
    pub fn new(history: Arc<H>, index: Arc<I>) -> Self {
        HistoryConflicts {
            history,
            projector: IndexedProjector::new(index),
        }
    }

    async fn full(&self) -> Result<Vec<Conflict>> {
        let mut checker = HistoryChecker::new();
        with_deadline(
            "conflict discovery",
            self.history.timeout(),
            None,
            Written::Nothing,
            self.history.visit_all(&mut checker),
        )
        .await?;
        Ok(checker.finish(None))
    }

    async fn after(&mut self, after: &Checkpoint) -> Result<Vec<Conflict>> {
        self.projector.refresh().await?;
        // Shards in which the index, complete at its refresh, holds nothing past `after`: no
        // need to read them again (an entry landing there since is seen by the next call).
        let quiet: HashSet<ShardId> = after
            .0
            .iter()
            .filter(|(shard, seq)| self.projector.index().position(**shard) <= **seq)
            .map(|(shard, _)| *shard)
            .collect();
        let newer = self.history.read_after(after, &quiet).await?;
        // Entries appended since the refresh join the index: it then holds every entry the
        // content checks below saw, and the answer is a function of one set of entries.
        let index = self.projector.index_mut();
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut ids = BTreeSet::new();
        let mut shards = HashSet::new();
        for e in &newer {
            if !after.is_after(e.shard, e.seq) || !seen.insert((e.shard, e.seq, e.epoch)) {
                continue;
            }
            index.apply(IndexRow::of(e));
            entry_conflicts(e, &mut out);
            ids.insert(e.record.id.as_str());
            shards.insert(e.shard);
        }
        out.extend(index.id_conflicts_of(ids));
        for (shard, positions) in index.positions_of(&shards) {
            position_conflicts(shard, positions, &mut out);
        }
        out.retain(|c| c.involves_entries_after(after));
        Ok(canonical_conflicts(out))
    }
}

#[async_trait]
impl<H: HistorySource, I: IndexSource> ConflictDiscovery for HistoryConflicts<H, I> {
    async fn conflicts(&mut self, after: Option<&Checkpoint>) -> Result<Vec<Conflict>> {
        match after {
            None => self.full().await,
            // One deadline for the refresh and the reads after it.
            Some(cp) => {
                let timeout = self.history.timeout();
                with_deadline("conflict discovery", timeout, None, Written::Nothing, self.after(cp)).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::index::tests::arb_entries;
    use crate::ids::WriterId;
    use crate::record::Record;
    use crate::testing::model;
    use proptest::prelude::*;

    /// A history source over a memory store that lets another writer append once between a
    /// check's refresh and its reads past the checkpoint: the race no backend can exclude.
    struct AppendsInBetween {
        store: crate::testing::MemoryStore,
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
        let store = crate::testing::MemoryStore::open(&format!("race-{}", uuid::Uuid::new_v4()), options).unwrap();
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
}
