//! Running cargo and other steps: the environment every build here needs (a vendored
//! `protoc` for Lance's build scripts), and quiet output — one line per step (name, result,
//! time); the full command and its output only with `--verbose` or when the step fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};

static VERBOSE: AtomicBool = AtomicBool::new(false);
static LINT: AtomicBool = AtomicBool::new(false);

/// Print every command in full and stream its output.
pub(crate) fn set_verbose(v: bool) {
    VERBOSE.store(v, Ordering::Relaxed);
}

pub(crate) fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// Lint the workspace's own crates while they are built: every later cargo call compiles
/// them with `clippy-driver` as `RUSTC_WORKSPACE_WRAPPER` and `-D warnings`, as `cargo clippy`
/// does. Why: `cargo clippy` checks, and a check shares no artifact with a build — a cold run
/// would compile the whole dependency tree (DataFusion, Lance) twice, once as metadata only.
/// As the wrapper of a build, clippy-driver compiles for real and lints on the way; only the
/// workspace's crates see it, so dependencies stay one set of artifacts, and cargo keeps the
/// linted builds of the workspace's crates under their own names beside plain ones.
pub(crate) fn set_lint(on: bool) {
    LINT.store(on, Ordering::Relaxed);
}

/// The toolchain's `clippy-driver` (beside `rustc` in its sysroot), found once per run.
fn clippy_driver() -> Result<PathBuf> {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(driver) = FOUND.get() {
        return Ok(driver.clone());
    }
    let driver = find_clippy_driver()?;
    Ok(FOUND.get_or_init(|| driver).clone())
}

fn find_clippy_driver() -> Result<PathBuf> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .context("rustc --print sysroot")?;
    if !out.status.success() {
        bail!("rustc --print sysroot failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let driver = Path::new(String::from_utf8_lossy(&out.stdout).trim())
        .join("bin")
        .join(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX));
    if !driver.is_file() {
        bail!(
            "{} is missing: the tests lint with clippy (`rustup component add clippy`)",
            driver.display()
        );
    }
    Ok(driver)
}

/// A `cargo` command with `PROTOC` pointing at the vendored binary (unless the caller
/// set one) — Lance's build scripts need it.
pub(crate) fn cargo(args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args);
    // `cargo xtask` runs us with xtask's own package variables set. Build scripts that
    // rerun on them (ring's, via `cc`) would rebuild the whole dependency tree whenever the
    // same build is also run outside xtask: do not pass them on.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("CARGO_BIN_")
            || matches!(&*key, "CARGO_PRIMARY_PACKAGE" | "CARGO_CRATE_NAME" | "OUT_DIR")
        {
            cmd.env_remove(&*key);
        }
    }
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path().context("no vendored protoc for this platform")?;
        cmd.env("PROTOC", protoc);
    }
    if LINT.load(Ordering::Relaxed) {
        // clippy-driver's own protocol (what `cargo clippy` sets): arguments joined by a marker.
        cmd.env("RUSTC_WORKSPACE_WRAPPER", clippy_driver()?)
            .env("CLIPPY_ARGS", "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__");
    }
    Ok(cmd)
}

/// Run `cargo args…` as the step `what`.
pub(crate) fn run(what: &str, args: &[&str]) -> Result<()> {
    step(what, &mut cargo(args)?)
}

/// A command as it may be printed: program and arguments, with every URI's query string
/// (storage options) redacted; never the environment.
pub(crate) fn shown(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        out.push(' ');
        out.push_str(&ctxlog::redact_uri(&a.to_string_lossy()));
    }
    out
}

/// Run one step: a line with its name, result and time; with `--verbose`, the command and
/// its output as it runs; on failure, the command and everything it printed.
pub(crate) fn step(what: &str, cmd: &mut Command) -> Result<()> {
    let started = Instant::now();
    if verbose() {
        eprintln!("xtask: {what}: {}", shown(cmd));
        let status = cmd.status().with_context(|| format!("cannot start {what}"))?;
        eprintln!("xtask: {what}: {status} in {:.1} s", started.elapsed().as_secs_f64());
        if !status.success() {
            bail!("{what} failed ({status})");
        }
        return Ok(());
    }
    eprint!("xtask: {what} … ");
    let _ = std::io::stderr().flush();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {what}"))?;
    let took = started.elapsed().as_secs_f64();
    if out.status.success() {
        eprintln!("ok ({took:.1} s)");
        return Ok(());
    }
    eprintln!("FAILED ({took:.1} s)");
    eprintln!("xtask: {what}: {}", shown(cmd));
    let _ = std::io::stderr().write_all(&out.stdout);
    let _ = std::io::stderr().write_all(&out.stderr);
    bail!("{what} failed ({})", out.status)
}

/// The cargo-nextest this repository's tests run under when the machine has none: its
/// per-test timeouts (`.config/nextest.toml`) and `threads-required` are what keep a hang
/// from stalling a run and a 2-core machine from being oversubscribed.
const NEXTEST_VERSION: &str = "0.9.143";

fn nextest_answers(path: Option<&std::ffi::OsStr>) -> bool {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `cargo nextest ARGS…`: with the machine's cargo-nextest, or else the pinned one, which is
/// installed under the target directory the first time (`cargo install --locked`). Never
/// falls back to `cargo test`, which would drop every per-test timeout.
pub(crate) fn nextest(args: &[&str]) -> Result<Command> {
    let mut all = vec!["nextest"];
    all.extend_from_slice(args);
    let mut cmd = cargo(&all)?;
    if nextest_answers(None) {
        return Ok(cmd);
    }
    let root = target_dir()?
        .join("tools")
        .join(format!("cargo-nextest-{NEXTEST_VERSION}"));
    let path = std::env::join_paths(
        std::iter::once(root.join("bin")).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )?;
    if !nextest_answers(Some(&path)) {
        let version = format!("={NEXTEST_VERSION}");
        let root_arg = root.to_string_lossy().into_owned();
        run(
            &format!("install cargo-nextest {NEXTEST_VERSION} (not on this machine)"),
            &[
                "install",
                "cargo-nextest",
                "--locked",
                "--version",
                &version,
                "--root",
                &root_arg,
            ],
        )?;
        if !nextest_answers(Some(&path)) {
            bail!(
                "cargo-nextest {NEXTEST_VERSION} was installed under {} but does not run",
                root.display()
            );
        }
    }
    cmd.env("PATH", path);
    Ok(cmd)
}

/// Cargo's target directory (honours `CARGO_TARGET_DIR`).
pub(crate) fn target_dir() -> Result<PathBuf> {
    let out = cargo(&["metadata", "--format-version", "1", "--no-deps"])?
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(PathBuf::from(
        meta["target_directory"]
            .as_str()
            .context("target_directory in cargo metadata")?,
    ))
}

/// The workspace root (where `Cargo.lock` is).
///
/// Taken from the environment `cargo run` gives the process, not from the path compiled in:
/// clones that share one target directory share one xtask binary, and a fresh-looking binary
/// built in another clone would otherwise run every task on that clone's tree (or fail when
/// it is gone).
/// Run directly (not by `cargo run`), the nearest directory upwards from the current one
/// that holds `Cargo.lock` and `xtask/`; never the path compiled in.
pub(crate) fn root() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR")
        && let Some(root) = Path::new(&dir).parent()
    {
        return root.to_path_buf();
    }
    let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    here.ancestors()
        .find(|d| d.join("Cargo.lock").is_file() && d.join("xtask").is_dir())
        .map_or(here.clone(), Path::to_path_buf)
}
