//! The three tiers a reader merges, and the one walk over them: the base table, each
//! shard's flushed generations not yet folded into it, and each shard's WAL tail.
//!
//! Read order matters. The base table (and, from its MemWAL index, which generations of
//! each shard it already holds) is read first, then each shard's manifest (its flushed
//! generations and the WAL position they cover), then the WAL after that position. A
//! flush that commits in between only adds a generation whose rows are also still in the
//! WAL, so nothing is missed; rows seen twice have the same key `(shard, epoch, seq)` and
//! are applied once.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use ctxlog_core::{Result, ShardId, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::scanner::MaterializationStyle as Materialization;
use lance_io::object_store::ObjectStore;
use object_store::path::Path;
use uuid::Uuid;

use crate::error::lance_err;
use crate::schema::{Columns, POSITION_COLUMNS, SHARD};
use crate::store::Shared;
use crate::wal::{WalEntry, read_entry};

/// WAL entries fetched at once while reading a tail.
const WAL_READ_AHEAD: usize = 16;

/// Independent reads in flight at once: shard manifests, generation datasets, their scans
/// and shards' WAL tails. On object storage every read is a round trip, so reads that do
/// not depend on each other are issued together, up to this window (which bounds memory:
/// a generation's rows are held until its turn to be visited comes).
pub(crate) const READ_WINDOW: usize = 8;

pub(crate) fn read_err(e: lance::Error) -> ctxlog_core::Error {
    lance_err("read", None, Written::Nothing, e)
}

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
    /// How many generations the shard has flushed in all (folded or not).
    pub flushed: usize,
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
    /// Which rows of the base table a walk reads (an SQL filter; all when `None`). Taken for
    /// one shard: only its rows.
    pub base_filter: Option<String>,
    /// Which rows of the generations a walk reads (all when `None`). Apart from the base
    /// table's: a filter of the base table may leave out shards it knows were never folded.
    pub generation_filter: Option<String>,
    /// Whether a walk reads the base table at all.
    pub read_base: bool,
    /// Per shard, the newest generation the base table holds (from its MemWAL index). Only
    /// compaction adds rows to the base table, and it records the generations it folds in
    /// the same commit: a shard with none here has no row there. A refresh relies on that
    /// (`index.rs`: what a new writer would otherwise cost every reader); a shard read and the
    /// history checker do not, so rows below the write path (a damaged store) are still read
    /// and judged.
    pub folded: HashMap<Uuid, u64>,
}

/// Per shard, the newest generation folded into the base table at `ds`'s version.
pub(crate) async fn folded(ds: &Dataset) -> Result<HashMap<Uuid, u64>> {
    Ok(ds
        .mem_wal_index_details()
        .await
        .map_err(read_err)?
        .map(|d| {
            d.compacted_sstables
                .iter()
                .map(|c| (c.shard_id, c.generation))
                .collect()
        })
        .unwrap_or_default())
}

/// The tiers of every shard, or of one.
pub(crate) async fn tiers(shared: &Shared, only: Option<ShardId>) -> Result<Tiers> {
    let base = shared.latest().await?;
    let (store, base_path) = shared.io(&base).await?;
    let compacted = folded(&base).await?;
    let ids = match only {
        Some(s) => vec![s.0],
        None => crate::wal::shard_ids(&store, &base_path, "read").await?,
    };
    let shards: Vec<Option<ShardTier>> = futures::stream::iter(ids)
        .map(|id| shard_tier(shared, &store, &base_path, ShardId(id), compacted.get(&id).copied()))
        .buffered(READ_WINDOW)
        .try_collect()
        .await?;
    let shards = shards.into_iter().flatten().collect();
    Ok(Tiers {
        base,
        store,
        base_path,
        shards,
        base_filter: only.map(shard_filter),
        generation_filter: None,
        read_base: true,
        folded: compacted,
    })
}

async fn shard_tier(
    shared: &Shared,
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: ShardId,
    compacted: Option<u64>,
) -> Result<Option<ShardTier>> {
    let manifest = crate::wal::latest_manifest(store, base_path, shard, "read", Written::Nothing).await?;
    let Some(m) = manifest else { return Ok(None) };
    let root = shared.uri.trim_end_matches('/');
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
        flushed: all.len(),
        generations: all.into_iter().filter(|g| g.generation > floor).collect(),
        wal_from: m.replay_after_wal_entry_position + 1,
        wal_known: m.wal_entry_position_last_seen,
    }))
}

pub(crate) fn shard_filter(shard: ShardId) -> String {
    format!("{SHARD} = '{}'", shard.0)
}

/// Which columns (and whether row ids) a walk reads.
#[derive(Clone, Copy)]
pub(crate) struct Walk<'a> {
    pub columns: Option<&'a [&'a str]>,
    pub row_ids: bool,
}

/// One batch of rows from one tier, and where its rows live.
pub(crate) enum Rows<'a> {
    /// From dataset number `source` of the walk (the base table is 0).
    Table { batch: &'a RecordBatch, source: u32 },
    /// From the WAL entry at `position` (of the shard its rows name): its record batch
    /// number `batch_no`.
    Wal {
        batch: &'a RecordBatch,
        position: u64,
        batch_no: u32,
    },
}

impl<'a> Rows<'a> {
    pub(crate) fn batch(&self) -> &'a RecordBatch {
        match self {
            Rows::Table { batch, .. } | Rows::Wal { batch, .. } => batch,
        }
    }
}

/// What a walk leaves behind.
pub(crate) struct Walked {
    /// Where each shard's WAL tail ended (the next position to read).
    pub wal_next: Vec<(ShardId, u64)>,
}

/// The datasets a walk reads, in `source` order: the base table, then each shard's
/// generations not yet folded.
pub(crate) async fn open_sources(shared: &Shared, t: &Tiers) -> Result<Vec<Dataset>> {
    // Owned items: borrowed ones trip the compiler's higher-ranked lifetime check inside
    // `async_trait` futures.
    let all: Vec<Generation> = t.shards.iter().flat_map(|s| s.generations.clone()).collect();
    let generations: Vec<Dataset> = futures::stream::iter(all)
        .map(|g: Generation| async move { shared.open_dataset(&g.uri).await.map_err(read_err) })
        .buffered(READ_WINDOW)
        .try_collect()
        .await?;
    let mut out = Vec::with_capacity(generations.len() + 1);
    out.push(t.base.clone());
    out.extend(generations);
    Ok(out)
}

/// Visit every row batch of the tiers: the base table (only the shard's rows when the
/// tiers were taken for one shard), then per shard its generations not yet folded and its
/// WAL tail. `sources` are [`open_sources`]' datasets.
pub(crate) async fn walk(
    t: &Tiers,
    sources: &[Dataset],
    how: Walk<'_>,
    mut visit: impl FnMut(Rows<'_>) -> Result<()>,
) -> Result<Walked> {
    // The WAL tails do not depend on the tables: read them meanwhile (on an object store a
    // round trip less), visit them after, as before.
    let wanted = t.shards.iter().map(|s| (s.shard, s.wal_from, s.wal_known)).collect();
    let tails = read_tails(&t.store, &t.base_path, wanted);
    let ((), tails) = futures::try_join!(visit_tables(t, sources, how, &mut visit), tails)?;
    // WAL tails: each visited whole, in shard order.
    let mut wal_next = Vec::with_capacity(t.shards.len());
    for (shard, next, entries) in tails {
        for rows in entries.iter().flat_map(wal_rows) {
            visit(rows)?;
        }
        wal_next.push((shard, next));
    }
    Ok(Walked { wal_next })
}

/// The table tiers of [`walk`]: the base table, then the generations.
async fn visit_tables(
    t: &Tiers,
    sources: &[Dataset],
    how: Walk<'_>,
    visit: &mut impl FnMut(Rows<'_>) -> Result<()>,
) -> Result<()> {
    // The base table streams (Lance reads its fragments concurrently); only it holds other
    // shards' rows. Generations are small: read up to a window of them at once, each
    // visited whole, in source order.
    if let Some(base) = sources.first().filter(|_| t.read_base) {
        scan_table(
            base,
            how,
            t.base_filter.as_deref(),
            Materialization::Heuristic,
            |batch| visit(Rows::Table { batch, source: 0 }),
        )
        .await?;
    }
    let mut generations = futures::stream::iter(sources.iter().cloned().enumerate().skip(1))
        .map(|(i, ds): (usize, Dataset)| async move {
            let mut batches = Vec::new();
            // Every column early: a generation is small, and late materialization of the
            // rows a filter keeps costs a request per range taken (seconds per page on an
            // object store, where a whole column is one request).
            scan_table(
                &ds,
                how,
                t.generation_filter.as_deref(),
                Materialization::AllEarly,
                |b| {
                    batches.push(b.clone());
                    Ok(())
                },
            )
            .await?;
            Ok::<_, ctxlog_core::Error>((i as u32, batches))
        })
        .buffered(READ_WINDOW);
    while let Some((source, batches)) = generations.try_next().await? {
        for batch in &batches {
            visit(Rows::Table { batch, source })?;
        }
    }
    Ok(())
}

/// [`walk`] over freshly opened sources.
pub(crate) async fn walk_all(
    shared: &Shared,
    t: &Tiers,
    how: Walk<'_>,
    visit: impl FnMut(Rows<'_>) -> Result<()>,
) -> Result<Walked> {
    let sources = open_sources(shared, t).await?;
    walk(t, &sources, how, visit).await
}

/// Scan `ds` (projected and filtered as asked), calling `f` per batch.
async fn scan_table(
    ds: &Dataset,
    how: Walk<'_>,
    filter: Option<&str>,
    materialization: Materialization,
    mut f: impl FnMut(&RecordBatch) -> Result<()>,
) -> Result<()> {
    let mut scan = ds.scan();
    scan.materialization_style(materialization);
    if let Some(cols) = how.columns {
        scan.project(cols).map_err(read_err)?;
    }
    if let Some(expr) = filter {
        scan.filter(expr).map_err(read_err)?;
    }
    if how.row_ids {
        scan.with_row_id();
    }
    let mut stream = scan.try_into_stream().await.map_err(read_err)?;
    while let Some(batch) = stream.try_next().await.map_err(read_err)? {
        f(&batch)?;
    }
    Ok(())
}

/// Read a shard's WAL from `from` to its end, fetching `WAL_READ_AHEAD` entries at a time.
/// Returns the first position not read (where the next read starts) and the entries read,
/// in position order.
///
/// The end is the first missing position with nothing after it. A missing position with an
/// entry after it — later in the same read-ahead window, or at or below `known` (a position
/// known to exist) — is a *hole*: an entry lost or never completed. Reading goes on past it,
/// so that nothing after a hole is hidden and a successor never reuses the seqs of entries
/// written after it; the history checker then reports the seqs the hole took as a gap.
pub(crate) async fn read_wal(
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shard: ShardId,
    from: u64,
    known: u64,
) -> Result<(u64, Vec<WalEntry>)> {
    let read = |pos| read_entry(store, base_path, shard, pos, "read the WAL", Written::Nothing);
    let mut entries = Vec::new();
    let mut next = from;
    loop {
        let start = next;
        let mut window: Vec<Option<WalEntry>> = futures::stream::iter(start..start + WAL_READ_AHEAD as u64)
            .map(read)
            .buffered(WAL_READ_AHEAD)
            .try_collect()
            .await?;
        let last_present = window.iter().rposition(Option::is_some);
        // The window's reads run concurrently, so they are no snapshot: the read of a
        // position may answer "missing" just before the writer puts it and the next, which
        // a later read of the window sees. A writer puts its entries one after another, so
        // once a later entry was seen, a second read of a missing position is final.
        if let Some(l) = last_present {
            for (pos, slot) in (start..).zip(&mut window[..l]) {
                if slot.is_none() {
                    *slot = read(pos).await?;
                }
            }
        }
        for (i, entry) in window.into_iter().enumerate() {
            let pos = start + i as u64;
            match entry {
                Some(e) => entries.push(e),
                None if last_present.is_some_and(|l| i < l) || pos <= known => {
                    tracing::warn!(%shard, position = pos, "a WAL entry is missing below later entries (a hole); reading on");
                }
                None => return Ok((pos, entries)),
            }
        }
        next = start + WAL_READ_AHEAD as u64;
    }
}

/// What [`read_tails`] read of one shard: its next WAL position and the entries before it.
pub(crate) type Tail = (ShardId, u64, Vec<WalEntry>);

/// The WAL tails of several shards, each `(shard, from, known)` as for [`read_wal`]: read up
/// to `READ_WINDOW` shards at once, returned in the order given.
pub(crate) async fn read_tails(
    store: &Arc<ObjectStore>,
    base_path: &Path,
    shards: Vec<(ShardId, u64, u64)>,
) -> Result<Vec<Tail>> {
    futures::stream::iter(shards)
        .map(|(shard, from, known)| async move {
            let (next, entries) = read_wal(store, base_path, shard, from, known).await?;
            Ok::<_, ctxlog_core::Error>((shard, next, entries))
        })
        .buffered(READ_WINDOW)
        .try_collect()
        .await
}

/// The record batches of a WAL entry, as rows of a walk.
pub(crate) fn wal_rows(e: &WalEntry) -> impl Iterator<Item = Rows<'_>> {
    e.batches.iter().enumerate().map(|(b, batch)| Rows::Wal {
        batch,
        position: e.position,
        batch_no: b as u32,
    })
}

/// Rows of a batch that are ctxlog entries (not MemWAL's delete markers).
pub(crate) fn rows(batch: &RecordBatch, mut f: impl FnMut(&Columns<'_>, usize) -> Result<()>) -> Result<()> {
    let cols = Columns::new(batch)?;
    for i in 0..cols.len() {
        if !cols.is_lance_tombstone(i) {
            f(&cols, i)?;
        }
    }
    Ok(())
}

/// What a shard holds, for a writer that takes it over.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub last_seq: u64,
    pub max_hlc: u64,
}

/// The highest seq and HLC a shard holds, read from its newest tiers only, so that a
/// takeover costs one generation and the WAL tail, not the shard's history.
///
/// A shard's seqs and HLCs only grow from the base table to its generations to its WAL
/// tail: a writer's clock and seqs never go back (they are recovered here on every open),
/// generations are flushed memtables in WAL order, and compaction folds the oldest
/// generations first. So the maxima are in the WAL tail (holes included) and the newest
/// generation not yet folded; only when every generation is folded is it the base table
/// (its rows of the shard — what compaction folded, whether or not the generations or WAL
/// entries it folded still exist).
pub(crate) async fn recover(shared: &Shared, shard: ShardId) -> Result<Recovered> {
    let t = tiers(shared, Some(shard)).await?;
    let mut out = Recovered::default();
    let how = Walk {
        columns: Some(&POSITION_COLUMNS),
        row_ids: false,
    };
    // The walk reads its first source as the table of the shard's older rows.
    let newest = match t.shards.first().and_then(|s| s.generations.last()) {
        Some(g) => shared.open_dataset(&g.uri).await.map_err(read_err)?,
        None => t.base.clone(),
    };
    walk(&t, &[newest], how, |r| {
        rows(r.batch(), |c, i| {
            out.last_seq = out.last_seq.max(c.seq(i));
            out.max_hlc = out.max_hlc.max(c.hlc(i)?.0);
            Ok(())
        })
    })
    .await?;
    Ok(out)
}
