//! Opening a store: the dataset URI and object-store parameters, race-safe creation,
//! MemWAL initialisation, and the check that a dataset is a ctxlog store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatchIterator;
use ctxlog_core::backend::with_deadline;
use ctxlog_core::{Error, Result, StoreOptions, Written, redact_uri};
use lance::Dataset;
use lance::dataset::builder::DatasetBuilder;
use lance::dataset::mem_wal::DatasetMemWalExt;
use lance::dataset::{WriteMode, WriteParams};
use lance::io::ObjectStoreParams;
use lance::session::Session;
use lance_io::object_store::ObjectStore;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::error::{is_not_found, lance_err};
use crate::faults::Faults;
use crate::io;
use crate::schema;
use crate::store::Shared;
use crate::store::WriterTuning;

/// Open (or create) the store at `uri`, bounded by the store's deadline.
pub(crate) async fn open_store(uri: &str, options: StoreOptions, faults: Option<Arc<Faults>>) -> Result<Shared> {
    options.validate()?;
    let uri = io::lance_uri(uri)?;
    let storage_options: HashMap<String, String> = options.storage_options.iter().cloned().collect();
    let faults = faults.or_else(Faults::from_env);
    let params = io::store_params(&uri, &storage_options, faults.as_ref());
    let session = Arc::new(Session::default());
    let ds = with_deadline(
        "open",
        options.timeout,
        None,
        Written::Nothing,
        open_or_create(&uri, &options, &params, &session),
    )
    .await?;
    let timeout = options.timeout;
    let shared = Shared::new(uri, options, params, session, ds, WriterTuning::default());
    with_deadline("open", timeout, None, Written::Nothing, crate::format::check(&shared)).await?;
    Ok(shared)
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
                        what: format!("no ctxlog store (Lance dataset) at {}", redact_uri(uri)),
                    });
                }
                if !claimed {
                    claimed = true;
                    create_exclusively(uri, params, session, options).await?;
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
    options: &StoreOptions,
) -> Result<()> {
    let (store, base) = ObjectStore::from_uri_and_params(session.store_registry(), uri, params)
        .await
        .map_err(|e| lance_err("create", None, Written::Nothing, e))?;
    let marker = Path::from(format!("{base}/_ctxlog/creator"));
    let timeout = options.timeout;
    let claim = format!(
        "pid {} at {}",
        std::process::id(),
        crate::io::storage_now().to_rfc3339()
    );
    let won = match store.put_if_absent(&marker, claim.into_bytes().into()).await {
        Ok(()) => true,
        Err(object_store::Error::AlreadyExists { .. }) => {
            // Abandoned by a creator that died before creating?
            match store.inner.head(&marker).await {
                Ok(meta) => {
                    let age = crate::io::storage_now().signed_duration_since(meta.last_modified);
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
    // The format first: whoever sees the dataset sees its format (rule 22).
    crate::format::record_new(&store, &base).await?;
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
pub(crate) fn check_schema(uri: &str, ds: &Dataset) -> Result<()> {
    let have: Vec<String> = ds.schema().fields.iter().map(|f| f.name.clone()).collect();
    let want: Vec<String> = schema::schema().fields().iter().map(|f| f.name().clone()).collect();
    if have != want {
        return Err(Error::NotAStore {
            location: redact_uri(uri),
            reason: format!("a Lance dataset with columns {have:?}, not ctxlog's {want:?}"),
        });
    }
    Ok(())
}
