//! `--restore SRC`: benchmark a copy of a real store.
//!
//! SRC is only ever read: it is copied into a scratch directory (a file, a directory, the
//! contents of a .tar/.tar.gz, or — through `ctxlog-bench copy` — the objects of an
//! object-store URI), and its fingerprint is checked again afterwards.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::bench::{FirstScanArgs, Row, copy_dir};

/// A content fingerprint of every file under `path` (blake3 over relative paths and bytes).
pub fn fingerprint(path: &Path) -> Result<String> {
    let mut files = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).with_context(|| format!("read {}", p.display()))?;
        if meta.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        } else {
            files.push(p);
        }
    }
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(f.strip_prefix(path).unwrap_or(&f).to_string_lossy().as_bytes());
        h.update(&std::fs::read(&f).with_context(|| format!("read {}", f.display()))?);
    }
    Ok(h.finalize().to_hex().to_string())
}

/// Sources read through an object store (copied object by object by `ctxlog-bench copy`):
/// every URI with a scheme, except a `file://` URI that names a single file.
fn is_remote(src: &str) -> bool {
    match src.split_once("://") {
        Some(("file", path)) => Path::new(path).is_dir(),
        Some(_) => true,
        None => false,
    }
}

/// Copy SRC into `into`; returns the path of the copied store (file or directory).
fn copy_source(bin: &Path, src: &str, storage_options: &[String], into: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(into)?;
    if is_remote(src) {
        let name = src.trim_end_matches('/').rsplit('/').next().unwrap_or("store");
        let dst = into.join(if name.ends_with(".lance") {
            name.to_string()
        } else {
            format!("{name}.lance")
        });
        let mut cmd = std::process::Command::new(bin);
        cmd.args(["--store", src]);
        for o in storage_options {
            cmd.args(["--storage-option", o]);
        }
        cmd.args(["copy", "--to"]).arg(&dst);
        let out = crate::bench::output_within(&mut cmd, Duration::from_secs(3600))?;
        ensure!(
            out.status.success(),
            "cannot copy {src}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return Ok(dst);
    }
    let path = PathBuf::from(src.strip_prefix("file://").unwrap_or(src));
    ensure!(path.exists(), "{}: no such file or directory", path.display());
    let name = path
        .file_name()
        .context("SRC has a name")?
        .to_string_lossy()
        .into_owned();
    if path.is_dir() {
        let dst = into.join(&name);
        copy_dir(&path, &dst)?;
        return Ok(dst);
    }
    if name.ends_with(".tar") || name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        let file = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let reader: Box<dyn std::io::Read> = if name.ends_with(".tar") {
            Box::new(file)
        } else {
            Box::new(flate2::read::GzDecoder::new(file))
        };
        let unpacked = into.join("unpacked");
        tar::Archive::new(reader)
            .unpack(&unpacked)
            .with_context(|| format!("{}: not a readable tar archive", path.display()))?;
        return find_store(&unpacked).with_context(|| format!("{}: the archive holds no ctxlog store", path.display()));
    }
    let dst = into.join(&name);
    std::fs::copy(&path, &dst).with_context(|| format!("copy {}", path.display()))?;
    for ext in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{ext}", path.display()));
        if side.exists() {
            std::fs::copy(&side, format!("{}{ext}", dst.display()))?;
        }
    }
    Ok(dst)
}

/// The backend of a store on disk: a SQLite file, or a Lance dataset directory.
pub fn detect(path: &Path) -> Result<&'static str> {
    if path.is_dir() {
        ensure!(
            path.join("_versions").is_dir(),
            "{}: a directory but not a Lance dataset (no _versions)",
            path.display()
        );
        return Ok("lance");
    }
    let mut magic = [0u8; 16];
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    std::io::Read::read_exact(&mut f, &mut magic)
        .with_context(|| format!("{}: too short to be a store", path.display()))?;
    ensure!(
        &magic == b"SQLite format 3\0",
        "{}: neither a SQLite file nor a Lance dataset directory",
        path.display()
    );
    Ok("sqlite")
}

/// The first store found in an unpacked archive.
fn find_store(dir: &Path) -> Result<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if detect(&p).is_ok() {
            return Ok(p);
        }
        if p.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    bail!("no SQLite file or Lance dataset inside")
}

/// Copy, check, measure; then prove SRC was not touched.
pub fn measure_copy(
    bin: &Path,
    src: &str,
    storage_options: &[String],
    scratch: &Path,
    _args: &FirstScanArgs,
    measure: impl FnOnce(&str, &str, &str) -> Result<Row>,
) -> Result<(Row, Value)> {
    // What can be fingerprinted: anything on the local disk, however it is named.
    let on_disk = PathBuf::from(src.strip_prefix("file://").unwrap_or(src));
    let local = on_disk.exists().then_some(on_disk);
    let before = match &local {
        Some(p) => Some(fingerprint(p)?),
        None => None,
    };
    let into = scratch.join(format!("restore-{}", crate::bench::chrono_stamp()));
    let copy = copy_source(bin, src, storage_options, &into)?;
    let backend = detect(&copy)?;
    let uri = match backend {
        "sqlite" => format!("sqlite:{}", copy.display()),
        _ => format!("lance:{}", copy.display()),
    };
    // The history checks first: they also prove the copy opens.
    let out = crate::bench::output_within(
        std::process::Command::new(bin).args(["--store", &uri, "conflicts"]),
        Duration::from_secs(3600),
    )?;
    ensure!(
        out.status.success(),
        "the store copied from {src} ({}) does not open: {}",
        copy.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let checks: Value = serde_json::from_slice(&out.stdout)?;
    let row = measure(backend, &uri, "restored")?;
    if let (Some(p), Some(before)) = (&local, &before) {
        let after = fingerprint(p)?;
        ensure!(&after == before, "{} changed while it was benchmarked", p.display());
    }
    let _ = std::fs::remove_dir_all(&into);
    let report = json!({
        "source": src,
        "backend": backend,
        "entries": row.entries,
        "history_checks": checks["conflicts"],
        "source_unchanged": before.is_some(),
        "source_fingerprint": before,
    });
    Ok((row, report))
}

pub fn describe(report: &Value) -> String {
    let mut s = format!(
        "Restored {} ({} backend, {} entries).\nHistory checks:",
        report["source"].as_str().unwrap_or("?"),
        report["backend"].as_str().unwrap_or("?"),
        report["entries"]
    );
    let checks = report["history_checks"].as_object();
    for kind in [
        "corrupt",
        "seq_gap",
        "stale_epoch",
        "divergent_put",
        "write_after_delete",
    ] {
        let n = checks.and_then(|c| c.get(kind)).and_then(Value::as_u64).unwrap_or(0);
        s.push_str(&format!(" {kind} {n};"));
    }
    if report["source_unchanged"].as_bool() == Some(true) {
        s.push_str("\nThe source is byte-identical after the run (blake3 of every file).");
    }
    s.push('\n');
    s
}
