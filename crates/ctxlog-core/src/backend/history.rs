//! The history checker (rules 6, 7, 10) generic over how a backend reads its entries: the
//! backend streams every stored entry ([`HistorySource`]); the checks live here, once.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::index::{IndexRow, ProjectionIndex};
use crate::entry::{Checkpoint, Entry};
use crate::error::{Result, Written, with_deadline};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::{Epoch, Seq, ShardId};
use crate::projection::{Conflict, canonical_conflicts};
use crate::traits::ConflictDiscovery;

/// Collects what the history checks need while a backend streams every entry past it.
#[derive(Default)]
pub struct HistoryChecker {
    index: ProjectionIndex,
    positions: HashMap<ShardId, Vec<(Seq, Epoch)>>,
    corrupt: Vec<Conflict>,
}

impl HistoryChecker {
    /// An empty checker.
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
        // A purged entry's content is gone (rule 16): nothing to check it against.
        let actual = ContentHash::of(&e.record);
        if !e.purged && actual != e.content_hash {
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
    /// Show every stored entry to `checker` (any order, repeats allowed).
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()>;

    /// The deadline of one pass.
    fn timeout(&self) -> Duration;
}

/// A [`ConflictDiscovery`] over any [`HistorySource`]: one full pass per call.
pub struct ScanConflictDiscovery<S: HistorySource> {
    source: std::sync::Arc<S>,
}

impl<S: HistorySource> ScanConflictDiscovery<S> {
    /// A history checker over `source`.
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
    use crate::backend::index::tests::arb_entries;
    use crate::ids::WriterId;
    use crate::record::Record;
    use crate::testing::model;
    use proptest::prelude::*;

    proptest! {
        /// The checker reports exactly what the reference model does, whatever the order
        /// and repeats of the entries it is shown.
        #[test]
        fn checker_matches_reference_model(entries in arb_entries()) {
            let mut seen = std::collections::HashSet::new();
            let entries: Vec<Entry> = entries.into_iter().filter(|e| seen.insert((e.shard, e.seq, e.epoch))).collect();
            let mut checker = HistoryChecker::new();
            for e in entries.iter().rev().chain(entries.iter()) {
                checker.visit(e);
            }
            prop_assert_eq!(checker.finish(None), model::conflicts(&entries));
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
                purged: false,
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
