//! Multi-process cases: real `ctxlog` processes writing one store, killed with SIGKILL,
//! fencing each other, racing to create it — on every backend compiled into the CLI, as
//! tests named `<backend>::<case>`. Every wait on a process has a deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail, ensure};
use ctxlog::ConflictKind;
use ctxlog_conformance::{Backend, Case, Ctx, FaultGuard, recs, w};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The `ctxlog` binary cargo built for these tests.
fn ctxlog_bin() -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(env!("CARGO_BIN_EXE_ctxlog")))
}

const RULE: &str = "Rules 1, 3, 12 across processes";

fn cases() -> Vec<Case> {
    vec![
        ctxlog_conformance::case!(multiprocess_writers_exactly_once),
        ctxlog_conformance::case!(multiprocess_sigkill_keeps_acked),
        ctxlog_conformance::case!(multiprocess_same_writer_fences_older),
        ctxlog_conformance::case!(multiprocess_concurrent_create),
        ctxlog_conformance::case!(sigkilled_writer_is_continued_by_its_successor),
    ]
}

/// Not needed by the multi-process cases (they write through the binary only).
fn unused<T>() -> ctxlog_conformance::BoxFuture<anyhow::Result<T>> {
    Box::pin(async { anyhow::bail!("the multi-process cases inject no faults") })
}

/// Every backend compiled into this build, reached through the facade's URIs.
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend {
        name: "sqlite",
        store_uri: |root| format!("sqlite:{}", root.join("store.db").display()),
        open: |uri, options| Box::pin(async move { ctxlog::open(&uri, options).await }),
        op_timeout: Duration::from_secs(10),
        case_timeout: Duration::from_secs(120),
        proptest_cases: 0,
        inject_raw_entry: |_, _| unused(),
        stall_writes: |_| unused::<FaultGuard>(),
        tamper_snapshots: |_, _| unused(),
        faults: None,
        files_in_root: true,
    }];
    if ctxlog::compiled_backends().contains(&"lance") {
        out.push(Backend {
            name: "lance",
            store_uri: |root| root.join("store.lance").display().to_string(),
            op_timeout: Duration::from_secs(30),
            case_timeout: Duration::from_secs(170),
            ..out[0]
        });
    }
    // Lance on the loopback S3 server: the binary gets `--store 's3://…?endpoint=…'`.
    #[cfg(feature = "s3")]
    out.push(Backend {
        name: "lance_s3",
        store_uri: s3_loopback::store_uri_for,
        op_timeout: Duration::from_secs(30),
        case_timeout: Duration::from_secs(240),
        files_in_root: false,
        ..out[0]
    });
    out
}

fn main() -> std::process::ExitCode {
    ctxlog_conformance::run_trials(&backends(), &cases())
}

/// One `ctxlog append` process.
struct WriterProcess {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    acks: Lines<BufReader<ChildStdout>>,
    deadline: Duration,
}

impl WriterProcess {
    fn spawn(ctx: &Ctx, writer: &str, batch: usize) -> anyhow::Result<Self> {
        let timeout = ctx.backend.op_timeout.as_secs_f64().to_string();
        let mut child = Command::new(ctxlog_bin()?)
            .args(["--store", &ctx.uri, "--timeout", &timeout, "append", "--writer", writer])
            .args(["--batch", &batch.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawn ctxlog")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(WriterProcess {
            name: writer.to_string(),
            stdin: child.stdin.take(),
            acks: BufReader::new(stdout).lines(),
            child,
            deadline: ctx.backend.op_timeout * 2,
        })
    }

    /// Write records `prefix-from .. prefix-to` (session `session`) to stdin.
    async fn send(&mut self, prefix: &str, session: &str, range: std::ops::Range<usize>) -> anyhow::Result<()> {
        let mut buf = String::new();
        for i in range {
            let line = json!({
                "id": format!("{prefix}-{i}"),
                "bot_id": "bot",
                "session_id": session,
                "role": "user",
                "text": format!("{prefix} says {i}"),
                "metadata": {"writer": self.name, "i": i},
            });
            buf.push_str(&line.to_string());
            buf.push('\n');
        }
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin.write_all(buf.as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// The next ack line, or `None` at end of output.
    async fn ack(&mut self) -> anyhow::Result<Option<Value>> {
        let line = tokio::time::timeout(self.deadline, self.acks.next_line())
            .await
            .map_err(|_| anyhow!("writer {} printed no ack within {:?}", self.name, self.deadline))??;
        Ok(match line {
            None => None,
            Some(l) => Some(serde_json::from_str(&l).with_context(|| format!("ack line `{l}`"))?),
        })
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Wait for exit within the deadline; returns the status and stderr.
    async fn wait(mut self) -> anyhow::Result<(ExitStatus, String, Vec<Value>)> {
        self.stdin = None;
        let mut rest = Vec::new();
        while let Some(a) = self.ack().await? {
            rest.push(a);
        }
        let status = tokio::time::timeout(self.deadline, self.child.wait())
            .await
            .map_err(|_| anyhow!("writer {} did not exit within {:?}", self.name, self.deadline))??;
        let mut stderr = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut stderr).await?;
        }
        Ok((status, stderr, rest))
    }

    /// SIGKILL, then collect whatever acks it printed before dying.
    async fn kill(mut self) -> anyhow::Result<Vec<Value>> {
        self.child.start_kill()?;
        self.stdin = None;
        let mut rest = Vec::new();
        while let Some(a) = self.ack().await? {
            rest.push(a);
        }
        tokio::time::timeout(self.deadline, self.child.wait())
            .await
            .map_err(|_| anyhow!("killed writer {} did not exit", self.name))??;
        Ok(rest)
    }
}

/// The ids of every ack line, in order.
fn ack_ids(acks: &[Value]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for a in acks {
        for id in a["ids"].as_array().context("ack has ids")? {
            out.push(id.as_str().context("id is a string")?.to_string());
        }
    }
    Ok(out)
}

async fn visible(ctx: &Ctx, session: &str) -> anyhow::Result<Vec<String>> {
    let store = ctx.store().await?;
    let view = store.projector().session("bot", session).await?;
    Ok(view.into_iter().map(|e| e.record.id).collect())
}

/// K writer processes × M records into one session: every acked record visible once.
async fn multiprocess_writers_exactly_once(ctx: Ctx) -> anyhow::Result<()> {
    const K: usize = 3;
    const M: usize = 120;
    const BATCH: usize = 20;
    ctx.store().await?; // created up front; concurrent creation has its own case
    let mut procs = Vec::new();
    for k in 0..K {
        let mut p = WriterProcess::spawn(&ctx, &format!("replica-{k}"), BATCH)?;
        p.send(&format!("p{k}"), "shared", 0..M).await?;
        p.close_stdin();
        procs.push(p);
    }
    let mut acked = Vec::new();
    for p in procs {
        let (status, stderr, acks) = p.wait().await?;
        ensure!(status.success(), "writer failed ({status}): {stderr}");
        ensure!(acks.len() == M / BATCH, "one ack per batch: {}", acks.len());
        acked.extend(ack_ids(&acks)?);
    }
    ensure!(acked.len() == K * M);
    let seen = visible(&ctx, "shared").await?;
    ensure!(seen.len() == K * M, "{} visible of {}", seen.len(), K * M);
    let unique: BTreeSet<&String> = seen.iter().collect();
    ensure!(unique.len() == seen.len(), "a record is visible twice");
    ensure!(acked.iter().all(|id| unique.contains(id)), "an acked record is missing");
    // Within one writer, the session keeps its write order.
    for k in 0..K {
        let mine: Vec<&String> = seen.iter().filter(|id| id.starts_with(&format!("p{k}-"))).collect();
        let want: Vec<String> = (0..M).map(|i| format!("p{k}-{i}")).collect();
        ensure!(
            mine.iter().map(|s| s.as_str()).eq(want.iter().map(|s| s.as_str())),
            "writer {k} out of order"
        );
    }
    Ok(())
}

/// A writer killed with SIGKILL mid-stream: everything it acked is there after reopen, and
/// a successor continues its shard without a gap.
async fn multiprocess_sigkill_keeps_acked(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let mut p = WriterProcess::spawn(&ctx, "doomed", 10)?;
    let mut acks = Vec::new();
    for round in 0..5 {
        p.send("k", "s", round * 10..round * 10 + 10).await?;
        acks.push(p.ack().await?.context("an ack per batch")?);
    }
    // More batches in flight, then the kill.
    p.send("k", "s", 50..95).await?;
    acks.extend(p.kill().await?);
    let acked = ack_ids(&acks)?;
    ensure!(acked.len() >= 50);

    let store = ctx.store().await?;
    let seen: BTreeSet<String> = visible(&ctx, "s").await?.into_iter().collect();
    for id in &acked {
        ensure!(seen.contains(id), "acked {id} lost to SIGKILL");
    }
    // Batches are atomic across the crash too: whole batches of 10 only.
    ensure!(
        seen.len().is_multiple_of(10),
        "a torn batch survived: {} records",
        seen.len()
    );
    let mut successor = store.open_shard(&w("doomed")).await?;
    let next = successor.append(recs("after", "s", 1)).await?;
    ensure!(
        next.first_seq as usize == seen.len() + 1,
        "the successor continues at {}",
        next.first_seq
    );
    successor.close().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "{conflicts:?}");
    Ok(())
}

/// Two processes with one writer id: the older exits 3 (fenced) within the deadline, and
/// every record either acked is present.
async fn multiprocess_same_writer_fences_older(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let mut older = WriterProcess::spawn(&ctx, "same", 5)?;
    older.send("old", "s", 0..5).await?;
    let first = older.ack().await?.context("older acks")?;
    let mut newer = WriterProcess::spawn(&ctx, "same", 5)?;
    newer.send("new", "s", 0..5).await?;
    let second = newer.ack().await?.context("newer acks")?;
    ensure!(
        second["epoch"].as_u64() > first["epoch"].as_u64(),
        "{first} then {second}"
    );

    older.send("old", "s", 5..10).await?;
    let (status, stderr, late_acks) = older.wait().await?;
    ensure!(late_acks.is_empty(), "a fenced writer acked: {late_acks:?}");
    ensure!(
        status.code() == Some(3),
        "the fenced writer must exit 3, got {status}: {stderr}"
    );
    ensure!(stderr.contains("fenced"), "stderr says what happened: {stderr}");

    newer.send("new", "s", 5..10).await?;
    let (status, stderr, rest) = newer.wait().await?;
    ensure!(status.success(), "{stderr}");
    let mut acked = ack_ids(&[first, second])?;
    acked.extend(ack_ids(&rest)?);
    ensure!(acked.len() == 15);
    let seen: BTreeSet<String> = visible(&ctx, "s").await?.into_iter().collect();
    for id in &acked {
        ensure!(seen.contains(id), "acked {id} missing");
    }
    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        !conflicts.iter().any(|c| c.kind() == ConflictKind::SeqGap),
        "fencing left a seq gap: {conflicts:?}"
    );
    Ok(())
}

/// N processes creating the same missing store at once all succeed and share one store.
async fn multiprocess_concurrent_create(ctx: Ctx) -> anyhow::Result<()> {
    const N: usize = 5;
    let mut procs = Vec::new();
    for i in 0..N {
        procs.push(WriterProcess::spawn(&ctx, &format!("creator-{i}"), 1)?);
    }
    for (i, p) in procs.iter_mut().enumerate() {
        p.send(&format!("c{i}"), "s", 0..1).await?;
    }
    let mut codes = BTreeMap::new();
    for (i, p) in procs.into_iter().enumerate() {
        let (status, stderr, acks) = p.wait().await?;
        if !status.success() {
            bail!("creator {i} failed ({status}): {stderr}");
        }
        codes.insert(i, acks.len());
    }
    ensure!(codes.values().all(|&n| n == 1), "{codes:?}");
    let store = ctx.store().await?;
    ensure!(store.shards().await?.len() == N);
    ensure!(visible(&ctx, "s").await?.len() == N);
    Ok(())
}

/// A writer killed mid-stream: every acknowledged record is visible at once (before any
/// flush), and its successor continues its seqs and leaves no conflict.
async fn sigkilled_writer_is_continued_by_its_successor(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let mut p = WriterProcess::spawn(&ctx, "crashy", 10)?;
    let mut acks = Vec::new();
    for r in 0..4 {
        p.send("k", "s", r * 10..r * 10 + 10).await?;
        acks.push(p.ack().await?.context("ack")?);
    }
    p.send("k", "s", 40..75).await?;
    acks.extend(p.kill().await?);
    let acked = ack_ids(&acks)?;
    ensure!(acked.len() >= 40);
    // Visible at once, from the WAL tail alone: the killed writer never flushed.
    let ids = |v: Vec<ctxlog::Entry>| v.into_iter().map(|e| e.record.id).collect::<BTreeSet<_>>();
    let seen = ids(ctx.store().await?.projector().session("bot", "s").await?);
    ensure!(
        acked.iter().all(|id| seen.contains(id)),
        "an acked entry is not visible"
    );
    // The successor replays the WAL, continues the seqs and flushes on close.
    let store = ctx.store().await?;
    let mut next = store.open_shard(&w("crashy")).await?;
    let ack = next.append(recs("after", "s", 1)).await?;
    ensure!(
        ack.first_seq as usize == seen.len() + 1,
        "{ack:?} after {} entries",
        seen.len()
    );
    next.close().await?;
    let after = ids(ctx.store().await?.projector().session("bot", "s").await?);
    ensure!(after.len() == seen.len() + 1 && seen.is_subset(&after));
    ensure!(store.conflict_discovery().conflicts(None).await?.is_empty());
    Ok(())
}
