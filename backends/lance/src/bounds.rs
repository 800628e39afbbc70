//! What shard reads learned of the flushed generations they read: bounds that let a reader
//! paging through a shard skip the generations it has passed.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use ctxlog_core::ShardId;

/// Per shard, per flushed generation (by URI), a seq no entry of that generation exceeds:
/// learned by `entries::read_shard`, so that a reader paging through a shard skips the generations
/// it has passed instead of opening and scanning each of them for every page. A generation
/// never gains rows once listed: Lance flushes each into a directory of its own
/// (`{random}_gen_{n}`), finished before the shard's manifest lists it, and ctxlog rewrites
/// only the base table (purge) and deletes only folded generations (gc); so a bound once
/// true stays true. Only the generations a shard's manifest listed at its last read are kept.
#[derive(Default)]
pub(crate) struct GenerationTops(Mutex<HashMap<ShardId, HashMap<String, u64>>>);

impl GenerationTops {
    /// Of the generations of `shard` its manifest lists (by URI), those known to hold
    /// nothing past `after`; forgets the generations no longer listed.
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

    /// `top` bounds the seqs of the generation at `uri`.
    pub(crate) fn learn(&self, shard: ShardId, uri: &str, top: u64) {
        let mut all = self.0.lock().expect("not poisoned");
        let known = all.entry(shard).or_default().entry(uri.to_owned()).or_insert(top);
        *known = (*known).min(top);
    }
}
