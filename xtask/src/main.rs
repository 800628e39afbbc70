//! `cargo xtask`: the project's automation, in Rust.
//!
//! - `cargo xtask test`: fmt, clippy (all targets, all features, `-D warnings`), then every
//!   test of every crate and feature under nextest (per-test timeouts), or `cargo test`
//!   when nextest is missing.
//! - `cargo xtask conformance [--backend NAME] [--json FILE]`: the conformance suite, as a
//!   table per backend.
//!
//! Every cargo call gets `PROTOC` from a vendored `protoc`, so Lance's build scripts work on
//! a machine with only the Rust toolchain. All test builds use `--workspace --all-features`:
//! one feature set means one set of artifacts, so nothing is built twice.

mod bench;
mod cargo;
mod plot;
mod restore;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt --check, clippy -D warnings, then every test (nextest with timeouts).
    Test {
        /// Extra arguments for nextest / cargo test (e.g. a filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `first-scan` (generated logs or `--restore SRC`) and `append`.
    Bench(bench::BenchArgs),
    /// Run the conformance suite and print a table per backend.
    Conformance {
        /// Only this backend (`sqlite`, `lance`).
        #[arg(long)]
        backend: Option<String>,
        /// Only cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Write results as JSON to FILE.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Test { args } => test(&args),
        Task::Conformance { backend, filter, json } => conformance(backend, filter, json),
        Task::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn test(extra: &[String]) -> Result<()> {
    cargo::run("format", &["fmt", "--all", "--", "--check"])?;
    cargo::run(
        "clippy",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // The multi-process cases spawn the `ctxlog` binary; cargo builds it for the CLI's own
    // integration tests, with the same (all) features. No separate `build --bins`: without
    // dev-dependencies it would resolve other features and build everything twice.
    if cargo::has_nextest() {
        let mut args = vec!["nextest", "run", "--workspace", "--all-features", "--profile", "ci"];
        args.extend(extra.iter().map(String::as_str));
        cargo::run("tests (nextest)", &args)?;
        cargo::run("doc tests", &["test", "--workspace", "--all-features", "--doc"])?;
        bench_smoke()
    } else {
        eprintln!("xtask: cargo-nextest not found, falling back to `cargo test` (no per-test timeouts)");
        let mut args = vec!["test", "--workspace", "--all-features"];
        if !extra.is_empty() {
            args.push("--");
            args.extend(extra.iter().map(String::as_str));
        }
        cargo::run("tests", &args)?;
        bench_smoke()
    }
}

/// The benchmark harness end to end on a tiny log (1k entries, 1 run, debug build), so that
/// it cannot rot: generated logs, `--restore` of a file, a directory and a .tar.gz, a
/// restore that must fail with a clear error, and the append benchmark.
fn bench_smoke() -> Result<()> {
    use anyhow::{Context, ensure};
    let started = std::time::Instant::now();
    let out = tempfile::tempdir()?;
    let dir = out.path().to_path_buf();
    let common = |json: bool| bench::Common {
        backends: vec!["sqlite".into(), "lance".into()],
        json,
        debug: true,
        out: Some(dir.clone()),
    };
    let first = |restore: Option<String>| bench::FirstScanArgs {
        common: common(false),
        sizes: vec!["1k".into()],
        runs: 1,
        writers: 2,
        seed: 42,
        restore,
        storage_options: Vec::new(),
    };
    bench::run(bench::BenchArgs {
        what: bench::BenchKind::FirstScan(first(None)),
    })?;
    let latest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("first-scan-latest.json"))?)?;
    let rows = latest["rows"].as_array().context("rows")?;
    ensure!(rows.len() == 2, "one row per backend: {rows:?}");
    for r in rows {
        ensure!(r["entries"] == 1000, "{r}");
        for k in [
            "first_scan_warm",
            "first_scan_cold",
            "floor_warm",
            "refresh_warm",
            "conflicts_warm",
        ] {
            ensure!(r[k]["median"].as_f64().is_some_and(|v| v > 0.0), "{k} missing in {r}");
        }
        ensure!(r["ratios"]["first_scan_over_floor_warm"].is_number(), "{r}");
    }
    ensure!(dir.join("first-scan.svg").exists(), "no plot");

    // Restore: each kind of source, and SRC must stay byte-identical (checked inside).
    let stores = dir.join("stores");
    let sqlite = stores.join("sqlite-1k-w2-s42.db");
    let lance = stores.join("lance-1k-w2-s42.lance");
    let tarball = dir.join("lance-store.tar.gz");
    {
        let gz = flate2::write::GzEncoder::new(std::fs::File::create(&tarball)?, flate2::Compression::fast());
        let mut tar = tar::Builder::new(gz);
        tar.append_dir_all("lance-1k.lance", &lance)?;
        tar.into_inner()?.finish()?;
    }
    // A Lance dataset named by a file:// URI is copied object by object, as from S3.
    let as_url = format!("file://{}", lance.display());
    for (src, name) in [
        (&sqlite, sqlite.display().to_string()),
        (&lance, lance.display().to_string()),
        (&tarball, tarball.display().to_string()),
        (&lance, as_url),
    ] {
        let before = restore::fingerprint(src)?;
        bench::run(bench::BenchArgs {
            what: bench::BenchKind::FirstScan(first(Some(name))),
        })?;
        ensure!(restore::fingerprint(src)? == before, "{} changed", src.display());
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("first-scan-latest.json"))?)?;
        ensure!(doc["restore"]["history_checks"].is_object(), "{doc}");
        ensure!(doc["rows"][0]["entries"] == 1000, "{doc}");
    }
    // An object-store URI with a query string: the copy lands under the dataset's name,
    // and no storage option value reaches the report.
    let secret = format!("SECRET-{}", std::process::id());
    let with_query = format!(
        "file://{}?aws_secret_access_key={secret}&region=eu-west-1",
        lance.display()
    );
    bench::run(bench::BenchArgs {
        what: bench::BenchKind::FirstScan(first(Some(with_query))),
    })?;
    let report = std::fs::read_to_string(dir.join("first-scan-latest.json"))?;
    ensure!(!report.contains(&secret), "a storage option value reached the report");
    ensure!(
        report.contains("\"entries\": 1000") || report.contains("\"entries\":1000"),
        "{report}"
    );

    let junk = dir.join("not-a-store.db");
    std::fs::write(&junk, b"this is not a database, just bytes")?;
    let err = bench::run(bench::BenchArgs {
        what: bench::BenchKind::FirstScan(first(Some(junk.display().to_string()))),
    })
    .err()
    .context("restoring junk must fail")?;
    let msg = format!("{err:#}");
    ensure!(msg.contains("not-a-store.db"), "the error names the file: {msg}");

    bench::run(bench::BenchArgs {
        what: bench::BenchKind::Append(bench::AppendArgs {
            common: common(true),
            batches: vec![10],
            writers: vec![1, 2],
            appends: Some(5),
        }),
    })?;
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("append-latest.json"))?)?;
    ensure!(doc["rows"].as_array().is_some_and(|r| r.len() == 4), "{doc}");
    eprintln!(
        "xtask: bench smoke: harness end to end in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn conformance(backend: Option<String>, filter: Option<String>, json: Option<std::path::PathBuf>) -> Result<()> {
    // `--all-targets` resolves features as the test build does: the artifacts are shared.
    cargo::run("build", &["build", "--workspace", "--all-features", "--all-targets"])?;
    let bin = cargo::target_dir()?.join("debug").join("ctxlog-conformance");
    let mut cmd = std::process::Command::new(&bin);
    if let Some(b) = backend {
        cmd.args(["--backend", &b]);
    }
    if let Some(f) = filter {
        cmd.args(["--filter", &f]);
    }
    if let Some(j) = json {
        cmd.arg("--json").arg(j);
    }
    cargo::status("conformance", &mut cmd)
}
