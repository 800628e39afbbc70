//! How the store reaches its objects: the dataset URI Lance is given, and the object-store
//! parameters every dataset, writer and generation of the store is opened with.
//!
//! **Durability on a local disk.** lance-io's own local store never calls fsync, and its
//! fast paths for `file://` write data files and version hints past any wrapper. ctxlog
//! opens local stores through lance-io's `file-object-store://` scheme instead, where every
//! request goes through the object-store API, and puts an object store there that syncs
//! each file and its directory before a put returns (object_store's `LocalFileSystem` with
//! fsync). So an acknowledged append — its WAL entry — survives a power loss, and so does
//! every generation, data file and manifest a commit refers to.

use std::collections::HashMap;
use std::sync::Arc;

use ctxlog_core::{Error, Result};
use lance::io::ObjectStoreParams;
use lance_io::object_store::{ChainedWrappingObjectStore, StorageOptionsAccessor, WrappingObjectStore};
use object_store::ObjectStore;
use object_store::list::PaginatedListStore;
use object_store::local::LocalFileSystem;

use crate::faults::Faults;

/// The machine's clock, for what is compared with times the storage records itself
/// (Lance's version timestamps, an object's `last_modified`) and for names that sort by when
/// they were stored. Not the store's injected clock (`StoreOptions::clock`): that one drives
/// the writers' hybrid logical clocks, and a test may hold it still, while the storage's own
/// times go on.
#[allow(clippy::disallowed_methods)]
pub(crate) fn storage_now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

/// The scheme under which lance-io sends every request of a local store through the
/// object-store API (and so through our wrappers).
const LOCAL_SCHEME: &str = "file-object-store://";

/// The URI Lance should use: `memory://x` becomes `shared-memory://x` so that every handle
/// in the process sees one store (plain `memory://` gives each open a fresh, empty one); a
/// local path (relative, absolute or `file://`) becomes an absolute `file-object-store://`
/// URI (see the module docs).
pub(crate) fn lance_uri(uri: &str) -> Result<String> {
    if let Some(rest) = uri.strip_prefix("memory://") {
        let rest = if rest.is_empty() { "ctxlog" } else { rest };
        return Ok(format!("shared-memory://{rest}"));
    }
    if uri.starts_with(LOCAL_SCHEME) {
        return Ok(uri.to_string());
    }
    let path = match uri.strip_prefix("file://") {
        Some(p) => p,
        None if uri.contains("://") => return Ok(uri.to_string()),
        None => uri,
    };
    let abs = std::path::absolute(path).map_err(|e| Error::invalid("uri", None, format!("`{path}`: {e}")))?;
    Ok(format!("{LOCAL_SCHEME}{}", abs.to_string_lossy()))
}

/// The local directory of a store URI as [`lance_uri`] writes it, if it is local.
pub(crate) fn local_dir(lance_uri: &str) -> Option<std::path::PathBuf> {
    lance_uri.strip_prefix(LOCAL_SCHEME).map(std::path::PathBuf::from)
}

/// The object-store parameters of a store: its storage options, durable local writes, and
/// the fault injector of a test, if any.
pub(crate) fn store_params(
    lance_uri: &str,
    storage_options: &HashMap<String, String>,
    faults: Option<&Arc<Faults>>,
) -> ObjectStoreParams {
    let mut wrappers: Vec<Arc<dyn WrappingObjectStore>> = Vec::new();
    if local_dir(lance_uri).is_some() {
        wrappers.push(Arc::new(DurableLocal));
    }
    // Outermost: faults strike before (or after) a request reaches the real store.
    if let Some(f) = faults {
        wrappers.push(f.wrapper());
    }
    ObjectStoreParams {
        storage_options_accessor: (!storage_options.is_empty())
            .then(|| Arc::new(StorageOptionsAccessor::with_static_options(storage_options.clone()))),
        object_store_wrapper: (!wrappers.is_empty())
            .then(|| Arc::new(ChainedWrappingObjectStore::new(wrappers)) as Arc<dyn WrappingObjectStore>),
        ..Default::default()
    }
}

/// Replaces lance-io's local file store by one that fsyncs every file it writes and the
/// directory it lands in, before the put returns.
#[derive(Debug)]
struct DurableLocal;

impl WrappingObjectStore for DurableLocal {
    fn wrap(&self, _store_prefix: &str, _original: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        // The same root ("/") and path layout as lance-io's own local store.
        Arc::new(LocalFileSystem::new().with_fsync(true))
    }

    fn wrap_paginated(
        &self,
        _store_prefix: &str,
        _original: Arc<dyn PaginatedListStore>,
    ) -> Option<Arc<dyn PaginatedListStore>> {
        // Listings must go through the replaced store.
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_paths_go_through_the_object_store_api() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            lance_uri("rel/a.lance").unwrap(),
            format!("{LOCAL_SCHEME}{}", cwd.join("rel/a.lance").display())
        );
        assert_eq!(lance_uri("/x/a.lance").unwrap(), format!("{LOCAL_SCHEME}/x/a.lance"));
        assert_eq!(
            lance_uri("file:///x/a.lance").unwrap(),
            format!("{LOCAL_SCHEME}/x/a.lance")
        );
        assert_eq!(lance_uri("memory://t").unwrap(), "shared-memory://t");
        assert_eq!(lance_uri("s3://b/a.lance").unwrap(), "s3://b/a.lance");
        assert_eq!(
            local_dir(&lance_uri("/x/a.lance").unwrap()),
            Some(std::path::PathBuf::from("/x/a.lance"))
        );
        assert_eq!(local_dir("s3://b/a.lance"), None);
    }

    /// Local stores go through the store that syncs every file and its directory before a
    /// put returns; object stores keep their own client (their puts are durable on success).
    #[test]
    fn local_writes_go_through_the_syncing_store() {
        let none = HashMap::new();
        let local = store_params(&lance_uri("/x/a.lance").unwrap(), &none, None);
        assert!(
            local.object_store_wrapper.is_some(),
            "a local store must sync its writes"
        );
        let s3 = store_params(&lance_uri("s3://b/a.lance").unwrap(), &none, None);
        assert!(
            s3.object_store_wrapper.is_none(),
            "an object store keeps its own client"
        );
    }
}
