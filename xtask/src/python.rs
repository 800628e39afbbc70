//! `cargo xtask test`'s Python step: the `ctxlog` Python package (`python/`) linted, type
//! checked and tested against real `ctxlog serve` processes (the debug binary the Rust tests
//! built), on SQLite and on Lance on the run's loopback S3 server; then the frameworks' own
//! tests (vendored under `python/tests/upstream/`) against its adapters.
//!
//! The environment is a virtualenv under the target directory holding exactly
//! `python/requirements-test.txt` (installed once per change of that file); the package is
//! installed into it afresh each run, without its dependencies (they are pinned there).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

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
    // This clone's package, found at run time (`cargo::root`): a path compiled in would be
    // that of whichever clone built the shared xtask binary.
    let python_dir = cargo::root().join("python");
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
    // Everything is installed with `--no-deps` from the pins: `pip check` proves the pins
    // are a consistent set (every requirement of every package is met at a fitting version).
    cargo::step(
        "python: pip check",
        Command::new(bin.join("pip")).args(["check", "--disable-pip-version-check"]),
    )?;
    Ok((python_dir, bin))
}
