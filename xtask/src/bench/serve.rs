//! `cargo xtask bench serve`: `ctxlog serve` replicas on loopback, against the library in
//! the same run.
//!
//! - Append throughput and latency through HTTP, with 1, 16 and 64 concurrent clients,
//!   batches of 1 and 100, group commit on and off; against one library writer appending
//!   the same batches (`ctxlog-bench append`).
//! - A session read (a 100-record session in a store of `--read-store-size` entries): the
//!   latency of its page.
//! - Watch latency: a record appended through replica A, until its event arrives on a
//!   watcher of replica B.
//! - The replica's resident memory with `--watchers` idle watch streams, against none.
//! - Lance on the loopback S3 server with a latency per request (`--s3-latency-ms`): watch
//!   latency across replicas, and what an idle replica costs in object-store requests per
//!   minute (counted by the server over `--idle-seconds`).
//! - The Python client (`python/benchmarks/serve_load.py`, in the pinned virtualenv of
//!   `cargo xtask test`): appends and the session read against `ctxlog-http-load`'s figures
//!   of the same run, and each framework adapter's hot call against the bare client.
//!
//! Every figure comes from fresh processes of a release build (the server, the load client,
//! the library probe); ratios are against the library measured in the same run.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;
use serde_json::{Value, json};

use super::probe::{PROBE_DEADLINE, output_within, probe};
use super::stores::{generate_or_reuse, remove_store, store_uri};
use super::{chrono_stamp, machine, out_dir, progress};
use crate::flags::ServeArgs;

/// A `ctxlog serve` process.
struct Replica {
    child: Child,
    addr: String,
}

/// The first line a child process prints, read on a thread of its own; `None` if none came
/// within `within` (the caller decides what to do with the child).
fn first_line(stdout: std::process::ChildStdout, within: Duration) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(within).ok()
}

impl Replica {
    fn start(ctxlog: &Path, uri: &str, writer: &str, extra: &[&str]) -> Result<Replica> {
        let mut child = Command::new(ctxlog)
            .args(["--store", uri, "--timeout", "60", "serve", "--writer", writer])
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start ctxlog serve")?;
        let line = match first_line(child.stdout.take().context("stdout")?, Duration::from_secs(600)) {
            Some(l) => l,
            None => {
                let _ = child.kill();
                bail!("ctxlog serve did not start within 600 s");
            }
        };
        let v: Value = serde_json::from_str(&line).with_context(|| format!("ctxlog serve said `{line}`"))?;
        let addr = v["listening"].as_str().context("listening")?.to_string();
        Ok(Replica { child, addr })
    }

    /// `http://ADDR`.
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Resident memory, in KiB.
    fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .context("VmRSS")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(bin: &Path, args: &[&str]) -> Result<Value> {
    let out = output_within(Command::new(bin).args(args), PROBE_DEADLINE)?;
    ensure!(
        out.status.success(),
        "ctxlog-http-load {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The Python load client.
struct PythonLoad {
    python: std::path::PathBuf,
    script: std::path::PathBuf,
}

impl PythonLoad {
    fn new() -> Result<PythonLoad> {
        let (dir, bin) = crate::python::environment()?;
        Ok(PythonLoad {
            python: bin.join("python"),
            script: dir.join("benchmarks").join("serve_load.py"),
        })
    }

    fn run(&self, args: &[&str]) -> Result<Value> {
        let out = output_within(Command::new(&self.python).arg(&self.script).args(args), PROBE_DEADLINE)?;
        ensure!(
            out.status.success(),
            "serve_load.py {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

fn latencies(v: &Value) -> Vec<u64> {
    sorted(&v["latencies_us"])
}

fn sorted(v: &Value) -> Vec<u64> {
    let mut l: Vec<u64> = v.as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    l.sort_unstable();
    l
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

/// Two replicas of `uri`, and the latencies of `records` appended through the first until
/// they arrive on a watcher of the second (sorted, µs). The replicas are returned running.
fn watch_latency(ctxlog: &Path, http: &Path, uri: &str, records: usize) -> Result<(Vec<u64>, (Replica, Replica))> {
    let a_side = Replica::start(ctxlog, uri, "bench-a", &[])?;
    let b_side = Replica::start(ctxlog, uri, "bench-b", &[])?;
    let v = load(
        http,
        &[
            "watch",
            "--from",
            &a_side.addr,
            "--to",
            &b_side.addr,
            "--records",
            &records.to_string(),
        ],
    )?;
    Ok((latencies(&v), (a_side, b_side)))
}

/// Two replicas of a Lance store on a loopback S3 server of their own, every request waiting
/// `--s3-latency-ms`: watch latency A→B, then the requests both make while nothing happens.
fn lance_on_s3(a: &ServeArgs, ctxlog: &Path, http: &Path, bench: &Path) -> Result<Vec<Value>> {
    let venv = crate::cargo::target_dir()?
        .join("s3-loopback")
        .join(format!("moto-{}", s3_loopback::MOTO_VERSION));
    let latency = Duration::from_millis(a.s3_latency_ms);
    let s3 = s3_loopback::Server::start_with_latency(&venv, latency).map_err(|e| anyhow::anyhow!("{e}"))?;
    s3.create_bucket("serve-bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let uri = s3.uri("serve-bench", "watch.lance");
    probe(bench, &uri, false, &["generate", "--entries", "1", "--writers", "1"])?;
    let (l, replicas) = watch_latency(ctxlog, http, &uri, a.watch_records)?;
    let watch = json!({"backend": "lance-s3", "what": "watch latency A→B", "request_latency_ms": a.s3_latency_ms,
        "records": a.watch_records, "p50_ms": pct(&l, 0.5), "p99_ms": pct(&l, 0.99)});
    // Idle: the replicas' polls back off to their longest interval; then count.
    std::thread::sleep(Duration::from_secs(5));
    let before = s3.requests().map_err(|e| anyhow::anyhow!("{e}"))?;
    std::thread::sleep(Duration::from_secs(a.idle_seconds));
    let after = s3.requests().map_err(|e| anyhow::anyhow!("{e}"))?;
    drop(replicas);
    let per_minute = (after - before) as f64 * 60.0 / a.idle_seconds as f64 / 2.0;
    let idle = json!({"backend": "lance-s3", "what": "idle replica", "request_latency_ms": a.s3_latency_ms,
        "seconds": a.idle_seconds, "requests_per_minute_per_replica": per_minute});
    Ok(vec![watch, idle])
}

#[derive(Debug, Serialize)]
struct AppendRow {
    backend: String,
    via: String,
    clients: usize,
    batch: usize,
    records: u64,
    records_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// records/s against the library writer with the same batch, same run.
    vs_library: f64,
    /// Python rows: records/s against one raw HTTP client with the same batch, same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_http: Option<f64>,
}

impl AppendRow {
    /// The row of a load run's result `v` (`records`, `seconds`, latencies), against the
    /// library writer's `library` records/s with the same batch.
    fn of(backend: &str, via: &str, clients: usize, batch: usize, v: &Value, library: f64) -> AppendRow {
        let records = v["records"].as_u64().unwrap_or(0);
        let rate = records as f64 / v["seconds"].as_f64().unwrap_or(f64::INFINITY);
        let l = latencies(v);
        AppendRow {
            backend: backend.to_string(),
            via: via.into(),
            clients,
            batch,
            records,
            records_per_second: rate,
            p50_ms: pct(&l, 0.5),
            p99_ms: pct(&l, 0.99),
            vs_library: rate / library,
            vs_http: None,
        }
    }
}

pub(crate) fn run(a: &ServeArgs) -> Result<()> {
    let (bench, ctxlog, http) = super::release_binaries(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    let mut other = Vec::new();
    let py = PythonLoad::new()?;
    let pb = progress(a.common.json || a.common.quiet, 0, "serve");
    for backend in &a.common.backends {
        let fresh = |name: &str| -> Result<String> {
            let path = scratch.join(if backend == "sqlite" {
                format!("serve-{name}.db")
            } else {
                format!("serve-{name}.lance")
            });
            let uri = store_uri(backend, &path)?;
            remove_store(&uri);
            probe(&bench, &uri, false, &["generate", "--entries", "1", "--writers", "1"])?;
            Ok(uri)
        };
        // The library: one writer, the same batches.
        let mut library = std::collections::BTreeMap::new();
        for &batch in &a.batches {
            let uri = fresh(&format!("lib-{batch}"))?;
            let records = (a.library_records / batch).max(1) * batch;
            let v = probe(
                &bench,
                &uri,
                false,
                &[
                    "append",
                    "--writer",
                    "lib",
                    "--batch",
                    &batch.to_string(),
                    "--records",
                    &records.to_string(),
                ],
            )?;
            let rate = records as f64 / v["seconds"].as_f64().unwrap_or(f64::INFINITY);
            let l = latencies(&v);
            rows.push(AppendRow {
                backend: backend.clone(),
                via: "library".into(),
                clients: 1,
                batch,
                records: records as u64,
                records_per_second: rate,
                p50_ms: pct(&l, 0.5),
                p99_ms: pct(&l, 0.99),
                vs_library: 1.0,
                vs_http: None,
            });
            library.insert(batch, rate);
            remove_store(&uri);
        }
        // Through HTTP.
        for group in [true, false] {
            for &batch in &a.batches {
                for &clients in &a.clients {
                    let uri = fresh(&format!("http-{group}-{batch}-{clients}"))?;
                    let extra: &[&str] = if group { &[] } else { &["--no-group-commit"] };
                    let server = Replica::start(&ctxlog, &uri, "bench", extra)?;
                    let requests = (a.http_records / (batch * clients)).max(5);
                    let v = load(
                        &http,
                        &[
                            "append",
                            "--addr",
                            &server.addr,
                            "--clients",
                            &clients.to_string(),
                            "--batch",
                            &batch.to_string(),
                            "--requests",
                            &requests.to_string(),
                        ],
                    )?;
                    drop(server);
                    remove_store(&uri);
                    let via = if group { "http" } else { "http, no group commit" };
                    let lib = library.get(&batch).copied().unwrap_or(f64::NAN);
                    rows.push(AppendRow::of(backend, via, clients, batch, &v, lib));
                    pb.inc(1);
                }
            }
        }
        // Through the Python client: one client, as the raw row with one client.
        for &batch in &a.batches {
            let uri = fresh(&format!("py-{batch}"))?;
            let server = Replica::start(&ctxlog, &uri, "bench", &[])?;
            let requests = (a.http_records / batch).max(5);
            let v = py.run(&[
                "append",
                "--url",
                &server.url(),
                "--batch",
                &batch.to_string(),
                "--requests",
                &requests.to_string(),
            ])?;
            drop(server);
            remove_store(&uri);
            let raw = rows
                .iter()
                .find(|r| r.backend == *backend && r.via == "http" && r.clients == 1 && r.batch == batch)
                .map_or(f64::NAN, |r| r.records_per_second);
            let lib = library.get(&batch).copied().unwrap_or(f64::NAN);
            let mut row = AppendRow::of(backend, "python client", 1, batch, &v, lib);
            row.vs_http = Some(row.records_per_second / raw);
            rows.push(row);
        }
        // Each adapter's hot call against the bare client.
        {
            let uri = fresh("adapters")?;
            let server = Replica::start(&ctxlog, &uri, "bench", &[])?;
            let v = py.run(&[
                "adapters",
                "--url",
                &server.url(),
                "--calls",
                &a.adapter_calls.to_string(),
            ])?;
            drop(server);
            remove_store(&uri);
            let calls = &v["latencies_us"];
            let p50 = |name: &str| pct(&sorted(&calls[name]), 0.5);
            for (call, bare) in [
                ("openai-agents add_items", "client append (async)"),
                ("adk append_event", "client append (async)"),
                ("langgraph put", "client append (sync)"),
            ] {
                let l = sorted(&calls[call]);
                other.push(json!({"backend": backend, "what": "adapter hot call", "call": call,
                    "p50_ms": pct(&l, 0.5), "p99_ms": pct(&l, 0.99), "against": bare,
                    "bare_p50_ms": p50(bare), "added_p50_ms": pct(&l, 0.5) - p50(bare)}));
            }
        }
        // MCP over stdio (`ctxlog mcp`, a second replica) against the HTTP route it wraps.
        {
            let uri = fresh("mcp")?;
            let server = Replica::start(&ctxlog, &uri, "bench", &[])?;
            let v = py.run(&[
                "mcp",
                "--url",
                &server.url(),
                "--ctxlog",
                &ctxlog.display().to_string(),
                "--store",
                &uri,
                "--calls",
                &a.adapter_calls.to_string(),
            ])?;
            drop(server);
            remove_store(&uri);
            let (http, stdio) = (
                sorted(&v["latencies_us"]["http"]),
                sorted(&v["latencies_us"]["mcp stdio"]),
            );
            other.push(
                json!({"backend": backend, "what": "read_context over MCP stdio", "records": 20,
                "p50_ms": pct(&stdio, 0.5), "p99_ms": pct(&stdio, 0.99), "against": "GET …/context over HTTP",
                "http_p50_ms": pct(&http, 0.5), "p50_vs_http": pct(&stdio, 0.5) / pct(&http, 0.5)}),
            );
        }
        // A session read in a large store.
        let big = scratch.join(if backend == "sqlite" {
            format!("serve-read-{}.db", a.read_store_size)
        } else {
            format!("serve-read-{}.lance", a.read_store_size)
        });
        let big_uri = store_uri(backend, &big)?;
        let entries = super::parse_size(&a.read_store_size)?.to_string();
        let mut args = vec!["--entries", entries.as_str()];
        if backend != "sqlite" {
            args.push("--compact");
        }
        generate_or_reuse(&bench, &big_uri, &big.with_extension("done"), &args, || {
            progress(a.common.json || a.common.quiet, 0, "generating the read store")
        })?;
        {
            let server = Replica::start(&ctxlog, &big_uri, "bench-reader", &[])?;
            // A session of its own, 100 records.
            load(
                &http,
                &[
                    "append",
                    "--addr",
                    &server.addr,
                    "--clients",
                    "1",
                    "--batch",
                    "100",
                    "--requests",
                    "1",
                    "--run",
                    &format!("read-{}", chrono_stamp()),
                ],
            )?;
            let v = load(
                &http,
                &[
                    "read",
                    "--addr",
                    &server.addr,
                    "--bot",
                    "load",
                    "--session",
                    "s0",
                    "--times",
                    &a.reads.to_string(),
                ],
            )?;
            let l = latencies(&v);
            other.push(
                json!({"backend": backend, "what": "session read", "store_entries": a.read_store_size,
                              "records_per_page": v["records"], "p50_ms": pct(&l, 0.5), "p99_ms": pct(&l, 0.99)}),
            );
            let v = py.run(&["read", "--url", &server.url(), "--times", &a.reads.to_string()])?;
            let lp = latencies(&v);
            other.push(
                json!({"backend": backend, "what": "session read (python client)", "store_entries": a.read_store_size,
                              "records_per_page": v["records"], "p50_ms": pct(&lp, 0.5), "p99_ms": pct(&lp, 0.99),
                              "p50_vs_http": pct(&lp, 0.5) / pct(&l, 0.5)}),
            );
        }
        // Watch latency, across replicas.
        {
            let uri = fresh("watch")?;
            let (l, replicas) = watch_latency(&ctxlog, &http, &uri, a.watch_records)?;
            other.push(
                json!({"backend": backend, "what": "watch latency A→B", "records": a.watch_records,
                              "p50_ms": pct(&l, 0.5), "p99_ms": pct(&l, 0.99)}),
            );
            drop(replicas);
            remove_store(&uri);
        }
        if backend == "lance" && a.s3_latency_ms > 0 {
            other.extend(lance_on_s3(a, &ctxlog, &http, &bench)?);
        }
        // Memory of idle watchers.
        {
            let uri = fresh("rss")?;
            let server = Replica::start(&ctxlog, &uri, "bench", &[])?;
            let before = server.rss_kib()?;
            let mut holder = Command::new(&http)
                .args(["hold", "--addr", &server.addr, "--streams", &a.watchers.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let opened = first_line(holder.stdout.take().context("stdout")?, Duration::from_secs(300));
            let after = server.rss_kib()?;
            drop(holder.stdin.take());
            let _ = holder.kill();
            let _ = holder.wait();
            ensure!(opened.is_some_and(|l| l.contains("open")), "the watchers did not open");
            other.push(
                json!({"backend": backend, "what": "resident memory", "watchers": a.watchers,
                              "rss_mib_without": before as f64 / 1024.0, "rss_mib_with": after as f64 / 1024.0,
                              "delta_mib": (after as f64 - before as f64) / 1024.0}),
            );
            drop(server);
            remove_store(&uri);
        }
    }
    pb.finish_and_clear();
    let stamp = chrono_stamp();
    let doc = json!({"kind": "serve", "date": stamp, "machine": machine(), "appends": rows, "other": other});
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("serve-{stamp}.json")), &text)?;
    std::fs::write(out.join("serve-latest.json"), &text)?;
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    println!("| backend | via | clients | batch | records/s | p50 ms | p99 ms | vs library | vs http |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in doc["appends"].as_array().into_iter().flatten() {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2}× | {} |",
            r["backend"].as_str().unwrap_or(""),
            r["via"].as_str().unwrap_or(""),
            r["clients"],
            r["batch"],
            r["records_per_second"].as_f64().unwrap_or(0.0),
            r["p50_ms"].as_f64().unwrap_or(0.0),
            r["p99_ms"].as_f64().unwrap_or(0.0),
            r["vs_library"].as_f64().unwrap_or(0.0),
            r["vs_http"].as_f64().map_or(String::new(), |v| format!("{v:.2}×")),
        );
    }
    for o in doc["other"].as_array().into_iter().flatten() {
        println!("{o}");
    }
    Ok(())
}
