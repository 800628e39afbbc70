//! Reading across processes: base table + each shard's flushed generations + each shard's
//! WAL tail.
//!
//! Read order matters. The base table (and, from its MemWAL index, which generations of
//! each shard it already holds) is read first, then each shard's manifest (its flushed
//! generations and the WAL position they cover), then the WAL after that position. A
//! flush that commits in between only adds a generation whose rows are also still in the
//! WAL (MemWAL 14 never trims it), so nothing is missed; rows seen twice have the same key
//! and are applied once.
//!
//! After the first scan, a refresh reads only each shard's WAL past where it stopped:
//! every entry passes through the WAL, which only grows.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use ctxlog_core::engine::{CatchUp, HistoryChecker, HistorySource, IndexSource};
use ctxlog_core::index::{Loc, ProjectionIndex};
use ctxlog_core::{Entry, Error, OrderKey, Result, ShardId, ShardInfo, WriterId, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::ProjectionRequest;
use lance::dataset::mem_wal::{DatasetMemWalExt, ShardManifestStore, WalReadEntry, WalTailer};
use lance_io::object_store::ObjectStore;
use object_store::path::Path;
use uuid::Uuid;

use crate::Inner;
use crate::error::lance_err;
use crate::schema::{Columns, INDEX_COLUMNS, POSITION_COLUMNS, SHARD};

/// WAL entries fetched at once while reading a tail.
const WAL_READ_AHEAD: usize = 16;

fn read_err(e: lance::Error) -> Error {
    lance_err("read", None, Written::Nothing, e)
}

// ---- writer names ---------------------------------------------------------------------

/// Where the writer id of a shard is recorded (MemWAL manifests have no place for it).
fn writer_path(base: &Path, shard: ShardId) -> Path {
    Path::from(format!("{base}/_ctxlog/writers/{shard}"))
}

pub(crate) async fn remember_writer(store: &ObjectStore, base: &Path, shard: ShardId, writer: &WriterId) -> Result<()> {
    store
        .put(&writer_path(base, shard), writer.as_str().as_bytes())
        .await
        .map_err(|e| lance_err("record the writer id", Some(shard), Written::Nothing, e))?;
    Ok(())
}

async fn writer_of(store: &ObjectStore, base: &Path, shard: ShardId) -> Result<String> {
    match store.read_one_all(&writer_path(base, shard)).await {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if crate::error::is_not_found(&e) => Ok(String::from("unknown")),
        Err(e) => Err(read_err(e)),
    }
}

// ---- the tiers --------------------------------------------------------------------------

/// One flushed generation of a shard.
#[derive(Clone, Debug)]
pub(crate) struct Generation {
    pub shard: ShardId,
    pub generation: u64,
    pub uri: String,
}

/// What one shard has beyond the base table.
#[derive(Clone, Debug)]
pub(crate) struct ShardTier {
    pub shard: ShardId,
    pub epoch: u64,
    /// Generations the base table does not hold yet, oldest first.
    pub generations: Vec<Generation>,
    /// Every generation, compacted or not, oldest first.
    pub all_generations: Vec<Generation>,
    /// First WAL position not covered by a flushed generation.
    pub wal_from: u64,
    /// A WAL position known to exist (the tip a writer saw when it opened): a missing
    /// position below it is a hole, not the end.
    pub wal_known: u64,
}

/// A consistent view: the base table at one version and each shard's tiers after it.
pub(crate) struct Tiers {
    pub base: Dataset,
    pub store: Arc<ObjectStore>,
    pub base_path: Path,
    pub shards: Vec<ShardTier>,
}

pub(crate) async fn tiers(inner: &Inner, only: Option<ShardId>) -> Result<Tiers> {
    let base = inner.latest().await?;
    let (store, base_path) = inner.io(&base).await?;
    let compacted: HashMap<Uuid, u64> = base
        .mem_wal_index_details()
        .await
        .map_err(read_err)?
        .map(|d| {
            d.compacted_sstables
                .iter()
                .map(|c| (c.shard_id, c.generation))
                .collect()
        })
        .unwrap_or_default();
    let ids = match only {
        Some(s) => vec![s.0],
        None => base.list_mem_wal_latest_shard_ids().await.map_err(read_err)?,
    };
    let mut shards = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(t) = shard_tier(inner, &store, &base_path, ShardId(id), compacted.get(&id).copied()).await? {
            shards.push(t);
        }
    }
    Ok(Tiers {
        base,
        store,
        base_path,
        shards,
    })
}

async fn shard_tier(
    inner: &Inner,
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: ShardId,
    compacted: Option<u64>,
) -> Result<Option<ShardTier>> {
    // A fresh manifest store per read: `latest()` then scans storage instead of
    // returning a cached position.
    let manifest = ShardManifestStore::new(store.clone(), base_path, shard.0, 2)
        .latest()
        .await
        .map_err(read_err)?;
    let Some(m) = manifest else { return Ok(None) };
    let root = inner.uri.trim_end_matches('/');
    let mut all: Vec<Generation> = m
        .sstables
        .iter()
        .map(|t| Generation {
            shard,
            generation: t.generation,
            uri: format!("{root}/_mem_wal/{}/{}", shard.0, t.path),
        })
        .collect();
    all.sort_by_key(|g| g.generation);
    let floor = compacted.unwrap_or(0);
    Ok(Some(ShardTier {
        shard,
        epoch: m.writer_epoch,
        generations: all.iter().filter(|g| g.generation > floor).cloned().collect(),
        all_generations: all,
        wal_from: m.replay_after_wal_entry_position + 1,
        wal_known: m.wal_entry_position_last_seen,
    }))
}

/// Scan `ds` (projected to `columns`, optionally filtered), calling `f` per batch.
async fn scan_table(
    ds: &Dataset,
    columns: Option<&[&str]>,
    row_ids: bool,
    filter: Option<&str>,
    mut f: impl FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut scan = ds.scan();
    if let Some(cols) = columns {
        scan.project(cols).map_err(read_err)?;
    }
    if let Some(expr) = filter {
        scan.filter(expr).map_err(read_err)?;
    }
    if row_ids {
        scan.with_row_id();
    }
    let mut stream = scan.try_into_stream().await.map_err(read_err)?;
    while let Some(batch) = stream.try_next().await.map_err(read_err)? {
        f(&batch)?;
    }
    Ok(())
}

/// Read a shard's WAL from `from` to its end, fetching `WAL_READ_AHEAD` entries at a time;
/// `f` sees entries in position order. Returns the first position not read (where the next
/// read starts).
///
/// The end is the first missing position with nothing after it. A missing position with an
/// entry after it — later in the same read-ahead window, or at or below `known` (a position
/// known to exist) — is a *hole*: an entry lost or never completed. Reading goes on past it,
/// so that nothing after a hole is hidden and a successor never reuses the seqs of entries
/// written after it; the history checker then reports the seqs the hole took as a gap.
async fn read_wal(
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: ShardId,
    from: u64,
    known: u64,
    mut f: impl FnMut(&WalReadEntry) -> Result<()>,
) -> Result<u64> {
    let tailer = WalTailer::new(store.clone(), base_path.clone(), shard.0);
    let mut next = from;
    loop {
        let start = next;
        let window: Vec<Option<WalReadEntry>> = futures::stream::iter(start..start + WAL_READ_AHEAD as u64)
            .map(|pos| tailer.read_entry(pos))
            .buffered(WAL_READ_AHEAD)
            .try_collect()
            .await
            .map_err(|e| lance_err("read the WAL", Some(shard), Written::Nothing, e))?;
        let last_present = window.iter().rposition(Option::is_some);
        for (i, entry) in window.into_iter().enumerate() {
            let pos = start + i as u64;
            match entry {
                Some(e) => f(&e)?,
                None if last_present.is_some_and(|l| i < l) || pos <= known => {
                    tracing::warn!(%shard, position = pos, "a WAL entry is missing below later entries (a hole); reading on");
                }
                None => return Ok(pos),
            }
        }
        next = start + WAL_READ_AHEAD as u64;
    }
}

/// Rows of `columns` in `ds`, read with a plain scan (the benchmark floor).
pub(crate) async fn count_rows(ds: &Dataset, columns: &[&str]) -> Result<u64> {
    let mut n = 0u64;
    scan_table(ds, Some(columns), false, None, |b| {
        n += b.num_rows() as u64;
        Ok(())
    })
    .await?;
    Ok(n)
}

/// Rows in a shard's WAL tail (the benchmark floor).
pub(crate) async fn count_wal_rows(store: &Arc<ObjectStore>, base_path: &Path, tier: &ShardTier) -> Result<u64> {
    let mut n = 0u64;
    read_wal(store, base_path, tier.shard, tier.wal_from, tier.wal_known, |e| {
        n += e.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        Ok(())
    })
    .await?;
    Ok(n)
}

/// Rows of a WAL entry that are ctxlog entries (not MemWAL's delete markers).
fn wal_rows(entry: &WalReadEntry, mut f: impl FnMut(&Columns<'_>, usize, usize) -> Result<()>) -> Result<()> {
    for (b, batch) in entry.batches.iter().enumerate() {
        let cols = Columns::new(batch)?;
        for i in 0..cols.len() {
            if !cols.is_lance_tombstone(i) {
                f(&cols, b, i)?;
            }
        }
    }
    Ok(())
}

fn table_rows(batch: &RecordBatch, mut f: impl FnMut(&Columns<'_>, usize) -> Result<()>) -> Result<()> {
    let cols = Columns::new(batch)?;
    for i in 0..cols.len() {
        if !cols.is_lance_tombstone(i) {
            f(&cols, i)?;
        }
    }
    Ok(())
}

fn row_ids(batch: &RecordBatch) -> Result<&arrow_array::UInt64Array> {
    use arrow_array::cast::AsArray;
    batch
        .column_by_name("_rowid")
        .and_then(|c| c.as_primitive_opt::<arrow_array::types::UInt64Type>())
        .ok_or_else(|| Error::Corrupt {
            shard: None,
            what: "scan returned no row ids".into(),
        })
}

/// Visit every stored entry (all columns), in any order, repeats possible.
async fn for_each_entry(
    inner: &Inner,
    tiers: &Tiers,
    filter: Option<&str>,
    f: &mut (dyn FnMut(Entry) + Send),
) -> Result<()> {
    scan_table(&tiers.base, None, false, filter, |b| {
        table_rows(b, |c, i| c.entry(i).map(&mut *f))
    })
    .await?;
    for t in &tiers.shards {
        for g in &t.generations {
            let ds = inner.open_dataset(&g.uri).await.map_err(read_err)?;
            scan_table(&ds, None, false, None, |b| {
                table_rows(b, |c, i| c.entry(i).map(&mut *f))
            })
            .await?;
        }
        read_wal(&tiers.store, &tiers.base_path, t.shard, t.wal_from, t.wal_known, |e| {
            wal_rows(e, |c, _, i| c.entry(i).map(&mut *f))
        })
        .await?;
    }
    Ok(())
}

fn shard_filter(shard: ShardId) -> String {
    format!("{SHARD} = '{}'", shard.0)
}

// ---- store-level reads ------------------------------------------------------------------

pub(crate) async fn read_shard(inner: &Inner, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
    let tiers = tiers(inner, Some(shard)).await?;
    let mut out: HashMap<(u64, u64), Entry> = HashMap::new();
    let filter = shard_filter(shard);
    for_each_entry(inner, &tiers, Some(&filter), &mut |e| {
        if e.shard == shard && e.seq > after_seq {
            out.entry((e.seq, e.epoch)).or_insert(e);
        }
    })
    .await?;
    let mut entries: Vec<Entry> = out.into_values().collect();
    entries.sort_by_key(|e| (e.seq, e.epoch));
    entries.truncate(limit);
    Ok(entries)
}

pub(crate) async fn shards(inner: &Inner) -> Result<Vec<ShardInfo>> {
    let tiers = tiers(inner, None).await?;
    let mut out = Vec::new();
    for t in &tiers.shards {
        let mut keys: BTreeSet<(u64, u64)> = BTreeSet::new();
        let filter = shard_filter(t.shard);
        scan_table(&tiers.base, Some(&POSITION_COLUMNS), false, Some(&filter), |b| {
            table_rows(b, |c, i| {
                keys.insert((c.seq(i), c.epoch(i)));
                Ok(())
            })
        })
        .await?;
        for g in &t.generations {
            let ds = inner.open_dataset(&g.uri).await.map_err(read_err)?;
            scan_table(&ds, Some(&POSITION_COLUMNS), false, None, |b| {
                table_rows(b, |c, i| {
                    keys.insert((c.seq(i), c.epoch(i)));
                    Ok(())
                })
            })
            .await?;
        }
        read_wal(&tiers.store, &tiers.base_path, t.shard, t.wal_from, t.wal_known, |e| {
            wal_rows(e, |c, _, i| {
                keys.insert((c.seq(i), c.epoch(i)));
                Ok(())
            })
        })
        .await?;
        out.push(ShardInfo {
            shard: t.shard,
            writer: WriterId::new(writer_of(&tiers.store, &tiers.base_path, t.shard).await?)?,
            epoch: t.epoch,
            last_seq: keys.iter().map(|k| k.0).max().unwrap_or(0),
            entries: keys.len() as u64,
        });
    }
    out.sort_by_key(|s| s.shard);
    Ok(out)
}

/// What a shard holds, for a writer that takes it over.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub last_seq: u64,
    pub max_hlc: u64,
}

/// The highest seq and HLC a shard holds, from what is authoritative whatever was folded
/// or removed: the base table's rows of the shard (what compaction folded, whether or not
/// the generations it folded still exist), the generations not folded yet, and the WAL
/// past what those cover (holes included).
pub(crate) async fn recover(inner: &Inner, shard: ShardId) -> Result<Recovered> {
    let t = tiers(inner, Some(shard)).await?;
    let mut out = Recovered::default();
    let Some(tier) = t.shards.first() else {
        return Ok(out);
    };
    let (mut seq, mut hlc) = (0u64, 0u64);
    let mut see = |c: &Columns<'_>, i: usize| -> Result<()> {
        seq = seq.max(c.seq(i));
        hlc = hlc.max(c.hlc(i)?.0);
        Ok(())
    };
    let filter = shard_filter(shard);
    scan_table(&t.base, Some(&POSITION_COLUMNS), false, Some(&filter), |b| {
        table_rows(b, &mut see)
    })
    .await?;
    for g in &tier.generations {
        let ds = inner.open_dataset(&g.uri).await.map_err(read_err)?;
        scan_table(&ds, Some(&POSITION_COLUMNS), false, None, |b| table_rows(b, &mut see)).await?;
    }
    read_wal(&t.store, &t.base_path, shard, tier.wal_from, tier.wal_known, |e| {
        wal_rows(e, |c, _, i| see(c, i))
    })
    .await?;
    out.last_seq = seq;
    out.max_hlc = hlc;
    Ok(out)
}

// ---- the projector's source -------------------------------------------------------------

/// Where an entry can be fetched from: kept by the index with each put, as a [`Loc`].
#[derive(Clone, Copy, Debug)]
enum Location {
    /// A row of a scanned dataset (the base table or a generation).
    Table { source: u32, row_id: u64 },
    /// Row `row` of batch `batch` of the entry's shard's WAL entry at `position`.
    Wal { position: u64, batch: u32, row: u32 },
}

const WAL_TAG: u64 = 1 << 63;

impl Location {
    fn to_loc(self) -> Loc {
        match self {
            Location::Table { source, row_id } => Loc(u64::from(source), row_id),
            Location::Wal { position, batch, row } => {
                Loc(WAL_TAG | position, (u64::from(batch) << 32) | u64::from(row))
            }
        }
    }

    fn of(loc: Loc) -> Self {
        if loc.0 & WAL_TAG != 0 {
            Location::Wal {
                position: loc.0 & !WAL_TAG,
                batch: (loc.1 >> 32) as u32,
                row: loc.1 as u32,
            }
        } else {
            Location::Table {
                source: loc.0 as u32,
                row_id: loc.1,
            }
        }
    }
}

/// What the projector's source remembers between refreshes.
#[derive(Default)]
pub(crate) struct Cursor {
    scanned: bool,
    /// Per shard, the next WAL position to read.
    wal_next: HashMap<ShardId, u64>,
    /// Datasets rows were scanned from, pinned at the version scanned.
    sources: Vec<Dataset>,
}

pub(crate) struct LanceIndex {
    inner: Arc<Inner>,
}

impl LanceIndex {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        LanceIndex { inner }
    }
}

/// Apply one row to the index, with where it lives (the index keeps the first seen).
fn index_row(
    view: &crate::schema::IndexView<'_, '_>,
    i: usize,
    at: Location,
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
) -> Result<()> {
    let mut row = view.row(i)?;
    row.loc = at.to_loc();
    done.read += 1;
    if index.apply(row) {
        done.applied += 1;
    }
    Ok(())
}

/// Scan a dataset (base table or generation), or the rows `filter` selects, into the
/// index, pinning it as a source.
async fn apply_dataset(
    ds: Dataset,
    filter: Option<&str>,
    cursor: &mut Cursor,
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
) -> Result<()> {
    let source = cursor.sources.len() as u32;
    cursor.sources.push(ds.clone());
    scan_table(&ds, Some(&INDEX_COLUMNS), true, filter, |b| {
        let ids = row_ids(b)?;
        let cols = Columns::new(b)?;
        let view = cols.index_view()?;
        for i in 0..cols.len() {
            if cols.is_lance_tombstone(i) {
                continue;
            }
            let at = Location::Table {
                source,
                row_id: ids.value(i),
            };
            index_row(&view, i, at, index, done)?;
        }
        Ok(())
    })
    .await
}

/// Apply a shard's WAL from `from` (`known`: a position known to exist); returns the next
/// position.
async fn apply_wal(
    tiers_store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: ShardId,
    from: u64,
    known: u64,
    index: &mut ProjectionIndex,
    done: &mut CatchUp,
) -> Result<u64> {
    read_wal(tiers_store, base_path, shard, from, known, |e| {
        wal_rows(e, |c, b, i| {
            let at = Location::Wal {
                position: e.entry_position,
                batch: b as u32,
                row: i as u32,
            };
            index_row(&c.index_view()?, i, at, index, done)
        })
    })
    .await
}

#[async_trait]
impl IndexSource for LanceIndex {
    type Cursor = Cursor;

    async fn catch_up(&self, cursor: &mut Cursor, index: &mut ProjectionIndex) -> Result<CatchUp> {
        let inner = &self.inner;
        let mut done = CatchUp::default();
        if !cursor.scanned {
            // First scan: the index columns of every tier. The cursor only advances after
            // its rows are applied, so a cancelled scan leaves the two consistent.
            let t = tiers(inner, None).await?;
            // Make room for every entry at once: the base table and the generations know
            // their row counts; the WAL tails are small.
            let mut datasets = vec![t.base.clone()];
            for shard in &t.shards {
                for g in &shard.generations {
                    datasets.push(inner.open_dataset(&g.uri).await.map_err(read_err)?);
                }
            }
            let mut rows = 0;
            for ds in &datasets {
                rows += ds.count_rows(None).await.map_err(read_err)?;
            }
            index.reserve(rows);
            let mut datasets = datasets.into_iter();
            let base = datasets.next().expect("the base table");
            apply_dataset(base, None, cursor, index, &mut done).await?;
            for shard in &t.shards {
                for _ in &shard.generations {
                    let ds = datasets.next().expect("opened above, in this order");
                    apply_dataset(ds, None, cursor, index, &mut done).await?;
                }
                let next = apply_wal(
                    &t.store,
                    &t.base_path,
                    shard.shard,
                    shard.wal_from,
                    shard.wal_known,
                    index,
                    &mut done,
                )
                .await?;
                cursor.wal_next.insert(shard.shard, next);
            }
            cursor.scanned = true;
            return Ok(done);
        }
        // Refresh: the WAL past each known shard's cursor; a shard new since the last
        // scan is read whole (all its generations, compacted or not, and its WAL).
        let base = inner.latest().await?;
        let (store, base_path) = inner.io(&base).await?;
        let ids = base.list_mem_wal_latest_shard_ids().await.map_err(read_err)?;
        for id in ids {
            let shard = ShardId(id);
            let (from, known) = match cursor.wal_next.get(&shard) {
                Some(&next) => (next, 0),
                None => {
                    // A shard new since the last scan: its rows the base table holds (if
                    // compaction folded any), its generations not folded yet, its WAL tail.
                    let t = tiers(inner, Some(shard)).await?;
                    let Some(tier) = t.shards.first() else {
                        continue;
                    };
                    apply_dataset(t.base.clone(), Some(&shard_filter(shard)), cursor, index, &mut done).await?;
                    for g in &tier.generations {
                        let ds = inner.open_dataset(&g.uri).await.map_err(read_err)?;
                        apply_dataset(ds, None, cursor, index, &mut done).await?;
                    }
                    (tier.wal_from, tier.wal_known)
                }
            };
            let next = apply_wal(&store, &base_path, shard, from, known, index, &mut done).await?;
            cursor.wal_next.insert(shard, next);
        }
        Ok(done)
    }

    async fn fetch(&self, cursor: &Cursor, keys: &[(OrderKey, Loc)]) -> Result<Vec<Entry>> {
        let mut out: Vec<Option<Entry>> = vec![None; keys.len()];
        // Group by where the rows are, so that each dataset gets one `take` and each WAL
        // entry one read.
        let mut takes: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
        let mut wal: HashMap<(ShardId, u64), Vec<(usize, u32, u32)>> = HashMap::new();
        for (slot, (k, loc)) in keys.iter().enumerate() {
            match Location::of(*loc) {
                Location::Table { source, row_id } => takes.entry(source).or_default().push((slot, row_id)),
                Location::Wal { position, batch, row } => {
                    wal.entry((k.shard, position)).or_default().push((slot, batch, row))
                }
            }
        }
        for (source, rows) in takes {
            let ds = cursor.sources.get(source as usize).ok_or_else(|| Error::Corrupt {
                shard: None,
                what: format!("an indexed entry names unknown source {source}"),
            })?;
            let ids: Vec<u64> = rows.iter().map(|r| r.1).collect();
            let projection = ProjectionRequest::from(Arc::new(ds.schema().clone()));
            let batch = ds.take_rows(&ids, projection).await.map_err(read_err)?;
            let cols = Columns::new(&batch)?;
            for (i, (slot, _)) in rows.iter().enumerate() {
                out[*slot] = Some(cols.entry(i)?);
            }
        }
        if !wal.is_empty() {
            let base = self.inner.latest().await?;
            let (store, base_path) = self.inner.io(&base).await?;
            for ((shard, position), rows) in wal {
                let entry = WalTailer::new(store.clone(), base_path.clone(), shard.0)
                    .read_entry(position)
                    .await
                    .map_err(read_err)?
                    .ok_or_else(|| Error::Corrupt {
                        shard: Some(shard),
                        what: format!("WAL entry {position} vanished"),
                    })?;
                for (slot, b, i) in rows {
                    let batch = entry.batches.get(b as usize).ok_or_else(|| Error::Corrupt {
                        shard: Some(shard),
                        what: format!("WAL entry {position} changed"),
                    })?;
                    out[slot] = Some(Columns::new(batch)?.entry(i as usize)?);
                }
            }
        }
        out.into_iter()
            .zip(keys.iter().map(|k| k.0))
            .map(|(e, k)| {
                e.ok_or_else(|| Error::Corrupt {
                    shard: Some(k.shard),
                    what: format!("entry seq {} epoch {} could not be read", k.seq, k.epoch),
                })
            })
            .collect()
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
}

// ---- the history checker's source -------------------------------------------------------

pub(crate) struct LanceHistory {
    inner: Arc<Inner>,
}

impl LanceHistory {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        LanceHistory { inner }
    }
}

#[async_trait]
impl HistorySource for LanceHistory {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
        let tiers = tiers(&self.inner, None).await?;
        for_each_entry(&self.inner, &tiers, None, &mut |e| checker.visit(&e)).await
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
}
