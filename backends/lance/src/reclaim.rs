//! Reclaim (`gc`, rule 15) and purge (rule 16) on Lance.
//!
//! What may go, and why it is safe:
//!
//! - **The rows of WAL entries** below a shard's *floor*. A pass first records, per shard,
//!   the WAL position its flushed generations cover (`replay_after_wal_entry_position`) as
//!   the shard's floor in the base table's config (`ctxlog.wal_floor.<shard>`), in one
//!   commit. A later pass empties the entries below the floors of the newest base version
//!   older than the grace period: each is overwritten by an entry with the same epoch and no
//!   rows. The object stays, so every WAL slot ever taken stays taken: a stale writer's
//!   `put_if_absent` still collides (and learns it is fenced) wherever it aims, and a writer
//!   that probes for the WAL's tip still finds it. Readers read the floors from the base
//!   version they start from: a reader whose WAL position is below its shard's floor reads
//!   that shard from the generations and the base table instead (`index.rs`).
//! - **Flushed generations** folded into the base table (per the compaction markers of the
//!   same grace-old base version): their rows are in the base table.
//! - **Base-table versions** superseded before that grace-old version, with the data files
//!   only they reference: Lance's own cleanup (it never touches `_mem_wal/` or `_ctxlog/`).
//!
//! Every step re-derives what to do from durable state, and every step is idempotent, so an
//! interrupted pass is finished by the next one. Per shard, how far the WAL is emptied is
//! recorded too (`ctxlog.wal_emptied.<shard>`), so that a pass reads only the entries it has
//! not emptied yet.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::Utc;
use ctxlog_core::{Error, GcOptions, GcReport, PurgeOptions, PurgeReport, Result, ShardId, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::UpdateBuilder;
use lance::dataset::cleanup::CleanupPolicy;
use lance::dataset::mem_wal::util::{shard_base_path, shard_wal_path, wal_entry_filename};
use lance::dataset::mem_wal::{DatasetMemWalExt, ShardManifestStore};
use lance::dataset::optimize::{CompactionOptions, compact_files};
use lance_io::object_store::ObjectStore;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use uuid::Uuid;

use crate::error::lance_err;
use crate::schema::{BODY_BYTES, BODY_TEXT, ID, KIND, METADATA};
use crate::store::Shared;

/// The config key of a shard's WAL floor.
const FLOOR_PREFIX: &str = "ctxlog.wal_floor.";
/// The config key of the position below which a shard's WAL entries are all emptied.
const EMPTIED_PREFIX: &str = "ctxlog.wal_emptied.";

fn gc_err(e: lance::Error) -> Error {
    lance_err("gc", None, Written::Unknown, e)
}

/// Per shard, the WAL position below which entries may be emptied, as recorded in `ds`.
pub(crate) fn floors(ds: &Dataset) -> HashMap<ShardId, u64> {
    positions(ds, FLOOR_PREFIX)
}

fn positions(ds: &Dataset, prefix: &str) -> HashMap<ShardId, u64> {
    ds.config()
        .iter()
        .filter_map(|(k, v)| {
            let shard = Uuid::parse_str(k.strip_prefix(prefix)?).ok()?;
            Some((ShardId(shard), v.parse().ok()?))
        })
        .collect()
}

/// One gc pass (see the module docs).
pub(crate) async fn gc(shared: &Shared, opts: &GcOptions) -> Result<GcReport> {
    let mut base = shared.latest().await?;
    let (store, base_path) = shared.io(&base).await?;
    let shards: Vec<Uuid> = base.list_mem_wal_latest_shard_ids().await.map_err(gc_err)?;
    // 1. Record each shard's floor: the WAL position its flushed generations cover.
    // Shard manifests at once, as the readers take them (`tiers::READ_WINDOW`).
    let manifests: HashMap<Uuid, _> = futures::stream::iter(shards.iter().copied())
        .map(|shard| {
            let manifests = ShardManifestStore::new(store.clone(), &base_path, shard, 2);
            async move { Ok::<_, Error>((shard, manifests.latest().await.map_err(gc_err)?)) }
        })
        .buffered(crate::tiers::READ_WINDOW)
        .try_filter_map(|(shard, m)| async move { Ok(m.map(|m| (shard, m))) })
        .try_collect()
        .await?;
    let recorded = floors(&base);
    let raised: Vec<(String, String)> = manifests
        .iter()
        .filter(|(s, m)| recorded.get(&ShardId(**s)).copied().unwrap_or(0) < m.replay_after_wal_entry_position)
        .map(|(s, m)| {
            (
                format!("{FLOOR_PREFIX}{s}"),
                m.replay_after_wal_entry_position.to_string(),
            )
        })
        .collect();
    if !raised.is_empty() {
        base.update_config(raised).await.map_err(gc_err)?;
    }
    // 2. What the newest base version older than the grace period allows.
    let cutoff = Utc::now() - chrono::Duration::from_std(opts.grace).unwrap_or(chrono::Duration::MAX);
    let versions = base.versions().await.map_err(gc_err)?;
    let Some(settled) = versions.iter().rev().find(|v| v.timestamp <= cutoff) else {
        return Ok(GcReport {
            note: "lance: nothing older than the grace period yet".into(),
            ..GcReport::default()
        });
    };
    let old = base.checkout_version(settled.version).await.map_err(gc_err)?;
    let (floors, folded) = (floors(&old), crate::tiers::folded(&old).await?);
    let emptied = positions(&base, EMPTIED_PREFIX);
    let mut progress: Vec<(String, String)> = Vec::new();
    let mut report = GcReport::default();
    let mut budget = opts.max_objects;
    for shard in &shards {
        let Some(m) = manifests.get(shard) else { continue };
        // 3. Folded generations.
        let upto = folded.get(shard).copied().unwrap_or(0);
        for t in m.sstables.iter().filter(|t| t.generation <= upto) {
            let dir = shard_base_path(&base_path, shard).join(t.path.as_str());
            let (n, bytes, more) = remove_all(&store, &dir, &mut budget).await?;
            report.objects_deleted += n;
            report.bytes_reclaimed += bytes;
            report.objects_pending += more;
        }
        // 4. The rows of WAL entries below the floor.
        let floor = floors.get(&ShardId(*shard)).copied().unwrap_or(0);
        let from = emptied.get(&ShardId(*shard)).copied().unwrap_or(1).max(1);
        let (n, bytes, upto) = empty_wal(&store, &base_path, *shard, from, floor, &mut budget).await?;
        report.objects_deleted += n;
        report.bytes_reclaimed += bytes;
        report.objects_pending += floor.saturating_sub(upto);
        if upto > from {
            progress.push((format!("{EMPTIED_PREFIX}{shard}"), upto.to_string()));
        }
    }
    if !progress.is_empty() {
        base.update_config(progress).await.map_err(gc_err)?;
    }
    // 5. Base-table versions superseded before the settled one, and the files only they use.
    let policy = CleanupPolicy {
        before_timestamp: Some(cutoff),
        before_version: Some(settled.version),
        error_if_tagged_old_versions: false,
        ..CleanupPolicy::default()
    };
    let removed = base.cleanup_with_policy(policy).await.map_err(gc_err)?;
    report.objects_deleted += removed.old_versions
        + removed.data_files_removed
        + removed.transaction_files_removed
        + removed.index_files_removed
        + removed.deletion_files_removed;
    report.bytes_reclaimed += removed.bytes_removed;
    report.note = format!(
        "lance: folded generations deleted and WAL entries below the floors of version {} emptied; \
         {} old versions cleaned up",
        settled.version, removed.old_versions
    );
    Ok(report)
}

/// Delete every object under `dir`, within `budget`. Returns (deleted, bytes, left over).
async fn remove_all(store: &Arc<ObjectStore>, dir: &Path, budget: &mut u64) -> Result<(u64, u64, u64)> {
    let objects: Vec<object_store::ObjectMeta> = store.list(Some(dir.clone())).try_collect().await.map_err(gc_err)?;
    let take = objects.len().min(usize::try_from(*budget).unwrap_or(usize::MAX));
    let bytes: u64 = objects[..take].iter().map(|o| o.size).sum();
    // The dataset's manifests first: a half-deleted generation then no longer opens as a
    // dataset with missing files (nobody opens a folded one, but a listing might).
    let mut paths: Vec<Path> = objects[..take].iter().map(|o| o.location.clone()).collect();
    paths.sort_by_key(|p| !p.as_ref().contains("/_versions/"));
    remove(store, paths).await?;
    *budget -= take as u64;
    Ok((take as u64, bytes, (objects.len() - take) as u64))
}

async fn remove(store: &Arc<ObjectStore>, paths: Vec<Path>) -> Result<()> {
    let stream = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
    store
        .remove_stream(stream)
        .try_collect::<Vec<_>>()
        .await
        .map_err(gc_err)?;
    Ok(())
}

/// Empty a shard's WAL entries from `from` to below `floor` that hold rows, within
/// `budget`: each is overwritten by an entry of the same epoch without rows (see the module
/// docs). Returns (entries emptied, bytes freed, the position below which all are emptied).
async fn empty_wal(
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: Uuid,
    from: u64,
    floor: u64,
    budget: &mut u64,
) -> Result<(u64, u64, u64)> {
    let dir = shard_wal_path(base_path, &shard);
    let (mut emptied, mut bytes) = (0u64, 0u64);
    let mut position = from;
    while position < floor && *budget > 0 {
        let path = dir.clone().join(wal_entry_filename(position));
        let data = match store.inner.get(&path).await {
            Ok(d) => d.bytes().await.map_err(|e| gc_err(e.into()))?,
            // A hole (an entry never completed): nothing to empty.
            Err(object_store::Error::NotFound { .. }) => {
                position += 1;
                continue;
            }
            Err(e) => return Err(gc_err(e.into())),
        };
        if let Some(empty) = without_rows(&data)? {
            store.put(&path, &empty).await.map_err(gc_err)?;
            emptied += 1;
            bytes += (data.len() as u64).saturating_sub(empty.len() as u64);
            *budget -= 1;
        }
        position += 1;
    }
    Ok((emptied, bytes, position))
}

/// The same WAL entry without its rows: its schema's metadata (the writer epoch, what
/// MemWAL records), no fields, no batches. `None` when it has no rows already.
fn without_rows(entry: &[u8]) -> Result<Option<Vec<u8>>> {
    let corrupt = |e: arrow_schema::ArrowError| Error::Corrupt {
        shard: None,
        what: format!("a WAL entry is not an Arrow IPC stream: {e}"),
    };
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(entry), None).map_err(corrupt)?;
    let metadata = reader.schema().metadata().clone();
    let mut rows = 0;
    for batch in reader {
        rows += batch.map_err(corrupt)?.num_rows();
    }
    if rows == 0 {
        return Ok(None);
    }
    let schema = Arc::new(arrow_schema::Schema::new_with_metadata(
        arrow_schema::Fields::empty(),
        metadata,
    ));
    let mut out = Vec::new();
    let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, &schema).map_err(corrupt)?;
    writer.finish().map_err(corrupt)?;
    drop(writer);
    Ok(Some(out))
}

/// Ids per filter of a purge: each filter is one scan of the base table (a hashed `IN`
/// list), so fewer, larger lists are cheaper.
const IDS_PER_STATEMENT: usize = 10_000;

fn purge_err(e: lance::Error) -> Error {
    lance_err("purge", None, Written::Unknown, e)
}

/// The filter of the rows of `ids` whose body or metadata is still stored.
fn unerased_rows_of(ids: &[String]) -> String {
    // String literals of a Lance filter: single quotes, doubled inside.
    let list: Vec<String> = ids.iter().map(|s| format!("'{}'", s.replace('\'', "''"))).collect();
    format!(
        "{ID} IN ({}) AND ({BODY_TEXT} IS NOT NULL OR {BODY_BYTES} IS NOT NULL OR {METADATA} IS NOT NULL)",
        list.join(", ")
    )
}

/// One purge pass: fold what can be folded, erase body and metadata of the base table's
/// rows of up to `max_ids` tombstoned ids, and rewrite the fragments that held them, so that
/// the old bytes are only in files of superseded versions (which `gc` deletes).
pub(crate) async fn purge(shared: &Arc<Shared>, opts: &PurgeOptions) -> Result<PurgeReport> {
    // Rows of generations not yet folded would survive in them: fold first.
    for _ in 0..64 {
        let r = crate::compact::compact(shared, &ctxlog_core::CompactOptions::default(), None).await?;
        if r.generations_remaining == 0 {
            break;
        }
    }
    let base = shared.latest().await?;
    let tombstoned = column_values(&base, ID, &format!("{KIND} = 1")).await?;
    if tombstoned.is_empty() {
        return Ok(PurgeReport {
            erased: true,
            note: "lance: no tombstoned id".into(),
            ..PurgeReport::default()
        });
    }
    let mut pending = Vec::new();
    for chunk in tombstoned.chunks(IDS_PER_STATEMENT) {
        pending.extend(column_values(&base, ID, &unerased_rows_of(chunk)).await?);
    }
    pending.sort();
    pending.dedup();
    let take = usize::try_from(opts.max_ids).unwrap_or(usize::MAX).min(pending.len());
    let chosen = &pending[..take];
    let mut erased_entries = 0;
    let mut ds = base;
    for chunk in chosen.chunks(IDS_PER_STATEMENT) {
        let job = UpdateBuilder::new(Arc::new(ds.clone()))
            .update_where(&unerased_rows_of(chunk))
            .and_then(|b| b.set(BODY_TEXT, "NULL"))
            .and_then(|b| b.set(BODY_BYTES, "NULL"))
            .and_then(|b| b.set(METADATA, "NULL"))
            .and_then(|b| b.build())
            .map_err(purge_err)?;
        let done = job.execute().await.map_err(purge_err)?;
        erased_entries += done.rows_updated;
        ds = done.new_dataset.as_ref().clone();
    }
    // Rewrite every fragment with deleted rows, also those an interrupted pass left: the old
    // bodies are then only in files of superseded versions. Lance's planner also merges
    // small fragments on the way (what its own optimize does); `target_rows_per_fragment`
    // is the size of what it writes, so it keeps its default.
    let options = CompactionOptions {
        materialize_deletions: true,
        materialize_deletions_threshold: 0.0,
        ..CompactionOptions::default()
    };
    compact_files(&mut ds, options, None).await.map_err(purge_err)?;
    Ok(PurgeReport {
        ids_purged: take as u64,
        entries_purged: erased_entries,
        ids_remaining: (pending.len() - take) as u64,
        erased: false,
        note: "lance: base-table rows erased and their fragments rewritten; older copies (superseded \
               versions, folded generations, WAL entries) go with `gc` after its grace period"
            .into(),
    })
}

/// The values of string column `column` of the rows matching `filter`.
async fn column_values(ds: &Dataset, column: &str, filter: &str) -> Result<Vec<String>> {
    let mut scan = ds.scan();
    scan.project(&[column]).map_err(purge_err)?;
    scan.filter(filter).map_err(purge_err)?;
    let batches: Vec<arrow_array::RecordBatch> = scan
        .try_into_stream()
        .await
        .map_err(purge_err)?
        .try_collect()
        .await
        .map_err(purge_err)?;
    let mut out = Vec::new();
    for b in batches {
        let col = b
            .column(0)
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .ok_or_else(|| Error::Corrupt {
                shard: None,
                what: format!("column `{column}` is not a string column"),
            })?;
        out.extend(col.iter().flatten().map(str::to_string));
    }
    Ok(out)
}
