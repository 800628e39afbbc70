//! The MemWAL reads every reader makes — the list of shards, a shard's newest manifest, one
//! WAL entry, where a shard's WAL ends — made by ctxlog itself rather than through Lance's
//! `list_mem_wal_latest_shard_ids`, `ShardManifestStore::latest`, `WalTailer::read_entry`
//! and `WalTailer::next_position`: Lance formats a failed request's cause into its message, so a
//! throttled or unreachable object store reached users as a plain storage error (502)
//! instead of `Unavailable` (503, retry later), the typed cause lost. An entry is the Arrow
//! IPC stream MemWAL puts whole: the writer's epoch in the schema's metadata, then the
//! batches of one flush (none for a successor's fence sentinel). A manifest version is a
//! protobuf `ShardManifest` put once under its bit-reversed version; the newest is found as
//! Lance finds it (the version hint when it names one that exists, else the listing, then
//! HEADs forward while a next version exists).

use arrow_array::RecordBatch;
use ctxlog_core::{Error, Result, ShardId, Written};
use lance::dataset::mem_wal::util::{
    manifest_filename, mem_wal_path, parse_bit_reversed_filename, shard_manifest_path, shard_wal_path,
    wal_entry_filename,
};
use lance_io::object_store::ObjectStore;
use lance_table::format::pb;
use lance_table::system_index::mem_wal::ShardManifest;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use prost::Message as _;
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

/// Whether the object at `path` exists (a HEAD).
async fn exists(store: &ObjectStore, path: &Path) -> std::result::Result<bool, object_store::Error> {
    match store.inner.head(path).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The highest number named (bit-reversed, as MemWAL names its objects) by an object in `dir`
/// whose name ends with `ext`; 0 when none does.
async fn highest_listed(store: &ObjectStore, dir: &Path, ext: &str) -> std::result::Result<u64, object_store::Error> {
    let mut listing = store.inner.list(Some(dir));
    let mut highest = 0;
    while let Some(item) = futures::StreamExt::next(&mut listing).await {
        let meta = item?;
        if let Some(n) = meta
            .location
            .filename()
            .filter(|f| f.ends_with(ext))
            .and_then(parse_bit_reversed_filename)
        {
            highest = highest.max(n);
        }
    }
    Ok(highest)
}

/// `shard`'s newest manifest (its writer epoch, generations and WAL positions), `None` for a
/// shard that has none. A failed request is mapped as every object-store error is (`op`,
/// `written` as the caller says); a manifest that does not decode is `Corrupt`.
pub(crate) async fn latest_manifest(
    store: &ObjectStore,
    base_path: &Path,
    shard: ShardId,
    op: &'static str,
    written: Written,
) -> Result<Option<ShardManifest>> {
    let dir = shard_manifest_path(base_path, &shard.0);
    let failed = |e| store_err(op, Some(shard), written, e);
    let version_path = |v: u64| dir.clone().join(manifest_filename(v).as_str());
    // The hint is best effort, as in Lance: unreadable, the versions are listed.
    let read_hint = async {
        store
            .inner
            .get(&dir.clone().join("version_hint.json"))
            .await?
            .bytes()
            .await
    };
    let hint = match read_hint.await {
        Ok(bytes) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["version"].as_u64()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => {
            tracing::debug!(%shard, error = %e, "reading a shard's version hint failed; listing its versions");
            None
        }
    };
    let mut latest = match hint {
        Some(h) if h > 0 && exists(store, &version_path(h)).await.map_err(failed)? => h,
        _ => highest_listed(store, &dir, ".binpb").await.map_err(failed)?,
    };
    // Forward two at a time (Lance's scan batch), while either exists.
    loop {
        let (after, next) = (version_path(latest + 1), version_path(latest + 2));
        let (one, two) = futures::try_join!(exists(store, &after), exists(store, &next)).map_err(failed)?;
        latest = match (one, two) {
            (_, true) => latest + 2,
            (true, false) => latest + 1,
            (false, false) => break,
        };
    }
    if latest == 0 {
        return Ok(None);
    }
    let bytes = store
        .inner
        .get(&version_path(latest))
        .await
        .map_err(failed)?
        .bytes()
        .await
        .map_err(failed)?;
    let corrupt = |what: String| Error::Corrupt {
        shard: Some(shard),
        what: format!("shard manifest version {latest}: {what}"),
    };
    let decoded = pb::ShardManifest::decode(bytes).map_err(|e| corrupt(format!("not a ShardManifest: {e}")))?;
    ShardManifest::try_from(decoded)
        .map(Some)
        .map_err(|e| corrupt(e.to_string()))
}

/// How far past the hint [`next_wal_position`] probes before it lists (Lance's
/// `MAX_CURSOR_PROBE`).
const MAX_PROBE: u64 = 4096;

/// Where `shard`'s next WAL entry goes, as Lance's `WalTailer::next_position` finds it: past
/// the run of entries from the newest manifest's last seen position when that entry exists
/// (at most [`MAX_PROBE`] of them), else one past the highest listed.
pub(crate) async fn next_wal_position(
    store: &ObjectStore,
    base_path: &Path,
    shard: ShardId,
    op: &'static str,
    written: Written,
) -> Result<u64> {
    let failed = |e| store_err(op, Some(shard), written, e);
    let wal = shard_wal_path(base_path, &shard.0);
    let entry = |p: u64| wal.clone().join(wal_entry_filename(p));
    // The manifest only hints where to look: unreadable, the WAL is listed.
    let hint = match latest_manifest(store, base_path, shard, op, written).await {
        Ok(m) => m.map_or(0, |m| m.wal_entry_position_last_seen),
        Err(e) => {
            tracing::debug!(%shard, error = %e, "reading a shard's manifest failed; listing its WAL");
            0
        }
    };
    if hint > 0 && exists(store, &entry(hint)).await.map_err(failed)? {
        let mut next = hint + 1;
        while next - hint <= MAX_PROBE {
            if !exists(store, &entry(next)).await.map_err(failed)? {
                return Ok(next);
            }
            next += 1;
        }
    }
    let highest = highest_listed(store, &wal, "").await.map_err(failed)?;
    highest.checked_add(1).ok_or_else(|| Error::Corrupt {
        shard: Some(shard),
        what: "a WAL position past u64::MAX".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LanceStore;
    use ctxlog_core::{Record, Store, StoreOptions, WriterId};
    use lance::dataset::mem_wal::{ShardManifestStore, WalTailer};

    /// What ctxlog reads itself is what Lance reads (its format is Lance's, copied): every
    /// WAL entry (epoch and batches, a missing one as none), where the WAL goes on, and the
    /// newest manifest, on a shard with entries, a flushed generation and a second claim.
    #[tokio::test]
    async fn the_reads_ctxlog_makes_itself_are_lances() {
        let dir = tempfile::tempdir().unwrap();
        let uri = dir.path().join("parity.lance").to_string_lossy().into_owned();
        let store = LanceStore::open_store(&uri, StoreOptions::default()).await.unwrap();
        let writer = WriterId::new("parity").unwrap();
        let shard = writer.shard_id();
        for claim in 0..2 {
            let mut s = store.open_shard(&writer).await.unwrap();
            // Past `max_wal_tail` appends: a freeze, a generation, a new manifest.
            for i in 0..20 {
                let id = format!("r{claim}-{i}");
                s.append(vec![Record::text(id, "bot", "s", "user", "x")]).await.unwrap();
            }
            s.close().await.unwrap();
        }
        let shared = &store.shared;
        let (os, base) = shared.io(&shared.latest().await.unwrap()).await.unwrap();
        let theirs = ShardManifestStore::new(os.clone(), &base, shard.0, 2)
            .latest()
            .await
            .unwrap();
        let ours = latest_manifest(&os, &base, shard, "read", Written::Nothing)
            .await
            .unwrap();
        assert!(ours.is_some(), "the shard has a manifest");
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "the newest manifest");
        let tailer = WalTailer::new(os.clone(), base.clone(), shard.0);
        let next = next_wal_position(&os, &base, shard, "read", Written::Nothing)
            .await
            .unwrap();
        assert_eq!(next, tailer.next_position().await.unwrap(), "where the WAL goes on");
        assert!(next > 20, "the WAL holds both claims' entries: {next}");
        for position in 1..=next {
            let ours = read_entry(&os, &base, shard, position, "read", Written::Nothing)
                .await
                .unwrap();
            let theirs = tailer.read_entry(position).await.unwrap();
            match (ours, theirs) {
                (None, None) => {}
                (Some(o), Some(t)) => {
                    assert_eq!(o.epoch, t.writer_epoch, "entry {position}'s epoch");
                    // The rows (the schema's metadata is the entry's, which Lance keeps apart).
                    let rows = |bs: &[RecordBatch]| -> Vec<_> {
                        bs.iter()
                            .map(|b| (b.schema().fields().clone(), b.columns().to_vec()))
                            .collect()
                    };
                    assert_eq!(rows(&o.batches), rows(&t.batches), "entry {position}'s batches");
                }
                (o, t) => panic!("entry {position}: ours {:?}, Lance's {:?}", o.is_some(), t.is_some()),
            }
        }
    }
}
