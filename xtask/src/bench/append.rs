//! `cargo xtask bench append`: durable append throughput and latency per backend, batch size
//! and writer count (writers are separate processes on one store).

use std::process::Command;

use anyhow::{Result, ensure};
use serde::Serialize;
use serde_json::{Value, json};

use super::probe::{PROBE_DEADLINE, output_within, probe};
use super::stores::{remove_store, store_uri};
use super::{bench_binary, chrono_stamp, machine, out_dir, progress};
use crate::flags::AppendArgs;

#[derive(Debug, Serialize)]
struct AppendRow {
    backend: String,
    batch: usize,
    writers: usize,
    records: usize,
    records_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

pub(crate) fn run(a: &AppendArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    let total = (a.common.backends.len() * a.batches.len() * a.writers.len()) as u64;
    let pb = progress(a.common.json || a.common.quiet, total, "append");
    for backend in &a.common.backends {
        for &batch in &a.batches {
            for &writers in &a.writers {
                ensure!(batch > 0 && writers > 0, "batch and writers must be positive");
                let appends = a.appends.unwrap_or_else(|| (100_000 / batch).clamp(100, 500));
                let records = batch * appends;
                let name = format!("append-{backend}-b{batch}-w{writers}");
                let path = scratch.join(if backend == "sqlite" {
                    format!("{name}.db")
                } else {
                    format!("{name}.lance")
                });
                let uri = store_uri(backend, &path)?;
                remove_store(&uri);
                // Create the store first: creation is not what is measured.
                probe(&bin, &uri, false, &["generate", "--entries", "1", "--writers", "1"])?;
                // Separate processes, started together.
                let children: Vec<_> = (0..writers)
                    .map(|w| {
                        let mut cmd = Command::new(&bin);
                        cmd.args(["--store", &uri, "append", "--writer", &format!("bench-{w}")])
                            .args(["--batch", &batch.to_string(), "--records", &records.to_string()])
                            .args(["--seed", &(w + 11).to_string()]);
                        std::thread::spawn(move || output_within(&mut cmd, PROBE_DEADLINE))
                    })
                    .collect();
                let mut lat = Vec::new();
                let mut slowest: f64 = 0.0;
                for c in children {
                    let o = c.join().map_err(|_| anyhow::anyhow!("append runner panicked"))??;
                    ensure!(
                        o.status.success(),
                        "append writer failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    let v: Value = serde_json::from_slice(&o.stdout)?;
                    slowest = slowest.max(v["seconds"].as_f64().unwrap_or(0.0));
                    lat.extend(
                        v["latencies_us"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_u64),
                    );
                }
                lat.sort_unstable();
                rows.push(AppendRow {
                    backend: backend.clone(),
                    batch,
                    writers,
                    records: records * writers,
                    records_per_second: (records * writers) as f64 / slowest.max(1e-9),
                    p50_ms: percentile(&lat, 0.50),
                    p99_ms: percentile(&lat, 0.99),
                });
                remove_store(&uri);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let stamp = chrono_stamp();
    let doc = json!({"kind": "append", "date": stamp, "machine": machine(), "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("append-{stamp}.json")), &text)?;
    std::fs::write(out.join("append-latest.json"), &text)?;
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    println!("| backend | batch | writers (processes) | records | records/s | p50 | p99 |");
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.2} ms | {:.2} ms |",
            r.backend, r.batch, r.writers, r.records, r.records_per_second, r.p50_ms, r.p99_ms
        );
    }
    for r in &rows {
        let key = format!("{}.b{}.w{}", r.backend, r.batch, r.writers);
        println!("METRIC:append_throughput.{key}:{:.1}:records/s", r.records_per_second);
        println!("METRIC:append_p50.{key}:{:.3}:ms", r.p50_ms);
        println!("METRIC:append_p99.{key}:{:.3}:ms", r.p99_ms);
    }
    eprintln!("xtask: figures in {}", out.join("append-latest.json").display());
    Ok(())
}
