//! Fault injection for the conformance suite and the Lance tests. Not for production use.

use arrow_array::RecordBatchIterator;
use ctxlog_core::{CompactOptions, CompactReport, Entry, Error, Result, StoreOptions, Written};
use lance::Dataset;
use lance::dataset::{WriteMode, WriteParams};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::LanceStore;
pub use crate::compact::StopPoint;
use crate::error::lance_err;
use crate::faults::{Action, Faults, Op, Rule, RuleId};
use crate::io::lance_uri;
use crate::schema::{Stamped, schema, to_batch};

/// A URI's base and the storage options of its query string.
fn split_uri(uri: &str) -> (String, HashMap<String, String>) {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    let options = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    (base.to_string(), options)
}

/// The fault injector of every store a test opens at one URI (see [`open_faulted`]).
pub fn faults_for(uri: &str) -> Arc<Faults> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<Faults>>>> = OnceLock::new();
    let (base, _) = split_uri(uri);
    ALL.get_or_init(Default::default)
        .lock()
        .expect("not poisoned")
        .entry(base)
        .or_insert_with(|| Faults::new(0))
        .clone()
}

/// Open the store at `uri` (storage options in its query) with the URI's fault injector, so
/// that a test can make this very store's requests misbehave.
pub async fn open_faulted(uri: &str, mut options: StoreOptions) -> Result<Arc<dyn ctxlog_core::Store>> {
    let (base, storage) = split_uri(uri);
    options.storage_options.extend(storage);
    Ok(Arc::new(
        LanceStore::open_with_faults(&base, options, Some(faults_for(uri))).await?,
    ))
}

/// While the guard lives, every WAL write of the store at `uri` (opened with
/// [`open_faulted`]) fails before reaching storage, so appends end indeterminate: Lance
/// retries, then poisons its writer.
pub fn fail_wal_writes(uri: &str) -> FaultGuard {
    with_rules(
        uri,
        vec![Rule::new(&[Op::PutIfAbsent, Op::Put], Action::FailBefore).path("/wal/")],
    )
}

/// Put `rules` on the fault injector of the stores at `uri` until the guard drops.
pub fn with_rules(uri: &str, rules: Vec<Rule>) -> FaultGuard {
    let faults = faults_for(uri);
    let ids = rules.into_iter().map(|r| faults.add(r)).collect();
    FaultGuard { faults, ids }
}

/// Removes fault rules when dropped.
pub struct FaultGuard {
    faults: Arc<Faults>,
    ids: Vec<RuleId>,
}

impl Drop for FaultGuard {
    fn drop(&mut self) {
        for id in &self.ids {
            self.faults.remove(*id);
        }
    }
}

/// Store an entry exactly as given (epoch, seq, hash and all), bypassing every check, by
/// appending it to the base table: what a broken writer or a damaged store leaves behind.
/// Storage options come from the URI's query.
pub async fn inject_raw_entry(uri: &str, e: &Entry) -> Result<()> {
    inject(uri, e, None).await
}

/// [`inject_raw_entry`] with the kind column set to `kind`, which need not be a kind (a
/// damaged row).
pub async fn inject_row_of_kind(uri: &str, e: &Entry, kind: u8) -> Result<()> {
    inject(uri, e, Some(kind)).await
}

async fn inject(uri: &str, e: &Entry, kind: Option<u8>) -> Result<()> {
    let (uri, storage) = split_uri(uri);
    let uri = lance_uri(&uri)?;
    let stamped = [Stamped {
        shard: e.shard,
        epoch: e.epoch,
        seq: e.seq,
        hlc: e.hlc,
        hash: e.content_hash,
        record: &e.record,
    }];
    let mut batch = to_batch("injected", &stamped)?;
    if let Some(k) = kind {
        let at = batch.schema().index_of(crate::schema::KIND).expect("a kind column");
        let mut columns = batch.columns().to_vec();
        columns[at] = Arc::new(arrow_array::UInt8Array::from(vec![k]));
        batch = arrow_array::RecordBatch::try_new(batch.schema(), columns).expect("the same schema");
    }
    let reader = RecordBatchIterator::new(vec![Ok(batch)], schema());
    let params = WriteParams {
        mode: WriteMode::Append,
        store_params: Some(crate::io::store_params(&uri, &storage, None)),
        ..Default::default()
    };
    Dataset::write(reader, uri.as_str(), Some(params))
        .await
        .map_err(|e| lance_err("inject", None, Written::Unknown, e))?;
    Ok(())
}

/// Run one compaction pass that stops at `stop`, as a crash there would.
pub async fn compact_interrupted(
    uri: &str,
    options: StoreOptions,
    opts: &CompactOptions,
    stop: StopPoint,
) -> Result<()> {
    let store = LanceStore::open_store(uri, options).await?;
    match crate::compact::compact(&store.shared, opts, Some(stop)).await {
        Err(_) => Ok(()),
        Ok(r) => Err(Error::backend(
            "lance",
            "compact_interrupted",
            None,
            Written::Unknown,
            format!("the pass was not interrupted: {r:?}"),
        )),
    }
}

/// One compaction pass through a store handle of its own.
pub async fn compact(uri: &str, options: StoreOptions, opts: &CompactOptions) -> Result<CompactReport> {
    let store = LanceStore::open_store(uri, options).await?;
    crate::compact::compact(&store.shared, opts, None).await
}

/// The dataset directory of a local store URI.
pub fn local_dir(uri: &str) -> Result<std::path::PathBuf> {
    crate::io::local_dir(&lance_uri(uri)?)
        .ok_or_else(|| Error::invalid("uri", None, format!("`{uri}` is not a local store")))
}

/// The base table's `columns`, every row in the order the rows are stored.
async fn base_rows(uri: &str, columns: &[&str]) -> Result<Vec<arrow_array::RecordBatch>> {
    use futures::TryStreamExt;
    let err = |e| lance_err("read", None, Written::Nothing, e);
    let ds = Dataset::open(&lance_uri(uri)?).await.map_err(err)?;
    let mut scan = ds.scan();
    scan.project(columns).map_err(err)?;
    scan.scan_in_order(true);
    scan.try_into_stream()
        .await
        .map_err(err)?
        .try_collect()
        .await
        .map_err(err)
}

/// The session id of every row of the base table, in the order the rows are stored.
pub async fn base_sessions(uri: &str) -> Result<Vec<String>> {
    use arrow_array::cast::AsArray;
    let batches = base_rows(uri, &[crate::schema::SESSION_ID]).await?;
    Ok(batches
        .iter()
        .flat_map(|b| {
            let col = b.column(0).as_string::<i32>();
            (0..b.num_rows()).map(|i| col.value(i).to_string()).collect::<Vec<_>>()
        })
        .collect())
}

/// Every `(shard, epoch, seq)` row of the base table, repeats included: what compaction
/// folded, to prove it folded nothing twice.
pub async fn base_keys(uri: &str) -> Result<Vec<(String, u64, u64)>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    let batches = base_rows(uri, &crate::schema::PRIMARY_KEY).await?;
    let mut out = Vec::new();
    for b in batches {
        let (s, e, q) = (
            b.column(0).as_string::<i32>(),
            b.column(1).as_primitive::<UInt64Type>(),
            b.column(2).as_primitive::<UInt64Type>(),
        );
        for i in 0..b.num_rows() {
            out.push((s.value(i).to_string(), e.value(i), q.value(i)));
        }
    }
    Ok(out)
}

/// The file of WAL entry `position` of `shard` in a local store (to lose it on purpose).
pub fn wal_entry_file(uri: &str, shard: ctxlog_core::ShardId, position: u64) -> Result<std::path::PathBuf> {
    Ok(local_dir(uri)?
        .join("_mem_wal")
        .join(shard.0.to_string())
        .join("wal")
        .join(lance::dataset::mem_wal::util::bit_reversed_filename(position, "arrow")))
}

/// Every flushed generation directory of a local store.
pub fn generation_dirs(uri: &str) -> Result<Vec<std::path::PathBuf>> {
    let io = |e: std::io::Error| Error::backend("lance", "list generations", None, Written::Nothing, e);
    let mut out = Vec::new();
    let root = local_dir(uri)?.join("_mem_wal");
    for shard in std::fs::read_dir(&root).map_err(io)? {
        for g in std::fs::read_dir(shard.map_err(io)?.path()).map_err(io)? {
            let g = g.map_err(io)?.path();
            if g.file_name().is_some_and(|n| n.to_string_lossy().contains("_gen_")) {
                out.push(g);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Raw access to the projection snapshots stored under the store at `uri` (storage options
/// in its query), for tests that damage them as a disk or an operator might: `f` changes
/// each one's bytes, which are written back; returns them as they were, newest first.
pub async fn tamper_with_snapshots(uri: &str, mut f: impl FnMut(&mut Vec<u8>) + Send) -> Result<Vec<Vec<u8>>> {
    let (base, storage) = split_uri(uri);
    let options = StoreOptions {
        create_if_missing: false,
        storage_options: storage.into_iter().collect(),
        ..StoreOptions::default()
    };
    let store = LanceStore::open_store(&base, options).await?;
    crate::snapshots::tamper(&store.shared, &mut f).await
}
