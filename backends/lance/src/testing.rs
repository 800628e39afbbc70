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
use ctxlog_core::backend::failpoint;

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
/// An entry with `purged` set is stored without a body (both body columns null), as purge
/// leaves one — or as damage may, on an id without a tombstone; its metadata as given.
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
    if e.purged {
        let schema = batch.schema();
        let mut columns = batch.columns().to_vec();
        for name in [crate::schema::BODY_TEXT, crate::schema::BODY_BYTES] {
            let at = schema.index_of(name).expect("a body column");
            columns[at] = arrow_array::new_null_array(schema.field(at).data_type(), batch.num_rows());
        }
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

/// Fail the next open of a shard of `store` once where it reads seqs and clocks after its
/// claim landed (as a throttled read there would); the guard disarms it, and says whether an
/// open reached the point.
pub fn fail_recovery_after_claim_once(store: &LanceStore) -> failpoint::Armed {
    failpoint::arm_once(
        crate::shard::RECOVER_AFTER_CLAIM,
        store.shared.uri.clone(),
        failpoint::Action::Fail,
    )
}

/// Run one compaction pass that stops at `stop`, as a crash there would.
pub async fn compact_interrupted(
    uri: &str,
    options: StoreOptions,
    opts: &CompactOptions,
    stop: StopPoint,
) -> Result<()> {
    let store = LanceStore::open_store(uri, options).await?;
    let _stopped = failpoint::arm(stop.point(), store.shared.uri.clone(), failpoint::Action::Fail);
    match crate::compact::compact(&store.shared, opts).await {
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
    crate::compact::compact(&store.shared, opts).await
}

/// One compaction pass that another compaction (through a handle of its own) overtakes:
/// the other plans, folds and commits after this one has read its generations and before
/// it commits. Returns this pass's report and the other's.
pub async fn compact_overtaken(
    uri: &str,
    options: StoreOptions,
    opts: &CompactOptions,
) -> Result<(CompactReport, CompactReport)> {
    let store = LanceStore::open_store(uri, options.clone()).await?;
    let failed = |what: &str| Error::backend("lance", "compact_overtaken", None, Written::Unknown, what.to_string());
    // This pass is held before its commit; the other passes there (once) and commits.
    let held = failpoint::arm_once(
        StopPoint::BeforeCommit.point(),
        store.shared.uri.clone(),
        failpoint::Action::Pause,
    );
    let mine = {
        let (shared, opts) = (store.shared.clone(), opts.clone());
        tokio::spawn(async move { crate::compact::compact(&shared, &opts).await })
    };
    if !held.reached(options.timeout).await {
        return Err(failed("this pass never reached its commit"));
    }
    let theirs = compact(uri, options, opts).await?;
    drop(held);
    let mine = mine.await.map_err(|e| failed(&format!("this pass panicked: {e}")))??;
    Ok((mine, theirs))
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

/// Every flushed generation directory of a local store (none before a shard exists).
pub fn generation_dirs(uri: &str) -> Result<Vec<std::path::PathBuf>> {
    let io = |e: std::io::Error| Error::backend("lance", "list generations", None, Written::Nothing, e);
    let mut out = Vec::new();
    let root = local_dir(uri)?.join("_mem_wal");
    // No shard yet: no generation.
    if !root.exists() {
        return Ok(out);
    }
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

/// The existing store at `uri` (storage options in its query), never created.
async fn open_existing(uri: &str) -> Result<LanceStore> {
    let (base, storage) = split_uri(uri);
    let options = StoreOptions::default()
        .with_create_if_missing(false)
        .with_storage_options(storage.into_iter().collect());
    LanceStore::open_store(&base, options).await
}

/// Raw access to the projection snapshots stored under the store at `uri` (storage options
/// in its query), for tests that damage them as a disk or an operator might: `f` changes
/// each one's bytes, which are written back; returns them as they were, newest first.
pub async fn tamper_with_snapshots(uri: &str, mut f: impl FnMut(&mut Vec<u8>) + Send) -> Result<Vec<Vec<u8>>> {
    let store = open_existing(uri).await?;
    crate::snapshots::tamper(&store.shared, &mut f).await
}

/// Rewrite the datasets that every stored projection snapshot of the store at `uri` (storage
/// options in its query) names: `f` gets each `(dataset URI as Lance sees it, version)` of a
/// snapshot's cursor and returns what to store instead. The snapshot is sealed again with a
/// valid checksum — what anyone who can write under `_ctxlog/snapshots/` can do. Returns how
/// many snapshots were rewritten.
pub async fn rewrite_snapshot_sources(
    uri: &str,
    mut f: impl FnMut(&str, u64) -> (String, u64) + Send,
) -> Result<usize> {
    let store = open_existing(uri).await?;
    crate::snapshots::rewrite_sources(&store.shared, &mut f).await
}

/// The latest version of the Lance dataset at `uri` (a local path, or a URI as a store takes
/// it), opened with no storage options.
pub async fn dataset_version(uri: &str) -> Result<u64> {
    let ds = Dataset::open(&lance_uri(uri)?)
        .await
        .map_err(|e| lance_err("read", None, Written::Nothing, e))?;
    Ok(ds.version().version)
}

/// How many fetches of readers of the store at `uri` in this process found, where their index
/// pinned an entry, another row (or none), and found the entries by key instead. Stays 0
/// unless a row's location went wrong.
pub fn misplaced_rows(uri: &str) -> Result<u64> {
    let (base, _) = split_uri(uri);
    Ok(crate::index::misplaced_rows(&lance_uri(&base)?))
}

pub use decoded::decoded_values_containing;

/// Issue 23, item 10: the audit of rule 16 that a byte scan cannot do. Compacted data files
/// are compressed, and an object store has no files to scan: this search reads what the
/// store keeps with Lance's (and Arrow's) own decoders instead.
mod decoded {
    use std::collections::{BTreeSet, HashSet};

    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::{Array, RecordBatch};
    use arrow_schema::DataType;
    use ctxlog_core::{Error, Result, Written};
    use futures::TryStreamExt;
    use lance::Dataset;
    use lance::dataset::fragment::FileFragment;
    use lance_io::object_store::ObjectStore;
    use object_store::ObjectStoreExt as _;
    use object_store::path::Path;

    use crate::error::{lance_err, store_err};
    use crate::store::Shared;

    const OP: &str = "search decoded values";

    fn err(e: lance::Error) -> Error {
        lance_err(OP, None, Written::Nothing, e)
    }

    fn cannot(what: String) -> Error {
        Error::backend("lance", OP, None, Written::Nothing, what)
    }

    /// Every place the store at `uri` (storage options in its query) still holds `needle`:
    ///
    /// - in a decoded value of **every version of the base table** Lance still lists (each
    ///   checked out and scanned whole, rows deleted in that version included), and of every
    ///   data file under its `data/` that no listed version references;
    /// - the same for **every flushed generation** (a dataset: a directory with `_versions/`
    ///   under `_mem_wal/`);
    /// - in a decoded value of **every WAL entry** (an Arrow IPC stream under
    ///   `_mem_wal/<shard>/wal/`);
    /// - in the raw bytes of **any object** of the store (snapshots, manifests, what a
    ///   decoder skips).
    ///
    /// Objects are listed and read through the store's own object store (local disk,
    /// `memory://` or S3 alike), never as files. A value is searched in every string and
    /// binary column. Each place is one line: `base table version 7: row address 4294967298
    /// (fragment 1, offset 2, deleted), column body_text`, `generation
    /// _mem_wal/<shard>/<dir> version 1: …`, `WAL entry _mem_wal/<shard>/wal/<file>: batch 0,
    /// row 1, column metadata`, `object <path>: raw bytes`. What it cannot decode, or values
    /// a version hides from a scan (data overlays, replaced columns; ctxlog writes neither),
    /// is an error, never a silent pass.
    pub async fn decoded_values_containing(uri: &str, needle: &str) -> Result<Vec<String>> {
        let store = super::open_existing(uri).await?;
        let shared: &Shared = &store.shared;
        let needle = needle.as_bytes();
        let latest = shared.latest().await?;
        let (objects, base_path) = shared.io(&latest).await?;
        let mut hits = Vec::new();

        // Every object of the store, through its object store.
        let mut listed: Vec<object_store::ObjectMeta> = objects
            .inner
            .list(Some(&base_path))
            .try_collect()
            .await
            .map_err(|e| store_err(OP, None, Written::Nothing, e))?;
        listed.sort_by(|a, b| a.location.cmp(&b.location));
        let mut generations = BTreeSet::new();
        // Directories under `_mem_wal/` holding data files: each must be a generation.
        let mut with_data = BTreeSet::new();
        for meta in &listed {
            let rel = relative(&base_path, &meta.location);
            let bytes = match objects.inner.get(&meta.location).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map_err(|e| store_err(OP, None, Written::Nothing, e))?,
                Err(e) => return Err(store_err(OP, None, Written::Nothing, e)),
            };
            if contains(&bytes, needle) {
                hits.push(format!("object {rel}: raw bytes"));
            }
            let Some(in_wal) = rel.strip_prefix("_mem_wal/") else {
                continue;
            };
            if let Some((dataset, _)) = in_wal.split_once("/_versions/") {
                generations.insert(format!("_mem_wal/{dataset}"));
            } else if let Some((dataset, _)) = in_wal.split_once("/data/") {
                with_data.insert(format!("_mem_wal/{dataset}"));
            } else if in_wal.contains("/wal/") && rel.ends_with(".arrow") {
                wal_entry(&bytes, &format!("WAL entry {rel}"), needle, &mut hits)?;
            }
        }

        // The base table, every version.
        search_dataset(&objects, latest, "base table", needle, &mut hits).await?;

        // Every flushed generation, every version: opened as the readers open them. Data
        // files in a directory without versions (a generation half deleted) cannot be
        // opened as a dataset: not decoded, so not shown free of the needle.
        if let Some(d) = with_data.difference(&generations).next() {
            return Err(cannot(format!(
                "{d} holds data files but no dataset versions: its values cannot be decoded"
            )));
        }
        let root = shared.uri.trim_end_matches('/');
        for g in generations {
            let ds = shared.open_dataset(&format!("{root}/{g}")).await.map_err(err)?;
            search_dataset(&objects, ds, &format!("generation {g}"), needle, &mut hits).await?;
        }
        Ok(hits)
    }

    /// `path` below the store's base path.
    fn relative(base: &Path, path: &Path) -> String {
        let (base, path): (&str, &str) = (base.as_ref(), path.as_ref());
        path.strip_prefix(base)
            .map(|r| r.trim_start_matches('/'))
            .unwrap_or(path)
            .to_string()
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
    }

    /// The rows of `array` whose value holds `needle`: every string and binary type.
    fn matching_rows(array: &dyn Array, needle: &[u8]) -> Vec<usize> {
        fn rows<'a>(values: impl Iterator<Item = Option<&'a [u8]>>, needle: &[u8]) -> Vec<usize> {
            values
                .enumerate()
                .filter(|(_, v)| v.is_some_and(|v| contains(v, needle)))
                .map(|(i, _)| i)
                .collect()
        }
        match array.data_type() {
            DataType::Utf8 => rows(array.as_string::<i32>().iter().map(|v| v.map(str::as_bytes)), needle),
            DataType::LargeUtf8 => rows(array.as_string::<i64>().iter().map(|v| v.map(str::as_bytes)), needle),
            DataType::Utf8View => rows(array.as_string_view().iter().map(|v| v.map(str::as_bytes)), needle),
            DataType::Binary => rows(array.as_binary::<i32>().iter(), needle),
            DataType::LargeBinary => rows(array.as_binary::<i64>().iter(), needle),
            DataType::BinaryView => rows(array.as_binary_view().iter(), needle),
            DataType::FixedSizeBinary(_) => rows(array.as_fixed_size_binary().iter(), needle),
            _ => Vec::new(),
        }
    }

    /// Every `(column, row)` of `batch` whose value holds `needle`.
    fn matches(batch: &RecordBatch, needle: &[u8]) -> Vec<(String, usize)> {
        let schema = batch.schema();
        let mut out = Vec::new();
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            for row in matching_rows(column.as_ref(), needle) {
                out.push((field.name().clone(), row));
            }
        }
        out
    }

    /// A WAL entry's values, decoded as the Arrow IPC stream it is.
    fn wal_entry(bytes: &[u8], what: &str, needle: &[u8], hits: &mut Vec<String>) -> Result<()> {
        let corrupt = |e: arrow_schema::ArrowError| Error::Corrupt {
            shard: None,
            what: format!("{what} cannot be decoded as an Arrow IPC stream: {e}"),
        };
        let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None).map_err(corrupt)?;
        for (b, batch) in reader.enumerate() {
            let batch = batch.map_err(corrupt)?;
            for (column, row) in matches(&batch, needle) {
                hits.push(format!("{what}: batch {b}, row {row}, column {column}"));
            }
        }
        Ok(())
    }

    /// Every version of the dataset `latest` is the newest of, scanned whole (deleted rows
    /// too), then every data file of it that no listed version references.
    async fn search_dataset(
        objects: &ObjectStore,
        latest: Dataset,
        what: &str,
        needle: &[u8],
        hits: &mut Vec<String>,
    ) -> Result<()> {
        let mut referenced: HashSet<String> = HashSet::new();
        let newest = latest.version().version;
        for v in latest.versions().await.map_err(err)? {
            let ds = if v.version == newest {
                latest.clone()
            } else {
                latest.checkout_version(v.version).await.map_err(err)?
            };
            for f in ds.fragments().iter() {
                // What a scan would not show: values an overlay or a newer file of the
                // fragment replaces are still stored.
                if !f.overlays.is_empty() {
                    return Err(cannot(format!(
                        "{what} version {}: fragment {} has data overlays, whose replaced values a scan \
                         does not show",
                        v.version, f.id
                    )));
                }
                let mut fields = HashSet::new();
                for df in &f.files {
                    if df.fields.iter().any(|&id| id < 0 || !fields.insert(id)) {
                        return Err(cannot(format!(
                            "{what} version {}: fragment {} has replaced or dropped columns, whose old \
                             values a scan does not show",
                            v.version, f.id
                        )));
                    }
                    referenced.insert(df.path.clone());
                }
            }
            let mut scan = ds.scan();
            scan.with_row_id().with_row_address().include_deleted_rows();
            let mut stream = scan.try_into_stream().await.map_err(err)?;
            while let Some(batch) = stream.try_next().await.map_err(err)? {
                let found = matches(&batch, needle);
                if found.is_empty() {
                    continue;
                }
                let ids = batch.column_by_name(lance_core::ROW_ID);
                let addrs = batch
                    .column_by_name(lance_core::ROW_ADDR)
                    .and_then(|a| a.as_primitive_opt::<UInt64Type>());
                for (column, row) in found {
                    // A deleted row has no row id.
                    let deleted = if ids.is_some_and(|ids| ids.is_null(row)) {
                        ", deleted"
                    } else {
                        ""
                    };
                    let place = match addrs {
                        Some(a) => {
                            let a = a.value(row);
                            format!(
                                "row address {a} (fragment {}, offset {}{deleted})",
                                a >> 32,
                                a & 0xffff_ffff
                            )
                        }
                        None => format!("row {row} of a batch{deleted}"),
                    };
                    hits.push(format!("{what} version {}: {place}, column {column}", v.version));
                }
            }
        }
        // Data files no listed version references (a failed commit's, say): each decoded as
        // a fragment of its own.
        let data_dir = latest.data_dir();
        let prefix = format!("{data_dir}/");
        let files: Vec<object_store::ObjectMeta> = objects
            .inner
            .list(Some(&data_dir))
            .try_collect()
            .await
            .map_err(|e| store_err(OP, None, Written::Nothing, e))?;
        for meta in files {
            let location: &str = meta.location.as_ref();
            let Some(name) = location.strip_prefix(&prefix) else {
                continue;
            };
            if !name.ends_with(".lance") || referenced.contains(name) {
                continue;
            }
            let fragment = FileFragment::create_from_file(name, &latest, 0, None)
                .await
                .map_err(|e| cannot(format!("{what}: unreferenced data file {name} cannot be decoded: {e}")))?;
            let mut scan = latest.scan();
            scan.with_fragments(vec![fragment]);
            let mut stream = scan.try_into_stream().await.map_err(err)?;
            let mut offset = 0;
            while let Some(batch) = stream.try_next().await.map_err(err)? {
                for (column, row) in matches(&batch, needle) {
                    hits.push(format!(
                        "{what}: data file data/{name} (no listed version references it), row {}, column {column}",
                        offset + row
                    ));
                }
                offset += batch.num_rows();
            }
        }
        Ok(())
    }
}
