//! ctxlog over one Lance dataset with MemWAL: one shard per writer.
//!
//! - **Write** (`shard.rs`). `open_shard(w)` opens one long-lived MemWAL `ShardWriter` on
//!   `ShardId(w)` (manual sharding, durable writes): the open claims a new epoch and fences
//!   the previous holder. Each append is one record batch `put` that returns once its WAL
//!   entry is stored. Memtables become flushed *generations* when they fill up and on close.
//! - **Read** (`tiers.rs`, `index.rs`, `entries.rs`). Readers in any process merge the base
//!   table, every shard's generations not yet compacted into it, and every shard's WAL tail,
//!   so an acknowledged append is visible at once, without a flush (rule 1). Entry keys
//!   `(shard, epoch, seq)` are unique, so overlapping tiers are de-duplicated by key;
//!   record-level de-duplication is the projection's (rule 6).
//! - **Compact** (`compact.rs`). Folds flushed generations into the base table with an
//!   insert-only `merge_insert` that records, in the same commit, which generations it
//!   folded.
//! - **Open** (`open.rs`, `store.rs`, `io.rs`). Race-safe creation, MemWAL initialisation,
//!   the object-store parameters every dataset of the store is opened with (durable local
//!   writes; a test's fault injector, `faults.rs`).
//!
//! Every call that can wait runs under the store's deadline.

#![warn(missing_docs)]

mod bounds;
mod compact;
mod entries;
mod error;
#[doc(hidden)]
pub mod faults;
mod format;
mod index;
mod io;
mod open;
mod reclaim;
mod schema;
mod shard;
mod snapshots;
mod store;
mod tiers;
mod wal;
mod writers;

#[cfg(feature = "testing")]
pub mod bench;
#[cfg(feature = "testing")]
pub mod testing;

use std::sync::Arc;

use async_trait::async_trait;
use ctxlog_core::backend::history::HistoryConflicts;
use ctxlog_core::backend::projector::IndexedProjector;
use ctxlog_core::backend::with_deadline;
use ctxlog_core::{
    CompactOptions, CompactReport, ConflictDiscovery, Entry, Epoch, GcOptions, GcReport, Projector, PurgeOptions,
    PurgeReport, Result, Shard, ShardId, ShardInfo, Store, StoreOptions, WriterId, Written,
};

use crate::error::BACKEND;
use crate::faults::Faults;
use crate::store::Shared;
pub use crate::store::WriterTuning;

/// The layout of a ctxlog Lance store this build writes: the entry schema, MemWAL with one
/// shard per writer, and the `_ctxlog/` objects beside them. Bump it when any of them
/// changes. A store records it in `_ctxlog/format` once it differs from format 1 (rule 22;
/// see `format`); benchmarks key the stores they generate on it.
pub use crate::format::{FORMAT, READS as READS_FORMATS};

/// A ctxlog store in one Lance dataset.
pub struct LanceStore {
    shared: Arc<Shared>,
}

impl LanceStore {
    /// Open the store at `uri`, creating the dataset and initialising MemWAL when
    /// `options.create_if_missing`. Safe when many processes do it at once (rule 12).
    pub async fn open(uri: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(Self::open_store(uri, options).await?))
    }

    /// [`LanceStore::open`], as the concrete type.
    pub async fn open_store(uri: &str, options: StoreOptions) -> Result<Self> {
        Self::open_with_faults(uri, options, None).await
    }

    /// [`LanceStore::open_store`], with every object-store request of this handle passing
    /// through `faults` (tests and the chaos soak).
    pub async fn open_with_faults(uri: &str, options: StoreOptions, faults: Option<Arc<Faults>>) -> Result<Self> {
        Ok(LanceStore {
            shared: Arc::new(open::open_store(uri, options, faults).await?),
        })
    }

    /// Override how writers size their memtables (tests and benchmarks).
    pub fn with_tuning(mut self, tuning: WriterTuning) -> Self {
        Arc::get_mut(&mut self.shared)
            .expect("tuning is set before the store is shared")
            .tuning = tuning;
        self
    }

    /// The dataset URI as Lance sees it.
    pub fn uri(&self) -> &str {
        &self.shared.uri
    }
}

#[async_trait]
impl Store for LanceStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn options(&self) -> &StoreOptions {
        &self.shared.options
    }

    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>> {
        Ok(Box::new(
            shard::LanceShard::open(self.shared.clone(), writer.clone(), None).await?,
        ))
    }

    async fn reopen_shard(&self, writer: &WriterId, held: Epoch) -> Result<Box<dyn Shard>> {
        Ok(Box::new(
            shard::LanceShard::open(self.shared.clone(), writer.clone(), Some(held)).await?,
        ))
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        with_deadline(
            "list shards",
            self.shared.timeout(),
            None,
            Written::Nothing,
            entries::shards(&self.shared),
        )
        .await
    }

    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
        with_deadline(
            "read shard",
            self.shared.timeout(),
            Some(shard),
            Written::Nothing,
            entries::read_shard(&self.shared, shard, after_seq, limit),
        )
        .await
    }

    async fn format(&self) -> Result<u32> {
        with_deadline(
            "read the store format",
            self.shared.timeout(),
            None,
            Written::Nothing,
            format::number(&self.shared),
        )
        .await
    }

    async fn set_format(&self, from: u32, to: u32) -> Result<()> {
        format::set(&self.shared, from, to).await
    }

    fn projector(&self) -> Box<dyn Projector> {
        Box::new(IndexedProjector::new(Arc::new(index::LanceIndex::new(
            self.shared.clone(),
        ))))
    }

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery> {
        Box::new(HistoryConflicts::new(
            Arc::new(entries::LanceHistory::new(self.shared.clone())),
            Arc::new(index::LanceIndex::new(self.shared.clone())),
        ))
    }

    async fn compact(&self, options: &CompactOptions) -> Result<CompactReport> {
        compact::compact(&self.shared, options).await
    }

    /// Folded generations, WAL entries below each shard's recorded floor (never a fence
    /// entry), and base-table versions superseded longer ago than the grace period. See
    /// `reclaim.rs`.
    async fn gc(&self, options: &GcOptions) -> Result<GcReport> {
        with_deadline("gc", self.shared.timeout(), None, Written::Unknown, async {
            let report = reclaim::gc(&self.shared, options).await?;
            // Saved search indexes begun before the last purge (a save that died half-way).
            if let Some(saved) = self.saved_indexes() {
                ctxlog_core::search::saved::sweep(&*saved).await?;
            }
            Ok(report)
        })
        .await
    }

    /// Fold, erase the base table's rows of tombstoned ids, rewrite their fragments; `gc`
    /// deletes the older copies. See `reclaim.rs`.
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let purge = ctxlog_core::search::saved::around_purge(
            self.saved_indexes(),
            BACKEND,
            reclaim::purge(&self.shared, options),
        );
        with_deadline("purge", self.shared.timeout(), None, Written::Unknown, purge).await
    }

    /// Objects under the dataset, `_ctxlog/search/` (beside the snapshots).
    fn saved_indexes(&self) -> Option<Arc<dyn ctxlog_core::search::saved::SavedIndexes>> {
        Some(Arc::new(snapshots::LanceIndexes {
            shared: self.shared.clone(),
        }))
    }
}
