//! The conformance suite on SQLite: every case, named `sqlite::<case>`, each on a fresh
//! store file.

use std::sync::Arc;
use std::time::Duration;

use ctxlog_conformance::{Backend, FaultGuard};
use ctxlog_core::Store;
use ctxlog_sqlite::SqliteStore;

/// SQLite: one file per store. A raw entry is inserted past every check; a stall lets
/// appends commit and then holds them, as if the acknowledgement were lost.
const SQLITE: Backend = Backend {
    name: "sqlite",
    store_uri: |root| root.join("store.db").display().to_string(),
    open: |uri, options| {
        Box::pin(async move { Ok(Arc::new(SqliteStore::open(&uri, options).await?) as Arc<dyn Store>) })
    },
    op_timeout: Duration::from_secs(10),
    case_timeout: Duration::from_secs(120),
    proptest_cases: 32,
    inject_raw_entry: |uri, entry| {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || ctxlog_sqlite::testing::inject_raw_entry(uri.as_ref(), &entry))
                .await??;
            Ok(())
        })
    },
    stall_writes: |uri| {
        Box::pin(async move {
            let guard =
                tokio::task::spawn_blocking(move || ctxlog_sqlite::testing::stall_writes(uri.as_ref())).await??;
            Ok(Box::new(guard) as FaultGuard)
        })
    },
    tamper_snapshots: |uri, damage| {
        Box::pin(async move {
            let apply = move |b: &mut Vec<u8>| {
                if let Some(d) = &damage {
                    d.apply(b)
                }
            };
            let before =
                tokio::task::spawn_blocking(move || ctxlog_sqlite::testing::tamper_with_snapshots(uri.as_ref(), apply))
                    .await??;
            Ok(before)
        })
    },
    // A file on a local disk: no object store to fault.
    faults: None,
    files_in_root: true,
    // Its file holds values as written (no compression): the byte scan reads them.
    decoded_values_containing: None,
};

fn main() -> std::process::ExitCode {
    ctxlog_conformance::main(&[SQLITE])
}
