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

/// A virtualenv under the target directory holding exactly the pins of `requirements`
/// (`--no-deps`), named `{prefix}-{hash of the pins}`: a change of pins is a new one.
pub(crate) fn pinned_venv(prefix: &str, requirements: &Path, label: &str) -> Result<PathBuf> {
    let pins = std::fs::read_to_string(requirements)?;
    let venv = cargo::target_dir()?
        .join("python")
        .join(format!("{prefix}-{}", &blake3::hash(pins.as_bytes()).to_hex()[..12]));
    // Written last: an install cut short is redone whole.
    let ready = venv.join("ctxlog-ready");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        cargo::step(
            &format!("{label}: virtualenv"),
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
        )?;
        cargo::step(
            &format!("{label}: pinned packages"),
            Command::new(venv.join("bin").join("pip"))
                .args(["install", "--quiet", "--disable-pip-version-check", "--no-deps", "-r"])
                .arg(requirements),
        )?;
        std::fs::write(&ready, &pins)?;
    }
    Ok(venv)
}

/// The package's directory and the `bin` directory of a virtualenv holding exactly the
/// pinned test requirements and the package as it is in the tree.
pub(crate) fn environment() -> Result<(PathBuf, PathBuf)> {
    // This clone's package, found at run time (`cargo::root`): a path compiled in would be
    // that of whichever clone built the shared xtask binary.
    let python_dir = cargo::root().join("python");
    let venv = pinned_venv("venv", &python_dir.join("requirements-test.txt"), "python")?;
    let bin = venv.join("bin");
    // The package as it is in the tree, on the path (a `.pth` file): installing it would
    // build the `ctxlog` binary into a wheel (maturin), which the tests take from the Rust
    // build instead (`CTXLOG_BIN`). The wheel itself is tested on its own (`dist`).
    let site = Command::new(bin.join("python"))
        .args(["-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        .output()?;
    if !site.status.success() {
        anyhow::bail!("the virtualenv's python cannot say where its packages go");
    }
    let site = PathBuf::from(String::from_utf8(site.stdout)?.trim());
    std::fs::write(
        site.join("ctxlog-tree.pth"),
        format!("{}\n", python_dir.join("src").display()),
    )?;
    // Everything is installed with `--no-deps` from the pins: `pip check` proves the pins
    // are a consistent set (every requirement of every package is met at a fitting version).
    cargo::step(
        "python: pip check",
        Command::new(bin.join("pip")).args(["check", "--disable-pip-version-check"]),
    )?;
    Ok((python_dir, bin))
}
