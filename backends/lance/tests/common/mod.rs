//! The Lance backend as the conformance suite sees it, shared by this crate's tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ctxlog_conformance::{Backend, CaseFn, Fault, FaultGuard, run_case};
use ctxlog_core::Store;
use ctxlog_lance::LanceStore;

/// Lance: one dataset directory per store. Its operations are slower than SQLite's (every
/// append is a WAL object, every close flushes a generation), hence the wider deadlines and
/// fewer random histories. Stores are opened with their URI's fault injector: a raw entry is
/// appended to the base table; a stall makes every WAL write fail before reaching storage.
pub(crate) const LANCE: Backend = Backend {
    name: "lance",
    store_uri: |root| root.join("store.lance").display().to_string(),
    open: |uri, options| Box::pin(async move { ctxlog_lance::testing::open_faulted(&uri, options).await }),
    op_timeout: Duration::from_secs(30),
    case_timeout: Duration::from_secs(170),
    proptest_cases: 6,
    inject_raw_entry,
    stall_writes,
    faults: Some(faults),
    tamper_snapshots: |uri, damage| {
        Box::pin(async move {
            let apply = move |b: &mut Vec<u8>| {
                if let Some(d) = &damage {
                    d.apply(b)
                }
            };
            Ok(ctxlog_lance::testing::tamper_with_snapshots(&uri, apply).await?)
        })
    },
    files_in_root: true,
    // Compacted data files are compressed: a byte scan alone could miss a value in one.
    decoded_values_containing: Some(decoded_values_containing),
};

/// Lance on `memory://`: the object store Lance keeps in the process (one per name, for
/// the life of the process; nextest runs every case in a process of its own).
pub(crate) const LANCE_MEMORY: Backend = Backend {
    name: "lance_memory",
    store_uri: |root| {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("memory://{name}/store.lance")
    },
    files_in_root: false,
    ..LANCE
};

/// Lance over S3 on the loopback server (moto): the same store in a bucket of its own per
/// case, every storage option in the URI's query.
#[cfg(feature = "s3")]
pub(crate) const LANCE_S3: Backend = Backend {
    name: "lance_s3",
    store_uri: s3_loopback::store_uri_for,
    op_timeout: Duration::from_secs(30),
    // Below nextest's kill (.config/nextest.toml: 180 s): the case's own deadline fires
    // first and names the hang.
    case_timeout: Duration::from_secs(170),
    proptest_cases: 4,
    files_in_root: false,
    ..LANCE
};

fn inject_raw_entry(uri: String, entry: ctxlog_core::Entry) -> ctxlog_conformance::BoxFuture<anyhow::Result<()>> {
    Box::pin(async move {
        ctxlog_lance::testing::inject_raw_entry(&uri, &entry).await?;
        Ok(())
    })
}

/// The fault rules each case asks for, on the store's fault injector.
fn faults(uri: String, fault: Fault) -> ctxlog_conformance::BoxFuture<anyhow::Result<FaultGuard>> {
    use ctxlog_lance::faults::{Action, Op, Rule, When};
    Box::pin(async move {
        let wal_writes = [Op::PutIfAbsent, Op::Put];
        let rules = match fault {
            Fault::AppendFailsBefore => vec![Rule::new(&wal_writes, Action::FailBefore).path("/wal/")],
            Fault::AppendLandsUnanswered => vec![Rule::new(&wal_writes, Action::FailAfter).path("/wal/").limit(1)],
            Fault::AppendStalls => vec![Rule::new(&wal_writes, Action::Stall).path("/wal/")],
            Fault::ReadsThrottled => {
                vec![Rule::new(&[Op::Get, Op::Head, Op::List], Action::Throttle).when(When::Probability(0.02))]
            }
            Fault::WritesFailOften => vec![
                Rule::new(&[Op::Put, Op::PutIfAbsent, Op::Multipart], Action::FailBefore).when(When::Probability(0.5)),
            ],
            Fault::ConditionalWritesFlaky => vec![
                Rule::new(&[Op::PutIfAbsent], Action::FailBefore).when(When::Probability(0.1)),
                Rule::new(&[Op::PutIfAbsent], Action::FailAfter).when(When::Probability(0.1)),
            ],
        };
        Ok(Box::new(ctxlog_lance::testing::with_rules(&uri, rules)) as FaultGuard)
    })
}

/// Every place the store still holds `needle`, as Lance decodes what it stores (every
/// version of the base table and of each generation, every WAL entry), listed through the
/// store's object store, plus any object whose raw bytes hold it.
fn decoded_values_containing(
    uri: String,
    needle: String,
) -> ctxlog_conformance::BoxFuture<anyhow::Result<Vec<String>>> {
    Box::pin(async move { Ok(ctxlog_lance::testing::decoded_values_containing(&uri, &needle).await?) })
}

fn stall_writes(uri: String) -> ctxlog_conformance::BoxFuture<anyhow::Result<FaultGuard>> {
    Box::pin(async move { Ok(Box::new(ctxlog_lance::testing::fail_wal_writes(&uri)) as FaultGuard) })
}

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
