//! Multi-process cases: real `ctxlog` processes writing one store, killed with SIGKILL,
//! fencing each other, racing to create it — on every backend compiled into the CLI, as
//! tests named `<backend>::<case>`. Every wait on a process has a deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail, ensure};
use ctxlog::ConflictKind;
use ctxlog_conformance::{Backend, Case, Ctx, recs, w};

mod common;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The `ctxlog` binary cargo built for these tests.
fn ctxlog_bin() -> anyhow::Result<PathBuf> {
    Ok(PathBuf::from(env!("CARGO_BIN_EXE_ctxlog")))
}

const RULE: &str = "Rules 1, 3, 12, 21 across processes";

fn cases() -> Vec<Case> {
    vec![
        ctxlog_conformance::case!(multiprocess_writers_exactly_once),
        ctxlog_conformance::case!(multiprocess_sigkill_keeps_acked),
        ctxlog_conformance::case!(multiprocess_same_writer_fences_older),
        ctxlog_conformance::case!(multiprocess_concurrent_create),
        ctxlog_conformance::case!(sigkilled_writer_is_continued_by_its_successor),
        ctxlog_conformance::case!(two_handles_in_one_process_keep_every_ack),
        ctxlog_conformance::case!(retain_beside_a_writer_keeps_every_ack),
        ctxlog_conformance::case!(a_summary_never_swallows_appends_made_while_it_was_written),
    ]
}

/// Every backend compiled into this build, reached through the facade's URIs.
fn backends() -> Vec<Backend> {
    common::process_backends()
}

fn main() -> std::process::ExitCode {
    // Re-run as a child process that holds two handles on one store (see `holder`).
    if let Ok(uri) = std::env::var(holder::STORE_ENV) {
        return holder::run(&uri);
    }
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

/// The child role of this test binary: one process holding a projector and a shard on one
/// store, as a server does (and `retain`, and the README's example), driven line by line
/// from its stdin:
///
/// - started with [`STORE_ENV`] (the URI), [`WRITER_ENV`] and [`ORDER_ENV`]
///   (`projector-first` or `shard-first`): it opens both handles in that order (a refresh
///   makes the projector hold its connection), then prints `ready`;
/// - `append PREFIX N`: appends records `PREFIX-0 .. PREFIX-(N-1)` to session `held`,
///   refreshes the projector, and prints the ack as JSON;
/// - `close`: closes the shard, prints `closed` and exits 0.
///
/// Any failure is printed on stderr and exits 1; every operation runs under the deadline in
/// [`TIMEOUT_ENV`].
mod holder {
    use std::time::Duration;

    use anyhow::{Context, bail};
    use ctxlog::{Record, StoreOptions, WriterId};
    use serde_json::json;
    use tokio::io::AsyncBufReadExt;

    pub(crate) const STORE_ENV: &str = "CTXLOG_TEST_HOLDER_STORE";
    pub(crate) const WRITER_ENV: &str = "CTXLOG_TEST_HOLDER_WRITER";
    pub(crate) const ORDER_ENV: &str = "CTXLOG_TEST_HOLDER_ORDER";
    pub(crate) const TIMEOUT_ENV: &str = "CTXLOG_TEST_HOLDER_TIMEOUT";

    pub(crate) fn run(uri: &str) -> std::process::ExitCode {
        let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("holder: no runtime: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        match rt.block_on(serve(uri)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("holder: {e:#}");
                std::process::ExitCode::from(1)
            }
        }
    }

    async fn serve(uri: &str) -> anyhow::Result<()> {
        let writer = std::env::var(WRITER_ENV).context("the writer id")?;
        let order = std::env::var(ORDER_ENV).context("the order")?;
        let timeout: f64 = std::env::var(TIMEOUT_ENV).context("the timeout")?.parse()?;
        let timeout = Duration::from_secs_f64(timeout);
        let within = |what: &'static str| move |_| anyhow::anyhow!("holder: {what} outlived {timeout:?}");
        let options = StoreOptions::default().with_timeout(timeout);
        let store = tokio::time::timeout(timeout, ctxlog::open(uri, options))
            .await
            .map_err(within("open"))??;
        let mut projector = store.projector();
        let writer = WriterId::new(writer)?;
        let mut shard = match order.as_str() {
            "projector-first" => {
                tokio::time::timeout(timeout, projector.refresh())
                    .await
                    .map_err(within("refresh"))??;
                tokio::time::timeout(timeout, store.open_shard(&writer))
                    .await
                    .map_err(within("open_shard"))??
            }
            "shard-first" => {
                let shard = tokio::time::timeout(timeout, store.open_shard(&writer))
                    .await
                    .map_err(within("open_shard"))??;
                tokio::time::timeout(timeout, projector.refresh())
                    .await
                    .map_err(within("refresh"))??;
                shard
            }
            other => bail!("unknown order `{other}`"),
        };
        println!("ready");
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        // The driver answers each line at once; a silent driver is a failed test.
        while let Some(line) = tokio::time::timeout(timeout * 4, lines.next_line())
            .await
            .map_err(within("waiting for a command"))??
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["append", prefix, n] => {
                    let n: usize = n.parse()?;
                    let batch: Vec<Record> = (0..n)
                        .map(|i| Record::text(format!("{prefix}-{i}"), "bot", "held", "user", format!("{prefix} {i}")))
                        .collect();
                    let ack = tokio::time::timeout(timeout, shard.append(batch))
                        .await
                        .map_err(within("append"))??;
                    tokio::time::timeout(timeout, projector.refresh())
                        .await
                        .map_err(within("refresh"))??;
                    println!(
                        "{}",
                        json!({"ids": ack.ids, "first_seq": ack.first_seq, "last_seq": ack.last_seq})
                    );
                }
                ["close"] => {
                    tokio::time::timeout(timeout, shard.close())
                        .await
                        .map_err(within("close"))??;
                    println!("closed");
                    return Ok(());
                }
                _ => bail!("unknown command `{line}`"),
            }
        }
        bail!("stdin closed before `close`")
    }
}

/// A running [`holder`] process.
struct Holder {
    child: Child,
    stdin: ChildStdin,
    out: Lines<BufReader<ChildStdout>>,
    deadline: Duration,
}

impl Holder {
    /// Start a holder of `writer`'s shard and a projector, opened in `order`; returns once
    /// both handles are open.
    async fn start(ctx: &Ctx, writer: &str, order: &str) -> anyhow::Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(holder::STORE_ENV, &ctx.uri)
            .env(holder::WRITER_ENV, writer)
            .env(holder::ORDER_ENV, order)
            .env(holder::TIMEOUT_ENV, ctx.backend.op_timeout.as_secs_f64().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawn the holder")?;
        let mut h = Holder {
            stdin: child.stdin.take().context("stdin")?,
            out: BufReader::new(child.stdout.take().context("stdout")?).lines(),
            child,
            deadline: ctx.backend.op_timeout * 3,
        };
        let first = h.line().await?;
        ensure!(first == "ready", "the holder said `{first}`");
        Ok(h)
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        tokio::time::timeout(self.deadline, self.out.next_line())
            .await
            .map_err(|_| anyhow!("the holder said nothing within {:?}", self.deadline))??
            .context("the holder exited early")
    }

    /// Append `n` records `prefix-i` through the held shard; their acknowledged ids.
    async fn append(&mut self, prefix: &str, n: usize) -> anyhow::Result<Vec<String>> {
        self.stdin
            .write_all(format!("append {prefix} {n}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.line().await?;
        let ack: Value = serde_json::from_str(&line).with_context(|| format!("ack line `{line}`"))?;
        ack_ids(&[ack])
    }

    async fn close(mut self) -> anyhow::Result<()> {
        self.stdin.write_all(b"close\n").await?;
        self.stdin.flush().await?;
        let line = self.line().await?;
        ensure!(line == "closed", "the holder said `{line}`");
        let status = tokio::time::timeout(self.deadline, self.child.wait())
            .await
            .map_err(|_| anyhow!("the holder did not exit"))??;
        ensure!(status.success(), "the holder exited {status}");
        Ok(())
    }
}

/// One `ctxlog append` process that writes `prefix-0 .. prefix-(n-1)` to `session` and
/// exits; its acknowledged ids.
async fn append_and_exit(
    ctx: &Ctx,
    writer: &str,
    prefix: &str,
    session: &str,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let mut p = WriterProcess::spawn(ctx, writer, n)?;
    p.send(prefix, session, 0..n).await?;
    let (status, stderr, acks) = p.wait().await?;
    ensure!(status.success(), "writer {writer} failed ({status}): {stderr}");
    ack_ids(&acks)
}

/// Every id in `acked` is live in the store, read by a fresh handle.
async fn all_visible(ctx: &Ctx, acked: &[(String, String)]) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut p = store.projector();
    p.refresh().await?;
    let live: BTreeSet<String> = p.projection().records.into_iter().map(|r| r.id).collect();
    let lost: Vec<&(String, String)> = acked.iter().filter(|(_, id)| !live.contains(id)).collect();
    ensure!(
        lost.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    Ok(())
}

/// One process holds a projector and a shard on the store (opened in either order, as a
/// server holds them) while other processes append and exit: every acknowledged write of
/// every process is stored. (On SQLite, a second handle that opened the store file outside
/// SQLite dropped the process's locks; an exiting process then checkpointed and deleted the
/// WAL the holder kept writing to.)
async fn two_handles_in_one_process_keep_every_ack(ctx: Ctx) -> anyhow::Result<()> {
    let mut acked: Vec<(String, String)> = Vec::new();
    let mut note = |who: &str, ids: Vec<String>| acked.extend(ids.into_iter().map(|id| (who.to_string(), id)));
    note("creator", append_and_exit(&ctx, "creator", "c", "s", 5).await?);
    for order in ["projector-first", "shard-first"] {
        let mut holder = Holder::start(&ctx, &format!("holder-{order}"), order).await?;
        note(order, holder.append(&format!("{order}-a"), 20).await?);
        note(
            "other",
            append_and_exit(&ctx, &format!("other-{order}-1"), &format!("{order}-o1"), "s", 20).await?,
        );
        note(order, holder.append(&format!("{order}-b"), 20).await?);
        note(
            "other",
            append_and_exit(&ctx, &format!("other-{order}-2"), &format!("{order}-o2"), "s", 20).await?,
        );
        note(order, holder.append(&format!("{order}-c"), 20).await?);
        holder.close().await?;
    }
    ensure!(acked.len() == 5 + 2 * 100, "{} acknowledged", acked.len());
    all_visible(&ctx, &acked).await?;
    // Every id was written once by one writer at consecutive seqs: a lost lock that let two
    // handles reuse a seq, or an append stored twice, shows here even when every id is live.
    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts.is_empty(),
        "two handles in one process left {} conflicts, e.g. {:?}",
        conflicts.len(),
        &conflicts[..conflicts.len().min(2)]
    );
    Ok(())
}

/// `ctxlog retain` (a projector, then the maintenance shard, in one process) running while
/// other processes append and exit: the tombstones retain acknowledged are all stored, and
/// so is every other process's acknowledged append.
async fn retain_beside_a_writer_keeps_every_ack(ctx: Ctx) -> anyhow::Result<()> {
    // Many idle sessions, one record each: retain's pass is long enough to be written beside
    // (SQLite's pass over 400 took about as long as two appending processes).
    let sessions_count: usize = if ctx.backend.name == "sqlite" { 2000 } else { 400 };
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("old")).await?;
    for chunk in (0..sessions_count).collect::<Vec<_>>().chunks(500) {
        let batch = chunk
            .iter()
            .map(|i| ctxlog::Record::text(format!("old-{i}"), "bot", format!("idle-{i:04}"), "user", "old"))
            .collect();
        shard.append(batch).await?;
    }
    shard.close().await?;
    drop(store);
    // Not a synchronisation: the wall clock must pass retain's 1 ms cutoff.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let sessions = sessions_count.to_string();
    let mut retain = spawn_ctxlog(&ctx, &["retain", "--older-than", "1ms", "--max-sessions", &sessions])?;
    drop(retain.stdin.take());
    // Its report (every session ended) outgrows a pipe's buffer: read it as it comes, so
    // that "retain still runs" below means its pass, not a write blocked on a full pipe.
    let mut stdout = retain.stdout.take().context("retain's stdout")?;
    let report = tokio::spawn(async move {
        let mut out = String::new();
        stdout.read_to_string(&mut out).await.map(|_| out)
    });
    // Appends of other processes until retain has exited (at least four). The test means
    // something only if some append was acknowledged while retain still ran: counted, and
    // required below (a retain that ends before any append overlaps it proves nothing).
    let mut acked = Vec::new();
    let mut acked_while_retain_ran = 0;
    let until = tokio::time::Instant::now() + ctx.backend.op_timeout * 4;
    for k in 0.. {
        let running = retain.try_wait()?.is_none();
        // Two overlapping appends are proof enough; then wait for retain without writing.
        if k >= 4 && (!running || acked_while_retain_ran >= 2) {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < until,
            "retain ran past {:?}",
            ctx.backend.op_timeout * 4
        );
        for id in append_and_exit(&ctx, &format!("beside-{k}"), &format!("b{k}"), "live", 10).await? {
            acked.push((format!("beside-{k}"), id));
        }
        // Started while retain ran and acknowledged before it exited.
        if running && retain.try_wait()?.is_none() {
            acked_while_retain_ran += 1;
        }
    }
    eprintln!("{acked_while_retain_ran} appends acknowledged while retain ran");
    ensure!(
        acked_while_retain_ran > 0,
        "no append was acknowledged while retain ran: nothing was written beside it"
    );
    let within = ctx.backend.op_timeout * 4;
    let out = tokio::time::timeout(within, async {
        let status = retain.wait().await?;
        ensure!(status.success(), "ctxlog retain failed ({status})");
        Ok(report.await??)
    })
    .await
    .map_err(|_| anyhow!("ctxlog retain did not finish within {within:?}"))??;
    let report: Value = serde_json::from_str(&out).context("retain's report")?;
    let tombstones = report["tombstones"].as_u64().context("tombstones")?;
    ensure!(tombstones >= sessions_count as u64, "retain ended too little: {report}");
    let store = ctx.store().await?;
    let maintenance = store
        .shards()
        .await?
        .into_iter()
        .find(|s| s.writer.as_str() == ctxlog::MAINTENANCE_WRITER)
        .context("the maintenance shard is stored")?;
    ensure!(
        maintenance.entries == tombstones,
        "retain acknowledged {tombstones} tombstones, {} are stored",
        maintenance.entries
    );
    all_visible(&ctx, &acked).await
}

/// `ctxlog ARGS…` on the case's store, under the backend's deadline, its stdio piped.
fn spawn_ctxlog(ctx: &Ctx, args: &[&str]) -> anyhow::Result<tokio::process::Child> {
    let timeout = ctx.backend.op_timeout.as_secs_f64().to_string();
    Command::new(ctxlog_bin()?)
        .args(["--store", &ctx.uri, "--timeout", &timeout])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawn ctxlog")
}

/// Wait for a `ctxlog` process (`what` it runs) to end within `within`: its stdout, or why
/// it failed.
async fn finished(child: tokio::process::Child, what: &str, within: Duration) -> anyhow::Result<String> {
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .map_err(|_| anyhow!("ctxlog {what} did not finish"))??;
    ensure!(
        out.status.success(),
        "ctxlog {what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Run `ctxlog ARGS…` to its end (within the deadline); its stdout, or why it failed.
async fn run_ctxlog(ctx: &Ctx, args: &[&str], stdin: &str) -> anyhow::Result<String> {
    let mut child = spawn_ctxlog(ctx, args)?;
    let mut input = child.stdin.take().context("stdin")?;
    input.write_all(stdin.as_bytes()).await?;
    drop(input);
    finished(child, &format!("{args:?}"), ctx.backend.op_timeout * 2).await
}

/// A `ctxlog context` process's view of session `s`.
async fn context_of(ctx: &Ctx) -> anyhow::Result<Value> {
    Ok(serde_json::from_str(
        &run_ctxlog(ctx, &["context", "--bot", "bot", "--session", "s"], "").await?,
    )?)
}

/// A `ctxlog append` process that writes summary `id` of session `s` covering `position`.
async fn summarise(ctx: &Ctx, writer: &str, id: &str, position: &Value) -> anyhow::Result<()> {
    let summary = json!({
        "id": id, "bot_id": "bot", "session_id": "s", "role": "summary", "kind": "summary",
        "text": format!("summary {id}"), "covers": position,
    });
    run_ctxlog(ctx, &["append", "--writer", writer], &format!("{summary}\n")).await?;
    Ok(())
}

fn record_ids(view: &Value) -> anyhow::Result<Vec<String>> {
    view["records"]
        .as_array()
        .context("records")?
        .iter()
        .map(|r| r["id"].as_str().map(str::to_string).context("id"))
        .collect()
}

/// Rule 21 across processes: summarisers read the session's context (`ctxlog context`),
/// work while a long-lived writer process and another one keep appending, and then write
/// their summaries (`ctxlog append`). Every append made while a summariser worked shows in
/// the context view; what a summary that does not govern covers shows raw; what the
/// governing summary covers, and only that, is left out.
async fn a_summary_never_swallows_appends_made_while_it_was_written(ctx: Ctx) -> anyhow::Result<()> {
    let mut a = WriterProcess::spawn(&ctx, "writer-a", 5)?;
    a.send("a1", "s", 0..10).await?;
    let mut before = Vec::new();
    for _ in 0..2 {
        before.extend(ack_ids(&[a.ack().await?.context("an ack")?])?);
    }
    // Summariser 1 reads; writer A appends while it works; summariser 2 reads later.
    let first = context_of(&ctx).await?;
    ensure!(
        record_ids(&first)? == before,
        "the first read sees what was acknowledged"
    );
    a.send("a2", "s", 0..10).await?;
    let mut during = Vec::new();
    for _ in 0..2 {
        during.extend(ack_ids(&[a.ack().await?.context("an ack")?])?);
    }
    let second = context_of(&ctx).await?;
    // Another process appends and exits while both still work.
    let from_b = append_and_exit(&ctx, "writer-b", "b", "s", 10).await?;
    // Summariser 2 lands first, summariser 1 (the staler view) last: the last one governs.
    summarise(&ctx, "summariser-2", "sum-2", &second["position"]).await?;
    summarise(&ctx, "summariser-1", "sum-1", &first["position"]).await?;
    a.send("a3", "s", 0..5).await?;
    let after = ack_ids(&[a.ack().await?.context("an ack")?])?;
    let (status, stderr, _) = a.wait().await?;
    ensure!(status.success(), "writer A failed ({status}): {stderr}");

    let view = context_of(&ctx).await?;
    ensure!(view["summary"] == "sum-1", "the summary written last governs: {view}");
    let mut want = vec!["sum-1".to_string()];
    // Covered by sum-2 only (which does not govern): shown raw, never lost.
    want.extend(during);
    want.extend(from_b);
    want.extend(after);
    // In contract order: the summary where its clock puts it, after what it follows.
    let mut got = record_ids(&view)?;
    ensure!(
        got.iter().position(|id| id == "sum-1") < got.iter().position(|id| id == "a3-0"),
        "{got:?}"
    );
    got.sort();
    want.sort();
    ensure!(got == want, "the context view: expected {want:?}, got {got:?}");
    ensure!(
        view["covered"] == before.len(),
        "sum-1 stands for what its writer read: {view}"
    );
    // Every replica agrees: a library reader's context view is the same.
    let store = ctx.store().await?;
    let lib = store.projector().context("bot", "s").await?;
    ensure!(
        lib.entries.iter().map(|e| e.record.id.clone()).collect::<BTreeSet<_>>() == got.iter().cloned().collect(),
        "a library reader disagrees"
    );
    Ok(())
}
