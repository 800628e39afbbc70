//! `cargo xtask chaos`: a seeded soak. Writer processes (`ctxlog-chaos write`) append to
//! shared sessions with caller ids and log every acknowledgement; some of them also hold a
//! projector on the store (opened before or after their shard, as a server holds both).
//! Meanwhile the soak SIGKILLs writers at random points, starts a second process with the
//! same writer id (a takeover), runs compaction and the maintenance commands (`ctxlog
//! retain`, `purge`, `gc`, `snapshot`, each a process of its own), keeps a reader refreshing
//! and — on Lance — lets every writer's object store inject faults of every kind. At the end
//! `ctxlog-chaos check` verifies the store against every acknowledgement. One summary, with
//! the seed that replays the run's decisions; [`verdict`] fails the run on any recorded
//! failure and on a run that showed no progress.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use wait_timeout::ChildExt;

use crate::cargo;
use crate::flags::ChaosArgs;

/// Writer identities the soak keeps busy.
const WRITERS: usize = 3;

/// One writer process and the files it writes.
struct Writer {
    slot: usize,
    /// Which process of the run this is (1, 2, …).
    incarnation: u64,
    /// Another process of its slot ran beside it (a takeover, either side): either may
    /// claim the shard (the older one when it reopens after an unknown outcome) and fence
    /// the other.
    rival: bool,
    child: Child,
}

/// What the soak counts of writers that ended by themselves.
#[derive(Default)]
struct Exits {
    fenced: u64,
    failed: u64,
    hangs: u64,
    failures: Vec<String>,
}

impl Exits {
    /// Count a writer that ended: 0 is a clean stop; 3 (fenced) is one only when another
    /// process of its identity ran beside it, which claimed the shard; anything else fails.
    fn ended(&mut self, w: &mut Writer, status: std::process::ExitStatus) {
        let stderr = read_stderr(&mut w.child);
        match status.code() {
            Some(0) => {}
            Some(3) if w.rival => self.fenced += 1,
            Some(3) => {
                self.failed += 1;
                self.failures.push(format!(
                    "writer slot {} (process {}) exited fenced, but no other process of its identity ran beside it: {}",
                    w.slot,
                    w.incarnation,
                    stderr.trim()
                ));
            }
            _ => {
                self.failed += 1;
                if stderr.contains("HANG") {
                    self.hangs += 1;
                }
                self.failures
                    .push(format!("writer slot {} exited {status}: {}", w.slot, stderr.trim()));
            }
        }
    }
}

/// Add a started writer to the running ones. With another process of its slot still running
/// (a takeover, or a kill of one of a takeover's pair), each is the other's rival: either
/// may claim the shard and fence the other.
fn join(writers: &mut Vec<Writer>, mut w: Writer) {
    for o in writers.iter_mut().filter(|o| o.slot == w.slot) {
        o.rival = true;
        w.rival = true;
    }
    writers.push(w);
}

pub(crate) fn run(args: &ChaosArgs) -> Result<()> {
    if args.serve {
        return crate::chaos_serve::run(args);
    }
    let seconds = args.minutes.map_or(args.seconds, |m| m * 60);
    let summary = soak(&args.backend, Duration::from_secs(seconds), args.seed, None)?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    verdict(&summary)
}

/// The short soaks of `cargo xtask test`: SQLite, then Lance on the run's S3 server, each
/// with a fresh seed (printed, with a one-line summary).
pub(crate) fn short(s3: &s3_loopback::Server) -> Result<()> {
    let seed: u64 = rand::random::<u32>().into();
    for (backend, seconds) in [("sqlite", 15), ("lance-s3", 20)] {
        let started = Instant::now();
        let summary = soak(backend, Duration::from_secs(seconds), seed, Some(s3))?;
        eprintln!(
            "xtask: chaos {backend} (seed {seed}) … {} acks, {} kills, {} takeovers, {} faults, {:.1} s",
            summary["acks"],
            summary["kills"],
            summary["takeovers"],
            summary["faults_injected"]
                .as_object()
                .map_or(0, |f| f.values().filter_map(Value::as_u64).sum::<u64>()),
            started.elapsed().as_secs_f64()
        );
        if let Err(e) = verdict(&summary) {
            eprintln!("{}", serde_json::to_string_pretty(&summary)?);
            return Err(e);
        }
    }
    Ok(())
}

/// The soak's verdict: the final check passed (nothing acknowledged lost or changed, no
/// conflict the ack logs do not explain), nothing hung, no process failed (a writer, the
/// reader, compaction, a maintenance command; a writer that exits fenced with no other
/// process of its identity beside it, or that had failed before the final kill), no operation failed
/// in a run without injected faults, and the run made progress: every writer identity had
/// batches acknowledged and could still write after the storm, the reader refreshed, a
/// summary was written, the check saw acknowledged ids.
pub(crate) fn verdict(summary: &Value) -> Result<()> {
    let (backend, seed) = (&summary["backend"], &summary["seed"]);
    ensure!(
        summary["check"]["ok"] == true,
        "chaos ({backend}): the final check failed (seed {seed}): {}",
        summary["check"]
    );
    ensure!(
        summary["acknowledged_records_lost"] == 0,
        "chaos ({backend}): acknowledged records were lost (seed {seed})"
    );
    ensure!(
        summary["hangs"] == 0,
        "chaos ({backend}): operations hung (seed {seed})"
    );
    let failures = summary["failures"].as_array().map_or(0, Vec::len);
    ensure!(
        failures == 0,
        "chaos ({backend}): {failures} processes failed (seed {seed}): {}",
        summary["failures"]
    );
    ensure!(
        summary["final_writes"] == WRITERS,
        "chaos ({backend}): not every writer identity could write after the storm (seed {seed}): {}",
        summary["final_writes"]
    );
    let by_identity = summary["acks_by_identity"].as_object();
    for slot in 0..WRITERS {
        let id = identity(slot);
        let acks = by_identity
            .and_then(|m| m.get(&id))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        ensure!(
            acks > 0,
            "chaos ({backend}): writer identity {id} had nothing acknowledged (seed {seed})"
        );
    }
    ensure!(
        summary["reader"]["refreshes"].as_u64().unwrap_or(0) > 0,
        "chaos ({backend}): the reader never refreshed (seed {seed})"
    );
    ensure!(
        summary["check"]["acked_ids"].as_u64().unwrap_or(0) > 0,
        "chaos ({backend}): the check saw no acknowledged id (seed {seed})"
    );
    ensure!(
        summary["summaries"].as_u64().unwrap_or(0) > 0,
        "chaos ({backend}): no summary was written (seed {seed})"
    );
    // Without an injected fault (SQLite, or a Lance run that drew none) no operation may
    // fail: kills, takeovers and maintenance alone must not make an error.
    let injected: u64 = summary["faults_injected"]
        .as_object()
        .map_or(0, |f| f.values().filter_map(Value::as_u64).sum());
    if injected == 0 {
        for (what, n) in [
            ("definite errors", &summary["definite_errors"]),
            ("indeterminate errors", &summary["indeterminate_errors"]),
            ("read errors", &summary["read_errors"]),
            ("reader errors", &summary["reader"]["errors"]),
        ] {
            let n = n.as_u64().unwrap_or(0);
            ensure!(
                n == 0,
                "chaos ({backend}): {n} {what} in a run without an injected fault (seed {seed})"
            );
        }
    }
    Ok(())
}

/// The writer identity of a slot.
fn identity(slot: usize) -> String {
    format!("chaos-w{slot}")
}

/// How a writer process holds the store: its shard only, or a projector too (opened first or
/// second), chosen per process.
const HOLDS: [&str; 3] = ["none", "projector-first", "shard-first"];

/// How long the last writers, after the storm, may take to have one batch each
/// acknowledged: an open (a WAL replay) and an append, within the writers' own deadlines.
const FINAL_WRITE_DEADLINE: Duration = Duration::from_secs(120);

/// Maintenance commands the soak runs beside the writers, each a `ctxlog` process.
const MAINTENANCE: [&str; 4] = ["retain", "purge", "gc", "snapshot"];

/// Run one soak; `s3` is a running loopback S3 server for `lance-s3` (started if `None`).
pub(crate) fn soak(backend: &str, seconds: Duration, seed: u64, s3: Option<&s3_loopback::Server>) -> Result<Value> {
    let target = cargo::target_dir()?;
    cargo::run("build (debug)", &["build", "--workspace", "--all-features", "--bins"])?;
    let bin = target.join("debug").join("ctxlog-chaos");
    let cli = target.join("debug").join("ctxlog");
    let dir = tempfile::Builder::new().prefix("ctxlog-chaos-").tempdir()?;
    let acks = dir.path().join("acks");
    std::fs::create_dir_all(&acks)?;
    let own_server;
    let (uri, faults) = match backend {
        "sqlite" => (format!("sqlite:{}", dir.path().join("chaos.db").display()), false),
        "lance" => (dir.path().join("chaos.lance").display().to_string(), true),
        "lance-s3" => {
            let server = match s3 {
                Some(s) => s,
                None => {
                    own_server = crate::s3::server()?;
                    &own_server
                }
            };
            let bucket = s3_loopback::bucket_for(dir.path());
            server.create_bucket(&bucket).map_err(|e| anyhow::anyhow!("{e}"))?;
            (server.uri(&bucket, "chaos.lance"), true)
        }
        other => bail!("unknown backend `{other}` (have: sqlite, lance, lance-s3)"),
    };
    let timeout = if backend == "lance-s3" { 15.0 } else { 10.0 };
    let driver = |args: &[&str]| {
        let mut cmd = Command::new(&bin);
        cmd.args(["--store", &uri, "--timeout", &timeout.to_string()])
            .args(args);
        cmd
    };
    // Maintenance runs with an operator's deadline, longer than a writer's: it works through
    // the whole store, which grows fast under the soak's writers.
    let ctxlog_cli = |args: &[&str]| {
        let mut cmd = Command::new(&cli);
        cmd.args(["--store", &uri, "--timeout", &MAINTENANCE_TIMEOUT.as_secs().to_string()])
            .args(args);
        cmd
    };
    // A grace period longer than any reader's deadline (rule 15).
    let grace = format!("{}s", (timeout * 3.0) as u64);
    // Create the store before the writers race (creation has its own cases).
    let out = crate::bench::probe::output_within(&mut driver(&["compact"]), Duration::from_secs(120))?;
    ensure!(
        out.status.success(),
        "the chaos store does not open: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );

    let mut rng = StdRng::seed_from_u64(seed);
    let mut incarnation = 0u64;
    // `batches`: how many batches the writer stops after, if not drawn here; `calm`: a writer
    // after the storm, without injected faults.
    let mut spawn_writer = |slot: usize, rng: &mut StdRng, batches: Option<u64>, calm: bool| -> Result<Writer> {
        incarnation += 1;
        let name = format!("w{slot}-{incarnation}");
        let writer_seed = rng.random::<u64>().to_string();
        let acks_file = acks.join(format!("{name}.acks"));
        let stats_file = acks.join(format!("{name}.stats"));
        let hold = HOLDS[below(rng, HOLDS.len() as u64) as usize];
        let mut cmd = driver(&["--seed", &writer_seed, "write", "--writer", &identity(slot)]);
        cmd.arg("--acks").arg(&acks_file).arg("--stats").arg(&stats_file);
        cmd.args(["--hold-projector", hold]);
        // One writer in three stops by itself after some batches and closes its handles
        // (then its slot starts again): a process that closes the store cleanly beside the
        // others is where a lost lock shows (it may checkpoint and delete the WAL).
        let batches = batches.or_else(|| (below(rng, 3) == 0).then(|| 20 + below(rng, 300)));
        if let Some(n) = batches {
            cmd.args(["--batches", &n.to_string()]);
        }
        if faults && !calm {
            cmd.arg("--faults");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start a chaos writer")?;
        Ok(Writer {
            slot,
            incarnation,
            rival: false,
            child,
        })
    };
    let mut writers: Vec<Writer> = Vec::new();
    for slot in 0..WRITERS {
        writers.push(spawn_writer(slot, &mut rng, None, false)?);
    }
    // Readers come and go too (a new process now and then), each with its own stats file.
    let mut readers_started = 0u64;
    let spawn_reader = |readers_started: &mut u64| -> Result<Child> {
        *readers_started += 1;
        let stats = acks.join(format!("reader-{readers_started}.stats"));
        let mut cmd = driver(&["--seed", &seed.to_string(), "read", "--stats"]);
        cmd.arg(&stats);
        if faults {
            cmd.arg("--faults");
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start the chaos reader")
    };
    let mut reader = spawn_reader(&mut readers_started)?;

    let (mut kills, mut takeovers, mut compactions) = (0u64, 0u64, 0u64);
    let mut exits = Exits::default();
    let mut maintenance: BTreeMap<&str, u64> = BTreeMap::new();
    let mut maintenance_running: Option<Maintenance> = None;
    let mut retained = 0u64;
    let mut hangs = 0u64;
    let mut failures: Vec<String> = Vec::new();
    let started = Instant::now();
    while started.elapsed() < seconds {
        std::thread::sleep(Duration::from_millis(200 + below(&mut rng, 600)));
        // Reap writers that ended, and start their slot again.
        let mut i = 0;
        while i < writers.len() {
            match writers[i].child.try_wait()? {
                None => i += 1,
                Some(status) => {
                    let mut w = writers.swap_remove(i);
                    exits.ended(&mut w, status);
                    if !writers.iter().any(|o| o.slot == w.slot) {
                        writers.push(spawn_writer(w.slot, &mut rng, None, false)?);
                    }
                }
            }
        }
        if let Some(m) = maintenance_running.take() {
            maintenance_running = settle_maintenance(m, false, &mut retained, &mut hangs, &mut failures)?;
        }
        match below(&mut rng, 10) {
            // SIGKILL a writer mid-flight, and start its identity again.
            0 | 1 if !writers.is_empty() => {
                let i = below(&mut rng, writers.len() as u64) as usize;
                let mut w = writers.swap_remove(i);
                let _ = w.child.kill();
                let _ = w.child.wait_timeout(Duration::from_secs(30))?;
                kills += 1;
                // The killed process may have been one of a takeover's pair: its partner
                // still runs, and the new process is its rival too.
                join(&mut writers, spawn_writer(w.slot, &mut rng, None, false)?);
            }
            // A second process with the same writer id: it takes the shard over; the first
            // is fenced and exits.
            2 if !writers.is_empty() => {
                let slot = writers[below(&mut rng, writers.len() as u64) as usize].slot;
                join(&mut writers, spawn_writer(slot, &mut rng, None, false)?);
                takeovers += 1;
            }
            3 => {
                // Compaction works through every shard's new generations, which the writers
                // pile up fast: it runs with an operator's deadline, not a writer's.
                let mut cmd = Command::new(&bin);
                cmd.args([
                    "--store",
                    &uri,
                    "--timeout",
                    &COMPACT_TIMEOUT.as_secs().to_string(),
                    "compact",
                ]);
                let out = crate::bench::probe::output_within(&mut cmd, COMPACT_TIMEOUT * 2)?;
                compactions += 1;
                if !out.status.success() {
                    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
                    if stderr.contains("HANG") {
                        hangs += 1;
                    }
                    failures.push(format!("compaction exited {}: {}", out.status, stderr.trim()));
                }
            }
            // A maintenance command from its own process, beside the writers (one at a time).
            4 | 5 if maintenance_running.is_none() => {
                let op = MAINTENANCE[below(&mut rng, MAINTENANCE.len() as u64) as usize];
                let mut cmd = match op {
                    // Only the bot of the writers' cold sessions (written once, then idle).
                    "retain" => ctxlog_cli(&["retain", "--bot", "chaos-cold", "--older-than", "3s"]),
                    "gc" => ctxlog_cli(&["gc", "--grace", &grace]),
                    // The search index too: saved beside writers and purges (a purge that
                    // overlaps it withdraws it).
                    "snapshot" => ctxlog_cli(&["snapshot", "--search"]),
                    other => ctxlog_cli(&[other]),
                };
                let child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .with_context(|| format!("start ctxlog {op}"))?;
                *maintenance.entry(op).or_default() += 1;
                maintenance_running = Some(Maintenance {
                    op,
                    child,
                    started: Instant::now(),
                });
            }
            // A new reader process in place of the running one.
            6 => {
                let old = std::mem::replace(&mut reader, spawn_reader(&mut readers_started)?);
                stop_reader(old, &mut hangs, &mut failures)?;
            }
            _ => {}
        }
    }
    let soaked = started.elapsed();
    // A maintenance command still running is waited for (within its deadline): the check
    // counts what it acknowledged.
    if let Some(m) = maintenance_running.take() {
        settle_maintenance(m, true, &mut retained, &mut hangs, &mut failures)?;
    }
    // Stop: writers are killed (their acks are on disk), the reader told to finish. A writer
    // that already ended is counted as in the storm: a kill must not hide a failure.
    for mut w in writers {
        if let Some(status) = w.child.try_wait()? {
            exits.ended(&mut w, status);
            continue;
        }
        let _ = w.child.kill();
        let _ = w.child.wait_timeout(Duration::from_secs(30))?;
    }
    // After the storm (no kills, takeovers or injected faults) every identity can still
    // write: one writer per identity must have a batch acknowledged and close, all within
    // one deadline. How many acks an identity got *during* the storm is luck: a seed that
    // takes one identity over again and again on a slow store leaves it none.
    let mut last_writers = Vec::new();
    for slot in 0..WRITERS {
        last_writers.push(spawn_writer(slot, &mut rng, Some(1), true)?);
    }
    let mut final_writes = 0u64;
    let until = Instant::now() + FINAL_WRITE_DEADLINE;
    for mut w in last_writers {
        match w.child.wait_timeout(until.saturating_duration_since(Instant::now()))? {
            Some(status) if status.success() => final_writes += 1,
            Some(status) => failures.push(format!(
                "the last writer of slot {} exited {status}: {}",
                w.slot,
                read_stderr(&mut w.child).trim()
            )),
            None => {
                let _ = w.child.kill();
                let _ = w.child.wait_timeout(Duration::from_secs(30))?;
                hangs += 1;
                failures.push(format!(
                    "the last writer of slot {} had nothing acknowledged within {FINAL_WRITE_DEADLINE:?}",
                    w.slot
                ));
            }
        }
    }
    stop_reader(reader, &mut hangs, &mut failures)?;
    // The check scans the whole log (millions of entries after a long soak): its store
    // deadline is its own, inside the process's.
    let mut check_cmd = Command::new(&bin);
    check_cmd
        .args(["--store", &uri, "--timeout", "570", "check", "--acks"])
        .arg(&acks)
        .args(["--retained", &retained.to_string()]);
    let out = crate::bench::probe::output_within(&mut check_cmd, Duration::from_secs(600))?;
    let check: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| json!({"ok": false, "error": String::from_utf8_lossy(&out.stderr).trim().to_string()}));
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut faults_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let acks_by_identity = acks_by_identity(&acks)?;
    let mut reader_totals: BTreeMap<String, u64> = BTreeMap::new();
    reader_totals.insert("processes".into(), readers_started);
    for entry in std::fs::read_dir(&acks)? {
        let path = entry?.path();
        let is_reader = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("reader-"));
        if path.extension().is_none_or(|e| e != "stats") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap_or_default()) else {
            continue;
        };
        // Faults of every process, the readers' too: an error is excused only by a fault.
        if let Some(f) = v["faults"].as_object() {
            for (k, n) in f {
                *faults_by_kind.entry(k.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
        }
        if is_reader {
            for k in ["refreshes", "errors", "hot_ids_seen"] {
                *reader_totals.entry(k.into()).or_default() += v[k].as_u64().unwrap_or(0);
            }
            continue;
        }
        for k in [
            "appends",
            "acks",
            "acked_records",
            "definite_errors",
            "indeterminate_errors",
            "reopens",
            "hangs",
            "read_backs",
            "read_errors",
            "summaries",
        ] {
            *totals.entry(k.into()).or_default() += v[k].as_u64().unwrap_or(0);
        }
    }
    let reader = json!(reader_totals);
    hangs += totals.get("hangs").copied().unwrap_or(0) + exits.hangs;
    failures.extend(exits.failures);
    Ok(json!({
        "backend": backend,
        "seed": seed,
        "seconds": soaked.as_secs_f64(),
        "operations": totals.get("appends"),
        "acks": acks_by_identity.values().sum::<u64>(),
        "acked_records": totals.get("acked_records"),
        "definite_errors": totals.get("definite_errors"),
        "indeterminate_errors": totals.get("indeterminate_errors"),
        "reopens": totals.get("reopens"),
        "acks_by_identity": acks_by_identity,
        "read_backs": totals.get("read_backs"),
        "read_errors": totals.get("read_errors"),
        "summaries": totals.get("summaries"),
        "maintenance": maintenance,
        "retained_tombstones": retained,
        "faults_injected": faults_by_kind,
        "kills": kills,
        "takeovers": takeovers,
        "fenced_exits": exits.fenced,
        "failed_exits": exits.failed,
        "compactions": compactions,
        "reader": reader,
        // `null` when the check could not tell.
        "acknowledged_records_lost": check["lost"].clone(),
        "hangs": hangs,
        "check": check,
        "failures": failures,
        "final_writes": final_writes,
        "store": ctxlog::redact_uri(&uri),
    }))
}

/// Acknowledgements per writer identity, counted in the ack logs (`w{slot}-{incarnation}.acks`,
/// one line per acknowledged batch, synced before the writer goes on): a writer's stats file
/// is saved every few appends, so a writer killed early leaves its acks only in its log.
fn acks_by_identity(dir: &std::path::Path) -> Result<BTreeMap<String, u64>> {
    let mut by_identity: BTreeMap<String, u64> = (0..WRITERS).map(|s| (identity(s), 0)).collect();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "acks") {
            continue;
        }
        let slot = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix('w'))
            .and_then(|s| s.split('-').next())
            .and_then(|s| s.parse::<usize>().ok())
            .with_context(|| format!("an ack log not named w{{slot}}-{{incarnation}}: {}", path.display()))?;
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        // A line cut short by a kill was never acknowledged to anyone.
        let acked = text
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n') && !l.trim().is_empty())
            .count();
        *by_identity.entry(identity(slot)).or_default() += acked as u64;
    }
    Ok(by_identity)
}

/// Tell a reader to finish (its stdin closes) and wait for it: a non-zero exit (its view
/// shrank, a read failed indeterminately, a hang) is a failure.
fn stop_reader(mut reader: Child, hangs: &mut u64, failures: &mut Vec<String>) -> Result<()> {
    drop(reader.stdin.take());
    match reader.wait_timeout(Duration::from_secs(60))? {
        Some(status) if !status.success() => {
            let stderr = read_stderr(&mut reader);
            if stderr.contains("HANG") {
                *hangs += 1;
            }
            failures.push(format!("reader exited {status}: {}", stderr.trim()));
        }
        Some(_) => {}
        None => {
            *hangs += 1;
            let _ = reader.kill();
            let _ = reader.wait_timeout(Duration::from_secs(30))?;
            failures.push("a reader did not stop within 60 s".into());
        }
    }
    Ok(())
}

/// The deadline of a compaction (`--timeout`); the soak's loop waits for it (twice as long,
/// then it is a hang), so it is shorter than a maintenance command's.
const COMPACT_TIMEOUT: Duration = Duration::from_secs(60);
/// The deadline of a maintenance command (`--timeout`).
const MAINTENANCE_TIMEOUT: Duration = Duration::from_secs(240);
/// Past its deadline, how long a maintenance process may take to end before it counts as hung.
const MAINTENANCE_GRACE: Duration = Duration::from_secs(30);

/// A maintenance command running beside the writers.
struct Maintenance {
    op: &'static str,
    child: Child,
    started: Instant,
}

/// Look at a maintenance process: when it ended, count what it acknowledged (retention's
/// tombstones) or its failure; past its deadline and grace, kill it and count a hang. With
/// `wait`, wait for it to end first (within the same bounds). Returns it while it still runs.
fn settle_maintenance(
    mut m: Maintenance,
    wait: bool,
    retained: &mut u64,
    hangs: &mut u64,
    failures: &mut Vec<String>,
) -> Result<Option<Maintenance>> {
    let limit = MAINTENANCE_TIMEOUT + MAINTENANCE_GRACE;
    let status = if wait {
        m.child.wait_timeout(limit.saturating_sub(m.started.elapsed()))?
    } else {
        m.child.try_wait()?
    };
    let Some(status) = status else {
        if m.started.elapsed() < limit {
            return Ok(Some(m));
        }
        let _ = m.child.kill();
        let _ = m.child.wait_timeout(Duration::from_secs(30))?;
        *hangs += 1;
        failures.push(format!("ctxlog {} did not end within {limit:?}", m.op));
        return Ok(None);
    };
    let mut stdout = String::new();
    if let Some(mut o) = m.child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut stdout);
    }
    let stderr = read_stderr(&mut m.child);
    if status.success() {
        if m.op == "retain" {
            let report: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
            *retained += report["tombstones"].as_u64().unwrap_or(0);
        }
    } else {
        failures.push(format!("ctxlog {} exited {status}: {}", m.op, stderr.trim()));
    }
    Ok(None)
}

/// A number below `n` from the soak's seeded generator.
fn below(rng: &mut StdRng, n: u64) -> u64 {
    rng.random_range(0..n.max(1))
}

fn read_stderr(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A summary of a run that passed.
    fn passing() -> Value {
        json!({
            "backend": "sqlite", "seed": 1,
            "check": {"ok": true, "acked_ids": 120},
            "acknowledged_records_lost": 0,
            "hangs": 0,
            "failures": [],
            "acks_by_identity": {"chaos-w0": 3, "chaos-w1": 1, "chaos-w2": 7},
            "reader": {"refreshes": 9, "errors": 0},
            "final_writes": 3,
            "summaries": 2,
            "faults_injected": {},
            "definite_errors": 0,
            "indeterminate_errors": 0,
            "read_errors": 0,
        })
    }

    /// A writer killed before it saved its stats still counts: its acks are in its log.
    #[test]
    fn acks_are_counted_in_the_ack_logs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("w0-1.acks"), "{}\n{}\n").unwrap();
        std::fs::write(dir.path().join("w0-4.acks"), "{}\n{\"cut").unwrap();
        std::fs::write(dir.path().join("w2-2.acks"), "{}\n").unwrap();
        std::fs::write(dir.path().join("w2-2.stats"), r#"{"acks": 0}"#).unwrap();
        let by = acks_by_identity(dir.path()).unwrap();
        assert_eq!(by["chaos-w0"], 3);
        assert_eq!(by["chaos-w1"], 0);
        assert_eq!(by["chaos-w2"], 1);
    }

    #[test]
    fn a_run_that_passed_passes() {
        verdict(&passing()).unwrap();
        // Injected faults excuse errors (each is retried to a definite answer by the writer).
        let mut faulty = passing();
        faulty["faults_injected"] = json!({"put": 4});
        for k in ["definite_errors", "indeterminate_errors", "read_errors"] {
            faulty[k] = json!(1);
        }
        faulty["reader"]["errors"] = json!(1);
        verdict(&faulty).unwrap();
    }

    /// A writer that exits fenced is a fenced exit only when another process of its identity
    /// ran beside it; otherwise it failed, as any other exit but 0 does.
    #[test]
    fn a_fenced_exit_without_a_takeover_fails() {
        let exit = |code: i32, rival: bool| {
            let mut child = Command::new("sh")
                .args(["-c", &format!("echo why >&2; exit {code}")])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let status = child.wait().unwrap();
            let mut w = Writer {
                slot: 1,
                incarnation: 5,
                rival,
                child,
            };
            let mut exits = Exits::default();
            exits.ended(&mut w, status);
            exits
        };
        // The older of two: the newer one claimed the shard.
        let taken_over = exit(3, true);
        assert_eq!((taken_over.fenced, taken_over.failed), (1, 0));
        assert!(taken_over.failures.is_empty());
        // The newer of two: the older one reopened and claimed the shard back.
        let claimed_back = exit(3, true);
        assert_eq!((claimed_back.fenced, claimed_back.failed), (1, 0));
        let alone = exit(3, false);
        assert_eq!((alone.fenced, alone.failed), (0, 1));
        assert!(alone.failures[0].contains("no other process"), "{:?}", alone.failures);
        let clean = exit(0, false);
        assert_eq!((clean.fenced, clean.failed, clean.failures.len()), (0, 0, 0));
        let crashed = exit(4, false);
        assert_eq!((crashed.failed, crashed.failures.len()), (1, 1));
    }

    /// A writer started while another process of its slot runs is that one's rival, and it
    /// theirs; a writer alone in its slot is no one's. (Seed 2037053736 killed the newer of
    /// a takeover's pair: the slot's next process, started beside the older one, was fenced
    /// by it and counted as a failure.)
    #[test]
    fn a_writer_started_beside_one_of_its_slot_is_a_rival() {
        let writer = |slot: usize, incarnation: u64| Writer {
            slot,
            incarnation,
            rival: false,
            child: Command::new("true").spawn().unwrap(),
        };
        let mut writers = Vec::new();
        join(&mut writers, writer(0, 1));
        join(&mut writers, writer(1, 2));
        assert!(writers.iter().all(|w| !w.rival));
        // A takeover of slot 0, then a kill of its newer process and a restart.
        join(&mut writers, writer(0, 3));
        writers.retain(|w| w.incarnation != 3);
        join(&mut writers, writer(0, 4));
        let rivals: Vec<(u64, bool)> = writers.iter().map(|w| (w.incarnation, w.rival)).collect();
        assert_eq!(rivals, vec![(1, true), (2, false), (4, true)]);
        for mut w in writers {
            let _ = w.child.wait();
        }
    }

    /// Each way a run can go wrong fails the verdict on its own.
    #[test]
    fn every_recorded_failure_and_a_run_without_progress_fail() {
        type Breaks = fn(&mut Value);
        let broken: [(&str, Breaks); 15] = [
            ("the check failed", |s| s["check"]["ok"] = json!(false)),
            ("an ack was lost", |s| s["acknowledged_records_lost"] = json!(1)),
            ("the check could not tell", |s| {
                s["acknowledged_records_lost"] = Value::Null
            }),
            ("a hang", |s| s["hangs"] = json!(1)),
            ("a reader whose view shrank", |s| {
                s["failures"] = json!(["reader exited exit status: 1: a refreshed view lost a record"])
            }),
            ("a writer crash", |s| {
                s["failures"] = json!(["writer slot 1 exited exit status: 4"])
            }),
            ("an identity without acks", |s| {
                s["acks_by_identity"]["chaos-w1"] = json!(0)
            }),
            ("an identity that could not write after the storm", |s| {
                s["final_writes"] = json!(2)
            }),
            ("no refresh", |s| s["reader"]["refreshes"] = json!(0)),
            ("nothing checked", |s| s["check"]["acked_ids"] = json!(0)),
            ("no summary", |s| s["summaries"] = json!(0)),
            ("a definite error without a fault", |s| s["definite_errors"] = json!(1)),
            ("an indeterminate error without a fault", |s| {
                s["indeterminate_errors"] = json!(2)
            }),
            ("a read error without a fault", |s| s["read_errors"] = json!(1)),
            ("a reader error without a fault", |s| s["reader"]["errors"] = json!(1)),
        ];
        for (what, breaks) in broken {
            let mut s = passing();
            breaks(&mut s);
            assert!(verdict(&s).is_err(), "{what}: the verdict passed");
        }
    }
}
