//! What `cargo xtask bench` measures directly: the raw-scan floor, the layout, copies.

use std::sync::Arc;

use ctxlog_core::{Result, StoreOptions, Written};
use futures::{StreamExt, TryStreamExt};
use lance::Dataset;

use crate::LanceStore;
use crate::schema::INDEX_COLUMNS;
use crate::tiers::{READ_WINDOW, tiers};

fn floor_err(e: lance::Error) -> ctxlog_core::Error {
    crate::error::lance_err("raw scan", None, Written::Nothing, e)
}

/// The raw-scan floor: the projection's columns of every tier a first scan reads (the base
/// table, each shard's generations not yet folded, each shard's WAL tail), read with the
/// plainest Lance calls. Returns rows read.
///
/// Independent of the product's read path on purpose: the floor is what the first scan is
/// measured against (`first_scan_over_floor`), so if it read through the product's own walk,
/// a slow walk would slow the floor as much as the scan and flatter the ratio. `tiers` is
/// used only as the listing of what exists; nothing else of the product's read path runs:
/// the base table and each generation are a `Dataset::scan` of `INDEX_COLUMNS`, streamed
/// and counted (generations up to `READ_WINDOW` at once, in any order, no batch held); a
/// WAL tail is Lance's own `WalTailer`, entry after entry from the first position no
/// generation covers to the first missing one. The three tiers are read at once: a floor
/// that waited for one before the next would be slower than it need be, and flatter the
/// ratio too.
pub async fn raw_scan(uri: &str, options: StoreOptions) -> Result<u64> {
    let store = LanceStore::open_store(uri, options).await?;
    let shared = &store.shared;
    let t = tiers(shared, None).await?;
    let base = scan_count(&t.base);
    let uris: Vec<String> = t
        .shards
        .iter()
        .flat_map(|s| s.generations.iter().map(|g| g.uri.clone()))
        .collect();
    let generations = futures::stream::iter(uris)
        .map(|uri| async move {
            let ds = shared.open_dataset(&uri).await.map_err(floor_err)?;
            scan_count(&ds).await
        })
        .buffer_unordered(READ_WINDOW)
        .try_fold(0u64, |sum, n| async move { Ok(sum + n) });
    let tails = futures::stream::iter(t.shards.iter().map(|s| (s.shard, s.wal_from)))
        .map(|(shard, from)| {
            let (store, base_path) = (&t.store, &t.base_path);
            async move {
                let (mut rows, mut position) = (0u64, from);
                while let Some(entry) =
                    crate::wal::read_entry(store, base_path, shard, position, "count rows", Written::Nothing).await?
                {
                    rows += entry.batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
                    position += 1;
                }
                Ok::<_, ctxlog_core::Error>(rows)
            }
        })
        .buffer_unordered(READ_WINDOW)
        .try_fold(0u64, |sum, n| async move { Ok(sum + n) });
    let (base, generations, tails) = futures::try_join!(base, generations, tails)?;
    Ok(base + generations + tails)
}

/// `ds`'s rows, `INDEX_COLUMNS` only, streamed and counted.
async fn scan_count(ds: &Dataset) -> Result<u64> {
    let mut scan = ds.scan();
    scan.project(&INDEX_COLUMNS[..]).map_err(floor_err)?;
    let mut stream = scan.try_into_stream().await.map_err(floor_err)?;
    let mut rows = 0u64;
    while let Some(batch) = stream.try_next().await.map_err(floor_err)? {
        rows += batch.num_rows() as u64;
    }
    Ok(rows)
}

/// The store format a Lance store of this build has, for keying a generated benchmark
/// store: [`crate::FORMAT`] and a fingerprint of the entry schema (names, types,
/// nullability, field metadata), so a schema change regenerates stores even if the format
/// was not bumped with it.
pub fn store_format() -> String {
    // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let schema = crate::schema::schema();
    for f in schema.fields() {
        let mut metadata: Vec<_> = f.metadata().iter().collect();
        metadata.sort();
        let text = format!("{}:{:?}:{}:{metadata:?};", f.name(), f.data_type(), f.is_nullable());
        for b in text.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{} schema {h:016x}", crate::FORMAT)
}

/// `(shards, generations not yet folded, generations)`.
pub async fn layout(uri: &str, options: StoreOptions) -> Result<(usize, usize, usize)> {
    let store = LanceStore::open_store(uri, options).await?;
    let t = tiers(&store.shared, None).await?;
    Ok((
        t.shards.len(),
        t.shards.iter().map(|s| s.generations.len()).sum(),
        t.shards.iter().map(|s| s.flushed).sum(),
    ))
}

/// Copy every object of the dataset at `uri` into the local directory `to` (for
/// benchmarking a copy of a store on object storage). Returns (objects, bytes).
pub async fn copy_to_local(
    uri: &str,
    storage_options: Vec<(String, String)>,
    to: &std::path::Path,
) -> Result<(u64, u64)> {
    use object_store::ObjectStoreExt as _;
    let io = |e: std::io::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Nothing, e);
    let os = |e: object_store::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Nothing, e);
    let options = StoreOptions::default()
        .with_create_if_missing(false)
        .with_storage_options(storage_options);
    let store = LanceStore::open_store(uri, options).await?;
    let ds = store.shared.latest().await?;
    let (objects, base) = store.shared.io(&ds).await?;
    let listed: Vec<object_store::ObjectMeta> = objects.inner.list(Some(&base)).try_collect().await.map_err(os)?;
    let (mut n, mut bytes) = (0u64, 0u64);
    let prefix = base.as_ref().trim_end_matches('/');
    for meta in listed {
        let rel = meta
            .location
            .as_ref()
            .strip_prefix(prefix)
            .unwrap_or(meta.location.as_ref());
        let dst = to.join(rel.trim_start_matches('/'));
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let data = objects
            .inner
            .get(&meta.location)
            .await
            .map_err(os)?
            .bytes()
            .await
            .map_err(os)?;
        std::fs::write(&dst, &data).map_err(io)?;
        n += 1;
        bytes += data.len() as u64;
    }
    Ok((n, bytes))
}

/// Copy the local store `from` object by object to `to` (an object-store URI where
/// nothing exists yet), up to 16 puts at once: a store generated on local disk, measured
/// on object storage. Returns (objects, bytes).
pub async fn copy_from_local(from: &str, to: &str, storage_options: Vec<(String, String)>) -> Result<(u64, u64)> {
    use lance::io::ObjectStoreParams;
    use lance_io::object_store::{ObjectStore, ObjectStoreRegistry};
    use object_store::ObjectStoreExt as _;
    let io = |e: std::io::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Unknown, e);
    let os = |e: object_store::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Unknown, e);
    let from = crate::io::local_dir(&crate::io::lance_uri(from)?)
        .ok_or_else(|| ctxlog_core::Error::invalid("from", None, "the source of an upload must be a local store"))?;
    let from = from.as_path();
    let uri = crate::io::lance_uri(to)?;
    let options: std::collections::HashMap<String, String> = storage_options.into_iter().collect();
    let params: ObjectStoreParams = crate::io::store_params(&uri, &options, None);
    let (store, base) = ObjectStore::from_uri_and_params(Arc::new(ObjectStoreRegistry::default()), &uri, &params)
        .await
        .map_err(|e| crate::error::lance_err("copy", None, Written::Nothing, e))?;
    // Regular files only, never following a link (as a restore does).
    let mut files = Vec::new();
    let mut dirs = vec![from.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).map_err(io)? {
            let e = e.map_err(io)?;
            let kind = e.file_type().map_err(io)?;
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() {
                files.push(e.path());
            }
        }
    }
    let copied: Vec<u64> = futures::stream::iter(files)
        .map(|file| {
            let (store, base) = (store.clone(), base.clone());
            async move {
                let rel = file
                    .strip_prefix(from)
                    .expect("under the root")
                    .to_string_lossy()
                    .into_owned();
                let data = std::fs::read(&file).map_err(io)?;
                let len = data.len() as u64;
                let dst = object_store::path::Path::from(format!("{base}/{rel}"));
                store.inner.put(&dst, data.into()).await.map_err(os)?;
                Ok::<_, ctxlog_core::Error>(len)
            }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    Ok((copied.len() as u64, copied.iter().sum()))
}
