//! `cargo xtask mutants`: mutation testing (cargo-mutants) of `ctxlog-core` and the SQLite
//! backend against the fast suite — the core's own tests, the conformance suite on the
//! in-memory reference store and on SQLite. No Lance build. cargo-mutants is installed into
//! the target directory the first time; its report lands in `<target>/mutants/`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cargo;
use crate::flags::MutantsArgs;

/// The cargo-mutants release this task installs when none is on the PATH.
const CARGO_MUTANTS: &str = "27.0.0";

pub(crate) fn run(args: &MutantsArgs) -> Result<()> {
    let target = cargo::target_dir()?;
    let tool = installed(&target)?;
    let out = target.join("mutants");
    std::fs::create_dir_all(&out)?;
    let mut cmd = Command::new(&tool);
    cmd.current_dir(cargo::root())
        .args(["mutants", "--package", "ctxlog-core", "--package", "ctxlog-sqlite"])
        // The fast suite: what these two crates' tests and the conformance suite (in memory
        // and on SQLite) check. Lance is never built.
        .args([
            "--test-package",
            "ctxlog-core",
            "--test-package",
            "ctxlog-sqlite",
            "--test-package",
            "ctxlog-conformance",
        ])
        .args(["--features", "ctxlog-core/testing,ctxlog-sqlite/testing"])
        .arg("--output")
        .arg(&out)
        .args(["--jobs", &args.jobs.max(1).to_string(), "--timeout-multiplier", "3"]);
    if let Some(f) = &args.file {
        cmd.args(["--file", f]);
    }
    // cargo-mutants runs cargo itself: give it the same vendored protoc as every build here.
    if std::env::var_os("PROTOC").is_none()
        && let Ok(protoc) = protoc_bin_vendored::protoc_bin_path()
    {
        cmd.env("PROTOC", protoc);
    }
    let status = cmd.status().context("run cargo-mutants")?;
    let summary = summary(&out.join("mutants.out"));
    eprintln!("xtask: mutants: {summary}");
    eprintln!("xtask: report in {}", out.join("mutants.out").display());
    // cargo-mutants exits non-zero when a mutant survives: that is a finding, not a failure
    // of this task. Only a run that produced no outcomes failed.
    if summary.is_empty() && !status.success() {
        bail!("cargo-mutants failed ({status})");
    }
    Ok(())
}

/// cargo-mutants, from the PATH or installed under the target directory.
fn installed(target: &std::path::Path) -> Result<PathBuf> {
    let on_path = Command::new("cargo-mutants").arg("--version").output();
    if on_path.is_ok_and(|o| o.status.success()) {
        return Ok(PathBuf::from("cargo-mutants"));
    }
    let root = target.join("tools");
    let bin = root.join("bin").join("cargo-mutants");
    if bin.exists() {
        return Ok(bin);
    }
    let root_arg = root.to_string_lossy().into_owned();
    cargo::run(
        "install cargo-mutants",
        &[
            "install",
            "cargo-mutants",
            "--locked",
            "--version",
            CARGO_MUTANTS,
            "--root",
            &root_arg,
        ],
    )?;
    Ok(bin)
}

/// Counts by outcome from cargo-mutants' output directory.
fn summary(dir: &std::path::Path) -> String {
    let mut parts = Vec::new();
    for (file, what) in [
        ("caught.txt", "caught"),
        ("missed.txt", "missed"),
        ("timeout.txt", "timeout"),
        ("unviable.txt", "unviable"),
    ] {
        if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
            parts.push(format!(
                "{} {what}",
                text.lines().filter(|l| !l.trim().is_empty()).count()
            ));
        }
    }
    parts.join(", ")
}
