//! Writer names: MemWAL's shard manifests have no place for the writer id that owns a
//! shard, so it is recorded beside them, under `_ctxlog/writers/<shard>`.

use ctxlog_core::{Result, ShardId, WriterId, Written};
use lance_io::object_store::ObjectStore;
use object_store::path::Path;

use crate::error::{is_not_found, lance_err};

/// Where the writer id of a shard is recorded.
fn writer_path(base: &Path, shard: ShardId) -> Path {
    Path::from(format!("{base}/_ctxlog/writers/{shard}"))
}

/// Record the writer id of a shard (idempotent: the id is a function of the shard).
pub(crate) async fn remember(store: &ObjectStore, base: &Path, shard: ShardId, writer: &WriterId) -> Result<()> {
    store
        .put(&writer_path(base, shard), writer.as_str().as_bytes())
        .await
        .map_err(|e| lance_err("record the writer id", Some(shard), Written::Nothing, e))?;
    Ok(())
}

/// The writer id recorded for a shard (`unknown` when none is).
pub(crate) async fn writer_of(store: &ObjectStore, base: &Path, shard: ShardId) -> Result<String> {
    match store.read_one_all(&writer_path(base, shard)).await {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if is_not_found(&e) => Ok(String::from("unknown")),
        Err(e) => Err(lance_err("read the writer id", Some(shard), Written::Nothing, e)),
    }
}
