//! Backend parity: the same random history written to SQLite and to Lance gives
//! byte-identical canonical projection and conflict JSON, and identical session and
//! context views.
#![cfg(all(feature = "sqlite", feature = "lance", feature = "testing"))]

use std::collections::BTreeSet;

use anyhow::ensure;
use ctxlog::testing::ManualClock;
use ctxlog::{Store, StoreOptions};
use ctxlog_conformance::differential::{histories, write_history};
use ctxlog_conformance::{Backend, Ctx, FaultGuard, run_case};

/// The two backends as the facade opens them (the parity test injects no faults).
fn backend(name: &'static str, store_uri: fn(&std::path::Path) -> String) -> Backend {
    Backend {
        name,
        store_uri,
        open: |uri, options| Box::pin(async move { ctxlog::open(&uri, options).await }),
        op_timeout: std::time::Duration::from_secs(30),
        case_timeout: std::time::Duration::from_secs(170),
        proptest_cases: 6,
        inject_raw_entry: |_, _| Box::pin(async { anyhow::bail!("parity injects nothing") }),
        stall_writes: |_| Box::pin(async { anyhow::bail!("parity injects nothing") as anyhow::Result<FaultGuard> }),
        tamper_snapshots: |_, _| Box::pin(async { anyhow::bail!("parity damages nothing") }),
        faults: None,
        files_in_root: true,
        decoded_values_containing: None,
    }
}
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Everything a reader can observe, as canonical text.
async fn observe(store: &dyn Store) -> anyhow::Result<(String, String, Vec<String>)> {
    let mut p = store.projector();
    p.refresh().await?;
    let projection = p.projection();
    let sessions: BTreeSet<String> = projection.records.iter().map(|r| r.session_id.clone()).collect();
    let mut views = Vec::new();
    for s in sessions {
        views.push(format!("{:?}", p.session("bot", &s).await?));
        // Rule 21: the context view too (which summary governs, what it covers).
        views.push(format!("{:?}", p.context("bot", &s).await?));
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    Ok((projection.canonical_json(), ctxlog::conflicts_json(&conflicts), views))
}

/// Purge passes until no tombstoned id is left to erase.
async fn purge_all(store: &dyn Store) -> anyhow::Result<()> {
    for _ in 0..100 {
        if store.purge(&ctxlog::PurgeOptions::default()).await?.ids_remaining == 0 {
            return Ok(());
        }
    }
    anyhow::bail!("purge did not converge")
}

/// Random histories — puts, retries, divergent puts, tombstones, reopens, snapshots,
/// compaction and gc — on every backend, then purged: the canonical projection, the
/// conflict list and every session view are byte-identical across backends, and purge
/// changed none of them.
#[test]
fn sqlite_and_lance_agree_byte_for_byte() {
    let case: ctxlog_conformance::CaseFn = |ctx: Ctx| {
        Box::pin(async move {
            let handle = tokio::runtime::Handle::current();
            let ctx = std::sync::Arc::new(ctx);
            let result = tokio::task::spawn_blocking(move || {
                let mut runner = TestRunner::new(Config {
                    cases: 6,
                    max_shrink_iters: 32,
                    failure_persistence: None,
                    ..Config::default()
                });
                let n = std::sync::atomic::AtomicUsize::new(0);
                runner.run(&histories(), |history| {
                    let sub = ctx
                        .root
                        .join(format!("case-{}", n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
                    std::fs::create_dir_all(&sub).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    handle
                        .block_on(async {
                            let mut outputs = Vec::new();
                            let sqlite = backend("sqlite", |r| format!("sqlite:{}", r.join("store.db").display()));
                            let lance = backend("lance", |r| r.join("store.lance").display().to_string());
                            #[allow(unused_mut)]
                            let mut backends = vec![sqlite, lance];
                            // And Lance on the loopback S3 server.
                            #[cfg(feature = "s3")]
                            backends.push(backend("lance_s3", s3_loopback::store_uri_for));
                            for backend in backends {
                                // One fixed physical clock: both stores get the same HLCs.
                                let options = StoreOptions {
                                    clock: ManualClock::new(1_780_000_000_000),
                                    timeout: backend.op_timeout,
                                    ..StoreOptions::default()
                                };
                                let store = ctxlog::open(&(backend.store_uri)(&sub), options).await?;
                                let mut observer = store.projector();
                                write_history(store.as_ref(), &history, observer.as_mut()).await?;
                                // Purged (rule 16), every view stays as it was.
                                let before = observe(store.as_ref()).await?;
                                purge_all(store.as_ref()).await?;
                                let after = observe(store.as_ref()).await?;
                                ensure!(before == after, "{}: purge changed a view", backend.name);
                                outputs.push(after);
                            }
                            for (i, o) in outputs.iter().enumerate().skip(1) {
                                ensure!(outputs[0].0 == o.0, "canonical projections differ (sqlite vs #{i})");
                                ensure!(outputs[0].1 == o.1, "canonical conflict lists differ (sqlite vs #{i})");
                                ensure!(outputs[0].2 == o.2, "session views differ (sqlite vs #{i})");
                            }
                            anyhow::Ok(())
                        })
                        .map_err(|e| TestCaseError::fail(format!("{e:#}")))
                })
            })
            .await?;
            result.map_err(|e| anyhow::anyhow!("{e}"))
        })
    };
    let lance = backend("lance", |r| r.join("store.lance").display().to_string());
    if let Err(e) = run_case(lance, "sqlite_and_lance_agree_byte_for_byte", case) {
        panic!("{e}");
    }
}
