//! Reclaim (`gc`, rule 15) and purge (rule 16) on Lance.
//!
//! What may go, and why it is safe:
//!
//! - **The rows of WAL entries** up to a shard's *floor*. A pass first records, per shard,
//!   the last WAL position its flushed generations cover (`replay_after_wal_entry_position`)
//!   as the shard's floor in the base table's config (`ctxlog.wal_floor.<shard>`), in one
//!   commit. A later pass empties the entries up to and including the floors of the newest
//!   base version older than the grace period: each is overwritten by an entry with the same epoch and no
//!   rows. The object stays, so every WAL slot ever taken stays taken: a stale writer's
//!   `put_if_absent` still collides (and learns it is fenced) wherever it aims, and a writer
//!   that probes for the WAL's tip still finds it. Readers read the floors from the base
//!   version they start from: a reader whose next WAL position is at or below its shard's
//!   floor reads that shard from the generations and the base table instead (`index.rs`).
//! - **Flushed generations** folded into the base table (per the compaction markers of the
//!   same grace-old base version): their rows are in the base table.
//! - **Base-table versions** superseded before that grace-old version, with the data files
//!   only they reference: Lance's own cleanup (it never touches `_mem_wal/` or `_ctxlog/`).
//!
//! Every step re-derives what to do from durable state, and every step is idempotent, so an
//! interrupted pass is finished by the next one. A pass's work does not grow with history:
//!
//! - Per shard, how far the WAL is emptied (`ctxlog.wal_emptied.<shard>`) and up to which
//!   generation the folded ones are deleted (`ctxlog.gen_deleted.<shard>`) are recorded, so
//!   that a pass reads no entry and lists no generation an earlier pass finished.
//! - Steps 3 and 4 run requests several at once (`tiers::READ_WINDOW`) within the budget
//!   (`max_objects`): a unit per WAL entry read, per generation object deleted, per listing
//!   of a generation found empty — at most two requests a unit. They stop at half the
//!   store's deadline; then what they did is recorded, in one commit (also when they failed),
//!   and step 5 runs.
//! - Step 2 reads no manifest when the latest version is older than the grace period, and
//!   bisects the stored versions otherwise; step 5 cleans at most `max_objects / 8` versions
//!   (at least four, more than a pass commits) past the oldest, and is skipped when there
//!   is none to clean. A pass with nothing to do reads the latest version, lists the shards
//!   and the versions, and reads each shard's manifest and the MemWAL index: no listing of
//!   history.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::Utc;
use ctxlog_core::{Error, GcOptions, GcReport, PurgeOptions, PurgeReport, Result, ShardId, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::cleanup::CleanupPolicy;
use lance::dataset::mem_wal::ShardManifestStore;
use lance::dataset::mem_wal::util::{shard_base_path, shard_wal_path, wal_entry_filename};
use lance::dataset::optimize::{CompactionOptions, compact_files};
use lance::dataset::{UpdateBuilder, VersionRef};
use lance_io::object_store::ObjectStore;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use uuid::Uuid;

use crate::error::lance_err;
use crate::schema::{BODY_BYTES, BODY_TEXT, BOT_ID, ID, KIND, METADATA};
use crate::store::Shared;

/// The config key of a shard's WAL floor.
const FLOOR_PREFIX: &str = "ctxlog.wal_floor.";
/// The config key of the position below which a shard's WAL entries are all emptied.
const EMPTIED_PREFIX: &str = "ctxlog.wal_emptied.";
/// The config key of the generation up to which a shard's folded generations (those its
/// manifest lists) are all deleted.
const GEN_DELETED_PREFIX: &str = "ctxlog.gen_deleted.";

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

/// What a pass may still do, shared by the requests it runs at once: a unit per object it
/// visits (a WAL entry read, a generation's object deleted, a generation's listing that
/// found nothing), so that a pass makes at most two requests per unit.
struct Budget(AtomicU64);

impl Budget {
    /// Take up to `n` units; returns how many were taken.
    fn take(&self, n: u64) -> u64 {
        let mut got = 0;
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            got = left.min(n);
            Some(left - got)
        });
        got
    }
}

/// How far one shard is reclaimed, as a pass advances it.
#[derive(Clone, Copy, Debug, Default)]
struct Reclaimed {
    /// Every generation listed in the shard manifest up to this one is deleted.
    gen_deleted: u64,
    /// Generations past `gen_deleted` this pass visited, and the objects they still hold.
    gens_visited: u64,
    gens_left: u64,
    /// Every WAL entry below this position is emptied.
    wal_emptied: u64,
}

/// What the working steps (3 and 4) of a pass did.
#[derive(Default)]
struct Work {
    shards: HashMap<Uuid, Reclaimed>,
    deleted: u64,
    bytes: u64,
}

/// One gc pass (see the module docs).
pub(crate) async fn gc(shared: &Shared, opts: &GcOptions) -> Result<GcReport> {
    // Steps 3 and 4 stop at half the deadline, so that what they did is recorded and step 5
    // runs within it.
    let work_until = tokio::time::Instant::now() + shared.timeout() / 2;
    let mut base = shared.latest().await?;
    let (store, base_path) = shared.io(&base).await?;
    let shards: Vec<Uuid> = crate::wal::shard_ids(&store, &base_path, "gc").await?;
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
    let cutoff = crate::io::storage_now() - chrono::Duration::from_std(opts.grace).unwrap_or(chrono::Duration::MAX);
    let refs = base.version_refs().await.map_err(gc_err)?;
    let Some(old) = settled(&base, &refs, cutoff).await? else {
        return Ok(GcReport::default().with_note("lance: nothing older than the grace period yet"));
    };
    let settled_version = old.version().version;
    let (floors, folded) = (floors(&old), crate::tiers::folded(&old).await?);
    // How far earlier passes got: nothing below is listed or read again.
    let (emptied, gen_deleted) = (positions(&base, EMPTIED_PREFIX), positions(&base, GEN_DELETED_PREFIX));
    let budget = Arc::new(Budget(AtomicU64::new(opts.max_objects)));
    let mut order: Vec<Uuid> = manifests.keys().copied().collect();
    order.sort();
    if !order.is_empty() {
        // A different shard first in each pass that follows a commit: none waits behind a
        // busy one for ever.
        let first = usize::try_from(base.version().version).unwrap_or(0) % order.len();
        order.rotate_left(first);
    }
    let mut work = Work::default();
    for shard in &order {
        let id = ShardId(*shard);
        work.shards.insert(
            *shard,
            Reclaimed {
                gen_deleted: gen_deleted.get(&id).copied().unwrap_or(0),
                wal_emptied: emptied.get(&id).copied().unwrap_or(1).max(1),
                ..Reclaimed::default()
            },
        );
    }
    let steps = async {
        for shard in &order {
            let m = &manifests[shard];
            let id = ShardId(*shard);
            // 3. Folded generations, oldest first, past those already deleted.
            let upto = folded.get(shard).copied().unwrap_or(0);
            let after = work.shards[shard].gen_deleted;
            let mut gens: Vec<(u64, Path)> = m
                .sstables
                .iter()
                .filter(|t| t.generation > after && t.generation <= upto)
                .map(|t| (t.generation, shard_base_path(&base_path, shard).join(t.path.as_str())))
                .collect();
            gens.sort_by_key(|(g, _)| *g);
            remove_generations(&store, &gens, &budget, *shard, &mut work).await?;
            // 4. The rows of WAL entries up to the floor (the entry at the floor is covered
            // by a flush too).
            let floor = floors.get(&id).copied().unwrap_or(0);
            empty_wal(&store, &base_path, *shard, floor, &budget, &mut work).await?;
        }
        Ok::<_, Error>(())
    };
    let outcome = tokio::time::timeout_at(work_until, steps).await;
    let mut report = GcReport::default()
        .with_objects_deleted(work.deleted)
        .with_bytes_reclaimed(work.bytes);
    // Record how far each shard got, in one commit, also when the steps failed or ran out
    // of time: the next pass starts there.
    let mut progress: Vec<(String, String)> = Vec::new();
    for shard in &order {
        let (m, r, id) = (&manifests[shard], work.shards[shard], ShardId(*shard));
        let upto = folded.get(shard).copied().unwrap_or(0);
        let candidates = m
            .sstables
            .iter()
            .filter(|t| t.generation > r.gen_deleted && t.generation <= upto)
            .count() as u64;
        report.objects_pending += candidates.saturating_sub(r.gens_visited) + r.gens_left;
        let floor = floors.get(&id).copied().unwrap_or(0);
        report.objects_pending += (floor + 1).saturating_sub(r.wal_emptied);
        if r.gen_deleted > gen_deleted.get(&id).copied().unwrap_or(0) {
            progress.push((format!("{GEN_DELETED_PREFIX}{shard}"), r.gen_deleted.to_string()));
        }
        if r.wal_emptied > emptied.get(&id).copied().unwrap_or(1).max(1) {
            progress.push((format!("{EMPTIED_PREFIX}{shard}"), r.wal_emptied.to_string()));
        }
    }
    let committed = if progress.is_empty() {
        Ok(())
    } else {
        base.update_config(progress).await.map(|_| ()).map_err(gc_err)
    };
    // The steps' error first: it is what stopped them.
    let stopped = match outcome {
        Ok(steps) => {
            steps?;
            committed?;
            ""
        }
        Err(_) => {
            committed?;
            report.objects_pending = report.objects_pending.max(1);
            " (stopped at half the deadline)"
        }
    };
    // 5. Base-table versions superseded before the settled one, and the files only they use:
    // at most `max_objects / 8` versions (and at least a few, more than a pass commits) past
    // the oldest, so that a long history is cleaned over several passes.
    let oldest = refs.first().map_or(settled_version, |r| r.version);
    let per_pass = (opts.max_objects / 8).max(MIN_VERSIONS_PER_PASS);
    let before = settled_version.min(oldest.saturating_add(per_pass));
    report.objects_pending += settled_version - before;
    let mut cleaned = 0;
    if oldest < before {
        let policy = CleanupPolicy {
            before_timestamp: Some(cutoff),
            before_version: Some(before),
            error_if_tagged_old_versions: false,
            ..CleanupPolicy::default()
        };
        let removed = base.cleanup_with_policy(policy).await.map_err(gc_err)?;
        cleaned = removed.old_versions;
        report.objects_deleted += removed.old_versions
            + removed.data_files_removed
            + removed.transaction_files_removed
            + removed.index_files_removed
            + removed.deletion_files_removed;
        report.bytes_reclaimed += removed.bytes_removed;
    }
    report.note = format!(
        "lance: folded generations deleted and WAL entries up to the floors of version {settled_version} \
         emptied{stopped}; {cleaned} old versions cleaned up"
    );
    Ok(report)
}

/// Versions a pass may clean up however small its budget: more than a pass commits (two),
/// so that the count falls.
const MIN_VERSIONS_PER_PASS: u64 = 4;

/// The newest version at or before `cutoff`: the latest if it is, else found among `refs`
/// (every stored version, oldest first) by bisection, reading a manifest per step. Versions
/// are committed in order, so their timestamps rise with them; were a clock to step back,
/// bisection finds an older version at or before the cutoff, never a younger one.
async fn settled(base: &Dataset, refs: &[VersionRef], cutoff: chrono::DateTime<Utc>) -> Result<Option<Dataset>> {
    if base.version().timestamp <= cutoff {
        return Ok(Some(base.clone()));
    }
    let (mut lo, mut hi) = (0, refs.len());
    let mut found = None;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match base.checkout_version(refs[mid].version).await {
            Ok(ds) if ds.version().timestamp <= cutoff => {
                found = Some(ds);
                lo = mid + 1;
            }
            Ok(_) => hi = mid,
            // Cleaned up meanwhile: older than anything still there.
            Err(e)
                if e.is_not_found()
                    || matches!(
                        e,
                        lance::Error::DatasetNotFound { .. } | lance::Error::VersionNotFound { .. }
                    ) =>
            {
                lo = mid + 1
            }
            Err(e) => return Err(gc_err(e)),
        }
    }
    Ok(found)
}

/// Delete the directories of `gens` (one shard's folded generations past those already
/// deleted, oldest first), several at once, within `budget`, advancing the shard's
/// `gen_deleted` over the prefix deleted whole.
async fn remove_generations(
    store: &Arc<ObjectStore>,
    gens: &[(u64, Path)],
    budget: &Arc<Budget>,
    shard: Uuid,
    work: &mut Work,
) -> Result<()> {
    // Owned items and handles: borrowed ones trip the compiler's higher-ranked lifetime check
    // inside `async_trait` futures.
    let mut results = futures::stream::iter(gens.to_vec())
        .map(|(generation, dir)| {
            // Taken in order, as each generation is started: one unit for its listing.
            let reserved = budget.take(1) == 1;
            let (store, budget) = (store.clone(), budget.clone());
            async move {
                if !reserved {
                    return Ok(None);
                }
                remove_all(&store, &dir, &budget).await.map(|r| Some((generation, r)))
            }
        })
        .buffered(crate::tiers::READ_WINDOW);
    let mut whole = true;
    while let Some(done) = results.next().await {
        let Some((generation, (n, bytes, left))) = done? else {
            break;
        };
        work.deleted += n;
        work.bytes += bytes;
        let r = work.shards.get_mut(&shard).expect("every shard has its entry");
        r.gens_visited += 1;
        r.gens_left += left;
        whole &= left == 0;
        if whole {
            r.gen_deleted = generation;
            // Counted by `gen_deleted` from now on.
            r.gens_visited -= 1;
        }
    }
    Ok(())
}

/// Delete every object under `dir`, its listing paid for already, within `budget`.
/// Returns (deleted, bytes, left over).
async fn remove_all(store: &Arc<ObjectStore>, dir: &Path, budget: &Budget) -> Result<(u64, u64, u64)> {
    let mut objects: Vec<object_store::ObjectMeta> =
        store.list(Some(dir.clone())).try_collect().await.map_err(gc_err)?;
    // The dataset's manifests first: a half-deleted generation then no longer opens as a
    // dataset with missing files (nobody opens a folded one, but a listing might).
    objects.sort_by_key(|o| !o.location.as_ref().contains("/_versions/"));
    let found = objects.len() as u64;
    let take = if found == 0 { 0 } else { 1 + budget.take(found - 1) };
    let take = usize::try_from(take).unwrap_or(usize::MAX).min(objects.len());
    let bytes: u64 = objects[..take].iter().map(|o| o.size).sum();
    let paths: Vec<Path> = objects[..take].iter().map(|o| o.location.clone()).collect();
    remove(store, paths).await?;
    Ok((take as u64, bytes, found - take as u64))
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

/// Empty a shard's WAL entries from where earlier passes stopped up to and including
/// `floor` that hold rows, several at once, within `budget` (a unit per entry read): each
/// is overwritten by an entry of the same epoch without rows (see the module docs).
/// Advances the shard's `wal_emptied` as each entry is done, in order.
async fn empty_wal(
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: Uuid,
    floor: u64,
    budget: &Arc<Budget>,
    work: &mut Work,
) -> Result<()> {
    let dir = shard_wal_path(base_path, &shard);
    let from = work.shards[&shard].wal_emptied;
    let mut results = futures::stream::iter(from..=floor)
        .map(|position| {
            let reserved = budget.take(1) == 1;
            let path = dir.clone().join(wal_entry_filename(position));
            let store = store.clone();
            async move {
                if !reserved {
                    return Ok(None);
                }
                empty_entry(&store, &path).await.map(|r| Some((position, r)))
            }
        })
        .buffered(crate::tiers::READ_WINDOW);
    while let Some(done) = results.next().await {
        let Some((position, freed)) = done? else { break };
        if let Some(bytes) = freed {
            work.deleted += 1;
            work.bytes += bytes;
        }
        work.shards
            .get_mut(&shard)
            .expect("every shard has its entry")
            .wal_emptied = position + 1;
    }
    Ok(())
}

/// Empty one WAL entry if it holds rows. Returns the bytes freed, `None` when there was
/// nothing to empty (no rows, or a hole: an entry never completed).
async fn empty_entry(store: &Arc<ObjectStore>, path: &Path) -> Result<Option<u64>> {
    let data = match store.inner.get(path).await {
        Ok(d) => d.bytes().await.map_err(|e| gc_err(e.into()))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(gc_err(e.into())),
    };
    let Some(empty) = without_rows(&data)? else {
        return Ok(None);
    };
    store.put(path, &empty).await.map_err(gc_err)?;
    Ok(Some((data.len() as u64).saturating_sub(empty.len() as u64)))
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

/// A string literal of a Lance filter: single quotes, doubled inside.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The filter of the rows of `ids` (`(namespace, id)`: the bot, or `""` for the whole store)
/// whose body or metadata is still stored.
fn unerased_rows_of(ids: &[(String, String)]) -> String {
    let mut by_bot: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
    for (namespace, id) in ids {
        by_bot.entry(namespace).or_default().push(literal(id));
    }
    let of: Vec<String> = by_bot
        .into_iter()
        .map(|(namespace, ids)| match namespace {
            "" => format!("{ID} IN ({})", ids.join(", ")),
            bot => format!("({BOT_ID} = {} AND {ID} IN ({}))", literal(bot), ids.join(", ")),
        })
        .collect();
    format!(
        "({}) AND ({BODY_TEXT} IS NOT NULL OR {BODY_BYTES} IS NOT NULL OR {METADATA} IS NOT NULL)",
        of.join(" OR ")
    )
}

/// One purge pass: fold what can be folded, erase body and metadata of the base table's
/// rows of up to `max_ids` tombstoned ids, and rewrite the fragments that held them, so that
/// the old bytes are only in files of superseded versions (which `gc` deletes).
pub(crate) async fn purge(shared: &Arc<Shared>, opts: &PurgeOptions) -> Result<PurgeReport> {
    // Rows of generations not yet folded would survive in them: fold first.
    for _ in 0..64 {
        let r = crate::compact::compact(shared, &ctxlog_core::CompactOptions::default()).await?;
        if r.generations_remaining == 0 {
            break;
        }
    }
    let base = shared.latest().await?;
    // An id is one record in its namespace (rule 6): its bot in a store of format 3, so a
    // tombstone erases its own bot's record and never another bot's of the same id.
    let scope = crate::format::id_scope(shared).await?;
    let mut tombstoned: Vec<(String, String)> = column_pairs(&base, BOT_ID, ID, &format!("{KIND} = 1"))
        .await?
        .into_iter()
        .map(|(bot, id)| (scope.namespace(&bot).to_string(), id))
        .collect();
    tombstoned.sort();
    tombstoned.dedup();
    if tombstoned.is_empty() {
        return Ok(PurgeReport::default()
            .with_erased(true)
            .with_note("lance: no tombstoned id"));
    }
    let mut pending = Vec::new();
    for chunk in tombstoned.chunks(IDS_PER_STATEMENT) {
        let rows = column_pairs(&base, BOT_ID, ID, &unerased_rows_of(chunk)).await?;
        pending.extend(
            rows.into_iter()
                .map(|(bot, id)| (scope.namespace(&bot).to_string(), id)),
        );
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
    Ok(PurgeReport::default()
        .with_ids_purged(take as u64)
        .with_entries_purged(erased_entries)
        .with_ids_remaining((pending.len() - take) as u64)
        .with_erased(false)
        .with_note(
            "lance: base-table rows erased and their fragments rewritten; older copies (superseded \
               versions, folded generations, WAL entries) go with `gc` after its grace period",
        ))
}

/// The values of string columns `first` and `second` of the rows matching `filter`.
async fn column_pairs(ds: &Dataset, first: &str, second: &str, filter: &str) -> Result<Vec<(String, String)>> {
    let mut scan = ds.scan();
    scan.project(&[first, second]).map_err(purge_err)?;
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
        let col = |i: usize, name: &str| {
            b.column(i)
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .ok_or_else(|| Error::Corrupt {
                    shard: None,
                    what: format!("column `{name}` is not a string column"),
                })
        };
        let (a, z) = (col(0, first)?, col(1, second)?);
        out.extend(
            a.iter()
                .zip(z.iter())
                .filter_map(|(a, z)| Some((a?.to_string(), z?.to_string()))),
        );
    }
    Ok(out)
}
