//! The history checker (rules 6, 7, 10) generic over how a backend reads its entries: the
//! backend streams stored entries ([`HistorySource`]) and feeds a projection index
//! ([`IndexSource`]); the checks live here, once.
//!
//! Names: a *full check* reads every stored entry with its content ([`HistoryChecker`], in
//! `checker`); a check *after* a checkpoint reads with content only the entries past it and
//! asks a projection index it keeps for the rest ([`HistoryConflicts`]).

mod checker;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::index::{IndexRow, RowRef};
use crate::backend::projector::{IndexSource, IndexedProjector};
use crate::canonical::canonical_json;
use crate::entry::{Checkpoint, Entry, OrderKey};
use crate::error::{Result, Written, with_deadline};
use crate::ids::ShardId;
use crate::projection::{Conflict, canonical_conflicts};
use crate::traits::ConflictDiscovery;
use crate::traits::Projector;

use self::checker::{Found, RowBatch, coverage_conflicts, position_conflicts};
pub use self::checker::{HistoryChecker, StoredBody, StoredRow};

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
        with_deadline(
            "conflict discovery",
            self.history.timeout(),
            None,
            Written::Nothing,
            async {
                // Ids group as the store's format says, read at the start of each check (rule 22).
                let mut checker = HistoryChecker::scoped(self.projector.source().id_scope().await?);
                self.history.visit_all(&mut checker).await?;
                Ok(checker.finish(None))
            },
        )
        .await
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
        let mut seen = HashSet::new();
        let mut ids: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut shards = HashSet::new();
        let mut content = RowBatch::default();
        for e in &newer {
            if !after.is_after(e.shard, e.seq) || !seen.insert((e.shard, e.seq, e.epoch)) {
                continue;
            }
            index.apply(IndexRow::of(e));
            let metadata = e.record.metadata.as_ref().map(canonical_json);
            // Whether a missing body's id has a tombstone is settled below, once the index
            // holds every new entry too.
            let stored = e.record.stored_body();
            content.push(&StoredRow::of(e, metadata.as_deref(), &stored), false);
            ids.insert((e.record.bot_id.as_str(), e.record.id.as_str()));
            shards.insert(e.shard);
        }
        let mut found = Found::default();
        content.check(&mut found);
        // A missing body's id may have its tombstone below the checkpoint or in another
        // shard: the index, which holds every entry, answers for it.
        let mut out: Vec<Conflict> = found.settle(index).collect();
        out.extend(index.id_conflicts_of(ids));
        for (shard, positions) in index.positions_of(&shards) {
            position_conflicts(shard, positions, &mut out);
        }
        // Rule 21: every live summary's coverage, checked against the index as it is now
        // (whether a summary is implausible depends on the records of its session): those
        // read just now from what was read, the others (few) read again.
        let mut coverage: HashMap<OrderKey, checker::Coverage> = newer
            .iter()
            .filter_map(|e| {
                let covers = e.record.covers.clone()?;
                let parent = checker::fork_parent(e.record.kind, &e.record.body);
                Some((e.key(), (e.record.bot_id.clone(), e.record.id.clone(), covers, parent)))
            })
            .collect();
        let mut wanted: Vec<(OrderKey, RowRef)> = index
            .sessions_with_summaries()
            .into_iter()
            .flat_map(|s| {
                s.keys
                    .iter()
                    .filter(|(k, _)| s.is_summary(k))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        for (bot, session) in index.sessions_with_links() {
            let s = index.session_with_summaries(&bot, &session);
            wanted.extend(s.keys.iter().filter(|(k, _)| s.is_link(k)).copied());
        }
        wanted.retain(|(k, _)| !coverage.contains_key(k));
        for e in self.projector.fetch(&wanted).await? {
            if let Some(c) = e.record.covers.clone() {
                let parent = checker::fork_parent(e.record.kind, &e.record.body);
                coverage.insert(e.key(), (e.record.bot_id.clone(), e.record.id.clone(), c, parent));
            }
        }
        out.extend(coverage_conflicts(self.projector.index_mut(), |k| {
            coverage.get(k).cloned()
        }));
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
