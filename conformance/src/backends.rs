//! The backends under test, with their real differences spelled out as parameters.

use std::time::Duration;

#[allow(unused_imports)]
use crate::{Backend, FaultGuard};

/// SQLite: one file per store.
#[cfg(feature = "sqlite")]
pub const SQLITE: Backend = Backend {
    name: "sqlite",
    store_uri: |root| format!("sqlite:{}", root.join("store.db").display()),
    op_timeout: Duration::from_secs(10),
    case_timeout: Duration::from_secs(120),
    proptest_cases: 32,
    inject_raw_entry: |uri, entry| {
        Box::pin(async move {
            let path = sqlite_path(&uri)?;
            tokio::task::spawn_blocking(move || ctxlog_sqlite::testing::inject_raw_entry(&path, &entry)).await??;
            Ok(())
        })
    },
    stall_writes: |uri| {
        Box::pin(async move {
            let path = sqlite_path(&uri)?;
            let guard = tokio::task::spawn_blocking(move || ctxlog_sqlite::testing::stall_writes(&path)).await??;
            Ok(Box::new(guard) as FaultGuard)
        })
    },
};

#[cfg(feature = "sqlite")]
fn sqlite_path(uri: &str) -> anyhow::Result<std::path::PathBuf> {
    match ctxlog::Location::parse(uri)? {
        ctxlog::Location::Sqlite(p) => Ok(p),
        other => anyhow::bail!("not a SQLite location: {other:?}"),
    }
}

/// Lance: one dataset directory per store. Its operations are slower than SQLite's (every
/// append is a WAL object, every close flushes a generation), hence the wider deadlines
/// and fewer random histories.
#[cfg(feature = "lance")]
pub const LANCE: Backend = Backend {
    name: "lance",
    store_uri: |root| root.join("store.lance").display().to_string(),
    op_timeout: Duration::from_secs(30),
    case_timeout: Duration::from_secs(170),
    proptest_cases: 6,
    inject_raw_entry: |uri, entry| {
        Box::pin(async move {
            ctxlog_lance::testing::inject_raw_entry(&uri, &entry).await?;
            Ok(())
        })
    },
    stall_writes: |uri| {
        Box::pin(async move {
            let dir = ctxlog_lance::testing::local_dir(&uri)?;
            let guard = ctxlog_lance::testing::stall_writes(&dir)?;
            Ok(Box::new(guard) as FaultGuard)
        })
    },
};

/// Every backend compiled into this build.
pub fn all() -> Vec<Backend> {
    [
        #[cfg(feature = "sqlite")]
        SQLITE,
        #[cfg(feature = "lance")]
        LANCE,
    ]
    .to_vec()
}
