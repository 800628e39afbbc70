//! `cargo xtask chaos --serve`: the soak of `ctxlog serve` replicas (`ctxlog-serve-chaos`),
//! on SQLite and on Lance on the loopback S3 server. This module makes the store, runs the
//! soak process within a deadline, prints its verdict one line per check, and fails the run
//! on any failed check; the soak and its judge live in the `chaos` crate.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cargo;
use crate::flags::ChaosArgs;

/// `cargo xtask chaos --serve [--backend B] [--minutes N | --seconds N] [--seed S]`.
pub(crate) fn run(args: &ChaosArgs) -> Result<()> {
    let seconds = args.minutes.map_or(args.seconds, |m| m * 60);
    let backends: Vec<&str> = match args.backend.as_str() {
        "all" => vec!["sqlite", "lance-s3"],
        b => vec![b],
    };
    build()?;
    let s3 = if backends.contains(&"lance-s3") {
        Some(crate::s3::server()?)
    } else {
        None
    };
    let mut failed = Vec::new();
    for backend in backends {
        let summary = soak(backend, seconds, args.seed, s3.as_ref())?;
        println!("{}", serde_json::to_string_pretty(&summary)?);
        if let Err(e) = verdict(backend, &summary) {
            eprintln!("{e:#}");
            failed.push(backend);
        }
    }
    if !failed.is_empty() {
        bail!("chaos --serve failed on {}", failed.join(", "));
    }
    Ok(())
}

/// The short serve soak `cargo xtask test` runs, with a fresh seed (printed): 30 s of load
/// on SQLite and on Lance on the S3 server, each lasting until every fault has happened once
/// (the soak owes its first round), so that every check of the verdict sees every fault.
pub(crate) fn serve_short(s3: &s3_loopback::Server) -> Result<()> {
    build()?;
    let seed: u64 = rand::random::<u32>().into();
    for backend in ["sqlite", "lance-s3"] {
        let started = Instant::now();
        let summary = soak(backend, 30, seed, Some(s3))?;
        eprintln!(
            "xtask: chaos --serve {backend} (seed {seed}) … {} writes acknowledged, {} processes, {:.1} s",
            summary["acked_writes"],
            summary["processes"],
            started.elapsed().as_secs_f64()
        );
        verdict(backend, &summary)?;
    }
    Ok(())
}

fn build() -> Result<()> {
    cargo::run("build (debug)", &["build", "--workspace", "--all-features", "--bins"])
}

/// The verdict: one line per check (`ok` or `FAIL`, its counts, examples of what failed);
/// an error naming the failed checks and the seed that replays the run's decisions.
pub(crate) fn verdict(backend: &str, summary: &Value) -> Result<()> {
    let seed = &summary["seed"];
    let checks = summary["checks"]
        .as_array()
        .context("the soak's summary has no checks")?;
    let mut failed = Vec::new();
    for c in checks {
        let name = c["name"].as_str().unwrap_or("?");
        let ok = c["ok"] == true;
        eprintln!(
            "chaos --serve {backend} (seed {seed}): {} {name}: {}",
            if ok { "ok  " } else { "FAIL" },
            c["detail"]["counts"]
        );
        if !ok {
            for e in c["detail"]["examples"].as_array().into_iter().flatten() {
                eprintln!("    {}", e.as_str().unwrap_or(""));
            }
            failed.push(name.to_string());
        }
    }
    if checks.is_empty() || summary["ok"] != true || !failed.is_empty() {
        bail!(
            "chaos --serve ({backend}, seed {seed}): failed {}; history in {}",
            failed.join(", "),
            summary["history"]
        );
    }
    Ok(())
}

/// One serve soak on `backend` (`sqlite` or `lance-s3`; the S3 server is started if `None`).
fn soak(backend: &str, seconds: u64, seed: u64, s3: Option<&s3_loopback::Server>) -> Result<Value> {
    let target = cargo::target_dir()?;
    let bin = target.join("debug").join("ctxlog-serve-chaos");
    let ctxlog = target.join("debug").join("ctxlog");
    // The run's store (on SQLite), replica logs and history stay for a look afterwards;
    // the next run of the same backend and seed replaces them.
    let dir = target.join("ctxlog-serve-chaos").join(format!("{backend}-{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let own;
    // Deadlines of the replicas, and of the slow one (its refreshes and commits are cut).
    // On Lance on S3 the slow one's is 10 s: at 5 s its watch streams' reads of a large
    // shard never fit on a loaded emulator (150–300 ms a request), so a watcher there
    // stalled for the whole run (2026-12-03, seed 4120283323); the SIGSTOP bursts still
    // cut its refreshes.
    let (uri, timeout, slow) = match backend {
        "sqlite" => (format!("sqlite:{}", dir.join("serve.db").display()), 10.0, 0.5),
        "lance-s3" => {
            let server = match s3 {
                Some(s) => s,
                None => {
                    own = crate::s3::server()?;
                    &own
                }
            };
            // A bucket of this run's own: the S3 server outlives runs of the same seed.
            let bucket = s3_loopback::bucket_for(&dir.join(std::process::id().to_string()));
            server.create_bucket(&bucket).map_err(|e| anyhow::anyhow!("{e}"))?;
            (server.uri(&bucket, "serve.lance"), 20.0, 10.0)
        }
        other => bail!("chaos --serve: unknown backend `{other}` (have: sqlite, lance-s3, all)"),
    };
    let mut cmd = Command::new(&bin);
    cmd.arg("--ctxlog")
        .arg(&ctxlog)
        .args(["--store", &uri])
        .arg("--dir")
        .arg(dir.join("run"))
        .args(["--seconds", &seconds.to_string(), "--seed", &seed.to_string()])
        .args(["--timeout", &timeout.to_string(), "--slow-timeout", &slow.to_string()]);
    if backend == "lance-s3" {
        // Every replica's object store injects the soaks' seeded faults (logged, counted).
        cmd.arg("--faults");
    }
    // The load, its retries, the drain and the final reads and SIGTERMs, with room to spare.
    let within = Duration::from_secs(seconds + 900);
    let out = crate::bench::probe::output_within(&mut cmd, within)?;
    // What the soak said as it went (maintenance that failed and why, starts that failed)
    // stays with the replicas' logs: CI prints only the verdict.
    let _ = std::fs::write(dir.join("run").join("soak.log"), &out.stderr);
    let summary: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "ctxlog-serve-chaos ({backend}, seed {seed}) exited {} without a summary (logs in {}): {}",
            out.status,
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    Ok(summary)
}
