//! Fresh-process probes: one `ctxlog-bench` run per figure, each under a deadline.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The longest any one probe may take (generating 10M entries is the slowest).
pub(crate) const PROBE_DEADLINE: Duration = Duration::from_secs(3600);

/// Run a child to completion within `deadline`, or kill it and fail naming it.
pub(crate) fn output_within(cmd: &mut Command, deadline: Duration) -> Result<std::process::Output> {
    use std::io::Read;
    use wait_timeout::ChildExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("start {:?}", cmd.get_program()))?;
    // Drain the pipes on threads, so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let out_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        out.read_to_end(&mut b).map(|_| b)
    });
    let err_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        err.read_to_end(&mut b).map(|_| b)
    });
    let status = match child.wait_timeout(deadline)? {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            // The program only: its arguments may carry a URI's storage options.
            bail!("{:?} did not finish within {deadline:?}", cmd.get_program());
        }
    };
    let stdout = out_t.join().map_err(|_| anyhow::anyhow!("stdout reader panicked"))??;
    let stderr = err_t.join().map_err(|_| anyhow::anyhow!("stderr reader panicked"))??;
    Ok(std::process::Output { status, stdout, stderr })
}

/// The writer that appends the last 1 % after a snapshot (cold-start and conflicts rows).
pub(crate) const LATE_WRITER: &str = "late-writer";

/// Save a projection snapshot of `store`, then append `extra` records as [`LATE_WRITER`]
/// (batches of 100): what a cold start then reads past its snapshot. Returns what the
/// snapshot probe printed.
pub(crate) fn snapshot_then_late_writes(bin: &Path, store: &str, extra: u64) -> Result<Value> {
    let saved = probe(bin, store, false, &["snapshot"])?;
    let extra = extra.to_string();
    let late = ["append", "--writer", LATE_WRITER, "--batch", "100", "--records", &extra];
    probe(bin, store, false, &late)?;
    Ok(saved)
}

/// One fresh-process probe.
pub(crate) fn probe(bin: &Path, store: &str, cold: bool, args: &[&str]) -> Result<Value> {
    let mut cmd = Command::new(bin);
    cmd.args(["--store", store]);
    if cold {
        cmd.arg("--cold");
    }
    cmd.args(args);
    let out = output_within(&mut cmd, PROBE_DEADLINE)?;
    if !out.status.success() {
        bail!(
            "ctxlog-bench {} on {} failed ({}): {}",
            args.join(" "),
            ctxlog::redact_uri(store),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).with_context(|| format!("ctxlog-bench printed `{text}`"))
}
