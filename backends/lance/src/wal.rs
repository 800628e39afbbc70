//! The MemWAL reads every reader makes — the list of shards, one WAL entry — made by ctxlog
//! itself rather than through Lance's `list_mem_wal_latest_shard_ids` and
//! `WalTailer::read_entry`: Lance formats a failed request's cause into its message, so a
//! throttled or unreachable object store reached users as a plain storage error (502)
//! instead of `Unavailable` (503, retry later), the typed cause lost. An entry is the Arrow
//! IPC stream MemWAL puts whole: the writer's epoch in the schema's metadata, then the
//! batches of one flush (none for a successor's fence sentinel).

use arrow_array::RecordBatch;
use ctxlog_core::{Error, Result, ShardId, Written};
use lance::dataset::mem_wal::util::{mem_wal_path, shard_wal_path, wal_entry_filename};
use lance_io::object_store::ObjectStore;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use uuid::Uuid;

use crate::error::store_err;

/// The key of the writer epoch in an entry's schema metadata (MemWAL's `WRITER_EPOCH_KEY`).
const WRITER_EPOCH: &str = "writer_epoch";

/// Every shard of the store (its directory under `_mem_wal/`), sorted; `op` names the
/// operation that lists them.
pub(crate) async fn shard_ids(store: &ObjectStore, base_path: &Path, op: &'static str) -> Result<Vec<Uuid>> {
    let listed = store
        .inner
        .list_with_delimiter(Some(&mem_wal_path(base_path)))
        .await
        .map_err(|e| store_err(op, None, Written::Nothing, e))?;
    let mut ids: Vec<Uuid> = listed
        .common_prefixes
        .iter()
        .filter_map(|p| Uuid::parse_str(p.filename()?).ok())
        .collect();
    ids.sort();
    Ok(ids)
}

/// A WAL entry of one shard.
pub(crate) struct WalEntry {
    pub(crate) position: u64,
    /// The epoch of the writer that put it.
    pub(crate) epoch: u64,
    pub(crate) batches: Vec<RecordBatch>,
}

/// The entry at `position` of `shard`'s WAL, `None` when there is none. A failed request is
/// mapped as every object-store error is (`op`, `written` as the caller says); an object
/// that is not a WAL entry is `Corrupt`.
pub(crate) async fn read_entry(
    store: &ObjectStore,
    base_path: &Path,
    shard: ShardId,
    position: u64,
    op: &'static str,
    written: Written,
) -> Result<Option<WalEntry>> {
    let path = shard_wal_path(base_path, &shard.0).join(wal_entry_filename(position));
    let failed = |e| store_err(op, Some(shard), written, e);
    let bytes = match store.inner.get(&path).await {
        Ok(got) => got.bytes().await.map_err(failed)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    let corrupt = |what: String| Error::Corrupt {
        shard: Some(shard),
        what: format!("WAL entry {position}: {what}"),
    };
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(bytes), None)
        .map_err(|e| corrupt(format!("not an Arrow IPC stream: {e}")))?;
    let epoch = reader
        .schema()
        .metadata()
        .get(WRITER_EPOCH)
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| corrupt(format!("no `{WRITER_EPOCH}` in its metadata")))?;
    let batches = reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| corrupt(format!("a batch does not decode: {e}")))?;
    Ok(Some(WalEntry {
        position,
        epoch,
        batches,
    }))
}
