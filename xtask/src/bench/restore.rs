//! `--restore SRC`: benchmark a copy of a real store.
//!
//! SRC is only ever read: it is copied into a scratch directory and its fingerprint is
//! checked again afterwards (a live store may change meanwhile — by its own writers — and is
//! then reported as changed, not as an error). How each kind of SRC is copied:
//!
//! - a SQLite file: through SQLite's online backup API from a read-only connection
//!   (`ctxlog-bench copy`), one consistent snapshot even while writers checkpoint;
//! - a Lance dataset directory: its regular files;
//! - a `.tar`/`.tar.gz`: its regular files and directories only — links, devices, FIFOs,
//!   absolute paths and `..` are refused with an error naming the entry;
//! - an object-store URI (or a `file://` URI of a directory): object by object
//!   (`ctxlog-bench copy`); its query string (storage options, credentials) is passed on
//!   but never printed or stored.
//!
//! Nothing inside SRC is ever followed through a symbolic link; only SRC itself may be one.

use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use ctxlog::Location;
use ctxlog::redact_uri;
use serde_json::{Value, json};

/// A content fingerprint of every regular file under `path` (blake3 over relative paths and
/// bytes). Links and special files are refused: reading a FIFO would block forever.
pub(crate) fn fingerprint(path: &Path) -> Result<String> {
    let mut files = Vec::new();
    walk(path, &mut |p, kind| match kind {
        Kind::Dir => Ok(()),
        Kind::File => {
            files.push(p.to_path_buf());
            Ok(())
        }
    })?;
    files.sort();
    let mut h = blake3::Hasher::new();
    for f in files {
        h.update(f.strip_prefix(path).unwrap_or(&f).to_string_lossy().as_bytes());
        h.update(&std::fs::read(&f).with_context(|| format!("read {}", f.display()))?);
    }
    Ok(h.finalize().to_hex().to_string())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// Visit `root` and everything under it (parents before children), never following a
/// link. `root` itself may be a link (the user named it); anything under it that is not a
/// regular file or directory fails, naming it.
fn walk(root: &Path, visit: &mut dyn FnMut(&Path, Kind) -> Result<()>) -> Result<()> {
    let meta = std::fs::metadata(root).with_context(|| format!("{}: cannot read it", root.display()))?;
    let kind = kind_of(root, &meta)?;
    visit(root, kind)?;
    if kind == Kind::Dir {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(root)
            .with_context(|| format!("read {}", root.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        entries.sort();
        for p in entries {
            let meta = std::fs::symlink_metadata(&p).with_context(|| format!("read {}", p.display()))?;
            match kind_of(&p, &meta)? {
                Kind::Dir => walk(&p, visit)?,
                Kind::File => visit(&p, Kind::File)?,
            }
        }
    }
    Ok(())
}

fn kind_of(p: &Path, meta: &std::fs::Metadata) -> Result<Kind> {
    let t = meta.file_type();
    if t.is_dir() {
        Ok(Kind::Dir)
    } else if t.is_file() {
        Ok(Kind::File)
    } else if t.is_symlink() {
        bail!(
            "{}: a symbolic link; a store holds none, and links are never followed",
            p.display()
        )
    } else {
        bail!(
            "{}: neither a regular file nor a directory (a FIFO, socket or device?)",
            p.display()
        )
    }
}

/// Copy a directory's regular files (and directories), never following a link.
pub(crate) fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    walk(src, &mut |p, kind| {
        let to = dst.join(p.strip_prefix(src).unwrap_or(p));
        match kind {
            Kind::Dir => std::fs::create_dir_all(&to).with_context(|| format!("create {}", to.display())),
            Kind::File => std::fs::copy(p, &to)
                .map(|_| ())
                .with_context(|| format!("copy {}", p.display())),
        }
    })
}

/// What `--restore` was given, parsed once.
enum Source {
    /// A store on the local disk (a SQLite file or a Lance directory).
    Local(PathBuf),
    /// A tar archive holding one.
    Archive { path: PathBuf, gzip: bool },
    /// Objects behind a URI: `uri` is passed on whole, `shown` is what may be printed.
    Objects { uri: String, shown: String, name: String },
}

impl Source {
    fn parse(src: &str) -> Result<Self> {
        let shown = redact_uri(src);
        let without_query = src.split(['?', '#']).next().unwrap_or(src);
        let local = match without_query.split_once("://") {
            Some(("file", path)) => PathBuf::from(path),
            Some(_) => {
                let name = without_query
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .filter(|n| !n.is_empty() && !n.contains("://"))
                    .unwrap_or("store")
                    .to_string();
                return Ok(Source::Objects {
                    uri: src.to_string(),
                    shown,
                    name,
                });
            }
            None => PathBuf::from(without_query),
        };
        // The user may name a link; nothing under it is followed.
        let meta =
            std::fs::metadata(&local).with_context(|| format!("{}: no such file or directory", local.display()))?;
        let name = local
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if meta.is_dir() {
            // A directory named by a URI is copied object by object, as from S3.
            if src.contains("://") {
                return Ok(Source::Objects {
                    uri: src.to_string(),
                    shown,
                    name,
                });
            }
            return Ok(Source::Local(local));
        }
        ensure!(
            meta.is_file(),
            "{}: neither a regular file nor a directory",
            local.display()
        );
        if name.ends_with(".tar") {
            return Ok(Source::Archive {
                path: local,
                gzip: false,
            });
        }
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            return Ok(Source::Archive {
                path: local,
                gzip: true,
            });
        }
        Ok(Source::Local(local))
    }

    /// What may be printed and stored about the source.
    fn shown(&self) -> String {
        match self {
            Source::Local(p) | Source::Archive { path: p, .. } => p.display().to_string(),
            Source::Objects { shown, .. } => shown.clone(),
        }
    }

    /// What can be fingerprinted: anything on the local disk.
    fn on_disk(&self) -> Option<PathBuf> {
        match self {
            Source::Local(p) | Source::Archive { path: p, .. } => Some(p.clone()),
            Source::Objects { uri, .. } => uri
                .split(['?', '#'])
                .next()
                .and_then(|u| u.strip_prefix("file://"))
                .map(PathBuf::from),
        }
    }
}

/// Copy `source` into `into`; returns the copied store's location.
fn copy_source(bin: &Path, source: &Source, storage_options: &[String], into: &Path) -> Result<Location> {
    std::fs::create_dir_all(into)?;
    match source {
        Source::Objects { uri, shown, name } => {
            let dst = into.join(if name.ends_with(".lance") {
                name.clone()
            } else {
                format!("{name}.lance")
            });
            let mut cmd = std::process::Command::new(bin);
            cmd.args(["--store", uri]);
            for o in storage_options {
                cmd.args(["--storage-option", o]);
            }
            cmd.args(["copy", "--to"]).arg(&dst);
            let out = super::probe::output_within(&mut cmd, Duration::from_secs(3600))?;
            ensure!(
                out.status.success(),
                "cannot copy {shown}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            detect(&dst)
        }
        Source::Archive { path, gzip } => {
            let unpacked = into.join("unpacked");
            unpack(path, *gzip, &unpacked)?;
            find_store(&unpacked).with_context(|| format!("{}: the archive holds no ctxlog store", path.display()))
        }
        Source::Local(path) => match detect(path)? {
            Location::Sqlite(_) => {
                let dst = into.join(path.file_name().context("SRC has a name")?);
                copy_sqlite(bin, path, &dst)?;
                Ok(Location::Sqlite(dst))
            }
            Location::Lance { .. } => {
                let dst = into.join(path.file_name().context("SRC has a name")?);
                copy_dir(path, &dst)?;
                detect(&dst)
            }
            other => bail!("restore: no way to copy a {} store", other.backend()),
        },
    }
}

/// Copy a SQLite store consistently (`ctxlog-bench copy`: the online backup API).
pub(crate) fn copy_sqlite(bin: &Path, src: &Path, dst: &Path) -> Result<()> {
    let out = super::probe::output_within(
        std::process::Command::new(bin)
            .arg("--store")
            .arg(format!("sqlite:{}", src.display()))
            .args(["copy", "--to"])
            .arg(dst),
        Duration::from_secs(3600),
    )?;
    ensure!(
        out.status.success(),
        "cannot copy {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// The store at `path`, told by its contents (the facade's detection: links not followed).
pub(crate) fn detect(path: &Path) -> Result<Location> {
    Location::detect(path).with_context(|| {
        format!(
            "{}: neither a SQLite file nor a Lance dataset directory",
            path.display()
        )
    })
}

/// Unpack an archive's regular files and directories into `into`; refuse everything else,
/// naming the entry.
fn unpack(archive: &Path, gzip: bool, into: &Path) -> Result<()> {
    let file = std::fs::File::open(archive).with_context(|| format!("open {}", archive.display()))?;
    let reader: Box<dyn std::io::Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let unreadable = || format!("{}: not a readable tar archive", archive.display());
    let mut tar = tar::Archive::new(reader);
    std::fs::create_dir_all(into)?;
    for entry in tar.entries().with_context(unreadable)? {
        let mut entry = entry.with_context(unreadable)?;
        let path = entry.path().with_context(unreadable)?.into_owned();
        let named = || format!("{}: entry `{}`", archive.display(), path.display());
        for c in path.components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                _ => bail!(
                    "{}: an absolute path or `..` would leave the scratch directory",
                    named()
                ),
            }
        }
        let to = into.join(&path);
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                std::fs::create_dir_all(&to).with_context(named)?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent).with_context(named)?;
                }
                // create_new: never write through anything already there.
                let mut out = std::fs::File::create_new(&to).with_context(named)?;
                std::io::copy(&mut entry, &mut out).with_context(named)?;
            }
            other => bail!(
                "{}: a {other:?} entry; only regular files and directories are unpacked",
                named()
            ),
        }
    }
    Ok(())
}

/// The first store found in an unpacked archive (depth first, in name order).
fn find_store(dir: &Path) -> Result<Location> {
    let mut found = None;
    walk(dir, &mut |p, _| {
        if found.is_none() {
            found = Location::detect(p);
        }
        Ok(())
    })?;
    found.context("no SQLite file or Lance dataset inside")
}

/// Copy, check, measure (`measure(backend, uri)` gives its result and the entries it saw);
/// then check whether SRC changed.
pub(crate) fn measure_copy<R>(
    bin: &Path,
    src: &str,
    storage_options: &[String],
    scratch: &Path,
    measure: impl FnOnce(&str, &str) -> Result<(R, u64)>,
) -> Result<(R, Value)> {
    let source = Source::parse(src)?;
    let local = source.on_disk();
    let before = match &local {
        Some(p) => Some(fingerprint(p)?),
        None => None,
    };
    let into = scratch.join(format!("restore-{}", super::chrono_stamp()));
    let copy = copy_source(bin, &source, storage_options, &into)?;
    let backend = copy.backend();
    let uri = copy.uri();
    // The history checks first: they also prove the copy opens.
    let out = super::probe::output_within(
        std::process::Command::new(bin).args(["--store", &uri, "conflicts"]),
        Duration::from_secs(3600),
    )?;
    ensure!(
        out.status.success(),
        "the store copied from {} does not open: {}",
        source.shown(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let checks: Value = serde_json::from_slice(&out.stdout)?;
    let (row, entries) = measure(backend, &uri)?;
    let unchanged = match (&local, &before) {
        (Some(p), Some(before)) => {
            let same = fingerprint(p)? == *before;
            if !same {
                eprintln!(
                    "xtask: note: {} changed during the run (a live store: its own writers); the bench only read it",
                    p.display()
                );
            }
            Some(same)
        }
        _ => None,
    };
    let _ = std::fs::remove_dir_all(&into);
    let report = json!({
        "source": source.shown(),
        "backend": backend,
        "entries": entries,
        "history_checks": checks["conflicts"],
        "source_unchanged": unchanged,
        "source_fingerprint": before,
    });
    Ok((row, report))
}

pub(crate) fn describe(report: &Value) -> String {
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
        "implausible_hlc",
    ] {
        let n = checks.and_then(|c| c.get(kind)).and_then(Value::as_u64).unwrap_or(0);
        s.push_str(&format!(" {kind} {n};"));
    }
    match report["source_unchanged"].as_bool() {
        Some(true) => s.push_str("\nThe source is byte-identical after the run (blake3 of every file)."),
        Some(false) => s.push_str("\nThe source changed during the run (its own writers); the bench only read it."),
        None => {}
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tarball(dir: &Path, build: impl FnOnce(&mut tar::Builder<std::fs::File>)) -> PathBuf {
        let path = dir.join("evil.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
        build(&mut b);
        b.finish().unwrap();
        path
    }

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h
    }

    #[test]
    fn archives_with_links_devices_or_escaping_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        type Build = Box<dyn Fn(&mut tar::Builder<std::fs::File>)>;
        let cases: Vec<(&str, Build)> = vec![
            (
                "symlink",
                Box::new(|b| {
                    let mut h = header(tar::EntryType::Symlink, 0);
                    b.append_link(&mut h, "r", "/").unwrap();
                }),
            ),
            (
                "hard link",
                Box::new(|b| {
                    let mut h = header(tar::EntryType::Link, 0);
                    b.append_link(&mut h, "agents.db", "/etc/passwd").unwrap();
                }),
            ),
            (
                "fifo",
                Box::new(|b| {
                    let mut h = header(tar::EntryType::Fifo, 0);
                    b.append_data(&mut h, "pipe", std::io::empty()).unwrap();
                }),
            ),
            (
                "dot-dot",
                Box::new(|b| {
                    let mut h = header(tar::EntryType::Regular, 1);
                    // `append_data` refuses `..`; write the raw name as an attacker would.
                    h.as_gnu_mut().unwrap().name[..8].copy_from_slice(b"../evil\0");
                    h.set_cksum();
                    b.append(&h, &b"x"[..]).unwrap();
                }),
            ),
        ];
        for (what, build) in cases {
            let sub = dir.path().join(what.replace(' ', "-"));
            std::fs::create_dir_all(&sub).unwrap();
            let tar = tarball(&sub, |b| build(b));
            let err = unpack(&tar, false, &sub.join("out")).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains("entry `"), "{what}: the error names the entry: {msg}");
            assert!(!dir.path().join("evil").exists(), "{what}: nothing escaped");
        }
    }

    #[test]
    fn links_inside_a_source_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("store.lance");
        std::fs::create_dir_all(src.join("_versions")).unwrap();
        std::fs::write(src.join("_versions/1.manifest"), b"m").unwrap();
        std::os::unix::fs::symlink("/etc", src.join("escape")).unwrap();
        let err = copy_dir(&src, &dir.path().join("copy")).unwrap_err();
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
        assert!(fingerprint(&src).is_err(), "fingerprinting does not follow it either");
        // Detection does not follow a link to a store.
        std::fs::remove_file(src.join("escape")).unwrap();
        let link = dir.path().join("link.lance");
        std::os::unix::fs::symlink(&src, &link).unwrap();
        assert!(Location::detect(&link).is_none());
        assert!(Location::detect(&src).is_some());
    }

    #[test]
    fn object_store_sources_keep_their_query_out_of_names_and_output() {
        let s = Source::parse("s3://bucket/agents.lance?region=eu-west-1&aws_secret_access_key=SECRET").unwrap();
        match &s {
            Source::Objects { name, shown, uri } => {
                assert_eq!(name, "agents.lance");
                assert!(!shown.contains("SECRET") && !shown.contains("region"), "{shown}");
                assert!(uri.contains("SECRET"), "the copy itself gets every option");
            }
            _ => panic!("an object-store source"),
        }
        assert!(!s.shown().contains("SECRET"));
    }
}
