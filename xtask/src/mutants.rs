//! `cargo xtask mutants`: mutation testing (cargo-mutants) of `ctxlog-core`, the SQLite
//! backend and the server against the fast suite — the core's own tests, the conformance
//! suite on the reference store and on SQLite, the server's own tests (its writer, view and
//! watch over the reference store and its failpoints) — and the Lance backend against its own tests.
//! cargo-mutants is installed into the target directory the first time; its report lands in
//! `<target>/mutants/`. Mutants of the first three build in cargo-mutants' scratch copies, each with a
//! target directory of its own (no Lance build); Lance's are made in place, one at a time, in the
//! shared target directory with every feature (the features of every other build): a scratch copy
//! would build Lance cold, most of an hour, for each job.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cargo;
use crate::flags::MutantsArgs;

/// The cargo-mutants release this task installs when none is on the PATH.
const CARGO_MUTANTS: &str = "27.1.0";

/// One pass: the crate mutated, the tests that judge its mutants, its features.
struct Pass {
    name: &'static str,
    package: &'static str,
    tests: &'static [&'static str],
    /// The features to build with; `None`: every feature, in place (see the module docs).
    features: Option<&'static str>,
}

/// Core mutants are judged by the core's tests and the suite on the reference store (no
/// storage engine to rebuild); SQLite's by its own tests and the suite on SQLite.
const PASSES: [Pass; 4] = [
    Pass {
        name: "core",
        package: "ctxlog-core",
        tests: &["ctxlog-core", "ctxlog-conformance"],
        features: Some("ctxlog-core/testing"),
    },
    Pass {
        name: "sqlite",
        package: "ctxlog-sqlite",
        tests: &["ctxlog-sqlite"],
        features: Some("ctxlog-sqlite/testing"),
    },
    // The server on SQLite only (its default, no Lance build), judged by its own tests and
    // the CLI's, which drive `ctxlog serve` over HTTP: its own tests alone caught 15 of 38
    // viable mutants of its writer, view and watch (2026-12-02, a third of them sampled);
    // with the CLI's, 51 of 51 viable (2026-12-04, `--shard 0/6` and `1/6` of 194, 6 min each).
    Pass {
        name: "server",
        package: "ctxlog-server",
        tests: &["ctxlog-server", "ctxlog-cli"],
        features: Some("ctxlog-server/sqlite"),
    },
    // Lance's shard and index modules by its own tests (on a local directory and the
    // loopback S3 server); in place: run it with `--file`, a whole pass is hours.
    Pass {
        name: "lance",
        package: "ctxlog-lance",
        tests: &["ctxlog-lance"],
        features: None,
    },
];

pub(crate) fn run(args: &MutantsArgs) -> Result<()> {
    let target = cargo::target_dir()?;
    let tool = installed(&target)?;
    let mut summaries = Vec::new();
    for pass in PASSES
        .iter()
        // Lance's pass only when asked for (`--only lance`).
        .filter(|p| args.only.as_deref().map_or(p.features.is_some(), |o| o == p.name))
    {
        let out = target.join("mutants").join(pass.name);
        std::fs::create_dir_all(&out)?;
        let mut cmd = Command::new(&tool);
        cmd.current_dir(cargo::root())
            .args(["mutants", "--package", pass.package])
            .args(pass.tests.iter().flat_map(|t| ["--test-package", t]))
            .arg("--output")
            .arg(&out)
            .args(["--timeout-multiplier", "3"])
            // A mutant is judged by the tests, not by lints: under a clippy wrapper with
            // `-D warnings` (what a shell set up for CI's lint build has), a mutant that
            // leaves a field unread or an import unused does not build, and is counted
            // unviable untested (2026-12-06: `check_fence -> Ok(())`, among 5 of 9).
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CLIPPY_ARGS");
        match pass.features {
            Some(features) => {
                cmd.args(["--features", features])
                    .args(["--jobs", &args.jobs.max(1).to_string()])
                    // Each job builds in its scratch copy's own `target/` (cargo-mutants'
                    // default), never in the shared target directory: there, parallel jobs
                    // would overwrite each other's `ctxlog-core` (same package, same artifact
                    // names) between one job's build and its test run, so a mutant could be
                    // judged by another's binary; and the next ordinary build would rebuild
                    // everything above core (Lance, the CLI).
                    .env_remove("CARGO_TARGET_DIR");
            }
            // One job, in the tree and the shared target directory (cargo-mutants puts each
            // file back after its mutant); the next ordinary build rebuilds this crate only.
            // Refused on a tree with changes: a run killed half-way leaves a mutant in the
            // sources, and `git diff` must be able to show it.
            None => {
                let status = Command::new("git")
                    .current_dir(cargo::root())
                    .args(["status", "--porcelain"])
                    .output()
                    .context("run git status")?;
                if !status.stdout.is_empty() {
                    bail!(
                        "mutants ({}): the tree has changes; commit or stash them first (mutants are made in place)",
                        pass.name
                    );
                }
                cmd.args(["--all-features", "--in-place"]);
            }
        }
        for f in &args.file {
            cmd.args(["--file", f]);
        }
        for re in &args.re {
            cmd.args(["--re", re]);
        }
        if args.iterate {
            cmd.arg("--iterate");
        }
        if let Some(shard) = &args.shard {
            cmd.args(["--shard", shard, "--sharding", "round-robin"]);
        }
        // cargo-mutants runs cargo itself: give it the same vendored protoc as every build.
        if std::env::var_os("PROTOC").is_none()
            && let Ok(protoc) = protoc_bin_vendored::protoc_bin_path()
        {
            cmd.env("PROTOC", protoc);
        }
        eprintln!("xtask: mutants ({}): {}", pass.name, cargo::shown(&cmd));
        let status = cmd.status().context("run cargo-mutants")?;
        let summary = summary(&out.join("mutants.out"));
        eprintln!("xtask: mutants ({}): {summary}", pass.name);
        eprintln!("xtask: report in {}", out.join("mutants.out").display());
        // cargo-mutants exits non-zero when a mutant survives: a finding, not a failure of
        // this task. Only a pass that produced no outcomes failed.
        if summary.is_empty() && !status.success() {
            bail!("cargo-mutants ({}) failed ({status})", pass.name);
        }
        summaries.push(format!("{}: {summary}", pass.name));
    }
    eprintln!("xtask: mutants: {}", summaries.join("; "));
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
