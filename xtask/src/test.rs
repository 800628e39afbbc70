//! `cargo xtask test`: every check a change must pass, in the order that fails fastest.
//! All test builds use `--workspace --all-features`: one feature set means one set of
//! artifacts, so nothing is built twice; clippy lints the workspace's crates as they are
//! built, not in a check of its own (a check shares no artifact with a build).

use anyhow::Result;

use crate::cargo;

pub(crate) fn run(extra: &[String]) -> Result<()> {
    cargo::run("format", &["fmt", "--all", "--", "--check"])?;
    crate::tidy::run()?;
    // Lint while building (see `cargo::set_lint`): every target `cargo clippy --all-targets`
    // would check, built once for the tests below (which then build only what is left).
    cargo::set_lint(true);
    cargo::run(
        "build and lint (clippy -D warnings)",
        &["test", "--workspace", "--all-targets", "--all-features", "--no-run"],
    )?;
    // One S3 server on loopback for the whole run (each test process would otherwise start
    // its own): the Lance cases on S3, the multi-process cases and the parity test use it.
    let s3 = crate::s3::server()?;
    let with_s3 = |cmd: &mut std::process::Command| {
        cmd.env(s3_loopback::ENDPOINT_ENV, s3.endpoint());
    };
    // The multi-process cases spawn the `ctxlog` binary; cargo builds it for the CLI's own
    // integration tests, with the same (all) features.
    let mut args = vec!["run", "--workspace", "--all-features", "--profile", "ci"];
    args.extend(extra.iter().map(String::as_str));
    let mut cmd = cargo::nextest(&args)?;
    with_s3(&mut cmd);
    cargo::step("tests (nextest)", &mut cmd)?;
    cargo::run("doc tests", &["test", "--workspace", "--all-features", "--doc"])?;
    // The Python client against the `ctxlog` binary the tests above built.
    crate::python::run(&s3)?;
    // The wheel a user installs: built once (debug), tested with no cargo in reach.
    crate::dist::check_wheel()?;
    crate::smoke::run(&s3)?;
    crate::chaos::short(&s3)?;
    crate::chaos_serve::serve_short(&s3)
}
