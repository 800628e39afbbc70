//! Reads of full entries: one shard's entries, the shard listing, and the history
//! checker's pass over every stored entry.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ctxlog_core::backend::history::{HistoryChecker, HistorySource};
use ctxlog_core::{Checkpoint, Entry, Result, ShardId, ShardInfo, WriterId};

use crate::schema::{POSITION_COLUMNS, SEQ, SHARD};
use crate::store::Shared;
use crate::tiers::{Rows, Tiers, Walk, open_sources, rows, shard_filter, tiers, walk, walk_all};
use crate::writers;
use uuid::Uuid;

const EVERY_COLUMN: Walk<'static> = Walk {
    columns: None,
    row_ids: false,
};

/// Visit every stored entry of the tiers (all columns), in any order, repeats possible.
async fn for_each_entry(shared: &Shared, t: &Tiers, f: &mut (dyn FnMut(Entry) + Send)) -> Result<()> {
    walk_all(shared, t, EVERY_COLUMN, |r| {
        rows(r.batch(), |c, i| c.entry(i).map(&mut *f))
    })
    .await?;
    Ok(())
}

/// A shard's entries past `after_seq` (at most `limit`, by `(seq, epoch)`): what a watch's
/// every page costs, so it reads what is past `after_seq`, not the shard's history. Every
/// source (the base table, the generations not yet folded) only its rows past `after_seq`,
/// and none an earlier read found holds nothing past it ([`crate::bounds::SourceTops`]);
/// the WAL tail whole (it is what no generation covers yet).
pub(crate) async fn read_shard(shared: &Shared, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
    let mut t = tiers(shared, Some(shard)).await?;
    let past = format!("{SEQ} > {after_seq}");
    t.base_filter = Some(format!("{} AND {past}", shard_filter(shard)));
    t.generation_filter = Some(past);
    let base = crate::bounds::base_at(&t.base.version());
    let mut listed: Vec<&str> = vec![&base];
    if let Some(s) = t.shards.first() {
        listed.extend(s.generations.iter().map(|g| g.uri.as_str()));
    }
    let passed = shared.source_tops.passed(shard, &listed, after_seq);
    t.read_base = !passed.contains(&base);
    if let Some(s) = t.shards.first_mut() {
        s.generations.retain(|g| !passed.contains(&g.uri));
    }
    // The sources in their order (the base table is source 0 whether read or not).
    let sources_read: Vec<String> = std::iter::once(base.clone())
        .chain(t.shards.iter().flat_map(|s| &s.generations).map(|g| g.uri.clone()))
        .collect();
    // Per source, the highest seq of the shard it showed past `after_seq`.
    let mut tops: Vec<Option<u64>> = vec![None; sources_read.len()];
    let mut out: HashMap<(u64, u64), Entry> = HashMap::new();
    let sources = open_sources(shared, &t).await?;
    debug_assert_eq!(
        sources.len(),
        sources_read.len(),
        "the base table, then the generations read"
    );
    walk(&t, &sources, EVERY_COLUMN, |r| {
        let source = match r {
            Rows::Table { source, .. } => Some(source as usize),
            Rows::Wal { .. } => None,
        };
        rows(r.batch(), |c, i| {
            let e = c.entry(i)?;
            if e.shard == shard && e.seq > after_seq {
                if let Some(top) = source.and_then(|s| tops.get_mut(s)) {
                    *top = (*top).max(Some(e.seq));
                }
                out.entry((e.seq, e.epoch)).or_insert(e);
            }
            Ok(())
        })
    })
    .await?;
    // A source read that showed nothing past `after_seq` holds nothing past it; one that
    // did showed its highest seq. The base table only when it was read.
    for (at, (uri, top)) in sources_read.iter().zip(tops).enumerate() {
        if at > 0 || t.read_base {
            shared.source_tops.learn(shard, uri, top.unwrap_or(after_seq));
        }
    }
    let mut entries: Vec<Entry> = out.into_values().collect();
    entries.sort_by_key(|e| (e.seq, e.epoch));
    entries.truncate(limit);
    Ok(entries)
}

pub(crate) async fn shards(shared: &Shared) -> Result<Vec<ShardInfo>> {
    let all = tiers(shared, None).await?;
    let mut out = Vec::new();
    for s in &all.shards {
        let t = tiers(shared, Some(s.shard)).await?;
        let mut keys: BTreeSet<(u64, u64)> = BTreeSet::new();
        let how = Walk {
            columns: Some(&POSITION_COLUMNS),
            row_ids: false,
        };
        walk_all(shared, &t, how, |r| {
            rows(r.batch(), |c, i| {
                keys.insert((c.seq(i), c.epoch(i)));
                Ok(())
            })
        })
        .await?;
        out.push(ShardInfo {
            shard: s.shard,
            writer: WriterId::new(writers::writer_of(&all.store, &all.base_path, s.shard).await?)?,
            epoch: s.epoch,
            last_seq: keys.iter().map(|k| k.0).max().unwrap_or(0),
            entries: keys.len() as u64,
        });
    }
    out.sort_by_key(|s| s.shard);
    Ok(out)
}

/// The base table's rows past `after`, as a filter: each named shard that is not `quiet`
/// past its position, and every shard `after` does not name — those only if one of them has
/// rows there (compaction records every shard it folds, invariant 12). `None`: no row can
/// match, so the base table need not be read. `after` names at least one shard.
fn after_filter(after: &Checkpoint, quiet: &HashSet<ShardId>, folded: &HashMap<Uuid, u64>) -> Option<String> {
    let mut parts: Vec<String> = after
        .0
        .iter()
        .filter(|(shard, _)| !quiet.contains(shard))
        .map(|(shard, seq)| format!("({SHARD} = '{}' AND {SEQ} > {seq})", shard.0))
        .collect();
    if folded.keys().any(|id| !after.0.contains_key(&ShardId(*id))) {
        let named: Vec<String> = after.0.keys().map(|s| format!("'{}'", s.0)).collect();
        parts.push(format!("{SHARD} NOT IN ({})", named.join(", ")));
    }
    (!parts.is_empty()).then(|| parts.join(" OR "))
}

pub(crate) struct LanceHistory {
    shared: Arc<Shared>,
}

impl LanceHistory {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LanceHistory { shared }
    }
}

#[async_trait]
impl HistorySource for LanceHistory {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
        let t = tiers(&self.shared, None).await?;
        walk_all(&self.shared, &t, EVERY_COLUMN, |r| {
            rows(r.batch(), |c, i| c.stored_row(i).map(|row| checker.visit_row(row)))
        })
        .await?;
        Ok(())
    }

    /// The base table's rows past `after` only (a filter on shard and seq: Lance reads those
    /// two columns of every row and the rest of the matching ones), and not at all when
    /// every named shard is quiet and no other shard was ever folded; generations and WAL
    /// tails of the shards that are not quiet whole, filtered here (they hold what is not
    /// folded yet).
    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>> {
        let mut t = tiers(&self.shared, None).await?;
        t.shards.retain(|s| !quiet.contains(&s.shard));
        if !after.0.is_empty() {
            t.base_filter = after_filter(after, quiet, &t.folded);
            t.read_base = t.base_filter.is_some();
        }
        let mut out = Vec::new();
        for_each_entry(&self.shared, &t, &mut |e| {
            if after.is_after(e.shard, e.seq) {
                out.push(e);
            }
        })
        .await?;
        Ok(out)
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout()
    }
}
