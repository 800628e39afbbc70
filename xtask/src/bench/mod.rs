//! `cargo xtask bench`: what a cold replica pays before it can serve, and what a durable
//! append costs.
//!
//! Every figure comes from a fresh `ctxlog-bench` process (release build), so the first
//! scan really is a first scan. Results are reported as medians with min–max and as ratios
//! against the raw-scan floor measured in the same run; nothing here is a pass/fail gate.

mod append;
mod context;
mod first_scan;
mod forks;
mod object_store;
pub(crate) mod probe;
mod reclaim;
pub(crate) mod restore;
mod search;
mod serve;
mod stats;
pub(crate) mod stores;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

use crate::cargo;
use crate::flags::{BenchArgs, BenchKind, Common};

pub(crate) fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchKind::FirstScan(a) => first_scan::run(&a),
        BenchKind::Append(a) => append::run(&a),
        BenchKind::ObjectStore(a) => object_store::run(&a),
        BenchKind::Reclaim(a) => reclaim::run(&a),
        BenchKind::Serve(a) => serve::run(&a),
        BenchKind::Context(a) => context::run(&a),
        BenchKind::Forks(a) => forks::run(&a),
        BenchKind::Search(a) => search::run(&a),
    }
}

/// `10k` → 10_000, `1m` → 1_000_000.
pub(crate) fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.strip_suffix('k') {
        Some(n) => (n, 1_000),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 1_000_000),
            None => (s.as_str(), 1),
        },
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("`{s}` is not a size like 10k or 1m"))?;
    Ok((n * mult as f64) as usize)
}

pub(crate) fn size_label(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}m", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// The `ctxlog-bench` binary for these backends: built now (release unless `--debug`).
pub(crate) fn bench_binary(common: &Common) -> Result<PathBuf> {
    let target = cargo::target_dir()?;
    if common.debug {
        // The test build: same features, same artifacts as `cargo xtask test`. Once per
        // process: the smoke test runs the bench many times.
        static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        if BUILT.get().is_none() {
            cargo::run(
                "build (debug)",
                &["build", "--workspace", "--all-features", "--all-targets"],
            )?;
            let _ = BUILT.set(());
        }
        return Ok(target.join("debug").join("ctxlog-bench"));
    }
    Ok(release_binaries(common)?.0)
}

/// `ctxlog-bench`, `ctxlog` and `ctxlog-http-load` for these backends, in one release build:
/// one feature set for the crates they share (Lance among them), so every bench reuses it.
pub(crate) fn release_binaries(common: &Common) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let target = cargo::target_dir()?;
    if common.debug {
        bench_binary(common)?;
        let d = target.join("debug");
        return Ok((d.join("ctxlog-bench"), d.join("ctxlog"), d.join("ctxlog-http-load")));
    }
    let mut features = Vec::new();
    for b in &common.backends {
        match b.as_str() {
            "sqlite" => features.extend(["ctxlog-benches/sqlite", "ctxlog-cli/sqlite"]),
            // Lance with S3 always: one feature set, so one release build (Lance's is the
            // longest of all to build), and stores on S3 can be restored and measured.
            "lance" => features.extend([
                "ctxlog-benches/lance",
                "ctxlog-benches/s3",
                "ctxlog-cli/lance",
                "ctxlog-cli/s3",
            ]),
            other => bail!("unknown backend `{other}` (have: sqlite, lance)"),
        }
    }
    let features = features.join(",");
    cargo::run(
        "build the bench binaries (release)",
        &[
            "build",
            "--release",
            "-p",
            "ctxlog-benches",
            "-p",
            "ctxlog-cli",
            "--no-default-features",
            "--features",
            &features,
        ],
    )?;
    let r = target.join("release");
    Ok((r.join("ctxlog-bench"), r.join("ctxlog"), r.join("ctxlog-http-load")))
}

pub(crate) fn out_dir(common: &Common) -> Result<PathBuf> {
    let dir = match &common.out {
        Some(d) => d.clone(),
        None => cargo::target_dir()?.join("ctxlog-bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

pub(crate) fn progress(hidden: bool, len: u64, what: &str) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

pub(crate) fn chrono_stamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ").to_string()
}

pub(crate) fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(|l| l.to_string()))
        .unwrap_or_default();
    json!({"cpus": cpus, "memory": mem, "os": std::env::consts::OS})
}
