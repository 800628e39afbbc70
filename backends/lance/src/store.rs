//! What every part of one store handle shares: the dataset, its object-store parameters,
//! the deadline, and the writers this handle opened.

use std::sync::{Arc, Weak};
use std::time::Duration;

use ctxlog_core::{Result, StoreOptions, Written};
use lance::Dataset;
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::ShardWriter;
use lance::io::ObjectStoreParams;
use lance::session::Session;
use lance_io::object_store::ObjectStore;
use object_store::path::Path;

use crate::error::lance_err;

pub(crate) struct Shared {
    /// The dataset URI as Lance sees it (see `io::lance_uri`).
    pub uri: String,
    pub options: StoreOptions,
    /// Storage options, durable local writes and a test's fault injector: every dataset of
    /// the store is opened with these.
    pub params: ObjectStoreParams,
    pub session: Arc<Session>,
    /// The latest dataset version this handle knows; refreshed before each use.
    dataset: tokio::sync::Mutex<Dataset>,
    pub tuning: WriterTuning,
    /// Writers opened through this handle, so that `compact` can flush them first.
    live: std::sync::Mutex<Vec<Weak<ShardWriter>>>,
    /// Whether the store is known to be of the format that holds summaries (`format`).
    pub(crate) summaries_allowed: std::sync::atomic::AtomicBool,
    /// The newest format this handle saw the store at or moved it to, once 4 or later (links,
    /// rule 25; 5: embeddings, rule 27); 0 before.
    pub(crate) scoped_format: std::sync::atomic::AtomicU32,
    /// What shard reads learned of the sources they read: the base table at a version, each
    /// generation (see `entries::read_shard`).
    pub(crate) source_tops: crate::bounds::SourceTops,
}

impl Shared {
    pub(crate) fn new(
        uri: String,
        options: StoreOptions,
        params: ObjectStoreParams,
        session: Arc<Session>,
        dataset: Dataset,
        tuning: WriterTuning,
    ) -> Self {
        Shared {
            uri,
            options,
            params,
            session,
            dataset: tokio::sync::Mutex::new(dataset),
            tuning,
            live: std::sync::Mutex::new(Vec::new()),
            summaries_allowed: std::sync::atomic::AtomicBool::new(false),
            scoped_format: std::sync::atomic::AtomicU32::new(0),
            source_tops: Default::default(),
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// The dataset at its latest version.
    pub(crate) async fn latest(&self) -> Result<Dataset> {
        let mut ds = self.dataset.lock().await;
        ds.checkout_latest()
            .await
            .map_err(|e| lance_err("read the dataset manifest", None, Written::Nothing, e))?;
        Ok(ds.clone())
    }

    /// The object store and base path MemWAL's WAL and shard manifests live under.
    pub(crate) async fn io(&self, ds: &Dataset) -> Result<(Arc<ObjectStore>, Path)> {
        let store = ds
            .object_store(None)
            .await
            .map_err(|e| lance_err("open the object store", None, Written::Nothing, e))?;
        Ok((store, ds.branch_location().path))
    }

    /// The dataset at the version this handle last read: no request.
    pub(crate) async fn held(&self) -> Dataset {
        self.dataset.lock().await.clone()
    }

    /// The object store and base path, from the dataset as this handle holds it: neither
    /// changes with the version, so no manifest is read for them.
    pub(crate) async fn objects(&self) -> Result<(Arc<ObjectStore>, Path)> {
        self.io(&self.held().await).await
    }

    /// Open another dataset (a flushed generation) with the store's settings.
    pub(crate) async fn open_dataset(&self, uri: &str) -> std::result::Result<Dataset, lance::Error> {
        DatasetBuilder::from_uri(uri)
            .with_store_params(self.params.clone())
            .with_session(self.session.clone())
            .load()
            .await
    }

    /// Remember a writer this handle opened (weakly: its shard handle owns it).
    pub(crate) fn register_writer(&self, w: &Arc<ShardWriter>) {
        let mut live = self.live.lock().expect("not poisoned");
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(w));
    }

    /// The writers this handle opened that are still alive.
    pub(crate) fn live_writers(&self) -> Vec<Arc<ShardWriter>> {
        self.live
            .lock()
            .expect("not poisoned")
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// How a writer sizes its memtables. A memtable becomes a flushed generation when it
/// reaches any limit, and on close. Smaller memtables mean shorter WAL tails for readers
/// and more generations for `compact` to fold. Keep these fixed for a store: MemWAL
/// refuses to replay a WAL written under larger limits.
#[derive(Clone, Debug)]
pub struct WriterTuning {
    /// Rows at which a memtable is frozen into a generation.
    pub max_memtable_rows: usize,
    /// Record batches at which a memtable is frozen.
    pub max_memtable_batches: usize,
    /// Bytes at which a memtable is frozen.
    pub max_memtable_bytes: usize,
    /// Backstop for the WAL flush ticker; every durable put also triggers its own flush.
    pub wal_flush_interval: Duration,
    /// Appends after which a writer freezes its memtable (it becomes a generation in the
    /// background), whatever its size. This bounds the WAL tail a successor replays when it
    /// takes the shard over — one round trip per entry, one after another — and the WAL
    /// positions it probes to find the tip. An append waits for the last freeze's flush
    /// before the next freeze is due, so a tail never holds more than twice this many
    /// appends. Unlike the limits above it may change between opens.
    pub max_wal_tail: u64,
    /// How often, at most, an append first reads the shard manifest to see whether a
    /// successor has claimed the shard. Without it a writer learns it is fenced only when
    /// the successor's sentinel reaches the WAL tip, and a successor probing for the tip
    /// chases a writer that goes on appending, for as long as it appends (docs/benchmarks.md).
    pub fence_check_interval: Duration,
}

impl Default for WriterTuning {
    fn default() -> Self {
        WriterTuning {
            // Must admit the largest batch (Limits::max_batch_records).
            max_memtable_rows: 25_000,
            max_memtable_batches: 1_000,
            max_memtable_bytes: 64 * 1024 * 1024,
            wal_flush_interval: Duration::from_millis(500),
            // A takeover replays the tail one dependent round trip per entry: this bounds
            // how long a successor takes over object storage (docs/benchmarks.md). At 64,
            // a loaded S3 emulator (150–300 ms a request) made takeovers miss a 20 s
            // deadline again and again (the serve soak, 2026-12-03).
            max_wal_tail: 16,
            fence_check_interval: Duration::from_secs(1),
        }
    }
}
