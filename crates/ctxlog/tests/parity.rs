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

/// The deadline of one store operation.
const OP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A backend as the facade opens it (the parity test injects no faults).
fn backend(name: &'static str, store_uri: fn(&std::path::Path) -> String) -> Backend {
    Backend {
        name,
        store_uri,
        open: |uri, options| Box::pin(async move { ctxlog::open(&uri, options).await }),
        op_timeout: OP_TIMEOUT,
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
                            // Every backend this build has, and Lance on the loopback S3 server.
                            let mut stores: Vec<(String, String)> = ctxlog::Backend::compiled_in()
                                .map(|b| (b.name().to_string(), b.local_uri(&sub, "store")))
                                .collect();
                            ensure!(stores.len() >= 2, "parity needs two backends: {stores:?}");
                            #[cfg(feature = "s3")]
                            stores.push(("lance_s3".into(), s3_loopback::store_uri_for(&sub)));
                            for (name, uri) in stores {
                                // One fixed physical clock: every store gets the same HLCs.
                                let options = StoreOptions::default()
                                    .with_clock(ManualClock::new(1_780_000_000_000))
                                    .with_timeout(OP_TIMEOUT);
                                let store = ctxlog::open(&uri, options).await?;
                                let mut observer = store.projector();
                                write_history(store.as_ref(), &history, observer.as_mut()).await?;
                                // Purged (rule 16), every view stays as it was.
                                let before = observe(store.as_ref()).await?;
                                purge_all(store.as_ref()).await?;
                                let after = observe(store.as_ref()).await?;
                                ensure!(before == after, "{name}: purge changed a view");
                                outputs.push(after);
                            }
                            for (i, o) in outputs.iter().enumerate().skip(1) {
                                ensure!(
                                    outputs[0].0 == o.0,
                                    "canonical projections differ (the first backend vs #{i})"
                                );
                                ensure!(
                                    outputs[0].1 == o.1,
                                    "canonical conflict lists differ (the first backend vs #{i})"
                                );
                                ensure!(outputs[0].2 == o.2, "session views differ (the first backend vs #{i})");
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
