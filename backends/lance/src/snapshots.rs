//! Projection snapshots (rule 17) as objects under the dataset: `_ctxlog/snapshots/<time>-<uuid>`
//! (names sort by when they were stored), the newest [`KEEP`] kept; the store's identity
//! in `_ctxlog/identity`, made by whichever process wins its put-if-absent. Lance's own
//! cleanup never touches `_ctxlog/`.
//!
//! The projector's cursor is saved as JSON: each shard's next WAL position, and the dataset
//! versions (the base table's, each unfolded generation's) that the index's row locations
//! point into. Resuming reopens exactly those versions; if gc has removed one, the snapshot
//! is stale and the reader scans in full.

use std::collections::HashMap;

use ctxlog_core::backend::snapshot::{KEEP, Rejected, read_in_parts, read_parts};
use ctxlog_core::{Result, ShardId, Written, redact_uri};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use serde_json::json;

use crate::error::{is_not_found, lance_err, store_err};
use crate::store::Shared;
use crate::tiers::READ_WINDOW;

fn identity_path(base: &Path) -> Path {
    Path::from(format!("{base}/_ctxlog/identity"))
}

/// Where the snapshots lie under the dataset.
const DIR: &str = "_ctxlog/snapshots";

fn snapshot_path(base: &Path, name: &str) -> Path {
    Path::from(format!("{base}/{DIR}/{name}"))
}

/// The store's identity; with `create`, made now if it has none (race-safe).
pub(crate) async fn identity(shared: &Shared, create: bool) -> Result<Option<String>> {
    let (store, base_path) = shared.objects().await?;
    let path = identity_path(&base_path);
    for _ in 0..2 {
        match store.read_one_all(&path).await {
            Ok(bytes) => return Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(lance_err("read the store identity", None, Written::Nothing, e)),
        }
        if !create {
            return Ok(None);
        }
        let id = uuid::Uuid::new_v4().to_string();
        match store.put_if_absent(&path, id.clone().into_bytes().into()).await {
            Ok(()) => return Ok(Some(id)),
            // Another process made it first: read theirs.
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(store_err("make the store identity", None, Written::Unknown, e)),
        }
    }
    Ok(None)
}

/// The stored snapshots' names, newest first.
pub(crate) async fn names(shared: &Shared) -> Result<Vec<String>> {
    names_in(shared, DIR, "list snapshots").await
}

/// The names of the objects in `dir` under the dataset, newest first.
async fn names_in(shared: &Shared, dir: &str, op: &'static str) -> Result<Vec<String>> {
    let (store, base_path) = shared.objects().await?;
    let prefix = Path::from(format!("{base_path}/{dir}"));
    let listed: Vec<object_store::ObjectMeta> = store
        .inner
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| store_err(op, None, Written::Nothing, e))?;
    let mut names: Vec<String> = listed
        .into_iter()
        .filter_map(|m| m.location.filename().map(str::to_string))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// The bytes of snapshot `name`; `None` if it is gone.
pub(crate) async fn read(shared: &Shared, name: &str) -> Result<Option<Vec<u8>>> {
    read_in(shared, DIR, name, "read a snapshot").await
}

/// The bytes of the object `name` in `dir` under the dataset; `None` if it is gone.
async fn read_in(shared: &Shared, dir: &str, name: &str, op: &'static str) -> Result<Option<Vec<u8>>> {
    if let Some(local) = crate::io::local_dir(&shared.uri) {
        return read_local_file(local.join(dir).join(name)).await;
    }
    let (store, base_path) = shared.objects().await?;
    let path = Path::from(format!("{base_path}/{dir}/{name}"));
    let bytes = match store.inner.get(&path).await {
        Ok(got) => got.bytes().await,
        Err(e) => Err(e),
    };
    match bytes {
        // The loaded index keeps these bytes: take the buffer rather than copy it.
        Ok(bytes) => Ok(Some(Vec::from(bytes))),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(store_err(op, None, Written::Nothing, e)),
    }
}

/// A local store's snapshot, read from its file on every core at once (`read_in_parts` says
/// why) rather than through the object store, which reads a range on one thread into a
/// buffer it first fills with zeros. So a test's injected object-store faults never strike
/// this one read of a local store; on the object stores they do.
async fn read_local_file(path: std::path::PathBuf) -> Result<Option<Vec<u8>>> {
    let err = |e: std::io::Error| {
        lance_err(
            "read a snapshot",
            None,
            Written::Nothing,
            lance::Error::io_source(Box::new(e)),
        )
    };
    let read = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
        // Every reader reads the one open file at its own offsets (positional reads share no
        // file position), never the path again: a newer snapshot's cleanup may delete the
        // file meanwhile, and an open handle still reads it whole.
        let mut readers = vec![file];
        for _ in 1..read_parts(len) {
            readers.push(readers[0].try_clone()?);
        }
        let read = |file: &mut std::fs::File, offset, part: &mut [u8]| file.read_exact_at(part, offset);
        read_in_parts(len, readers, read).map(Some)
    });
    read.await.map_err(|e| err(std::io::Error::other(e)))?.map_err(err)
}

/// Store a snapshot, then delete all but the newest [`KEEP`].
pub(crate) async fn put(shared: &Shared, bytes: Vec<u8>) -> Result<()> {
    let (store, base_path) = shared.objects().await?;
    let name = format!(
        "{:020}-{}",
        crate::io::storage_now().timestamp_millis().max(0),
        uuid::Uuid::new_v4()
    );
    store
        .inner
        .put(&snapshot_path(&base_path, &name), bytes.into())
        .await
        .map_err(|e| store_err("save a snapshot", None, Written::Unknown, e))?;
    for old in names(shared).await?.into_iter().skip(KEEP) {
        match store.inner.delete(&snapshot_path(&base_path, &old)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_err("delete an old snapshot", None, Written::Unknown, e)),
        }
    }
    Ok(())
}

/// What a snapshot keeps of the projector's cursor: each shard's next WAL position, and the
/// datasets rows were scanned from, at their versions.
pub(crate) fn save_cursor(wal_next: &HashMap<ShardId, u64>, sources: &[Dataset]) -> Vec<u8> {
    let wal: Vec<(String, u64)> = wal_next.iter().map(|(s, n)| (s.0.to_string(), *n)).collect();
    let sources: Vec<(String, u64)> = sources
        .iter()
        .map(|ds| (ds.uri().to_string(), ds.version().version))
        .collect();
    json!({"wal_next": wal, "sources": sources}).to_string().into_bytes()
}

/// The cursor a snapshot saved (see [`save_cursor`]), with its datasets reopened at the
/// versions it saved.
pub(crate) async fn resume_cursor(
    shared: &Shared,
    saved: &[u8],
) -> std::result::Result<(HashMap<ShardId, u64>, Vec<Dataset>), Rejected> {
    #[derive(serde::Deserialize)]
    struct Saved {
        wal_next: Vec<(String, u64)>,
        sources: Vec<(String, u64)>,
    }
    let saved: Saved = serde_json::from_slice(saved).map_err(|e| Rejected::Corrupt(format!("cursor: {e}")))?;
    let mut wal_next = HashMap::new();
    for (shard, next) in saved.wal_next {
        let id = uuid::Uuid::parse_str(&shard).map_err(|e| Rejected::Corrupt(format!("cursor shard {shard}: {e}")))?;
        wal_next.insert(ShardId(id), next);
    }
    // A snapshot is bytes that anyone who can write under `_ctxlog/snapshots/` can forge
    // (its checksum is no secret), and the datasets it names are opened with the store's
    // storage options: it is used only if each one is a dataset of this store.
    if let Some((uri, _)) = saved.sources.iter().find(|(uri, _)| !inside_store(&shared.uri, uri)) {
        return Err(Rejected::Corrupt(format!(
            "cursor names a dataset outside the store: {}",
            redact_uri(uri)
        )));
    }
    // The base table starts from the version this handle holds (no listing of its
    // versions); the others are opened at once, each a round trip or two on an object store.
    let held = shared.held().await;
    let sources: Vec<Dataset> = futures::stream::iter(saved.sources)
        .map(|(uri, version)| {
            let held = &held;
            async move {
                let gone =
                    |e: lance::Error| Rejected::Stale(format!("{} version {version} is gone: {e}", redact_uri(&uri)));
                let ds = if uri == held.uri() {
                    held.clone()
                } else {
                    shared.open_dataset(&uri).await.map_err(gone)?
                };
                if ds.version().version == version {
                    Ok(ds)
                } else {
                    ds.checkout_version(version).await.map_err(gone)
                }
            }
        })
        .buffered(READ_WINDOW)
        .try_collect()
        .await?;
    Ok((wal_next, sources))
}

/// Whether `uri` names a dataset of the store at `root` (both as Lance sees them): the base
/// table itself, or a flushed generation of one of its shards,
/// `<root>/_mem_wal/<shard>/<directory>` as `tiers` names them. Nothing else — no other
/// path, bucket or scheme, no `..`, no escape, query or fragment a URI parser could turn
/// into another location.
fn inside_store(root: &str, uri: &str) -> bool {
    let root = root.trim_end_matches('/');
    if uri == root || uri.strip_suffix('/') == Some(root) {
        return true;
    }
    let Some(rest) = uri.strip_prefix(root).and_then(|r| r.strip_prefix("/_mem_wal/")) else {
        return false;
    };
    let Some((shard, dir)) = rest.split_once('/') else {
        return false;
    };
    // The shard as `tiers` writes it (a hyphenated UUID), and a directory name that is one
    // plain path segment (MemWAL's are `<hex>_gen_<n>`).
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    uuid::Uuid::parse_str(shard).is_ok_and(|id| id.to_string() == shard)
        && dir.starts_with(|c: char| c.is_ascii_alphanumeric())
        && dir.chars().all(plain)
}

/// Every stored snapshot through `f`, written back (tests: `testing::tamper_with_snapshots`).
/// Returns them as they were, newest first.
#[cfg(feature = "testing")]
pub(crate) async fn tamper(shared: &Shared, f: &mut (dyn FnMut(&mut Vec<u8>) + Send)) -> Result<Vec<Vec<u8>>> {
    let (store, base_path) = shared.objects().await?;
    let mut before = Vec::new();
    for name in names(shared).await? {
        let Some(mut bytes) = read(shared, &name).await? else {
            continue;
        };
        before.push(bytes.clone());
        f(&mut bytes);
        store
            .inner
            .put(&snapshot_path(&base_path, &name), bytes.into())
            .await
            .map_err(|e| store_err("tamper with a snapshot", None, Written::Unknown, e))?;
    }
    Ok(before)
}

/// Every stored snapshot with the datasets its cursor names passed through `f` (`(uri,
/// version)` in, as Lance sees the URI; what to store instead out), sealed again with a
/// valid checksum: what anyone who can write under `_ctxlog/snapshots/` can do (tests:
/// `testing::rewrite_snapshot_sources`). Returns how many snapshots were rewritten.
#[cfg(feature = "testing")]
pub(crate) async fn rewrite_sources(
    shared: &Shared,
    f: &mut (dyn FnMut(&str, u64) -> (String, u64) + Send),
) -> Result<usize> {
    use ctxlog_core::backend::snapshot::{decode, encode};
    let id = identity(shared, false).await?.unwrap_or_default();
    let mut rewritten = 0;
    tamper(shared, &mut |bytes: &mut Vec<u8>| {
        let Ok(mut loaded) = decode(bytes.clone(), &id) else {
            return;
        };
        let Ok(mut cursor) = serde_json::from_slice::<serde_json::Value>(&loaded.cursor) else {
            return;
        };
        if let Some(sources) = cursor.get_mut("sources").and_then(|s| s.as_array_mut()) {
            for source in sources.iter_mut() {
                let old = (source[0].as_str().map(str::to_string), source[1].as_u64());
                if let (Some(uri), Some(version)) = old {
                    let (uri, version) = f(&uri, version);
                    *source = json!([uri, version]);
                }
            }
        }
        *bytes = encode(
            &mut loaded.index,
            &id,
            cursor.to_string().into_bytes(),
            loaded.taken_millis,
        );
        rewritten += 1;
    })
    .await?;
    Ok(rewritten)
}

/// Where saved search indexes lie under the dataset (`<millis>-<uuid>.idx`), and the purge
/// mark beside them.
const SEARCH_DIR: &str = "_ctxlog/search";
const SEARCH_MARK: &str = "_ctxlog/search-purged";

/// Saved search indexes (issue 34) as objects under the dataset: put whole by the object
/// store, read like snapshots, the newest [`ctxlog_core::search::saved::KEEP`] kept.
pub(crate) struct LanceIndexes {
    pub(crate) shared: std::sync::Arc<Shared>,
}

#[async_trait::async_trait]
impl ctxlog_core::search::saved::SavedIndexes for LanceIndexes {
    async fn identity(&self, create: bool) -> Result<Option<String>> {
        identity(&self.shared, create).await
    }

    async fn names(&self) -> Result<Vec<String>> {
        let mut names = names_in(&self.shared, SEARCH_DIR, "list saved search indexes").await?;
        names.retain(|n| n.ends_with(".idx"));
        Ok(names)
    }

    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        if name.contains('/') {
            return Ok(None);
        }
        read_in(&self.shared, SEARCH_DIR, name, "read a saved search index").await
    }

    async fn put(&self, bytes: Vec<u8>, tag: &str) -> Result<String> {
        let (store, base_path) = self.shared.objects().await?;
        let name = format!(
            "{:020}-{}-{tag}.idx",
            crate::io::storage_now().timestamp_millis().max(0),
            uuid::Uuid::new_v4().simple()
        );
        store
            .inner
            .put(&Path::from(format!("{base_path}/{SEARCH_DIR}/{name}")), bytes.into())
            .await
            .map_err(|e| store_err("save a search index", None, Written::Unknown, e))?;
        for old in self.names().await?.into_iter().skip(ctxlog_core::search::saved::KEEP) {
            self.delete(&old).await?;
        }
        Ok(name)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        if name.contains('/') {
            return Ok(());
        }
        let (store, base_path) = self.shared.objects().await?;
        match store
            .inner
            .delete(&Path::from(format!("{base_path}/{SEARCH_DIR}/{name}")))
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_err("delete a saved search index", None, Written::Unknown, e)),
        }
    }

    async fn mark(&self) -> Result<Option<String>> {
        let (store, base_path) = self.shared.objects().await?;
        match store
            .read_one_all(&Path::from(format!("{base_path}/{SEARCH_MARK}")))
            .await
        {
            Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(lance_err("read the purge mark", None, Written::Nothing, e)),
        }
    }

    async fn remark(&self) -> Result<()> {
        let (store, base_path) = self.shared.objects().await?;
        store
            .inner
            .put(
                &Path::from(format!("{base_path}/{SEARCH_MARK}")),
                uuid::Uuid::new_v4().to_string().into_bytes().into(),
            )
            .await
            .map_err(|e| store_err("change the purge mark", None, Written::Unknown, e))?;
        // On a local disk, a crashed put leaves its staging file (`<name>#<n>`) beside the
        // saved indexes, which listing does not show: it may hold what the purge erases.
        if let Some(dir) = crate::io::local_dir(&self.shared.uri) {
            let dir = dir.join(SEARCH_DIR);
            let swept = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                    Err(e) => return Err(e),
                };
                for entry in entries {
                    let path = entry?.path();
                    if !path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".idx")) {
                        match std::fs::remove_file(&path) {
                            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                            _ => {}
                        }
                    }
                }
                Ok(())
            })
            .await;
            let err = |e: std::io::Error| {
                lance_err(
                    "sweep saved search indexes",
                    None,
                    Written::Unknown,
                    lance::Error::io_source(Box::new(e)),
                )
            };
            swept.map_err(|e| err(std::io::Error::other(e)))?.map_err(err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A local snapshot large enough to be read in parts comes back byte for byte (each
    /// part from its own offset); a missing one reads as none.
    #[tokio::test]
    async fn a_large_local_snapshot_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let bytes = ctxlog_core::testing::large_snapshot_bytes();
        std::fs::write(&path, &bytes).unwrap();
        let read_back = read_local_file(path).await.unwrap();
        assert!(
            read_back.as_deref() == Some(&bytes[..]),
            "the snapshot read back differs"
        );
        let missing = dir.path().join("gone");
        assert_eq!(read_local_file(missing).await.unwrap(), None);
    }

    /// A snapshot's datasets must be the store's own: its base table or a generation of one
    /// of its shards, named as the store names them.
    #[test]
    fn only_the_stores_own_datasets_are_inside_it() {
        let shard = uuid::Uuid::new_v4();
        for root in [
            "file-object-store:///tmp/a/store.lance",
            "s3://bucket/prefix/store.lance",
            "shared-memory://t/store.lance",
        ] {
            let inside = [
                root.to_string(),
                format!("{root}/"),
                format!("{root}/_mem_wal/{shard}/1a2b3c4d_gen_1"),
            ];
            for uri in &inside {
                assert!(inside_store(root, uri), "{uri} is inside {root}");
                assert!(inside_store(&format!("{root}/"), uri), "{uri} is inside {root}/");
            }
            let outside = [
                "file-object-store:///tmp/b/store.lance".to_string(),
                "s3://other/prefix/store.lance".to_string(),
                "/tmp/a/store.lance".to_string(),
                format!("{root}-other"),
                format!("{root}-other/_mem_wal/{shard}/1a2b3c4d_gen_1"),
                format!("{root}/other"),
                format!("{root}/_mem_wal/{shard}"),
                format!("{root}/_mem_wal/{shard}/"),
                format!("{root}/_mem_wal/{shard}/.."),
                format!("{root}/_mem_wal/{shard}/../../../b/store.lance/_mem_wal/{shard}/1a2b3c4d_gen_1"),
                format!("{root}/_mem_wal/{shard}/%2e%2e"),
                format!("{root}/_mem_wal/{shard}/1a2b3c4d_gen_1/../../x_gen_1"),
                format!("{root}/_mem_wal/{shard}/1a2b3c4d_gen_1?endpoint=http://elsewhere"),
                format!("{root}/_mem_wal/{shard}/1a2b3c4d_gen_1#x"),
                format!("{root}/_mem_wal/../_mem_wal/{shard}/1a2b3c4d_gen_1"),
                format!("{root}/_mem_wal/{}/1a2b3c4d_gen_1", shard.simple()),
                format!("{root}/_mem_wal/not-a-shard/1a2b3c4d_gen_1"),
                format!("{root}/./_mem_wal/{shard}/1a2b3c4d_gen_1"),
                format!("{root}//_mem_wal/{shard}/1a2b3c4d_gen_1"),
            ];
            for uri in &outside {
                assert!(!inside_store(root, uri), "{uri} is not inside {root}");
            }
        }
    }
}
