//! `cargo xtask dist`: the Python distribution. A wheel of the `ctxlog` package that carries
//! the `ctxlog` binary (CLI, server, MCP server), built by maturin with `bindings = "bin"`
//! (`python/pyproject.toml`), and an sdist, into `target/dist`. `pip install` of the wheel
//! needs no Rust toolchain; of the sdist, one.
//!
//! `cargo xtask test` builds the wheel once (debug profile) and proves it as a user would
//! meet it ([`check_wheel`]): a fresh virtualenv, no cargo on `PATH`, `pip install` of the
//! wheel with the adapters' extras (resolved by pip, within the test pins), then the README's
//! Python examples and the local-server tests against the wheel's own binary.
//!
//! maturin comes from `python/requirements-dist.txt` (pinned), into a virtualenv of its own
//! under the target directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cargo;
use crate::flags::DistArgs;

pub(crate) fn run(args: &DistArgs) -> Result<()> {
    let out = cargo::target_dir()?.join("dist");
    let wheel = wheel(&args.profile, &args.features, &out)?;
    eprintln!("xtask: wheel: {}", wheel.display());
    if !args.no_sdist {
        let mut cmd = maturin()?;
        cmd.args(["sdist", "--out"]).arg(&out);
        cargo::step("dist: sdist", &mut cmd)?;
    }
    Ok(())
}

/// maturin, from a virtualenv holding exactly the pinned `requirements-dist.txt`, run in
/// `python/`, with none of the variables a `cargo` or `cargo xtask` run sets that would
/// change what it builds (a lint wrapper, xtask's package variables).
fn maturin() -> Result<Command> {
    let python_dir = cargo::root().join("python");
    let venv = crate::python::pinned_venv("dist", &python_dir.join("requirements-dist.txt"), "dist")?;
    // `cargo::cargo` gives `PROTOC` (Lance's build) and drops xtask's own variables; the
    // command is then pointed at maturin.
    let template = cargo::cargo(&[])?;
    let mut cmd = Command::new(venv.join("bin").join("maturin"));
    for (key, value) in template.get_envs() {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    for key in ["RUSTC_WORKSPACE_WRAPPER", "CLIPPY_ARGS", "RUSTC_WRAPPER"] {
        cmd.env_remove(key);
    }
    cmd.current_dir(&python_dir);
    Ok(cmd)
}

/// Build the wheel with cargo's `profile` (`release`, or `dev` for the tests) and the CLI's
/// `features` (the default: SQLite only) into `out`; returns its path.
pub(crate) fn wheel(profile: &str, features: &[String], out: &Path) -> Result<PathBuf> {
    // Only this build's wheel is in `out` afterwards: the one to install is not a guess.
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out)?;
    let mut cmd = maturin()?;
    cmd.args(["build", "--profile", profile, "--out"]).arg(out);
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    cargo::step(&format!("dist: wheel ({profile})"), &mut cmd)?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!("expected one wheel in {}, found {}", out.display(), other.len()),
    }
}

/// The wheel as a user meets it: built (debug), installed into a fresh virtualenv with the
/// adapters' extras, no cargo on `PATH` and no `CTXLOG_BIN`, then the README's Python
/// examples and the local-server tests run against its own `ctxlog` binary.
pub(crate) fn check_wheel() -> Result<()> {
    let target = cargo::target_dir()?;
    let wheel = wheel("dev", &[], &target.join("dist-test"))?;
    let size = std::fs::metadata(&wheel)?.len();
    let python_dir = cargo::root().join("python");
    let scratch = tempfile::Builder::new().prefix("ctxlog-wheel-").tempdir_in(&target)?;
    let venv = scratch.path().join("venv");
    let bin = venv.join("bin");
    cargo::step(
        "wheel: fresh virtualenv",
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
    )?;
    // Only the system's directories and the virtualenv's: no cargo, no rustc.
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display());
    let isolated = |cmd: &mut Command| {
        cmd.env("PATH", &path)
            .env_remove("CTXLOG_BIN")
            .env_remove("PYTHONPATH")
            .env_remove("CARGO")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env("VIRTUAL_ENV", &venv);
    };
    let mut install = Command::new(bin.join("pip"));
    install
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("{}[openai-agents,langgraph,adk]", wheel.display()))
        .args(["pytest", "pytest-asyncio", "pytest-timeout", "-c"])
        .arg(python_dir.join("requirements-test.txt"));
    isolated(&mut install);
    let started = std::time::Instant::now();
    cargo::step(
        &format!("wheel: pip install ({:.1} MB)", size as f64 / 1e6),
        &mut install,
    )?;
    eprintln!(
        "xtask: wheel: installed with its extras in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // The package and the command are the wheel's, not the tree's or cargo's.
    let mut which = Command::new(bin.join("python"));
    which
        .args([
            "-c",
            "import ctxlog, shutil, sys; p = ctxlog.__file__; c = shutil.which('ctxlog'); \
             assert p.startswith(sys.prefix), p; assert c and c.startswith(sys.prefix), c; \
             assert shutil.which('cargo') is None",
        ])
        .current_dir(scratch.path());
    isolated(&mut which);
    cargo::step("wheel: the package and its binary are the wheel's", &mut which)?;
    let mut pytest = Command::new(bin.join("python"));
    pytest
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_readme.py",
            "tests/test_local.py",
        ])
        .current_dir(&python_dir);
    isolated(&mut pytest);
    cargo::step(
        "wheel: README examples and local servers, from the wheel alone",
        &mut pytest,
    )
    .context("the installed wheel")
}
