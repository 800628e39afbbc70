//! `cargo xtask test`: every check a change must pass, in the order that fails fastest.
//! All test builds use `--workspace --all-features`: one feature set means one set of
//! artifacts, so nothing is built twice.

use anyhow::Result;

use crate::cargo;

pub(crate) fn run(extra: &[String]) -> Result<()> {
    cargo::run("format", &["fmt", "--all", "--", "--check"])?;
    crate::tidy::run()?;
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
    // integration tests, with the same (all) features.
    if cargo::has_nextest() {
        let mut args = vec!["nextest", "run", "--workspace", "--all-features", "--profile", "ci"];
        args.extend(extra.iter().map(String::as_str));
        cargo::run("tests (nextest)", &args)?;
    } else {
        eprintln!("xtask: cargo-nextest not found, falling back to `cargo test` (no per-test timeouts)");
        let mut args = vec!["test", "--workspace", "--all-features"];
        if !extra.is_empty() {
            args.push("--");
            args.extend(extra.iter().map(String::as_str));
        }
        cargo::run("tests", &args)?;
    }
    cargo::run("doc tests", &["test", "--workspace", "--all-features", "--doc"])?;
    crate::smoke::run()
}
