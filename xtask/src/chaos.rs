//! `cargo xtask chaos`: a seeded soak. Writer processes (`ctxlog-chaos write`) append to
//! shared sessions with caller ids and log every acknowledgement; meanwhile the soak
//! SIGKILLs writers at random points, starts a second process with the same writer id (a
//! takeover), runs compaction, keeps a reader refreshing and — on Lance — lets every
//! writer's object store inject faults of every kind. At the end `ctxlog-chaos check`
//! verifies the store against every acknowledgement. One summary, with the seed that
//! replays the run's decisions.

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
    child: Child,
}

pub(crate) fn run(args: &ChaosArgs) -> Result<()> {
    let summary = soak(&args.backend, Duration::from_secs(args.seconds), args.seed, None)?;
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

/// The soak's verdict: nothing acknowledged lost, nothing hung, the check passed.
pub(crate) fn verdict(summary: &Value) -> Result<()> {
    ensure!(
        summary["check"]["ok"] == true,
        "chaos ({}): the final check failed (seed {}): {}",
        summary["backend"],
        summary["seed"],
        summary["check"]
    );
    ensure!(
        summary["acknowledged_records_lost"] == 0,
        "chaos ({}): acknowledged records were lost (seed {})",
        summary["backend"],
        summary["seed"]
    );
    ensure!(
        summary["hangs"] == 0,
        "chaos ({}): operations hung (seed {})",
        summary["backend"],
        summary["seed"]
    );
    Ok(())
}

/// Run one soak; `s3` is a running loopback S3 server for `lance-s3` (started if `None`).
pub(crate) fn soak(backend: &str, seconds: Duration, seed: u64, s3: Option<&s3_loopback::Server>) -> Result<Value> {
    let target = cargo::target_dir()?;
    cargo::run("build (debug)", &["build", "--workspace", "--all-features", "--bins"])?;
    let bin = target.join("debug").join("ctxlog-chaos");
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
                    own_server = crate::test::s3_server()?;
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
    // Create the store before the writers race (creation has its own cases).
    let out = crate::bench::probe::output_within(&mut driver(&["compact"]), Duration::from_secs(120))?;
    ensure!(
        out.status.success(),
        "the chaos store does not open: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );

    let mut rng = StdRng::seed_from_u64(seed);
    let mut incarnation = 0u64;
    let mut spawn_writer = |slot: usize, rng: &mut StdRng| -> Result<Writer> {
        incarnation += 1;
        let name = format!("w{slot}-{incarnation}");
        let writer_seed = rng.random::<u64>().to_string();
        let acks_file = acks.join(format!("{name}.acks"));
        let stats_file = acks.join(format!("{name}.stats"));
        let mut cmd = driver(&["--seed", &writer_seed, "write", "--writer", &format!("chaos-w{slot}")]);
        cmd.arg("--acks").arg(&acks_file).arg("--stats").arg(&stats_file);
        if faults {
            cmd.arg("--faults");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("start a chaos writer")?;
        Ok(Writer { slot, child })
    };
    let mut writers: Vec<Writer> = Vec::new();
    for slot in 0..WRITERS {
        writers.push(spawn_writer(slot, &mut rng)?);
    }
    let reader_stats = acks.join("reader.stats");
    let mut reader = driver(&["--seed", &seed.to_string(), "read", "--stats"]);
    reader.arg(&reader_stats);
    if faults {
        reader.arg("--faults");
    }
    let mut reader = reader
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start the chaos reader")?;

    let (mut kills, mut takeovers, mut compactions, mut fenced_exits, mut failed_exits) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
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
                    let stderr = read_stderr(&mut w.child);
                    match status.code() {
                        Some(3) => fenced_exits += 1,
                        Some(0) => {}
                        _ => {
                            failed_exits += 1;
                            if stderr.contains("HANG") {
                                hangs += 1;
                            }
                            failures.push(format!("writer slot {} exited {status}: {}", w.slot, stderr.trim()));
                        }
                    }
                    if !writers.iter().any(|o| o.slot == w.slot) {
                        writers.push(spawn_writer(w.slot, &mut rng)?);
                    }
                }
            }
        }
        match below(&mut rng, 10) {
            // SIGKILL a writer mid-flight, and start its identity again.
            0 | 1 if !writers.is_empty() => {
                let i = below(&mut rng, writers.len() as u64) as usize;
                let mut w = writers.swap_remove(i);
                let _ = w.child.kill();
                let _ = w.child.wait_timeout(Duration::from_secs(30))?;
                kills += 1;
                writers.push(spawn_writer(w.slot, &mut rng)?);
            }
            // A second process with the same writer id: it takes the shard over; the first
            // is fenced and exits.
            2 if !writers.is_empty() => {
                let slot = writers[below(&mut rng, writers.len() as u64) as usize].slot;
                writers.push(spawn_writer(slot, &mut rng)?);
                takeovers += 1;
            }
            3 => {
                let out = crate::bench::probe::output_within(&mut driver(&["compact"]), Duration::from_secs(120))?;
                compactions += 1;
                if !out.status.success() {
                    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
                    if stderr.contains("HANG") {
                        hangs += 1;
                        failures.push(format!("compaction hung: {}", stderr.trim()));
                    }
                }
            }
            _ => {}
        }
    }
    let soaked = started.elapsed();
    // Stop: writers are killed (their acks are on disk), the reader told to finish.
    for mut w in writers {
        let _ = w.child.kill();
        let _ = w.child.wait_timeout(Duration::from_secs(30))?;
    }
    drop(reader.stdin.take());
    match reader.wait_timeout(Duration::from_secs(60))? {
        Some(status) if !status.success() => {
            let stderr = read_stderr(&mut reader);
            if stderr.contains("HANG") {
                hangs += 1;
            }
            failures.push(format!("reader exited {status}: {}", stderr.trim()));
        }
        Some(_) => {}
        None => {
            hangs += 1;
            let _ = reader.kill();
            failures.push("the reader did not stop within 60 s".into());
        }
    }
    // The check scans the whole log (millions of entries after a long soak): its store
    // deadline is its own, inside the process's.
    let mut check_cmd = Command::new(&bin);
    check_cmd
        .args(["--store", &uri, "--timeout", "570", "check", "--acks"])
        .arg(&acks);
    let out = crate::bench::probe::output_within(&mut check_cmd, Duration::from_secs(600))?;
    let check: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| json!({"ok": false, "error": String::from_utf8_lossy(&out.stderr).trim().to_string()}));
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut faults_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for entry in std::fs::read_dir(&acks)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "stats") || path == reader_stats {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(&std::fs::read_to_string(&path).unwrap_or_default()) else {
            continue;
        };
        for k in [
            "appends",
            "acks",
            "acked_records",
            "definite_errors",
            "indeterminate_errors",
            "reopens",
            "hangs",
        ] {
            *totals.entry(k.into()).or_default() += v[k].as_u64().unwrap_or(0);
        }
        if let Some(f) = v["faults"].as_object() {
            for (k, n) in f {
                *faults_by_kind.entry(k.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
        }
    }
    let reader: Value =
        serde_json::from_str(&std::fs::read_to_string(&reader_stats).unwrap_or_default()).unwrap_or(Value::Null);
    hangs += totals.get("hangs").copied().unwrap_or(0);
    Ok(json!({
        "backend": backend,
        "seed": seed,
        "seconds": soaked.as_secs_f64(),
        "operations": totals.get("appends"),
        "acks": totals.get("acks"),
        "acked_records": totals.get("acked_records"),
        "definite_errors": totals.get("definite_errors"),
        "indeterminate_errors": totals.get("indeterminate_errors"),
        "reopens": totals.get("reopens"),
        "faults_injected": faults_by_kind,
        "kills": kills,
        "takeovers": takeovers,
        "fenced_exits": fenced_exits,
        "failed_exits": failed_exits,
        "compactions": compactions,
        "reader": reader,
        // `null` when the check could not tell.
        "acknowledged_records_lost": check["lost"].clone(),
        "hangs": hangs,
        "check": check,
        "failures": failures,
        "store": ctxlog::redact_uri(&uri),
    }))
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
