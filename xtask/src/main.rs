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

mod cargo;

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
        cargo::run("doc tests", &["test", "--workspace", "--all-features", "--doc"])
    } else {
        eprintln!("xtask: cargo-nextest not found, falling back to `cargo test` (no per-test timeouts)");
        let mut args = vec!["test", "--workspace", "--all-features"];
        if !extra.is_empty() {
            args.push("--");
            args.extend(extra.iter().map(String::as_str));
        }
        cargo::run("tests", &args)
    }
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
