//! `cargo xtask bench object-store`: what a Lance first scan costs on object storage.
//!
//! Each log is generated on the local disk, measured there, uploaded to the S3 server on
//! loopback and measured again with a fixed latency added to every request (a stand-in
//! for the first-byte time of a remote object store); then the same after compaction has
//! folded every generation into the base table. Reported per row: wall time (median of
//! fresh processes), requests by kind, bytes read, the ratio to the local first scan, and
//! what a session view costs after the scan. The server on loopback has costs of its own
//! (an emulator's time per request is not a remote store's), so each S3 figure
//! is also taken without added latency: the difference, divided by the latency, is the
//! number of round trips on the critical path — what a remote store's latency multiplies.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Value, json};

use super::probe::{probe, snapshot_then_late_writes};
use super::stats::{Stat, fmt_secs};
use super::stores::{generate_or_reuse, remove_store, store_uri};
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size, progress, size_label};
use crate::flags::ObjectStoreArgs;

/// The session a view is measured on (every generated log has it).
const VIEW: (&str, &str) = ("bot-0", "s-0000");

#[derive(Clone, Debug, Serialize)]
struct Row {
    entries: u64,
    writers: usize,
    compacted: bool,
    generations_unfolded: Value,
    local_first_scan: Option<Stat>,
    s3_first_scan: Option<Stat>,
    s3_first_scan_no_latency: Option<Stat>,
    s3_round_trips: Option<f64>,
    s3_over_local: Option<f64>,
    local_requests: Value,
    s3_requests: Value,
    s3_bytes_read: Value,
    view_records: Value,
    view_requests: Value,
    view_seconds: Value,
    view_round_trips: Option<f64>,
    /// Compacted logs only: a snapshot, 1 % more entries by a late writer, then fresh
    /// processes that start from the snapshot and read one session view.
    cold_start: Option<Stat>,
    cold_start_no_latency: Option<Stat>,
    cold_start_round_trips: Option<f64>,
    cold_start_over_s3_first_scan: Option<f64>,
    cold_start_requests: Value,
    cold_start_from_snapshot: bool,
    cold_start_entries_read: Value,
}

pub(crate) fn run(a: &ObjectStoreArgs) -> Result<()> {
    let mut common = a.common.clone();
    common.backends = vec!["lance".into()];
    let bin = bench_binary(&common)?;
    let out = out_dir(&common)?;
    let server = crate::s3::server()?;
    let latency = a.latency_ms.to_string();
    let hidden = common.json || common.quiet;
    let mut rows = Vec::new();
    for size in a.sizes.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>>>()? {
        for &writers in &a.writers {
            let raw = generated(&bin, size, writers, a.seed, &out, hidden)?;
            let compacted = out.join("stores").join(format!(
                "lance-{}-w{writers}-s{}-compacted.lance",
                size_label(size),
                a.seed
            ));
            remove_store(&store_uri("lance", &compacted)?);
            super::restore::copy_dir(&super::stores::path_of(&raw), &compacted)?;
            let compacted = store_uri("lance", &compacted)?;
            probe(&bin, &compacted, false, &["compact"])?;
            for (uri, folded) in [(&raw, false), (&compacted, true)] {
                let bucket = format!(
                    "bench-{}-w{writers}-{}",
                    size_label(size),
                    if folded { "compacted" } else { "raw" }
                );
                server
                    .create_bucket(&bucket)
                    .map_err(|e| anyhow::anyhow!("bucket {bucket}: {e}"))?;
                let s3 = server.uri(&bucket, "store.lance");
                let pb = progress(
                    hidden,
                    (a.runs * 5 + 3) as u64,
                    &format!(
                        "{} w{writers} {}",
                        size_label(size),
                        if folded { "compacted" } else { "raw" }
                    ),
                );
                probe(&bin, uri, false, &["upload", "--to", &s3])?;
                pb.inc(1);
                let scan = ["first-scan"];
                let (local, local_last) = runs(&bin, uri, &[], &scan, a.runs, &pb)?;
                let s3_args = ["--latency-ms", latency.as_str()];
                let (remote, s3_last) = runs(&bin, &s3, &s3_args, &scan, a.runs, &pb)?;
                let (remote_0, _) = runs(&bin, &s3, &[], &scan, a.runs, &pb)?;
                let view_args = ["session", "--bot", VIEW.0, "--session", VIEW.1];
                let view = probe(&bin, &s3, false, &[&s3_args[..], &view_args[..]].concat())?;
                let view_0 = probe(&bin, &s3, false, &view_args)?;
                // Cold start on S3 (compacted logs): changes the bucket, so last.
                let (mut cold, mut cold_0, mut cold_last) = (None, None, Value::Null);
                if folded {
                    let entries = local_last["entries"].as_u64().unwrap_or(0);
                    snapshot_then_late_writes(&bin, &s3, (entries / 100).max(1))?;
                    let start = ["cold-start", "--bot", VIEW.0, "--session", VIEW.1];
                    (cold, cold_last) = runs(&bin, &s3, &s3_args, &start, a.runs, &pb)?;
                    cold_0 = runs(&bin, &s3, &[], &start, a.runs, &pb)?.0;
                }
                pb.finish_and_clear();
                let trips = |with: f64, without: f64| (with - without).max(0.0) / (a.latency_ms / 1000.0);
                let cold_ratio = match (&cold, &remote) {
                    (Some(c), Some(r)) if r.median > 0.0 => Some(c.median / r.median),
                    _ => None,
                };
                let ratio = match (&remote, &local) {
                    (Some(r), Some(l)) if l.median > 0.0 => Some(r.median / l.median),
                    _ => None,
                };
                rows.push(Row {
                    entries: local_last["entries"].as_u64().unwrap_or(0),
                    writers,
                    compacted: folded,
                    generations_unfolded: local_last["layout"]["generations_unfolded"].clone(),
                    local_first_scan: local,
                    s3_round_trips: match (&remote, &remote_0) {
                        (Some(r), Some(z)) if a.latency_ms > 0.0 => Some(trips(r.median, z.median)),
                        _ => None,
                    },
                    s3_first_scan: remote,
                    s3_first_scan_no_latency: remote_0,
                    s3_over_local: ratio,
                    local_requests: local_last["requests"]["by_kind"].clone(),
                    s3_requests: s3_last["requests"]["by_kind"].clone(),
                    s3_bytes_read: s3_last["requests"]["bytes_read"].clone(),
                    view_records: view["records"].clone(),
                    view_requests: view["view_requests"].clone(),
                    view_seconds: view["view_seconds"].clone(),
                    view_round_trips: match (view["view_seconds"].as_f64(), view_0["view_seconds"].as_f64()) {
                        (Some(w), Some(z)) if a.latency_ms > 0.0 => Some(trips(w, z)),
                        _ => None,
                    },
                    cold_start_round_trips: match (&cold, &cold_0) {
                        (Some(c), Some(z)) if a.latency_ms > 0.0 => Some(trips(c.median, z.median)),
                        _ => None,
                    },
                    cold_start: cold,
                    cold_start_no_latency: cold_0,
                    cold_start_over_s3_first_scan: cold_ratio,
                    cold_start_requests: cold_last["requests"]["by_kind"].clone(),
                    cold_start_from_snapshot: cold_last["from_snapshot"].as_bool().unwrap_or(false),
                    cold_start_entries_read: cold_last["entries_read"].clone(),
                });
            }
            remove_store(&compacted);
        }
    }
    // How long an old writer takes to learn that a successor fenced it, and what the
    // takeover costs, on S3 with the same latency: writer A appends, then goes on appending
    // while B (the same writer id) claims the shard.
    let mut fences = Vec::new();
    for batches in [200usize, 1000] {
        let bucket = format!("bench-fence-{batches}");
        server
            .create_bucket(&bucket)
            .map_err(|e| anyhow::anyhow!("bucket {bucket}: {e}"))?;
        let s3 = server.uri(&bucket, "store.lance");
        let v = probe(
            &bin,
            &s3,
            false,
            &["--latency-ms", &latency, "fence", "--batches", &batches.to_string()],
        )?;
        fences.push(json!({
            "batches_before": batches,
            "old_writer_learned_seconds": v["seconds"],
            "appends_acknowledged_meanwhile": v["appends_acknowledged_meanwhile"],
            "takeover_seconds": v["takeover_seconds"],
            "takeover_requests": v["takeover_requests"],
            "append_median_us": v["append_median_us"],
        }));
    }
    let doc = json!({
        "fence": fences,
        "kind": "object-store",
        "date": chrono_stamp(),
        "machine": machine(),
        "server": "moto on loopback",
        "latency_ms": a.latency_ms,
        "runs": a.runs,
        "seed": a.seed,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("object-store-{}.json", chrono_stamp())), &text)?;
    std::fs::write(out.join("object-store-latest.json"), &text)?;
    if common.quiet {
        return Ok(());
    }
    if common.json {
        println!("{text}");
        return Ok(());
    }
    println!("{}", table(&rows, a.latency_ms));
    println!("{}", cold_start_table(&rows, a.latency_ms));
    for f in &fences {
        println!(
            "fence after {} appends: the old writer learned in {} s ({} appends acknowledged meanwhile); the takeover took {} s ({} requests)",
            f["batches_before"],
            f["old_writer_learned_seconds"],
            f["appends_acknowledged_meanwhile"],
            f["takeover_seconds"],
            total(&f["takeover_requests"]),
        );
    }
    for r in &rows {
        let tag = format!(
            "{}_w{}_{}",
            size_label(r.entries as usize),
            r.writers,
            if r.compacted { "compacted" } else { "raw" }
        );
        if let Some(s) = &r.s3_first_scan {
            println!("METRIC:object_store.first_scan.{tag}:{:.6}:s", s.median);
        }
        if let Some(x) = r.s3_round_trips {
            println!("METRIC:object_store.round_trips.{tag}:{x:.1}:round_trips");
        }
        if let Some(x) = r.s3_over_local {
            println!("METRIC:object_store.s3_over_local.{tag}:{x:.4}:ratio");
        }
        println!("METRIC:object_store.requests.{tag}:{}:requests", total(&r.s3_requests));
        println!(
            "METRIC:object_store.view_requests.{tag}:{}:requests",
            total(&r.view_requests)
        );
        if let Some(s) = &r.cold_start {
            println!("METRIC:object_store.cold_start.{tag}:{:.6}:s", s.median);
            println!(
                "METRIC:object_store.cold_start_requests.{tag}:{}:requests",
                total(&r.cold_start_requests)
            );
        }
        if let Some(x) = r.cold_start_over_s3_first_scan {
            println!("METRIC:object_store.cold_start_over_first_scan.{tag}:{x:.4}:ratio");
        }
    }
    eprintln!("xtask: figures in {}", out.join("object-store-latest.json").display());
    Ok(())
}

/// `runs` fresh-process probes `cmd` (first scans, cold starts): their times, and the
/// last probe's output.
fn runs(
    bin: &Path,
    uri: &str,
    pre: &[&str],
    cmd: &[&str],
    runs: usize,
    pb: &indicatif::ProgressBar,
) -> Result<(Option<Stat>, Value)> {
    let mut times = Vec::new();
    let mut last = Value::Null;
    for _ in 0..runs {
        let args = [pre, cmd].concat();
        last = probe(bin, uri, false, &args)?;
        times.push(last["seconds"].as_f64().context("seconds")?);
        pb.inc(1);
    }
    Ok((Stat::of(times), last))
}

/// A log generated with `writers` writers and left as they wrote it (nothing folded),
/// reused when it was generated with the same store format, generator and parameters (see
/// [`super::stores::generated_key`]).
fn generated(bin: &Path, size: usize, writers: usize, seed: u64, out: &Path, hidden: bool) -> Result<String> {
    let dir = out.join("stores");
    std::fs::create_dir_all(&dir)?;
    let name = format!("lance-{}-w{writers}-s{seed}-raw", size_label(size));
    let uri = store_uri("lance", &dir.join(format!("{name}.lance")))?;
    let done = dir.join(format!("{name}.done"));
    let (entries, writers_arg, seed) = (size.to_string(), writers.to_string(), seed.to_string());
    let args = [
        "--entries",
        entries.as_str(),
        "--writers",
        writers_arg.as_str(),
        "--seed",
        seed.as_str(),
    ];
    generate_or_reuse(bin, &uri, &done, &args, || {
        progress(hidden, 1, &format!("generating lance {} w{writers}", size_label(size)))
    })?;
    Ok(uri)
}

fn total(by_kind: &Value) -> u64 {
    by_kind
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

fn kinds(by_kind: &Value) -> String {
    let m: BTreeMap<String, u64> = serde_json::from_value(by_kind.clone()).unwrap_or_default();
    m.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(rows: &[Row], latency_ms: f64) -> String {
    let mut s = format!(
        "| entries | writers | compacted | generations unfolded | local first scan | S3 + {latency_ms} ms | S3 + 0 ms | S3 / local | round trips | requests (by kind) | bytes read | session view: records, requests, round trips, time |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    let show = |x: &Option<Stat>| x.as_ref().map(|s| fmt_secs(s.median)).unwrap_or_else(|| "-".into());
    let num = |x: Option<f64>| x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.1} MiB | {}, {}, {}, {} |\n",
            size_label(r.entries as usize),
            r.writers,
            if r.compacted { "yes" } else { "no" },
            r.generations_unfolded,
            show(&r.local_first_scan),
            show(&r.s3_first_scan),
            show(&r.s3_first_scan_no_latency),
            r.s3_over_local
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "-".into()),
            num(r.s3_round_trips),
            total(&r.s3_requests),
            kinds(&r.s3_requests),
            r.s3_bytes_read.as_f64().unwrap_or(0.0) / (1024.0 * 1024.0),
            r.view_records,
            total(&r.view_requests),
            num(r.view_round_trips),
            r.view_seconds.as_f64().map(fmt_secs).unwrap_or_else(|| "-".into()),
        ));
    }
    s
}

fn cold_start_table(rows: &[Row], latency_ms: f64) -> String {
    let mut s = format!(
        "| entries | writers | cold start, S3 + {latency_ms} ms | S3 + 0 ms | vs S3 first scan | round trips | requests (by kind) | entries read | from the snapshot |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    let show = |x: &Option<Stat>| x.as_ref().map(|s| fmt_secs(s.median)).unwrap_or_else(|| "-".into());
    for r in rows.iter().filter(|r| r.cold_start.is_some()) {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |\n",
            size_label(r.entries as usize),
            r.writers,
            show(&r.cold_start),
            show(&r.cold_start_no_latency),
            r.cold_start_over_s3_first_scan
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "-".into()),
            r.cold_start_round_trips
                .map(|x| format!("{x:.1}"))
                .unwrap_or_else(|| "-".into()),
            total(&r.cold_start_requests),
            kinds(&r.cold_start_requests),
            r.cold_start_entries_read,
            if r.cold_start_from_snapshot { "yes" } else { "no" },
        ));
    }
    s
}
