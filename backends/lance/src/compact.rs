//! Compaction: fold flushed generations into the base table.
//!
//! Without it, every reader's first scan opens every generation of every shard, so read
//! cost grows with the number of generations. One pass:
//!
//! 1. asks the writers this handle opened to flush their memtables into generations;
//! 2. picks, per shard and oldest first, the generations the base table does not hold yet,
//!    up to `max_generations` and `max_bytes` in all;
//! 3. folds their rows, sorted by bot, session and order key, into the base table with one
//!    insert-only `merge_insert` keyed by `(shard, epoch, seq)` that records, **in the same
//!    commit**, the newest generation folded per shard (`mark_sstables_as_compacted`).
//!
//! A pass is one commit: interrupted anywhere before it, nothing changed (data files it
//! wrote are unreferenced); after it, data and marker changed together. Rows already in
//! the base are left alone (`DoNothing` on match), so no pass can duplicate. Shard
//! manifests, epochs and WALs are never touched, so no live writer is fenced.
//!
//! Replicas compact the same store. A pass *overtaken* by another (which folded some of
//! the generations it chose and committed first) has its commit refused by MemWAL: a
//! shard's folded generation only grows. That is not a failure of compaction — what it
//! set out to fold is folded — so the pass is planned again from the new base table, up
//! to `OVERTAKEN_PASSES` times within the deadline. Whether a pass was overtaken is read
//! from the base table's markers after the refusal, never from the error's text.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use ctxlog_core::{CompactOptions, CompactReport, Error, Result, Written};
use lance::dataset::{MergeInsertBuilder, WhenMatched, WhenNotMatched};
use lance_index::mem_wal::CompactedSsTable;

use ctxlog_core::backend::failpoint;

use crate::error::lance_err;
use crate::schema::{PRIMARY_KEY, schema};
use crate::store::Shared;
use crate::tiers::{Generation, folded, tiers};

/// Where a test may stop a pass, to prove an interrupted pass loses and duplicates nothing:
/// the failpoints of a pass, by name.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopPoint {
    /// After reading the generations, before writing anything.
    AfterRead,
    /// After writing the new data files, before the commit that would reference them.
    BeforeCommit,
}

impl StopPoint {
    /// The failpoint's name.
    pub fn point(self) -> &'static str {
        match self {
            StopPoint::AfterRead => "lance.compact.after_read",
            StopPoint::BeforeCommit => "lance.compact.before_commit",
        }
    }
}

/// Passes planned again after being overtaken, before compaction gives up (each overtaking
/// pass folded something, so more than a few in a row means replicas compact in a loop).
const OVERTAKEN_PASSES: usize = 4;

/// How one pass ended.
enum Pass {
    Done(CompactReport),
    /// Another compaction folded some of the chosen generations first; nothing written.
    Overtaken,
}

fn compact_err(e: lance::Error) -> Error {
    lance_err("compact", None, Written::Nothing, e)
}

pub(crate) async fn compact(inner: &Arc<Shared>, opts: &CompactOptions) -> Result<CompactReport> {
    let timeout = inner.timeout();
    let deadline = tokio::time::Instant::now() + timeout;
    // 1. Flush this process's live writers, within the first half of the deadline. A fenced
    //    or failing writer is skipped: its rows are in its WAL, its successor flushes them.
    let flush_by = deadline - timeout / 2;
    for w in inner.live_writers() {
        let _ = tokio::time::timeout_at(flush_by, async { w.force_freeze_active().await?.wait().await }).await;
    }
    let passes = async {
        for _ in 0..OVERTAKEN_PASSES {
            if let Pass::Done(report) = pass(inner, opts).await? {
                return Ok(report);
            }
            tracing::debug!("compaction overtaken by another; planning again");
        }
        Err(Error::backend(
            "lance",
            "compact",
            None,
            Written::Nothing,
            format!("overtaken by other compactions {OVERTAKEN_PASSES} times in a row"),
        ))
    };
    match tokio::time::timeout_at(deadline, passes).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            op: "compact",
            after: timeout,
            shard: None,
            written: Written::Unknown,
        }),
    }
}

async fn pass(inner: &Arc<Shared>, opts: &CompactOptions) -> Result<Pass> {
    let t = tiers(inner, None).await?;
    // 2. Plan: round-robin over shards, each shard's oldest generations first (the marker
    //    says "folded up to g", so a shard's chosen generations are a prefix), within both
    //    caps. Round-robin, so that a busy shard cannot starve the others.
    let pending: usize = t.shards.iter().map(|s| s.generations.len()).sum();
    let mut chosen: Vec<Generation> = Vec::new();
    let mut markers: HashMap<ctxlog_core::ShardId, u64> = HashMap::new();
    let mut bytes = 0u64;
    let mut open: Vec<bool> = vec![true; t.shards.len()];
    'plan: for round in 0.. {
        let mut any = false;
        for (s, shard) in t.shards.iter().enumerate() {
            let Some(g) = shard.generations.get(round).filter(|_| open[s]) else {
                continue;
            };
            any = true;
            if chosen.len() >= opts.max_generations {
                break 'plan;
            }
            let size = generation_bytes(inner, g).await?;
            if !chosen.is_empty() && bytes + size > opts.max_bytes {
                // This shard's prefix ends here; others may still fit.
                open[s] = false;
                continue;
            }
            bytes += size;
            markers.insert(g.shard, g.generation);
            chosen.push(g.clone());
        }
        if !any {
            break;
        }
    }
    if chosen.is_empty() {
        return Ok(Pass::Done(
            CompactReport::default()
                .with_generations_remaining(pending as u64)
                .with_note("nothing to fold"),
        ));
    }
    // Read the chosen generations, as rows of the base table's schema.
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut entries = 0u64;
    for g in &chosen {
        let ds = inner.open_dataset(&g.uri).await.map_err(compact_err)?;
        let names: Vec<String> = schema().fields().iter().map(|f| f.name().clone()).collect();
        let mut scan = ds.scan();
        scan.project(&names).map_err(compact_err)?;
        // MemWAL delete markers: ctxlog never writes them, but never fold one as a row.
        if ds.schema().field("_tombstone").is_some() {
            scan.filter("NOT _tombstone").map_err(compact_err)?;
        }
        let found: Vec<RecordBatch> =
            futures::TryStreamExt::try_collect(scan.try_into_stream().await.map_err(compact_err)?)
                .await
                .map_err(compact_err)?;
        for b in found {
            entries += b.num_rows() as u64;
            // Generations relax payload columns to nullable; the base table's are not.
            let b = RecordBatch::try_new(schema(), b.columns().to_vec()).map_err(crate::schema::arrow_err)?;
            batches.push(b);
        }
    }
    if failpoint::hit(StopPoint::AfterRead.point(), || inner.uri.clone())
        .await
        .is_err()
    {
        return Err(interrupted(StopPoint::AfterRead));
    }
    let batches = by_session(batches)?;
    // 3. One commit: the rows and the markers.
    let planned = markers.clone();
    let mut markers: Vec<CompactedSsTable> = markers
        .into_iter()
        .map(|(shard, generation)| CompactedSsTable::new(shard.0, generation))
        .collect();
    markers.sort_by_key(|m| m.shard_id);
    let mut builder = MergeInsertBuilder::try_new(
        Arc::new(t.base.clone()),
        PRIMARY_KEY.iter().map(|s| s.to_string()).collect(),
    )
    .map_err(compact_err)?;
    builder
        .when_matched(WhenMatched::DoNothing)
        .when_not_matched(WhenNotMatched::InsertAll)
        .mark_sstables_as_compacted(markers);
    let job = builder.try_build().map_err(compact_err)?;
    // Stopped here, the pass writes the data files, then drops the transaction instead of
    // committing it; held here, another compaction may commit first.
    if failpoint::hit(StopPoint::BeforeCommit.point(), || inner.uri.clone())
        .await
        .is_err()
    {
        let _uncommitted = job.execute_uncommitted_batches(batches).await.map_err(compact_err)?;
        return Err(interrupted(StopPoint::BeforeCommit));
    }
    if let Err(e) = job.execute_batches(batches).await {
        let now = folded(&inner.latest().await?).await?;
        let overtaken = planned
            .iter()
            .any(|(shard, g)| now.get(&shard.0).is_some_and(|folded| folded >= g));
        return if overtaken {
            Ok(Pass::Overtaken)
        } else {
            Err(compact_err(e))
        };
    }
    Ok(Pass::Done(
        CompactReport::default()
            .with_generations_merged(chosen.len() as u64)
            .with_entries_merged(entries)
            .with_generations_remaining((pending - chosen.len()) as u64)
            .with_note(format!("folded {} generation(s), {bytes} bytes", chosen.len())),
    ))
}

/// The rows of one pass in one batch, sorted by bot, session and order key: a session's rows
/// then lie next to each other in the base table, so that a session view (one `take` of its
/// rows) reads a few ranges of each column instead of one per row. Order within the base
/// table means nothing else: every reader orders by the contract's order key.
fn by_session(batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    use crate::schema::{BOT_ID, HLC, SEQ, SESSION_ID, SHARD};
    if batches.is_empty() {
        return Ok(batches);
    }
    let all = arrow_select::concat::concat_batches(&schema(), &batches).map_err(crate::schema::arrow_err)?;
    let keys: Vec<arrow_ord::sort::SortColumn> = [BOT_ID, SESSION_ID, HLC, SHARD, SEQ]
        .into_iter()
        .map(|name| arrow_ord::sort::SortColumn {
            values: all.column_by_name(name).expect("a column of the schema").clone(),
            options: None,
        })
        .collect();
    let order = arrow_ord::sort::lexsort_to_indices(&keys, None).map_err(crate::schema::arrow_err)?;
    let sorted = arrow_select::take::take_record_batch(&all, &order).map_err(crate::schema::arrow_err)?;
    Ok(vec![sorted])
}

fn interrupted(at: StopPoint) -> Error {
    Error::Timeout {
        op: match at {
            StopPoint::AfterRead => "compact (stopped after read)",
            StopPoint::BeforeCommit => "compact (stopped before commit)",
        },
        after: std::time::Duration::ZERO,
        shard: None,
        written: Written::Nothing,
    }
}

/// The size of a generation's data files.
async fn generation_bytes(inner: &Shared, g: &Generation) -> Result<u64> {
    let ds = inner.open_dataset(&g.uri).await.map_err(compact_err)?;
    let mut total = 0u64;
    for f in ds.get_fragments() {
        for file in &f.metadata().files {
            total += file.file_size_bytes.get().map_or(0, |n| n.get());
        }
    }
    Ok(total)
}
