//! `cargo xtask test`'s Python step: the `ctxlog` Python package (`python/`) linted, type
//! checked and tested against real `ctxlog serve` processes (the debug binary the Rust tests
//! built), on SQLite and on Lance on the run's loopback S3 server; then the frameworks' own
//! tests (vendored under `python/tests/upstream/`) against its adapters.
//!
//! The environment is a virtualenv under the target directory holding exactly
//! `python/requirements-test.txt` (installed once per change of that file); the package is
//! installed into it afresh each run, without its dependencies (they are pinned there).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::cargo;

pub(crate) fn run(s3: &s3_loopback::Server) -> Result<()> {
    let (python_dir, bin) = environment()?;
    cargo::step(
        "python: ruff",
        Command::new(bin.join("ruff"))
            .args(["check", "src", "tests", "benchmarks"])
            .current_dir(&python_dir),
    )?;
    cargo::step("python: mypy", Command::new(bin.join("mypy")).current_dir(&python_dir))?;
    cargo::step(
        "python: mypy (benchmarks)",
        Command::new(bin.join("mypy"))
            .arg("benchmarks")
            .current_dir(&python_dir),
    )?;
    let ctxlog = cargo::target_dir()?.join("debug").join("ctxlog");
    cargo::step(
        "python: pytest",
        Command::new(bin.join("python"))
            .args([
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--ignore",
                "tests/upstream",
            ])
            .current_dir(&python_dir)
            .env("CTXLOG_BIN", &ctxlog)
            .env(s3_loopback::ENDPOINT_ENV, s3.endpoint()),
    )?;
    // The frameworks' own session and saver tests (a pinned subset vendored from the
    // released sdists, their fixtures swapped for the adapters): `tests/upstream/`.
    cargo::step(
        "python: the frameworks' own tests against the adapters",
        Command::new(bin.join("python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/upstream"])
            .current_dir(&python_dir)
            .env("CTXLOG_BIN", &ctxlog)
            .env(s3_loopback::ENDPOINT_ENV, s3.endpoint()),
    )
}

/// The package's directory and the `bin` directory of a virtualenv holding exactly the
/// pinned test requirements and the package as it is in the tree.
pub(crate) fn environment() -> Result<(PathBuf, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace root")?;
    let python_dir = root.join("python");
    let requirements = std::fs::read_to_string(python_dir.join("requirements-test.txt"))?;
    let venv = cargo::target_dir()?.join("python").join(format!(
        "venv-{}",
        &blake3::hash(requirements.as_bytes()).to_hex()[..12]
    ));
    let bin = venv.join("bin");
    // Written last: an install cut short is redone whole.
    let ready = venv.join("ctxlog-ready");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        cargo::step(
            "python: virtualenv",
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        )?;
        cargo::step(
            "python: pinned test environment",
            Command::new(bin.join("pip"))
                .args(["install", "--quiet", "--disable-pip-version-check", "--no-deps", "-r"])
                .arg(python_dir.join("requirements-test.txt")),
        )?;
        std::fs::write(&ready, &requirements)?;
    }
    cargo::step(
        "python: install the package",
        Command::new(bin.join("pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
            ])
            .arg("--force-reinstall")
            .arg(&python_dir),
    )?;
    Ok((python_dir, bin))
}
