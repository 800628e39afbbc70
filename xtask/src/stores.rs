//! Store URIs and the local files of a store: one place for the benches and the smoke test.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The URI of a local store of `backend` at `path`.
pub(crate) fn store_uri(backend: &str, path: &Path) -> String {
    match backend {
        "sqlite" => format!("sqlite:{}", path.display()),
        _ => format!("lance:{}", path.display()),
    }
}

/// The local path a store URI of [`store_uri`] names.
pub(crate) fn path_of(uri: &str) -> PathBuf {
    PathBuf::from(
        uri.strip_prefix("sqlite:")
            .or_else(|| uri.strip_prefix("lance:"))
            .unwrap_or(uri),
    )
}

/// A store URI for `path` of the same backend as `uri`.
fn store_uri_like(uri: &str, path: &Path) -> String {
    store_uri(if uri.starts_with("sqlite:") { "sqlite" } else { "lance" }, path)
}

/// Copy a local store: a SQLite file consistently (the online backup API), a dataset
/// directory file by file.
pub(crate) fn copy_store(bin: &Path, uri: &str, scratch: &Path) -> Result<String> {
    let src = path_of(uri);
    let name = src.file_name().context("store has a name")?;
    let dst = scratch.join(format!("refresh-{}", name.to_string_lossy()));
    remove_store(&store_uri_like(uri, &dst));
    if src.is_dir() {
        crate::bench::restore::copy_dir(&src, &dst)?;
    } else {
        crate::bench::restore::copy_sqlite(bin, &src, &dst)?;
    }
    Ok(store_uri_like(uri, &dst))
}

/// Remove a local store (a SQLite file with its -wal and -shm, or a directory).
pub(crate) fn remove_store(uri: &str) {
    let p = path_of(uri);
    if p.is_dir() {
        let _ = std::fs::remove_dir_all(&p);
    } else {
        let _ = std::fs::remove_file(&p);
        for ext in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", p.display()));
        }
    }
}
