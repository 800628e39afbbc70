//! `cargo xtask bench reclaim`: what a store costs on disk against what its records hold,
//! before and after compact + gc; what a gc pass costs; whether the first scan after gc is
//! slower; and retention and purge of a share of the sessions (time, bytes given back).
//!
//! Every step is its own fresh `ctxlog-bench` process over one generated store per backend
//! and size (never the first-scan bench's stores: this one changes them). Sizes are of the
//! files on the local disk; the logical size is the sum of the records' ids, bodies and
//! metadata (as JSON), counted by the generator.

use std::path::Path;

use anyhow::{Result, ensure};
use serde::Serialize;
use serde_json::{Value, json};

use super::probe::probe;
use super::stats::{Stat, fmt_secs};
use super::stores::{remove_store, store_uri};
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size, progress, size_label};
use crate::flags::ReclaimArgs;

/// The generated workload's bots and sessions per bot (`ctxlog-bench generate`).
const BOTS: usize = 10;
const SESSIONS_PER_BOT: usize = 100;

/// Every figure of one (backend, size).
#[derive(Clone, Debug, Serialize)]
struct Row {
    backend: String,
    size: String,
    entries: u64,
    logical_bytes: u64,
    /// As the writers left it.
    written_bytes: u64,
    /// After compaction folded every generation (Lance) or checkpointed (SQLite).
    compacted_bytes: u64,
    /// After gc passes until one deleted nothing.
    gc_bytes: u64,
    gc: Value,
    first_scan_before_gc: Option<Stat>,
    first_scan_after_gc: Option<Stat>,
    retain: Value,
    /// After retention's tombstones were written (before purge).
    retained_bytes: u64,
    purge: Value,
    gc_after_purge: Value,
    /// After purge and another gc.
    purged_bytes: u64,
}

impl Row {
    fn over_logical(&self, bytes: u64) -> f64 {
        bytes as f64 / self.logical_bytes.max(1) as f64
    }
}

fn bytes(v: &Value) -> u64 {
    v["store_bytes"].as_u64().unwrap_or(0)
}

fn first_scans(bin: &Path, uri: &str, runs: usize) -> Result<Option<Stat>> {
    probe(bin, uri, false, &["first-scan"])?; // warm the page cache, untimed
    let mut xs = Vec::new();
    for _ in 0..runs {
        xs.push(
            probe(bin, uri, false, &["first-scan"])?["seconds"]
                .as_f64()
                .unwrap_or(0.0),
        );
    }
    Ok(Stat::of(xs))
}

fn measure(bin: &Path, backend: &str, size: usize, a: &ReclaimArgs, dir: &Path) -> Result<Row> {
    let label = size_label(size);
    let name = format!("reclaim-{backend}-{label}-w{}-s{}", a.writers, a.seed);
    let path = dir.join(if backend == "sqlite" {
        format!("{name}.db")
    } else {
        format!("{name}.lance")
    });
    let uri = store_uri(backend, &path)?;
    remove_store(&uri);
    let pb = progress(
        a.common.json || a.common.quiet,
        (7 + 2 * a.runs) as u64,
        &format!("reclaim {backend} {label}"),
    );
    let step = |args: &[&str]| {
        let v = probe(bin, &uri, false, args);
        pb.inc(1);
        v
    };
    let (entries, writers, seed) = (size.to_string(), a.writers.to_string(), a.seed.to_string());
    let (bots, sessions) = (BOTS.to_string(), SESSIONS_PER_BOT.to_string());
    let generated = step(&[
        "generate",
        "--entries",
        &entries,
        "--writers",
        &writers,
        "--seed",
        &seed,
        "--bots",
        &bots,
        "--sessions",
        &sessions,
    ])?;
    let compacted = step(&["compact"])?;
    let before = first_scans(bin, &uri, a.runs)?;
    let gc = step(&["gc", "--grace-secs", "0"])?;
    let after = first_scans(bin, &uri, a.runs)?;
    let ended = ((BOTS * SESSIONS_PER_BOT) as f64 * a.percent / 100.0).ceil().max(1.0) as usize;
    let retain = step(&["retain", "--sessions", &ended.to_string()])?;
    let purge = step(&["purge"])?;
    let gc_after_purge = step(&["gc", "--grace-secs", "0"])?;
    pb.finish_and_clear();
    remove_store(&uri);
    ensure!(
        generated["entries"].as_u64() == Some(size as u64),
        "{backend} {label}: generated {generated}"
    );
    Ok(Row {
        backend: backend.to_string(),
        size: label,
        entries: size as u64,
        logical_bytes: generated["logical_bytes"].as_u64().unwrap_or(0),
        written_bytes: bytes(&generated),
        compacted_bytes: bytes(&compacted),
        gc_bytes: bytes(&gc),
        gc,
        first_scan_before_gc: before,
        first_scan_after_gc: after,
        retained_bytes: bytes(&retain),
        retain,
        purge,
        purged_bytes: bytes(&gc_after_purge),
        gc_after_purge,
    })
}

pub(crate) fn run(a: &ReclaimArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let dir = out.join("scratch");
    std::fs::create_dir_all(&dir)?;
    let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
    let mut rows = Vec::new();
    for backend in &a.common.backends {
        for &size in &sizes {
            rows.push(measure(&bin, backend, size, a, &dir)?);
        }
    }
    let stamp = chrono_stamp();
    let doc = json!({
        "kind": "reclaim",
        "date": stamp,
        "machine": machine(),
        "runs": a.runs,
        "writers": a.writers,
        "seed": a.seed,
        "percent": a.percent,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("reclaim-{stamp}.json")), &text)?;
    std::fs::write(out.join("reclaim-latest.json"), &text)?;
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    println!("{}", tables(&rows, a.percent));
    println!("{}", goals(&rows));
    for r in &rows {
        for line in metric_lines(r) {
            println!("{line}");
        }
    }
    eprintln!("xtask: figures in {}", out.join("reclaim-latest.json").display());
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

fn secs(v: &Value, k: &str) -> String {
    v[k].as_f64().map_or("–".into(), fmt_secs)
}

fn tables(rows: &[Row], percent: f64) -> String {
    let show = |s: &Option<Stat>| s.as_ref().map_or("–".into(), Stat::show);
    let mut t = String::from(
        "| backend | log | logical | as written | compacted | after gc | gc (passes) | first scan before gc | after gc |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let sized = |b: u64| format!("{} ({:.2}×)", mib(b), r.over_logical(b));
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} |\n",
            r.backend,
            r.size,
            mib(r.logical_bytes),
            sized(r.written_bytes),
            sized(r.compacted_bytes),
            sized(r.gc_bytes),
            secs(&r.gc, "seconds"),
            r.gc["passes"],
            show(&r.first_scan_before_gc),
            show(&r.first_scan_after_gc),
        ));
    }
    t.push_str(&format!(
        "\n| backend | log | retain {percent} % of sessions (tombstones) | purge (entries) | gc after purge | store before purge | after purge + gc | given back |\n\
         |---|---|---|---|---|---|---|---|\n"
    ));
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {} ({}) | {} ({}) | {} | {} | {} | {} |\n",
            r.backend,
            r.size,
            secs(&r.retain, "seconds"),
            r.retain["tombstones"],
            secs(&r.purge, "seconds"),
            r.purge["entries_purged"],
            secs(&r.gc_after_purge, "seconds"),
            mib(r.retained_bytes),
            mib(r.purged_bytes),
            mib(r.retained_bytes.saturating_sub(r.purged_bytes)),
        ));
    }
    t
}

/// Where the bounded-storage goals stand (reported, never enforced).
fn goals(rows: &[Row]) -> String {
    let mut out = String::from("\nGoals (reported, not enforced):\n");
    for r in rows.iter().filter(|r| r.entries >= 1_000_000) {
        let goal = if r.backend == "lance" { 1.3 } else { 1.8 };
        let v = r.over_logical(r.gc_bytes);
        out.push_str(&format!(
            "- {} {}: store after compact + gc / logical = {v:.2} (goal ≤ {goal}: {})\n",
            r.backend,
            r.size,
            if v <= goal { "met" } else { "missed" }
        ));
    }
    for r in rows {
        if let (Some(b), Some(a)) = (&r.first_scan_before_gc, &r.first_scan_after_gc) {
            out.push_str(&format!(
                "- {} {}: first scan after gc / before = {:.2} (goal: no slower, beyond noise [{}–{}] before)\n",
                r.backend,
                r.size,
                a.median / b.median.max(f64::MIN_POSITIVE),
                fmt_secs(b.min),
                fmt_secs(b.max),
            ));
        }
    }
    out
}

fn metric_lines(r: &Row) -> Vec<String> {
    let key = format!("{}.{}", r.backend, r.size);
    let mut out = vec![
        format!("METRIC:logical_size.{key}:{}:B", r.logical_bytes),
        format!("METRIC:store_size_written.{key}:{}:B", r.written_bytes),
        format!("METRIC:store_size_compacted.{key}:{}:B", r.compacted_bytes),
        format!("METRIC:store_size_after_gc.{key}:{}:B", r.gc_bytes),
        format!(
            "METRIC:store_over_logical_after_gc.{key}:{:.4}:ratio",
            r.over_logical(r.gc_bytes)
        ),
        format!(
            "METRIC:purge_bytes_given_back.{key}:{}:B",
            r.retained_bytes.saturating_sub(r.purged_bytes)
        ),
    ];
    for (name, v, k) in [
        ("gc", &r.gc, "seconds"),
        ("gc_first_pass", &r.gc, "first_pass_seconds"),
        ("retain", &r.retain, "seconds"),
        ("purge", &r.purge, "seconds"),
        ("gc_after_purge", &r.gc_after_purge, "seconds"),
    ] {
        if let Some(s) = v[k].as_f64() {
            out.push(format!("METRIC:{name}.{key}:{s:.6}:s"));
        }
    }
    for (name, s) in [
        ("first_scan_before_gc", &r.first_scan_before_gc),
        ("first_scan_after_gc", &r.first_scan_after_gc),
    ] {
        if let Some(s) = s {
            out.push(format!("METRIC:{name}.{key}:{:.6}:s", s.median));
        }
    }
    out
}
