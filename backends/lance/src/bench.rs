//! What `cargo xtask bench` measures directly: the raw-scan floor, the layout, copies.

use std::sync::Arc;

use ctxlog_core::{Result, StoreOptions, Written};

use crate::LanceStore;
use crate::schema::INDEX_COLUMNS;
use crate::tiers::{Walk, tiers, walk_all};

/// The raw-scan floor: the projection's columns from every tier (base table, unfolded
/// generations, WAL tails), with plain Lance scans and no processing. Returns rows read.
pub async fn raw_scan(uri: &str, options: StoreOptions) -> Result<u64> {
    let store = LanceStore::open_store(uri, options).await?;
    let t = tiers(&store.shared, None).await?;
    let mut rows = 0u64;
    let how = Walk {
        columns: Some(&INDEX_COLUMNS),
        row_ids: false,
    };
    walk_all(&store.shared, &t, how, |r| {
        rows += r.batch().num_rows() as u64;
        Ok(())
    })
    .await?;
    Ok(rows)
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
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt as _;
    let io = |e: std::io::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Nothing, e);
    let os = |e: object_store::Error| ctxlog_core::Error::backend("lance", "copy", None, Written::Nothing, e);
    let options = StoreOptions {
        create_if_missing: false,
        storage_options,
        ..StoreOptions::default()
    };
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
    use futures::{StreamExt, TryStreamExt};
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
