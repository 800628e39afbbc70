//! ctxlog over one Lance dataset with MemWAL: one shard per writer.
//!
//! - **Write.** `open_shard(w)` opens one long-lived MemWAL `ShardWriter` on `ShardId(w)`
//!   (manual sharding, durable writes): the open claims a new epoch and fences the previous
//!   holder. Each append is one record batch `put` that returns once its WAL entry is
//!   stored. Memtables become flushed *generations* when they fill up and on close.
//! - **Read.** Readers in any process merge the base table, every shard's generations not
//!   yet compacted into it, and every shard's WAL tail (`WalTailer`), so an acknowledged
//!   append is visible at once, without a flush (rule 1). Entries of every epoch are kept.
//!   Entry keys `(shard, epoch, seq)` are unique, so overlapping tiers are de-duplicated
//!   by key; record-level de-duplication is the projection's (rule 6).
//! - **Compact.** Folds flushed generations into the base table with an insert-only
//!   `merge_insert` that records, in the same commit, which generations it folded.
//!
//! Every call that can wait runs under the store's deadline.

#[doc(hidden)]
pub mod bench;
mod compact;
mod error;
#[doc(hidden)]
pub mod faults;
mod io;
mod read;
mod schema;
mod shard;
#[doc(hidden)]
pub mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arrow_array::RecordBatchIterator;
use async_trait::async_trait;
use ctxlog_core::engine::{IndexedProjector, ScanConflictDiscovery};
use ctxlog_core::{
    CompactOptions, CompactReport, ConflictDiscovery, Entry, Error, Projector, Result, Shard, ShardId, ShardInfo,
    Store, StoreOptions, WriterId, Written, with_deadline,
};
use lance::Dataset;
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::{DatasetMemWalExt, ShardWriter};
use lance::dataset::{WriteMode, WriteParams};
use lance::io::ObjectStoreParams;
use lance::session::Session;
use lance_io::object_store::ObjectStore;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::error::{BACKEND, is_not_found, lance_err};

use crate::faults::Faults;
pub use crate::shard::WriterTuning;

/// A ctxlog store in one Lance dataset.
pub struct LanceStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
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
}

impl Inner {
    pub fn timeout(&self) -> Duration {
        self.options.timeout
    }

    /// The dataset at its latest version.
    pub async fn latest(&self) -> Result<Dataset> {
        let mut ds = self.dataset.lock().await;
        ds.checkout_latest()
            .await
            .map_err(|e| lance_err("read the dataset manifest", None, Written::Nothing, e))?;
        Ok(ds.clone())
    }

    /// The object store and base path MemWAL's WAL and shard manifests live under.
    pub async fn io(&self, ds: &Dataset) -> Result<(Arc<ObjectStore>, Path)> {
        let store = ds
            .object_store(None)
            .await
            .map_err(|e| lance_err("open the object store", None, Written::Nothing, e))?;
        Ok((store, ds.branch_location().path))
    }

    /// Open another dataset (a flushed generation) with the store's settings.
    pub async fn open_dataset(&self, uri: &str) -> std::result::Result<Dataset, lance::Error> {
        DatasetBuilder::from_uri(uri)
            .with_store_params(self.params.clone())
            .with_session(self.session.clone())
            .load()
            .await
    }

    pub fn register_writer(&self, w: &Arc<ShardWriter>) {
        let mut live = self.live.lock().expect("not poisoned");
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(w));
    }

    pub fn live_writers(&self) -> Vec<Arc<ShardWriter>> {
        self.live
            .lock()
            .expect("not poisoned")
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

impl LanceStore {
    /// Open the store at `uri`, creating the dataset and initialising MemWAL when
    /// `options.create_if_missing`. Safe when many processes do it at once (rule 12).
    pub async fn open(uri: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
        Ok(Arc::new(Self::open_store(uri, options).await?))
    }

    pub async fn open_store(uri: &str, options: StoreOptions) -> Result<Self> {
        Self::open_with_faults(uri, options, None).await
    }

    /// [`LanceStore::open_store`], with every object-store request of this handle passing
    /// through `faults` (tests and the chaos soak).
    pub async fn open_with_faults(uri: &str, options: StoreOptions, faults: Option<Arc<Faults>>) -> Result<Self> {
        options.validate()?;
        let uri = io::lance_uri(uri)?;
        let storage_options: HashMap<String, String> = options.storage_options.iter().cloned().collect();
        let params = io::store_params(&uri, &storage_options, faults.as_ref());
        let session = Arc::new(Session::default());
        let timeout = options.timeout;
        let ds = with_deadline(
            "open",
            timeout,
            None,
            Written::Nothing,
            open_or_create(&uri, &options, &params, &session),
        )
        .await?;
        Ok(LanceStore {
            inner: Arc::new(Inner {
                uri,
                options,
                params,
                session,
                dataset: tokio::sync::Mutex::new(ds),
                tuning: WriterTuning::default(),
                live: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }

    /// Override how writers size their memtables (tests and benchmarks).
    pub fn with_tuning(mut self, tuning: WriterTuning) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("tuning is set before the store is shared")
            .tuning = tuning;
        self
    }

    pub fn uri(&self) -> &str {
        &self.inner.uri
    }
}

async fn open_or_create(
    uri: &str,
    options: &StoreOptions,
    params: &ObjectStoreParams,
    session: &Arc<Session>,
) -> Result<Dataset> {
    let load = || {
        DatasetBuilder::from_uri(uri)
            .with_store_params(params.clone())
            .with_session(session.clone())
            .load()
    };
    let mut claimed = false;
    let mut backoff = Duration::from_millis(2);
    let mut ds = loop {
        match load().await {
            Ok(ds) => break ds,
            Err(e) if is_not_found(&e) => {
                if !options.create_if_missing {
                    return Err(Error::NotFound {
                        what: format!(
                            "no ctxlog store (Lance dataset) at {}",
                            ctxlog_core::redact::redact_uri(uri)
                        ),
                    });
                }
                if !claimed {
                    claimed = true;
                    create_exclusively(uri, params, session, options.timeout).await?;
                } else {
                    // Another process is creating it: wait for it, within the deadline
                    // that bounds this whole open.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
            }
            Err(e) => return Err(diagnose(uri, params, session, e).await),
        }
    };
    check_schema(uri, &ds)?;
    ensure_mem_wal(&mut ds).await?;
    Ok(ds)
}

/// An open failed in a way Lance does not type (a listing that failed, say): ask the store
/// directly for one object, whose answer is typed (missing bucket, denied, unreachable).
async fn diagnose(uri: &str, params: &ObjectStoreParams, session: &Arc<Session>, e: lance::Error) -> Error {
    if crate::error::classify(&e).is_some() {
        return lance_err("open", None, Written::Nothing, e);
    }
    let probe = async {
        let (store, base) = ObjectStore::from_uri_and_params(session.store_registry(), uri, params).await?;
        store
            .inner
            .head(&base.clone().join("_versions"))
            .await
            .map_err(|e| lance::Error::io_source(Box::new(e)))
    };
    match probe.await {
        Err(probe) if crate::error::classify(&probe).is_some() => lance_err("open", None, Written::Nothing, probe),
        _ => lance_err("open", None, Written::Nothing, e),
    }
}

/// Create the (empty) dataset, once, however many processes try at the same moment.
///
/// Lance 14's `WriteMode::Create` is not safe against a concurrent creator: a creator
/// that finds no dataset when it starts but one when it commits commits an *Overwrite*
/// over it, which drops the MemWAL index another process may just have created. So only
/// the process that wins a put-if-absent of `_ctxlog/creator` creates; the others wait for
/// the dataset to appear. A creator that died leaves its marker behind: once the marker is
/// older than the deadline and there is still no dataset, anyone may create.
async fn create_exclusively(
    uri: &str,
    params: &ObjectStoreParams,
    session: &Arc<Session>,
    timeout: Duration,
) -> Result<()> {
    let (store, base) = ObjectStore::from_uri_and_params(session.store_registry(), uri, params)
        .await
        .map_err(|e| lance_err("create", None, Written::Nothing, e))?;
    let marker = Path::from(format!("{base}/_ctxlog/creator"));
    let claim = format!("pid {} at {}", std::process::id(), chrono::Utc::now().to_rfc3339());
    let won = match store.put_if_absent(&marker, claim.into_bytes().into()).await {
        Ok(()) => true,
        Err(object_store::Error::AlreadyExists { .. }) => {
            // Abandoned by a creator that died before creating?
            match store.inner.head(&marker).await {
                Ok(meta) => {
                    let age = chrono::Utc::now().signed_duration_since(meta.last_modified);
                    age.to_std().is_ok_and(|a| a > timeout)
                }
                Err(_) => false,
            }
        }
        Err(e) => return Err(crate::error::store_err("create", None, Written::Nothing, e)),
    };
    if !won {
        return Ok(());
    }
    let params = WriteParams {
        mode: WriteMode::Create,
        store_params: Some(params.clone()),
        session: Some(session.clone()),
        ..Default::default()
    };
    let empty = RecordBatchIterator::new(Vec::new(), schema::schema());
    match Dataset::write(empty, uri, Some(params)).await {
        Ok(mut ds) => ensure_mem_wal(&mut ds).await,
        Err(e) if matches!(e.find_root(), lance::Error::DatasetAlreadyExists { .. }) => Ok(()),
        Err(e) => Err(lance_err("create", None, Written::Unknown, e)),
    }
}

/// Initialise MemWAL (manual sharding) unless it is. Racing initialisers: the loser's
/// CreateIndex fails with a commit conflict, and a racing *creator* can even commit its
/// (empty) dataset over a freshly created one, dropping the index. So: re-read and check
/// after every failure, never assume, and give up after a few rounds.
pub(crate) async fn ensure_mem_wal(ds: &mut Dataset) -> Result<()> {
    let mut last = None;
    for _ in 0..8 {
        let details = ds
            .mem_wal_index_details()
            .await
            .map_err(|e| lance_err("open", None, Written::Nothing, e))?;
        if details.is_some() {
            return Ok(());
        }
        match ds.initialize_mem_wal().execute().await {
            Ok(()) => return Ok(()),
            Err(e) => {
                last = Some(e);
                ds.checkout_latest()
                    .await
                    .map_err(|e| lance_err("open", None, Written::Nothing, e))?;
            }
        }
    }
    Err(lance_err(
        "initialise MemWAL",
        None,
        Written::Unknown,
        last.expect("a failed round records its error"),
    ))
}

/// A dataset that is not a ctxlog store is refused, with the columns that differ.
fn check_schema(uri: &str, ds: &Dataset) -> Result<()> {
    let have: Vec<String> = ds.schema().fields.iter().map(|f| f.name.clone()).collect();
    let want: Vec<String> = schema::schema().fields().iter().map(|f| f.name().clone()).collect();
    if have != want {
        return Err(Error::NotAStore {
            location: ctxlog_core::redact::redact_uri(uri),
            reason: format!("a Lance dataset with columns {have:?}, not ctxlog's {want:?}"),
        });
    }
    Ok(())
}

#[async_trait]
impl Store for LanceStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn options(&self) -> &StoreOptions {
        &self.inner.options
    }

    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>> {
        Ok(Box::new(
            shard::LanceShard::open(self.inner.clone(), writer.clone()).await?,
        ))
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        with_deadline(
            "list shards",
            self.inner.timeout(),
            None,
            Written::Nothing,
            read::shards(&self.inner),
        )
        .await
    }

    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
        with_deadline(
            "read shard",
            self.inner.timeout(),
            Some(shard),
            Written::Nothing,
            read::read_shard(&self.inner, shard, after_seq, limit),
        )
        .await
    }

    fn projector(&self) -> Box<dyn Projector> {
        Box::new(IndexedProjector::new(Arc::new(read::LanceIndex::new(
            self.inner.clone(),
        ))))
    }

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery> {
        Box::new(ScanConflictDiscovery::new(Arc::new(read::LanceHistory::new(
            self.inner.clone(),
        ))))
    }

    async fn compact(&self, options: &CompactOptions) -> Result<CompactReport> {
        compact::compact(&self.inner, options, None).await
    }
}
