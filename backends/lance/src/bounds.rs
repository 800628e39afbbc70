//! What shard reads learned of the sources they read — the base table at one version and
//! each flushed generation: bounds that let a reader paging through a shard skip the sources
//! it has passed.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use ctxlog_core::ShardId;

/// The key of the base table at one version among a shard's sources: the version's number
/// and its commit time, so that a store replaced by a restored copy whose history reaches
/// the same number is not taken for the one a bound was learned of.
pub(crate) fn base_at(version: &lance::dataset::Version) -> String {
    format!(
        "the base table at version {} of {}",
        version.version,
        version.timestamp.to_rfc3339()
    )
}

/// Per shard, per source (a flushed generation by URI, or the base table at one version,
/// [`base_at`]), a seq no entry of that shard in that source exceeds: learned by
/// `entries::read_shard`, so that a reader paging through a shard skips the sources it has
/// passed instead of scanning each of them for every page. A source never gains rows once
/// listed: a version of the base table is a snapshot (compaction, purge and any other write
/// make a new version), and Lance flushes each generation into a directory of its own
/// (`{random}_gen_{n}`), finished before the shard's manifest lists it, and ctxlog deletes
/// only folded generations (gc); so a bound once true stays true. (The WAL tail, which gc
/// empties in place, is never bounded.) A read forgets the sources of its shard that are no
/// longer listed; a shard never read again keeps its few.
///
/// Why the base table is bounded by what was read, not skipped for a shard compaction never
/// folded: its rows are what the store holds, whatever put them there (a damaged store, a
/// broken writer, a restored copy), and a read of a shard must show what the history
/// checker judges.
#[derive(Default)]
pub(crate) struct SourceTops(Mutex<HashMap<ShardId, HashMap<String, u64>>>);

impl SourceTops {
    /// Of the sources of `shard` listed now, those known to hold nothing of it past
    /// `after`; forgets the sources no longer listed.
    pub(crate) fn passed(&self, shard: ShardId, listed: &[&str], after: u64) -> HashSet<String> {
        let listed: HashSet<&str> = listed.iter().copied().collect();
        let mut all = self.0.lock().expect("not poisoned");
        let Some(tops) = all.get_mut(&shard) else {
            return HashSet::new();
        };
        tops.retain(|uri, _| listed.contains(uri.as_str()));
        let passed = tops
            .iter()
            .filter(|(_, top)| **top <= after)
            .map(|(uri, _)| uri.clone())
            .collect();
        if tops.is_empty() {
            all.remove(&shard);
        }
        passed
    }

    /// `top` bounds the seqs of `shard` in the source `uri`.
    pub(crate) fn learn(&self, shard: ShardId, uri: &str, top: u64) {
        let mut all = self.0.lock().expect("not poisoned");
        let known = all.entry(shard).or_default().entry(uri.to_owned()).or_insert(top);
        *known = (*known).min(top);
    }
}
