//! The Lance backend as the conformance suite sees it, shared by this crate's tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ctxlog_conformance::{Backend, CaseFn, FaultGuard, run_case};
use ctxlog_core::Store;
use ctxlog_lance::LanceStore;

/// Lance: one dataset directory per store. Its operations are slower than SQLite's (every
/// append is a WAL object, every close flushes a generation), hence the wider deadlines and
/// fewer random histories. A raw entry is appended to the base table; a stall makes every
/// WAL write fail (each shard's `wal` directory is replaced by a file).
pub(crate) const LANCE: Backend = Backend {
    name: "lance",
    store_uri: |root| root.join("store.lance").display().to_string(),
    open: |uri, options| Box::pin(async move { LanceStore::open(&uri, options).await }),
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

/// Run one Lance-only case with a fresh root and the backend's deadline.
pub(crate) fn run(name: &str, case: CaseFn) {
    if let Err(e) = run_case(LANCE, name, case) {
        panic!("{e}");
    }
}

/// Open a store at the case's URI with some writer tuning.
pub(crate) async fn open_tuned(
    uri: &str,
    mut options: ctxlog_core::StoreOptions,
    tuning: ctxlog_lance::WriterTuning,
) -> anyhow::Result<Arc<dyn Store>> {
    // A batch must fit one memtable.
    options.limits.max_batch_records = tuning.max_memtable_rows;
    Ok(Arc::new(
        LanceStore::open_store(uri, options).await?.with_tuning(tuning),
    ))
}

/// Silence "unused" for helpers some test files do not use.
pub(crate) fn _unused() -> Duration {
    Duration::ZERO
}
