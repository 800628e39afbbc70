//! The projector's source: the index columns of every tier into the shared projection
//! index, each row with where to fetch it again; then, per refresh, each shard's WAL past
//! where the last one stopped (every entry passes through the WAL). Up to a shard's floor gc
//! may have emptied the WAL (`reclaim.rs`): a reader that is behind it reads that shard
//! whole instead, and a row whose pinned place is gone is found again by its key.
//!
//! A table row's place is a source number and a row address. The numbers index the cursor's
//! source list, which only grows between first scans: a read registers its datasets before
//! it applies a row under their numbers, and a first scan starts from an empty index and
//! cursor. So a place always names the dataset its row was read from; and a fetch checks
//! that each row it returns is the entry indexed there.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use ctxlog_core::backend::index::{IndexRow, ProjectionIndex, RowRef};
use ctxlog_core::backend::projector::{CatchUp, IndexSource, SnapshotBlobs};
use ctxlog_core::backend::snapshot::Rejected;
use ctxlog_core::{Entry, Error, OrderKey, Result, ShardId, StoreOptions, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::ProjectionRequest;

use crate::reclaim;
use crate::schema::{Columns, INDEX_COLUMNS};
use crate::store::Shared;
use crate::tiers::{READ_WINDOW, Rows, Tiers, Walk, Walked, open_sources, read_err, read_tails, tiers, wal_rows, walk};
use crate::wal::{WalEntry, read_entry};

/// Where an entry can be fetched from, kept by the index with each put as a [`RowRef`].
#[derive(Clone, Copy, Debug)]
enum RowPlace {
    /// A row of source dataset `source` (pinned at the version scanned).
    Table { source: u32, row_id: u64 },
    /// Row `row` of batch `batch` of the entry's shard's WAL entry at `position`.
    Wal { position: u64, batch: u32, row: u32 },
}

const WAL_TAG: u64 = 1 << 63;

/// Rows wanted from one WAL entry: (output slot, batch, row).
type WalSlots = Vec<(usize, u32, u32)>;

impl RowPlace {
    fn to_ref(self) -> RowRef {
        match self {
            RowPlace::Table { source, row_id } => RowRef(u64::from(source), row_id),
            RowPlace::Wal { position, batch, row } => {
                RowRef(WAL_TAG | position, (u64::from(batch) << 32) | u64::from(row))
            }
        }
    }

    fn of(r: RowRef) -> Self {
        if r.0 & WAL_TAG != 0 {
            RowPlace::Wal {
                position: r.0 & !WAL_TAG,
                batch: (r.1 >> 32) as u32,
                row: r.1 as u32,
            }
        } else {
            RowPlace::Table {
                source: r.0 as u32,
                row_id: r.1,
            }
        }
    }
}

/// What the projector's source remembers between refreshes.
#[derive(Default)]
pub(crate) struct Cursor {
    scanned: bool,
    /// Per shard, the next WAL position to read.
    pub(crate) wal_next: HashMap<ShardId, u64>,
    /// Datasets rows were scanned from, pinned at the version scanned.
    pub(crate) sources: Vec<Dataset>,
    /// The base table version the first scan started from.
    started: Option<u64>,
}

impl Cursor {
    /// The cursor of a first scan that a snapshot saved (`snapshots::resume_cursor`).
    pub(crate) fn resumed(wal_next: HashMap<ShardId, u64>, sources: Vec<Dataset>) -> Self {
        Cursor {
            scanned: true,
            wal_next,
            sources,
            started: None,
        }
    }
}

pub(crate) struct LanceIndex {
    shared: Arc<Shared>,
}

impl LanceIndex {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        LanceIndex { shared }
    }
}

/// Apply one batch of a walk to the index; table sources are numbered from `first_source`.
fn apply(rows: Rows<'_>, first_source: u32, index: &mut ProjectionIndex, done: &mut CatchUp) -> Result<()> {
    each_row(rows, first_source, |row| {
        done.read += 1;
        if index.apply(row) {
            done.applied += 1;
        }
    })
}

/// Hand every row of one batch of a walk to `sink`; table sources are numbered from
/// `first_source`.
fn each_row(rows: Rows<'_>, first_source: u32, mut sink: impl FnMut(IndexRow<'_>)) -> Result<()> {
    let batch = rows.batch();
    let cols = Columns::new(batch)?;
    let view = cols.index_view()?;
    let row_ids = match rows {
        Rows::Table { .. } => Some(crate::schema::row_ids(batch)?),
        Rows::Wal { .. } => None,
    };
    for i in 0..cols.len() {
        if cols.is_lance_tombstone(i) {
            continue;
        }
        let place = match (&rows, row_ids) {
            (Rows::Table { source, .. }, Some(ids)) => RowPlace::Table {
                source: first_source + source,
                row_id: ids.value(i),
            },
            (Rows::Wal { position, batch_no, .. }, _) => RowPlace::Wal {
                position: *position,
                batch: *batch_no,
                row: i as u32,
            },
            (Rows::Table { .. }, None) => unreachable!("table rows come with row ids"),
        };
        let mut row = view.row(i)?;
        row.at = place.to_ref();
        sink(row);
    }
    Ok(())
}

const HOW: Walk<'static> = Walk {
    columns: Some(&INDEX_COLUMNS),
    row_ids: true,
};

#[async_trait]
impl IndexSource for LanceIndex {
    type Cursor = Cursor;

    async fn catch_up(&self, cursor: &mut Cursor, index: &mut ProjectionIndex) -> Result<CatchUp> {
        let shared = &self.shared;
        let mut done = CatchUp::default();
        if !cursor.scanned {
            // First scan: the index columns of every tier, into an empty index and cursor —
            // whatever an earlier first scan that failed or was cancelled left behind (rows
            // numbered in a source list the new scan replaces) is dropped, never mixed in.
            *cursor = Cursor::default();
            *index = ProjectionIndex::scoped(index.scope());
            let mut attempt = 1;
            let behind = loop {
                match first_scan(shared, cursor, index, &mut done).await {
                    Ok(behind) => break behind,
                    // Rule 15: gc may delete what the version this scan started from names
                    // (a folded generation, a superseded version's files) once its grace
                    // period is over. If the store moved on meanwhile, start again from the
                    // newer version rather than fail or answer with part of the log.
                    Err(e) if attempt < FIRST_SCAN_ATTEMPTS && moved_since(shared, cursor.started).await => {
                        tracing::info!(attempt, error = %e, "the store moved under a first scan; scanning again");
                        *cursor = Cursor::default();
                        *index = ProjectionIndex::scoped(index.scope());
                        done = CatchUp::default();
                        attempt += 1;
                    }
                    Err(e) => {
                        *cursor = Cursor::default();
                        *index = ProjectionIndex::scoped(index.scope());
                        return Err(e);
                    }
                }
            };
            // WAL entries the scan read may have been emptied by a gc that ran meanwhile
            // (their rows are in a generation or the base table the scan did not read):
            // read those shards whole, as a refresh does. Never a partial first scan.
            if let Err(e) = read_whole(shared, cursor, index, &mut done, behind).await {
                *cursor = Cursor::default();
                *index = ProjectionIndex::scoped(index.scope());
                return Err(e);
            }
            cursor.scanned = true;
            return Ok(done);
        }
        // Refresh: the WAL past each known shard's cursor. A shard new since the last scan,
        // or one whose cursor is below its WAL floor (gc may have deleted the entries there:
        // their rows are in generations or the base table), is read whole: its rows in the
        // base table, its generations not folded, its WAL.
        // The latest version and the shard list at once: the list does not depend on the
        // version (each is a round trip on an object store).
        let (store, base_path) = shared.objects().await?;
        let (base, ids) = futures::try_join!(shared.latest(), crate::wal::shard_ids(&store, &base_path, "read"))?;
        let floors = reclaim::floors(&base);
        // gc may empty the WAL up to and including a shard's floor (`reclaim.rs`).
        let below = |s: &ShardId, next: u64| next <= floors.get(s).copied().unwrap_or(0);
        let (known, mut whole): (Vec<ShardId>, Vec<ShardId>) = ids
            .into_iter()
            .map(ShardId)
            .partition(|s| cursor.wal_next.get(s).is_some_and(|n| !below(s, *n)));
        // Known shards' WAL tails at once (a round trip each, most of them empty), applied
        // in shard order.
        let wanted: Vec<(ShardId, u64, u64)> = known.into_iter().map(|s| (s, cursor.wal_next[&s], 0)).collect();
        let read = read_tails(&store, &base_path, wanted.clone()).await?;
        // A gc that raised a floor while the tails were read may have deleted entries they
        // expected (a missing entry reads as the end): such shards are read whole.
        let floors = if read.is_empty() {
            floors
        } else {
            reclaim::floors(&shared.latest().await?)
        };
        for ((shard, next, entries), (_, from, _)) in read.into_iter().zip(wanted) {
            for rows in entries.iter().flat_map(wal_rows) {
                apply(rows, 0, index, &mut done)?;
            }
            if from <= floors.get(&shard).copied().unwrap_or(0) {
                whole.push(shard);
            } else {
                cursor.wal_next.insert(shard, next);
            }
        }
        read_whole(shared, cursor, index, &mut done, whole).await?;
        Ok(done)
    }

    async fn fetch(&self, cursor: &Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        match self.fetch_pinned(cursor, keys).await {
            Ok(entries) => Ok(entries),
            // What the index pinned may be gone (gc deleted a folded generation, a WAL entry
            // below its floor, a superseded version's files), or — never expected — hold
            // another entry than the one indexed there: find the rows again by key.
            Err(pinned) => self.fetch_by_key(keys).await.map_err(|_| pinned),
        }
    }

    fn options(&self) -> &StoreOptions {
        &self.shared.options
    }

    async fn id_scope(&self) -> Result<ctxlog_core::IdScope> {
        crate::format::id_scope(&self.shared).await
    }

    fn save_cursor(&self, cursor: &Cursor) -> Vec<u8> {
        crate::snapshots::save_cursor(&cursor.wal_next, &cursor.sources)
    }

    async fn resume_cursor(&self, saved: &[u8]) -> std::result::Result<Cursor, Rejected> {
        crate::snapshots::resume_cursor(&self.shared, saved)
            .await
            .map(|(wal_next, sources)| Cursor::resumed(wal_next, sources))
    }
}

#[async_trait]
impl SnapshotBlobs for LanceIndex {
    async fn store_identity(&self, create: bool) -> Result<Option<String>> {
        crate::snapshots::identity(&self.shared, create).await
    }

    async fn snapshot_names(&self) -> Result<Vec<String>> {
        crate::snapshots::names(&self.shared).await
    }

    async fn read_snapshot(&self, name: &str) -> Result<Option<Vec<u8>>> {
        crate::snapshots::read(&self.shared, name).await
    }

    async fn put_snapshot(&self, bytes: Vec<u8>) -> Result<()> {
        crate::snapshots::put(&self.shared, bytes).await
    }
}

/// Most times a first scan starts again because the store moved under it.
const FIRST_SCAN_ATTEMPTS: u32 = 3;

/// Most times a shard is read whole again because gc raised its floor during the read.
const WHOLE_READ_ATTEMPTS: u32 = 5;

/// One first scan into an empty index and cursor. Returns the shards whose WAL the scan
/// read from below the floor gc has set since (see `read_whole`).
async fn first_scan(
    shared: &Shared,
    cursor: &mut Cursor,
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
) -> Result<Vec<ShardId>> {
    let t = tiers(shared, None).await?;
    cursor.started = Some(t.base.version().version);
    let sources = open_sources(shared, &t).await?;
    // Make room for every entry at once: the datasets know their row counts; the WAL tails
    // are small.
    let mut rows = 0;
    for ds in &sources {
        rows += ds.count_rows(None).await.map_err(read_err)?;
    }
    index.reserve(rows);
    // The sources are the cursor's before a row is applied under their numbers (the cursor
    // and index are empty here: they are numbered from 0).
    cursor.sources = sources;
    let walked = walk_applying(&t, &cursor.sources, index, done).await?;
    cursor.wal_next.extend(walked.wal_next);
    below_floor(shared, &t).await
}

/// One batch of a walk, owned (its columns are shared, not copied), on its way to the thread
/// that applies it.
struct Batch {
    batch: RecordBatch,
    place: Place,
}

/// Where a queued batch comes from ([`Rows`] without the borrow).
enum Place {
    Table { source: u32 },
    Wal { position: u64, batch_no: u32 },
}

/// Rows applied on threads of their own, one per part of the index, while the walk goes on
/// reading and decoding (on the runtime's threads): a first scan costs about the longer of
/// the two, not their sum, and applying uses every core. The index is moved to those
/// threads and back; if the walk is cancelled, it stays empty.
async fn walk_applying(
    t: &Tiers,
    sources: &[Dataset],
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
) -> Result<Walked> {
    let (queue, batches) = std::sync::mpsc::sync_channel::<Batch>(APPLY_QUEUE);
    let mut idx = std::mem::take(index);
    let applier = tokio::task::spawn_blocking(move || {
        // One thread per part of the index, each keeping the rows of its part. Stops at the
        // first error, dropping `batches`: the walk's next send then fails.
        let threads = idx.parts();
        let (counts, applied) = idx.apply_in_parallel(threads, batches, |b, applier| {
            let rows = match b.place {
                Place::Table { source } => Rows::Table {
                    batch: &b.batch,
                    source,
                },
                Place::Wal { position, batch_no } => Rows::Wal {
                    batch: &b.batch,
                    position,
                    batch_no,
                },
            };
            each_row(rows, 0, |row| applier.apply(row))
        });
        (idx, counts, applied)
    });
    let walked = walk(t, sources, HOW, |r| {
        let place = match r {
            Rows::Table { source, .. } => Place::Table { source },
            Rows::Wal { position, batch_no, .. } => Place::Wal { position, batch_no },
        };
        // A bounded queue: a walk that outpaces the applier waits for it here.
        queue
            .send(Batch {
                batch: r.batch().clone(),
                place,
            })
            .map_err(|_| applier_error("the thread applying rows stopped".into()))
    })
    .await;
    drop(queue);
    let (idx, counts, applied) = applier
        .await
        .map_err(|e| applier_error(format!("the thread applying rows failed: {e}")))?;
    *index = idx;
    *done += counts;
    // An apply error explains a walk that stopped early: report it first.
    applied?;
    walked
}

/// Batches queued between a first scan's walk and the thread applying them.
const APPLY_QUEUE: usize = 8;

fn applier_error(what: String) -> Error {
    Error::Backend {
        backend: "lance",
        op: "refresh",
        shard: None,
        written: Written::Nothing,
        source: std::io::Error::other(what).into(),
    }
}

/// The shards of `t` whose WAL reads began at or below the floor the store has now: gc may have
/// emptied entries they read.
async fn below_floor(shared: &Shared, t: &Tiers) -> Result<Vec<ShardId>> {
    let floors = reclaim::floors(&shared.latest().await?);
    Ok(t.shards
        .iter()
        .filter(|s| s.wal_from <= floors.get(&s.shard).copied().unwrap_or(0))
        .map(|s| s.shard)
        .collect())
}

/// Whether the base table has a newer version than the one a first scan started from.
async fn moved_since(shared: &Shared, started: Option<u64>) -> bool {
    match (started, shared.latest().await) {
        (Some(v), Ok(latest)) => latest.version().version != v,
        _ => false,
    }
}

/// Read `shards` whole — their rows in the base table, their generations not folded, their
/// WAL — from the store as it is now. Again (bounded) for a shard whose floor gc raised past
/// where this read began its WAL.
async fn read_whole(
    shared: &Shared,
    cursor: &mut Cursor,
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
    shards: Vec<ShardId>,
) -> Result<()> {
    for shard in shards {
        let mut attempt = 1;
        loop {
            let mut t = tiers(shared, Some(shard)).await?;
            // A shard compaction never folded has no row in the base table: do not scan the
            // base table's shard column for it (what a new writer would cost every reader).
            t.read_base = t.folded.contains_key(&shard.0);
            // The sources join the cursor before a row is applied under their numbers: if
            // the walk fails or is cancelled part way, the rows it applied still point into
            // the datasets they were read from, and the next read's sources are numbered
            // after them. A number never names two datasets in one index's lifetime (only
            // a first scan, which starts from an empty index, numbers from 0 again).
            let sources = open_sources(shared, &t).await?;
            let first = cursor.sources.len();
            cursor.sources.extend(sources);
            let walked = walk(&t, &cursor.sources[first..], HOW, |r| {
                apply(r, first as u32, index, done)
            })
            .await?;
            cursor.wal_next.extend(walked.wal_next);
            if below_floor(shared, &t).await?.is_empty() {
                break;
            }
            if attempt == WHOLE_READ_ATTEMPTS {
                // Never a partial view: fail, and let the caller refresh again.
                return Err(Error::Backend {
                    backend: "lance",
                    op: "refresh",
                    shard: Some(shard),
                    written: Written::Nothing,
                    source: std::io::Error::other(format!(
                        "gc raised this shard's WAL floor {WHOLE_READ_ATTEMPTS} times while it was read"
                    ))
                    .into(),
                });
            }
            attempt += 1;
        }
    }
    Ok(())
}

impl LanceIndex {
    /// The entries of `keys` from the store as it is now, by `(shard, seq, epoch)`.
    async fn fetch_by_key(&self, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        let mut by_shard: HashMap<ShardId, u64> = HashMap::new();
        for (k, _) in keys {
            let low = by_shard.entry(k.shard).or_insert(k.seq);
            *low = (*low).min(k.seq);
        }
        let mut found: HashMap<OrderKey, Entry> = HashMap::new();
        for (shard, low) in by_shard {
            for e in crate::entries::read_shard(&self.shared, shard, low - 1, usize::MAX).await? {
                found.insert(e.key(), e);
            }
        }
        keys.iter()
            .map(|(k, _)| {
                found.remove(k).ok_or_else(|| Error::Corrupt {
                    shard: Some(k.shard),
                    what: format!("entry seq {} epoch {} is indexed but missing", k.seq, k.epoch),
                })
            })
            .collect()
    }

    /// The entries of `keys` from where the index saw them.
    async fn fetch_pinned(&self, cursor: &Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        let mut out: Vec<Option<Entry>> = vec![None; keys.len()];
        // Group by where the rows are, so that each dataset gets one `take` and each WAL
        // entry one read.
        let mut takes: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
        let mut wal: HashMap<(ShardId, u64), WalSlots> = HashMap::new();
        for (slot, (k, at)) in keys.iter().enumerate() {
            match RowPlace::of(*at) {
                RowPlace::Table { source, row_id } => takes.entry(source).or_default().push((slot, row_id)),
                RowPlace::Wal { position, batch, row } => {
                    wal.entry((k.shard, position)).or_default().push((slot, batch, row))
                }
            }
        }
        // Each dataset's take and each WAL entry's read is one request (or a few) that no
        // other depends on: all are issued at once, up to a window.
        let shared = &self.shared;
        let taken: Vec<(Vec<(usize, u64)>, RecordBatch)> = futures::stream::iter(takes)
            .map(|(source, rows)| async move {
                let ds = cursor.sources.get(source as usize).ok_or_else(|| {
                    misplaced(shared, None, format!("an indexed entry names unknown source {source}"))
                })?;
                let ids: Vec<u64> = rows.iter().map(|r| r.1).collect();
                // A row that cannot be in the dataset: never asked of Lance, which may read
                // past a fragment's end.
                if let Some(id) = not_a_row_of(ds, &ids) {
                    return Err(misplaced(
                        shared,
                        None,
                        format!("an indexed entry names row {id} of source {source}, which has no such row"),
                    ));
                }
                let projection = ProjectionRequest::from(Arc::new(ds.schema().clone()));
                let batch = ds.take_rows(&ids, projection).await.map_err(read_err)?;
                if batch.num_rows() != ids.len() {
                    return Err(misplaced(
                        shared,
                        None,
                        format!(
                            "{} rows taken from source {source} for {} indexed entries",
                            batch.num_rows(),
                            ids.len()
                        ),
                    ));
                }
                Ok::<_, Error>((rows, batch))
            })
            .buffer_unordered(READ_WINDOW)
            .try_collect()
            .await?;
        for (rows, batch) in taken {
            let cols = Columns::new(&batch)?;
            for (i, (slot, _)) in rows.iter().enumerate() {
                out[*slot] = Some(cols.entry(i)?);
            }
        }
        if !wal.is_empty() {
            let base = self.shared.latest().await?;
            let (store, base_path) = self.shared.io(&base).await?;
            let read: Vec<(ShardId, u64, WalSlots, WalEntry)> = futures::stream::iter(wal)
                .map(|((shard, position), rows)| {
                    let (store, base_path) = (&store, &base_path);
                    async move {
                        let entry = read_entry(store, base_path, shard, position, "read the WAL", Written::Nothing)
                            .await?
                            .ok_or_else(|| Error::Corrupt {
                                shard: Some(shard),
                                what: format!("WAL entry {position} vanished"),
                            })?;
                        Ok::<_, Error>((shard, position, rows, entry))
                    }
                })
                .buffer_unordered(READ_WINDOW)
                .try_collect()
                .await?;
            for (shard, position, rows, entry) in read {
                for (slot, b, i) in rows {
                    let batch = entry
                        .batches
                        .get(b as usize)
                        .filter(|batch| (i as usize) < batch.num_rows())
                        .ok_or_else(|| Error::Corrupt {
                            shard: Some(shard),
                            what: format!("WAL entry {position} changed"),
                        })?;
                    out[slot] = Some(Columns::new(batch)?.entry(i as usize)?);
                }
            }
        }
        // Every row must be the entry the index holds at its location: a location that
        // points elsewhere (into another dataset, at another row) is never answered with
        // what happens to lie there.
        out.into_iter()
            .zip(keys)
            .map(|(e, (k, _))| match e {
                Some(e) if e.key() == *k => Ok(e),
                Some(e) => Err(misplaced(
                    shared,
                    Some(k.shard),
                    format!(
                        "the row indexed as entry seq {} epoch {} is entry seq {} epoch {} of shard {}",
                        k.seq, k.epoch, e.seq, e.epoch, e.shard
                    ),
                )),
                None => Err(Error::Corrupt {
                    shard: Some(k.shard),
                    what: format!("entry seq {} epoch {} could not be read", k.seq, k.epoch),
                }),
            })
            .collect()
    }
}

/// The first of `ids` that cannot be a row of `ds` at its version: its fragment is not
/// there, or its offset is past the fragment's rows. Only a location that points into
/// another dataset names one.
fn not_a_row_of(ds: &Dataset, ids: &[u64]) -> Option<u64> {
    if ds.manifest().uses_stable_row_ids() {
        // Row ids are no addresses there; Lance looks them up itself.
        return None;
    }
    let rows: HashMap<u64, Option<usize>> = ds.fragments().iter().map(|f| (f.id, f.physical_rows)).collect();
    ids.iter().copied().find(|id| match rows.get(&(id >> 32)) {
        None => true,
        Some(n) => n.is_some_and(|n| (id & u64::from(u32::MAX)) >= n as u64),
    })
}

/// The error of a fetch that found, where the index pinned an entry, something else (the
/// caller then finds the entries by key). Never expected: logged, and counted for tests.
fn misplaced(shared: &Shared, shard: Option<ShardId>, what: String) -> Error {
    tracing::warn!(what = %what, "an indexed location does not hold the entry indexed there; reading by key");
    #[cfg(feature = "testing")]
    {
        *MISPLACED
            .get_or_init(Default::default)
            .lock()
            .expect("not poisoned")
            .entry(shared.uri.clone())
            .or_default() += 1;
    }
    #[cfg(not(feature = "testing"))]
    let _ = shared;
    Error::Corrupt { shard, what }
}

/// Per store URI, how many fetches found another row where the index pinned an entry.
#[cfg(feature = "testing")]
static MISPLACED: std::sync::OnceLock<std::sync::Mutex<HashMap<String, u64>>> = std::sync::OnceLock::new();

/// How many fetches of the store at `uri` (as Lance sees it) found another row where the
/// index pinned an entry (`testing::misplaced_rows`).
#[cfg(feature = "testing")]
pub(crate) fn misplaced_rows(uri: &str) -> u64 {
    MISPLACED
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned")
        .get(uri)
        .copied()
        .unwrap_or(0)
}
