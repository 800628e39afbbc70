//! Shared read machinery: a projector and a history checker generic over how a backend
//! reads its entries. Backends supply the scanning ([`IndexSource`], [`HistorySource`]);
//! the rules live here once.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{Result, Written, with_deadline};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::index::{IndexRow, Loc, ProjectionIndex};
use crate::projection::{Conflict, Projection, ProjectionStats, canonical_conflicts};
use crate::traits::{ConflictDiscovery, Projector, RefreshReport};
use crate::types::{Checkpoint, Entry, Epoch, OrderKey, Seq, SessionSummary, ShardId};

/// How a backend feeds its projector.
#[async_trait]
pub trait IndexSource: Send + Sync + 'static {
    /// Where the last catch-up stopped, beyond what the index's own checkpoint says.
    type Cursor: Default + Send + Sync + 'static;

    /// Apply every entry past `cursor` to `index` and advance `cursor`. If this fails or is
    /// cancelled, `cursor` and `index` must still agree (both advanced, or both reset to
    /// their defaults).
    async fn catch_up(&self, cursor: &mut Self::Cursor, index: &mut ProjectionIndex) -> Result<CatchUp>;

    /// Full entries for `keys`, in the same order, each with the location the backend gave
    /// its row. `cursor` is the state the keys were indexed with.
    async fn fetch(&self, cursor: &Self::Cursor, keys: &[(OrderKey, Loc)]) -> Result<Vec<Entry>>;

    /// The deadline of one operation.
    fn timeout(&self) -> Duration;
}

/// What one catch-up did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Entries read from storage.
    pub read: u64,
    /// Entries the index did not hold yet.
    pub applied: u64,
}

/// A [`Projector`] over any [`IndexSource`].
pub struct IndexedProjector<S: IndexSource> {
    source: std::sync::Arc<S>,
    cursor: S::Cursor,
    index: ProjectionIndex,
    scanned: bool,
}

impl<S: IndexSource> IndexedProjector<S> {
    pub fn new(source: std::sync::Arc<S>) -> Self {
        IndexedProjector {
            source,
            cursor: S::Cursor::default(),
            index: ProjectionIndex::new(),
            scanned: false,
        }
    }

    async fn ensure_scanned(&mut self) -> Result<()> {
        if !self.scanned {
            self.refresh().await?;
        }
        Ok(())
    }

    async fn fetch(&self, keys: &[(OrderKey, Loc)]) -> Result<Vec<Entry>> {
        with_deadline(
            "read entries",
            self.source.timeout(),
            None,
            Written::Nothing,
            self.source.fetch(&self.cursor, keys),
        )
        .await
    }
}

#[async_trait]
impl<S: IndexSource> Projector for IndexedProjector<S> {
    async fn refresh(&mut self) -> Result<RefreshReport> {
        let first_scan = !self.scanned;
        // Until this refresh completes, the projector counts as not scanned: a source may
        // reset the index when a catch-up fails or is cancelled (rather than leave it torn),
        // and the next read must then scan again instead of answering from an empty index.
        self.scanned = false;
        let timeout = self.source.timeout();
        let source = self.source.clone();
        let result = with_deadline(
            "refresh",
            timeout,
            None,
            Written::Nothing,
            source.catch_up(&mut self.cursor, &mut self.index),
        )
        .await;
        let done = result?;
        self.scanned = true;
        Ok(RefreshReport {
            entries_read: done.read,
            new_entries: done.applied,
            first_scan,
        })
    }

    async fn session(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>> {
        self.ensure_scanned().await?;
        let keys = self.index.session_keys(bot_id, session_id);
        self.fetch(&keys).await
    }

    async fn get(&mut self, id: &str) -> Result<Option<Entry>> {
        self.ensure_scanned().await?;
        match self.index.live(id) {
            None => Ok(None),
            Some(key) => Ok(self.fetch(&[key]).await?.pop()),
        }
    }

    async fn sessions(&mut self, bot_id: &str) -> Result<Vec<SessionSummary>> {
        self.ensure_scanned().await?;
        Ok(self.index.sessions(bot_id))
    }

    fn stats(&self) -> ProjectionStats {
        self.index.stats()
    }

    fn checkpoint(&self) -> Checkpoint {
        self.index.checkpoint()
    }

    fn projection(&self) -> Projection {
        self.index.projection()
    }

    fn max_hlc(&self) -> Hlc {
        self.index.max_hlc()
    }
}

/// Collects what the history checks need while a backend streams every entry past it.
#[derive(Default)]
pub struct HistoryChecker {
    index: ProjectionIndex,
    positions: HashMap<ShardId, Vec<(Seq, Epoch)>>,
    corrupt: Vec<Conflict>,
}

impl HistoryChecker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Visit one stored entry (any order, repeats allowed).
    pub fn visit(&mut self, e: &Entry) {
        if !self.index.apply(IndexRow::of(e)) {
            return;
        }
        self.positions.entry(e.shard).or_default().push((e.seq, e.epoch));
        if e.hlc.millis() > Hlc::PLAUSIBLE_MILLIS {
            self.corrupt.push(Conflict::ImplausibleHlc {
                shard: e.shard,
                seq: e.seq,
                epoch: e.epoch,
                hlc: e.hlc,
            });
        }
        let actual = ContentHash::of(&e.record);
        if actual != e.content_hash {
            self.corrupt.push(Conflict::Corrupt {
                shard: e.shard,
                seq: e.seq,
                epoch: e.epoch,
                id: e.record.id.clone(),
                stored_hash: e.content_hash,
                actual_hash: actual,
            });
        }
    }

    /// Every conflict, canonical order; with `after`, only those past that checkpoint.
    pub fn finish(self, after: Option<&Checkpoint>) -> Vec<Conflict> {
        let mut out = self.index.id_conflicts();
        out.extend(self.corrupt);
        for (shard, mut positions) in self.positions {
            positions.sort_unstable();
            // Stale epoch: an entry whose epoch is below the highest epoch at its seq or
            // any lower seq. Walk seqs upwards, one seq group at a time.
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
        let out = match after {
            Some(cp) => out.into_iter().filter(|c| c.involves_entries_after(cp)).collect(),
            None => out,
        };
        canonical_conflicts(out)
    }
}

/// How a backend feeds its history checker: every stored entry, full content.
#[async_trait]
pub trait HistorySource: Send + Sync + 'static {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()>;

    fn timeout(&self) -> Duration;
}

/// A [`ConflictDiscovery`] over any [`HistorySource`]: one full pass per call.
pub struct ScanConflictDiscovery<S: HistorySource> {
    source: std::sync::Arc<S>,
}

impl<S: HistorySource> ScanConflictDiscovery<S> {
    pub fn new(source: std::sync::Arc<S>) -> Self {
        ScanConflictDiscovery { source }
    }
}

#[async_trait]
impl<S: HistorySource> ConflictDiscovery for ScanConflictDiscovery<S> {
    async fn conflicts(&mut self, after: Option<&Checkpoint>) -> Result<Vec<Conflict>> {
        let mut checker = HistoryChecker::new();
        with_deadline(
            "conflict discovery",
            self.source.timeout(),
            None,
            Written::Nothing,
            self.source.visit_all(&mut checker),
        )
        .await?;
        Ok(checker.finish(after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;
    use crate::types::{Body, Kind, Record, WriterId};
    use proptest::prelude::*;

    /// Random histories, including stale epochs, gaps and corrupt entries, give the same
    /// projection and conflicts through the index/checker as through the reference model.
    fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
        let one = (0u8..3, 1u64..8, 1u64..3, 0u64..20, 0u8..6, 0u8..3, 0u8..8, 0u8..2);
        proptest::collection::vec(one, 0..40).prop_map(|raw| {
            raw.into_iter()
                .map(|(w, seq, epoch, hlc, id, text, op, sess)| {
                    let shard = WriterId::new(format!("w{w}")).unwrap().shard_id();
                    let mut record =
                        Record::text(format!("id{id}"), "bot", format!("s{sess}"), "user", format!("t{text}"));
                    if op == 0 {
                        record.kind = Kind::Tombstone;
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
                    }
                })
                .collect()
        })
    }

    fn index_of(entries: &[Entry]) -> ProjectionIndex {
        let mut idx = ProjectionIndex::new();
        for e in entries {
            idx.apply(IndexRow::of(e));
        }
        idx
    }

    proptest! {
        #[test]
        fn index_matches_reference_model(entries in arb_entries()) {
            // The model keeps the first of repeated positions; the index must too, so feed
            // unique positions only (backends never store two entries at one position).
            let mut seen = std::collections::HashSet::new();
            let entries: Vec<Entry> = entries.into_iter().filter(|e| seen.insert((e.shard, e.seq, e.epoch))).collect();
            let mut idx = index_of(&entries);
            let model = model::project(&entries);
            prop_assert_eq!(idx.projection().canonical_json(), model.canonical_json());

            let mut reversed = entries.clone();
            reversed.reverse();
            prop_assert_eq!(index_of(&reversed).projection().canonical_json(), model.canonical_json());

            let mut checker = HistoryChecker::new();
            for e in entries.iter().chain(entries.iter()) {
                checker.visit(e);
            }
            prop_assert_eq!(checker.finish(None), model::conflicts(&entries));

            for (bot, session) in [("bot", "s0"), ("bot", "s1")] {
                let view: Vec<OrderKey> = model::session_view(&entries, bot, session).iter().map(|e| e.key()).collect();
                let keys: Vec<OrderKey> = idx.session_keys(bot, session).into_iter().map(|k| k.0).collect();
                prop_assert_eq!(keys, view);
            }
        }

        #[test]
        fn incremental_application_equals_one_pass(entries in arb_entries(), split in 0usize..40) {
            let mut seen = std::collections::HashSet::new();
            let entries: Vec<Entry> = entries.into_iter().filter(|e| seen.insert((e.shard, e.seq, e.epoch))).collect();
            let split = split.min(entries.len());
            let mut idx = index_of(&entries[..split]);
            let _ = idx.projection();
            for e in &entries[split..] {
                idx.apply(IndexRow::of(e));
            }
            prop_assert_eq!(idx.projection().canonical_json(), index_of(&entries).projection().canonical_json());
        }
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
            }
        };
        let mut c = HistoryChecker::new();
        c.visit(&mk(1, 1, "a"));
        c.visit(&mk(2, 2, "b"));
        let mut cp = Checkpoint::default();
        cp.advance(s, 1);
        let mut c2 = HistoryChecker::new();
        c2.visit(&mk(1, 1, "a"));
        c2.visit(&mk(2, 2, "b"));
        assert_eq!(c.finish(Some(&cp)).len(), 1);
        cp.advance(s, 2);
        assert!(c2.finish(Some(&cp)).is_empty());
    }
}
