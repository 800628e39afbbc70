//! Fault injection for the conformance suite and the Lance tests. Not for production use.

use arrow_array::RecordBatchIterator;
use ctxlog_core::{CompactOptions, CompactReport, Entry, Error, Result, StoreOptions, Written};
use lance::Dataset;
use lance::dataset::{WriteMode, WriteParams};

use crate::LanceStore;
pub use crate::compact::StopPoint;
use crate::error::lance_err;
use crate::io::lance_uri;
use crate::schema::{Stamped, schema, to_batch};

/// Store an entry exactly as given (epoch, seq, hash and all), bypassing every check, by
/// appending it to the base table: what a broken writer or a damaged store leaves behind.
pub async fn inject_raw_entry(uri: &str, e: &Entry) -> Result<()> {
    let uri = lance_uri(uri)?;
    let stamped = [Stamped {
        shard: e.shard,
        epoch: e.epoch,
        seq: e.seq,
        hlc: e.hlc,
        hash: e.content_hash,
        record: &e.record,
    }];
    let batch = to_batch("injected", &stamped)?;
    let reader = RecordBatchIterator::new(vec![Ok(batch)], schema());
    let params = WriteParams {
        mode: WriteMode::Append,
        ..Default::default()
    };
    Dataset::write(reader, uri.as_str(), Some(params))
        .await
        .map_err(|e| lance_err("inject", None, Written::Unknown, e))?;
    Ok(())
}

/// While alive, every WAL write of the store's shards fails (each shard's `wal` directory
/// is replaced by a file), so appends end indeterminate. Local stores only.
pub struct WriteStall {
    dirs: Vec<std::path::PathBuf>,
}

impl Drop for WriteStall {
    fn drop(&mut self) {
        for wal in &self.dirs {
            let _ = std::fs::remove_file(wal);
            let _ = std::fs::rename(wal.with_extension("stalled"), wal);
        }
    }
}

/// While the guard lives, every WAL write of the store at `dataset_dir` fails.
pub fn stall_writes(dataset_dir: &std::path::Path) -> Result<WriteStall> {
    let io = |e: std::io::Error| Error::backend("lance", "stall", None, Written::Nothing, e);
    let mut dirs = Vec::new();
    for shard in std::fs::read_dir(dataset_dir.join("_mem_wal")).map_err(io)? {
        let wal = shard.map_err(io)?.path().join("wal");
        if wal.is_dir() {
            std::fs::rename(&wal, wal.with_extension("stalled")).map_err(io)?;
            std::fs::write(&wal, b"stalled by ctxlog-lance testing").map_err(io)?;
            dirs.push(wal);
        }
    }
    Ok(WriteStall { dirs })
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

/// Every `(shard, epoch, seq)` row of the base table, repeats included: what compaction
/// folded, to prove it folded nothing twice.
pub async fn base_keys(uri: &str) -> Result<Vec<(String, u64, u64)>> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use futures::TryStreamExt;
    let ds = Dataset::open(&lance_uri(uri)?)
        .await
        .map_err(|e| lance_err("read", None, Written::Nothing, e))?;
    let mut scan = ds.scan();
    scan.project(&crate::schema::PRIMARY_KEY)
        .map_err(|e| lance_err("read", None, Written::Nothing, e))?;
    let batches: Vec<arrow_array::RecordBatch> = scan
        .try_into_stream()
        .await
        .map_err(|e| lance_err("read", None, Written::Nothing, e))?
        .try_collect()
        .await
        .map_err(|e| lance_err("read", None, Written::Nothing, e))?;
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
