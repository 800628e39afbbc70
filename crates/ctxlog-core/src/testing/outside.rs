//! A store's files read by another process, as an auditor would read them.
//!
//! A test that holds a handle on a SQLite store must never open the store's files itself:
//! POSIX record locks belong to a process and a file, so closing any descriptor of the file
//! drops every lock the process holds on it (SQLite's included), and another process may then
//! delete the WAL this one still writes to. A child process's descriptors are its own, so a
//! read through `cat`, `cp` or `grep` changes nothing for the test's connections.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// How long one of these commands may take before it is killed and reported.
const DEADLINE: Duration = Duration::from_secs(60);

/// Run `cmd` to its end, within [`DEADLINE`]; its output.
fn run(mut cmd: Command) -> io::Result<Output> {
    use wait_timeout::ChildExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let drain = |pipe: Option<Box<dyn io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn io::Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn io::Read + Send>));
    let Some(status) = child.wait_timeout(DEADLINE)? else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{cmd:?} did not finish within {DEADLINE:?}"),
        ));
    };
    let joined = |h: std::thread::JoinHandle<Vec<u8>>| h.join().map_err(|_| io::Error::other("a pipe reader panicked"));
    Ok(Output {
        status,
        stdout: joined(stdout)?,
        stderr: joined(stderr)?,
    })
}

fn failed(what: &str, out: &Output) -> io::Error {
    io::Error::other(format!(
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The bytes of the file at `path`, read by `cat`.
pub fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut cmd = Command::new("cat");
    cmd.arg("--").arg(path);
    let out = run(cmd)?;
    if !out.status.success() {
        return Err(failed(&format!("cat {}", path.display()), &out));
    }
    Ok(out.stdout)
}

/// Copy the file `src` to `dst`, by `cp`.
pub fn copy_file(src: &Path, dst: &Path) -> io::Result<()> {
    let mut cmd = Command::new("cp");
    cmd.arg("--").arg(src).arg(dst);
    let out = run(cmd)?;
    if !out.status.success() {
        return Err(failed(&format!("cp {} {}", src.display(), dst.display()), &out));
    }
    Ok(())
}

/// Every regular file under `dir` (recursively, links not followed) whose bytes contain
/// `needle`, found by `grep` and sorted. `needle` must be text without a line break.
pub fn files_containing(dir: &Path, needle: &str) -> io::Result<Vec<PathBuf>> {
    if needle.is_empty() || needle.contains(['\n', '\r', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the needle must be one line of text",
        ));
    }
    let mut cmd = Command::new("grep");
    // -r: recurse without following links; -l: names only; -a: binary files as text;
    // -F: a fixed string.
    cmd.args(["-r", "-l", "-a", "-F", "-e", needle, "--"]).arg(dir);
    let out = run(cmd)?;
    match out.status.code() {
        Some(0) | Some(1) => {
            let mut found: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from)
                .collect();
            found.sort();
            Ok(found)
        }
        _ => Err(failed(&format!("grep -r {}", dir.display()), &out)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The helpers see what is there and only that; a missing file is an error, not "empty".
    #[test]
    fn another_process_reads_copies_and_finds() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.bin");
        std::fs::write(&a, b"\x00\x01 a needle in binary \xff").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b.txt"), b"nothing here").unwrap();
        assert_eq!(read_file(&a).unwrap(), b"\x00\x01 a needle in binary \xff");
        assert!(read_file(&dir.path().join("missing")).is_err());
        copy_file(&a, &dir.path().join("sub/c.bin")).unwrap();
        assert_eq!(
            files_containing(dir.path(), "needle").unwrap(),
            vec![a.clone(), dir.path().join("sub/c.bin")]
        );
        assert!(files_containing(dir.path(), "absent").unwrap().is_empty());
        assert!(files_containing(&dir.path().join("missing"), "needle").is_err());
    }
}
