//! Running cargo and friends with the environment every build here needs.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// A `cargo` command with `PROTOC` pointing at the vendored binary (unless the caller
/// set one) — Lance's build scripts need it.
pub fn cargo(args: &[&str]) -> Result<Command> {
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
    Ok(cmd)
}

/// Run `cargo args…`, failing with `what` if it fails.
pub fn run(what: &str, args: &[&str]) -> Result<()> {
    status(what, &mut cargo(args)?)
}

pub fn status(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {what}: {cmd:?}");
    let started = std::time::Instant::now();
    let status = cmd.status().with_context(|| format!("cannot start {what}"))?;
    eprintln!("xtask: {what}: {status} in {:.1} s", started.elapsed().as_secs_f64());
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

pub fn has_nextest() -> bool {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Cargo's target directory (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> Result<PathBuf> {
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
