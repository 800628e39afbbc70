//! `cargo xtask bench first-scan`: first scan, refresh, conflict discovery and the raw-scan
//! floor, per backend and size, on generated logs or on a restored copy of a real store.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};

use super::probe::{LATE_WRITER, probe, snapshot_then_late_writes};
use super::stats::{Stat, fmt_secs};
use super::stores::{copy_store, generate_or_reuse, remove_store, store_uri};
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size, progress, size_label};
use crate::flags::FirstScanArgs;

/// Every figure of one (backend, size).
#[derive(Clone, Debug, Serialize)]
pub(super) struct Row {
    pub backend: String,
    pub source: String,
    pub entries: u64,
    pub store_bytes: u64,
    pub first_scan_warm: Option<Stat>,
    pub first_scan_cold: Option<Stat>,
    pub floor_warm: Option<Stat>,
    pub floor_cold: Option<Stat>,
    /// Entries the first scan read.
    pub first_scan_entries_read: u64,
    /// Rows the raw-scan floor read (its own plain reads of every tier): about the first
    /// scan's entries; a floor that read more would be slower than it should be, and flatter
    /// the ratio.
    pub floor_rows: u64,
    pub refresh_warm: Option<Stat>,
    pub refresh_new_entries: u64,
    pub conflicts_warm: Option<Stat>,
    pub conflicts_found: Value,
    /// Open with a projection snapshot taken before the last 1 % of entries, first scan
    /// and one session view.
    pub cold_start_warm: Option<Stat>,
    pub cold_start_cold: Option<Stat>,
    pub cold_start_from_snapshot: bool,
    pub cold_start_entries_read: u64,
    pub peak_rss_kb_cold_start: u64,
    pub snapshot_bytes: u64,
    /// Conflict discovery after the checkpoint before the last 1 % (fresh process, from the
    /// snapshot), and the conflicts it found.
    pub conflicts_after_warm: Option<Stat>,
    pub conflicts_after_found: Value,
    pub peak_rss_kb_first_scan: u64,
    pub object_reads_first_scan: Value,
    pub layout: Value,
    pub ratios: BTreeMap<String, f64>,
}

/// Measure one store: first scan and floor (warm and cold), conflict discovery, and — on a
/// scratch copy, so the store stays as it was — refresh after 1 % new entries.
fn measure(
    bin: &Path,
    backend: &str,
    store: &str,
    source: &str,
    runs: usize,
    json: bool,
    scratch: &Path,
) -> Result<Row> {
    let pb = progress(json, (runs * 9 + 2) as u64, &format!("{backend} {source}"));
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut last = Value::Null;
    let mut rss = 0u64;
    let mut floor_rows = 0u64;
    // Warm the page cache once (untimed), then measure.
    probe(bin, store, false, &["first-scan"])?;
    pb.inc(1);
    for cold in [false, true] {
        for _ in 0..runs {
            let v = probe(bin, store, cold, &["first-scan"])?;
            series
                .entry(if cold { "first_scan_cold" } else { "first_scan_warm" })
                .or_default()
                .push(v["seconds"].as_f64().unwrap_or(0.0));
            rss = rss.max(v["peak_rss_kb"].as_u64().unwrap_or(0));
            last = v;
            pb.inc(1);
            let f = probe(bin, store, cold, &["floor"])?;
            floor_rows = f["rows"].as_u64().unwrap_or(0);
            series
                .entry(if cold { "floor_cold" } else { "floor_warm" })
                .or_default()
                .push(f["seconds"].as_f64().unwrap_or(0.0));
            pb.inc(1);
        }
    }
    let mut found = Value::Null;
    for _ in 0..runs {
        let v = probe(bin, store, false, &["conflicts"])?;
        series
            .entry("conflicts_warm")
            .or_default()
            .push(v["seconds"].as_f64().unwrap_or(0.0));
        found = v["conflicts"].clone();
        pb.inc(1);
    }
    // Refresh runs on a copy: each run's late writer appends 1 % more (run k sees the
    // appends of the runs before it, at most +runs %).
    let entries = last["entries"].as_u64().unwrap_or(0);
    let extra = (entries / 100).max(1).to_string();
    let copy = copy_store(bin, store, scratch)?;
    let mut new_entries = 0;
    for r in 0..runs {
        let v = probe(
            bin,
            &copy,
            false,
            &["refresh", "--extra", &extra, "--seed", &(r + 1).to_string()],
        )?;
        series
            .entry("refresh_warm")
            .or_default()
            .push(v["seconds"].as_f64().unwrap_or(0.0));
        new_entries = v["new_entries"].as_u64().unwrap_or(0);
        pb.inc(1);
    }
    remove_store(&copy);
    // Cold start, on another copy: a snapshot, then 1 % more entries by a late writer, then
    // fresh processes that open, start from the snapshot and read one session.
    let copy = copy_store(bin, store, scratch)?;
    let saved = snapshot_then_late_writes(bin, &copy, (entries / 100).max(1))?;
    let (mut from_snapshot, mut cold_read, mut cold_rss) = (true, 0, 0);
    for cold in [false, true] {
        for _ in 0..runs {
            let v = probe(
                bin,
                &copy,
                cold,
                &["cold-start", "--bot", "bot-0", "--session", "s-0000"],
            )?;
            series
                .entry(if cold { "cold_start_cold" } else { "cold_start_warm" })
                .or_default()
                .push(v["seconds"].as_f64().unwrap_or(0.0));
            from_snapshot &= v["from_snapshot"].as_bool().unwrap_or(false);
            cold_read = v["entries_read"].as_u64().unwrap_or(0);
            cold_rss = cold_rss.max(v["peak_rss_kb"].as_u64().unwrap_or(0));
            pb.inc(1);
        }
    }
    // Conflicts a reader that had seen everything before the late writer is told are new.
    let mut found_after = Value::Null;
    for _ in 0..runs {
        let v = probe(bin, &copy, false, &["conflicts", "--before-writer", LATE_WRITER])?;
        series
            .entry("conflicts_after_warm")
            .or_default()
            .push(v["seconds"].as_f64().unwrap_or(0.0));
        found_after = v["conflicts"].clone();
        pb.inc(1);
    }
    remove_store(&copy);
    pb.finish_and_clear();
    let stat = |k: &str| Stat::of(series.get(k).cloned().unwrap_or_default());
    let mut row = Row {
        backend: backend.to_string(),
        source: source.to_string(),
        entries,
        store_bytes: last["store_bytes"].as_u64().unwrap_or(0),
        first_scan_warm: stat("first_scan_warm"),
        first_scan_cold: stat("first_scan_cold"),
        floor_warm: stat("floor_warm"),
        floor_cold: stat("floor_cold"),
        first_scan_entries_read: last["entries_read"].as_u64().unwrap_or(0),
        floor_rows,
        refresh_warm: stat("refresh_warm"),
        refresh_new_entries: new_entries,
        conflicts_warm: stat("conflicts_warm"),
        conflicts_found: found,
        cold_start_warm: stat("cold_start_warm"),
        cold_start_cold: stat("cold_start_cold"),
        cold_start_from_snapshot: from_snapshot,
        cold_start_entries_read: cold_read,
        peak_rss_kb_cold_start: cold_rss,
        snapshot_bytes: saved["bytes"].as_u64().unwrap_or(0),
        conflicts_after_warm: stat("conflicts_after_warm"),
        conflicts_after_found: found_after,
        peak_rss_kb_first_scan: rss,
        object_reads_first_scan: last["object_reads"].clone(),
        layout: last["layout"].clone(),
        ratios: BTreeMap::new(),
    };
    let ratio = |a: &Option<Stat>, b: &Option<Stat>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
        _ => None,
    };
    for (name, value) in [
        (
            "first_scan_over_floor_warm",
            ratio(&row.first_scan_warm, &row.floor_warm),
        ),
        (
            "first_scan_over_floor_cold",
            ratio(&row.first_scan_cold, &row.floor_cold),
        ),
        (
            "refresh_over_first_scan_warm",
            ratio(&row.refresh_warm, &row.first_scan_warm),
        ),
        (
            "cold_start_over_first_scan_warm",
            ratio(&row.cold_start_warm, &row.first_scan_warm),
        ),
        (
            "conflicts_after_over_conflicts_warm",
            ratio(&row.conflicts_after_warm, &row.conflicts_warm),
        ),
        (
            "conflicts_over_first_scan_warm",
            ratio(&row.conflicts_warm, &row.first_scan_warm),
        ),
        (
            "cold_start_over_first_scan_cold",
            ratio(&row.cold_start_cold, &row.first_scan_cold),
        ),
    ] {
        if let Some(v) = value {
            row.ratios.insert(name.to_string(), v);
        }
    }
    Ok(row)
}

pub(crate) fn run(a: &FirstScanArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    let mut restored = Value::Null;
    if let Some(src) = &a.restore {
        let (row, report) = super::restore::measure_copy(&bin, src, &a.storage_options, &scratch, |backend, uri| {
            let row = measure(
                &bin,
                backend,
                uri,
                "restored",
                a.runs,
                a.common.json || a.common.quiet,
                &scratch,
            )?;
            let entries = row.entries;
            Ok((row, entries))
        })?;
        rows.push(row);
        restored = report;
    } else {
        let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
        for backend in &a.common.backends {
            for &size in &sizes {
                let quiet = a.common.json || a.common.quiet;
                let uri = generated_store(&bin, backend, size, (a.writers, a.seed, quiet), &out)?;
                rows.push(measure(
                    &bin,
                    backend,
                    &uri,
                    &size_label(size),
                    a.runs,
                    a.common.json || a.common.quiet,
                    &scratch,
                )?);
            }
        }
        growth_ratios(&mut rows);
    }
    let stamp = chrono_stamp();
    let doc = json!({
        "kind": "first-scan",
        "date": stamp,
        "machine": machine(),
        "runs": a.runs,
        "writers": a.writers,
        "seed": a.seed,
        "restore": restored,
        "rows": rows,
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("first-scan-{stamp}.json")), &text)?;
    std::fs::write(out.join("first-scan-latest.json"), &text)?;
    let svg = out.join("first-scan.svg");
    if a.restore.is_none() {
        plot(&rows, &svg)?;
    }
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    if !restored.is_null() {
        println!("{}", super::restore::describe(&restored));
    }
    println!("{}", first_scan_table(&rows));
    println!("{}", cold_start_table(&rows));
    println!("{}", goals(&rows));
    for r in &rows {
        for line in metric_lines(r) {
            println!("{line}");
        }
    }
    eprintln!("xtask: figures in {}", out.join("first-scan-latest.json").display());
    if a.restore.is_none() {
        eprintln!("xtask: plot in {}", svg.display());
    }
    Ok(())
}

/// Generate the store for one backend and size, or reuse it when it was generated with the
/// same store format, generator and parameters (see [`super::stores::generated_key`]).
/// `how`: writers, seed, and whether progress is hidden.
pub(super) fn generated_store(
    bin: &Path,
    backend: &str,
    size: usize,
    how: (usize, u64, bool),
    out: &Path,
) -> Result<String> {
    let (writers, seed, quiet) = how;
    let dir = out.join("stores");
    std::fs::create_dir_all(&dir)?;
    let name = format!("{backend}-{}-w{writers}-s{seed}", size_label(size));
    let path = dir.join(if backend == "sqlite" {
        format!("{name}.db")
    } else {
        format!("{name}.lance")
    });
    let uri = store_uri(backend, &path)?;
    let done = dir.join(format!("{name}.done"));
    let (entries, writers, seed) = (size.to_string(), writers.to_string(), seed.to_string());
    let mut args = vec![
        "--entries",
        entries.as_str(),
        "--writers",
        writers.as_str(),
        "--seed",
        seed.as_str(),
    ];
    if backend == "lance" {
        args.push("--compact");
    }
    generate_or_reuse(bin, &uri, &done, &args, || {
        progress(quiet, 1, &format!("generating {backend} {}", size_label(size)))
    })?;
    Ok(uri)
}

/// time(size 10×) / time(size) for every pair of sizes ten times apart.
fn growth_ratios(rows: &mut [Row]) {
    let snapshot = rows.to_vec();
    for r in rows.iter_mut() {
        let smaller = snapshot.iter().find(|s| {
            s.backend == r.backend
                && s.entries > 0
                && r.entries / s.entries.max(1) == 10
                && r.entries % s.entries.max(1) == 0
        });
        if let (Some(s), Some(big)) = (smaller, &r.first_scan_warm)
            && let Some(small) = &s.first_scan_warm
            && small.median > 0.0
        {
            r.ratios
                .insert("first_scan_over_size_div_10_warm".into(), big.median / small.median);
        }
        if let (Some(s), Some(big)) = (smaller, &r.cold_start_warm)
            && let Some(small) = &s.cold_start_warm
            && small.median > 0.0
        {
            r.ratios
                .insert("cold_start_over_size_div_10_warm".into(), big.median / small.median);
        }
    }
}

fn cold_start_table(rows: &[Row]) -> String {
    let mut t = String::from(
        "\n| backend | log | cold start, warm (first scan from a snapshot + 1 session view) | vs first scan | cold start, cold | vs first scan | entries read | peak RSS (vs first scan) | snapshot | conflicts after the last 1 % (vs full check) |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let show = |s: &Option<Stat>| s.as_ref().map_or("–".into(), Stat::show);
    let ratio = |r: &Row, k: &str| r.ratios.get(k).map_or("–".into(), |v| format!("{v:.2}×"));
    for r in rows {
        t.push_str(&format!(
            "| {} | {} | {}{} | {} | {} | {} | {} | {:.0} MiB ({:.0} MiB) | {:.1} MiB | {} ({}) |\n",
            r.backend,
            r.source,
            show(&r.cold_start_warm),
            if r.cold_start_from_snapshot {
                ""
            } else {
                " (full scan: snapshot not used)"
            },
            ratio(r, "cold_start_over_first_scan_warm"),
            show(&r.cold_start_cold),
            ratio(r, "cold_start_over_first_scan_cold"),
            r.cold_start_entries_read,
            r.peak_rss_kb_cold_start as f64 / 1024.0,
            r.peak_rss_kb_first_scan as f64 / 1024.0,
            r.snapshot_bytes as f64 / 1048576.0,
            show(&r.conflicts_after_warm),
            ratio(r, "conflicts_after_over_conflicts_warm"),
        ));
    }
    t
}

fn first_scan_table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| backend | log | cache | first scan | raw-scan floor | scan/floor | refresh (+1 %) | refresh/scan | conflict discovery | peak RSS | store | entries/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let show = |s: &Option<Stat>| s.as_ref().map_or("–".into(), Stat::show);
    let ratio = |r: &Row, k: &str| r.ratios.get(k).map_or("–".into(), |v| format!("{v:.2}×"));
    for r in rows {
        for (cache, scan, floor, key) in [
            ("warm", &r.first_scan_warm, &r.floor_warm, "first_scan_over_floor_warm"),
            ("cold", &r.first_scan_cold, &r.floor_cold, "first_scan_over_floor_cold"),
        ] {
            let warm = cache == "warm";
            let rate = scan
                .as_ref()
                .filter(|s| s.median > 0.0)
                .map_or("–".into(), |s| format!("{:.0}", r.entries as f64 / s.median));
            t.push_str(&format!(
                "| {} | {} ({}) | {cache} | {} | {} | {} | {} | {} | {} | {} | {} | {rate} |\n",
                r.backend,
                r.source,
                r.entries,
                show(scan),
                show(floor),
                ratio(r, key),
                if warm { show(&r.refresh_warm) } else { "".into() },
                if warm {
                    ratio(r, "refresh_over_first_scan_warm")
                } else {
                    "".into()
                },
                if warm { show(&r.conflicts_warm) } else { "".into() },
                if warm {
                    format!("{:.0} MiB", r.peak_rss_kb_first_scan as f64 / 1024.0)
                } else {
                    "".into()
                },
                if warm {
                    format!("{:.0} MiB", r.store_bytes as f64 / 1048576.0)
                } else {
                    "".into()
                },
            ));
        }
    }
    t
}

/// Where the benchmark goals of the project stand (reported, never enforced).
fn goals(rows: &[Row]) -> String {
    let mut out = String::from("\nGoals (reported, not enforced):\n");
    for r in rows {
        if let Some(v) = r.ratios.get("first_scan_over_floor_warm") {
            out.push_str(&format!(
                "- {} {}: first scan / floor = {v:.2} (goal ≤ 1.2: {})\n",
                r.backend,
                r.source,
                if *v <= 1.2 { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("refresh_over_first_scan_warm") {
            out.push_str(&format!(
                "- {} {}: refresh / first scan = {:.3} (goal ≤ 0.05: {})\n",
                r.backend,
                r.source,
                v,
                if *v <= 0.05 { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("first_scan_over_size_div_10_warm") {
            out.push_str(&format!(
                "- {} {}: time / time at a tenth of the size = {v:.2} (goal ≤ 10.5: {})\n",
                r.backend,
                r.source,
                if *v <= 10.5 { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("cold_start_over_first_scan_warm")
            && r.entries >= 1_000_000
        {
            out.push_str(&format!(
                "- {} {}: cold start from a snapshot / full first scan = {v:.2} (goal ≤ 0.2: {})\n",
                r.backend,
                r.source,
                if *v <= 0.2 { "met" } else { "missed" }
            ));
            let half = r.peak_rss_kb_cold_start as f64 <= r.peak_rss_kb_first_scan as f64 / 2.0;
            out.push_str(&format!(
                "- {} {}: peak RSS of a cold start {:.0} MiB vs first scan {:.0} MiB (goal ≤ half: {})\n",
                r.backend,
                r.source,
                r.peak_rss_kb_cold_start as f64 / 1024.0,
                r.peak_rss_kb_first_scan as f64 / 1024.0,
                if half { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("conflicts_after_over_conflicts_warm")
            && r.entries >= 1_000_000
        {
            out.push_str(&format!(
                "- {} {}: conflicts after the last 1 % / full check = {v:.3} (goal ≤ 0.05: {})\n",
                r.backend,
                r.source,
                if *v <= 0.05 { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("conflicts_over_first_scan_warm")
            && r.entries >= 1_000_000
        {
            out.push_str(&format!(
                "- {} {}: full check / first scan = {v:.2} (goal ≤ 3: {})\n",
                r.backend,
                r.source,
                if *v <= 3.0 { "met" } else { "missed" }
            ));
        }
        if let Some(v) = r.ratios.get("cold_start_over_size_div_10_warm") {
            out.push_str(&format!(
                "- {} {}: cold start / cold start at a tenth of the size = {v:.2} (goal ≤ 3: {})\n",
                r.backend,
                r.source,
                if *v <= 3.0 { "met" } else { "missed" }
            ));
        }
        if r.entries >= 1_000_000 {
            let mib = r.peak_rss_kb_first_scan as f64 / 1024.0;
            out.push_str(&format!(
                "- {} {}: peak RSS of a first scan = {mib:.0} MiB (goal ≤ 1024: {})\n",
                r.backend,
                r.source,
                if mib <= 1024.0 { "met" } else { "missed" }
            ));
        }
    }
    let at = |b: &str| {
        rows.iter()
            .find(|r| r.backend == b && r.entries == 1_000_000)
            .and_then(|r| r.first_scan_warm.as_ref().map(|s| s.median))
    };
    if let (Some(l), Some(s)) = (at("lance"), at("sqlite")) {
        out.push_str(&format!(
            "- 1m: Lance first scan {} vs SQLite {} (goal: Lance faster: {})\n",
            fmt_secs(l),
            fmt_secs(s),
            if l < s { "met" } else { "missed" }
        ));
    }
    out
}

fn metric_lines(r: &Row) -> Vec<String> {
    let key = format!("{}.{}", r.backend, r.source);
    let mut out = Vec::new();
    for (name, s) in [
        ("first_scan_warm", &r.first_scan_warm),
        ("first_scan_cold", &r.first_scan_cold),
        ("floor_warm", &r.floor_warm),
        ("floor_cold", &r.floor_cold),
        ("refresh_warm", &r.refresh_warm),
        ("conflicts_warm", &r.conflicts_warm),
        ("cold_start_warm", &r.cold_start_warm),
        ("cold_start_cold", &r.cold_start_cold),
        ("conflicts_after_warm", &r.conflicts_after_warm),
    ] {
        if let Some(s) = s {
            out.push(format!("METRIC:{name}.{key}:{:.6}:s", s.median));
        }
    }
    for (name, v) in &r.ratios {
        out.push(format!("METRIC:{name}.{key}:{v:.4}:ratio"));
    }
    out.push(format!("METRIC:peak_rss.{key}:{}:KiB", r.peak_rss_kb_first_scan));
    out.push(format!(
        "METRIC:peak_rss_cold_start.{key}:{}:KiB",
        r.peak_rss_kb_cold_start
    ));
    out.push(format!("METRIC:snapshot_size.{key}:{}:B", r.snapshot_bytes));
    out.push(format!("METRIC:store_size.{key}:{}:B", r.store_bytes));
    out
}

/// The first-scan plot: time against log size per backend, with its raw-scan floor beside it.
fn plot(rows: &[Row], path: &Path) -> Result<()> {
    let points = |backend: &str, pick: fn(&Row) -> Option<f64>| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.backend == backend && r.entries > 0)
            .filter_map(|r| pick(r).map(|t| (r.entries as f64, t.max(1e-6))))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let all: Vec<(f64, f64)> = rows
        .iter()
        .flat_map(|r| {
            [r.first_scan_warm.as_ref(), r.floor_warm.as_ref()]
                .into_iter()
                .flatten()
                .map(move |s| (r.entries as f64, s.median.max(1e-6)))
        })
        .collect();
    if all.is_empty() {
        return Ok(());
    }
    let (xmin, xmax) = all.iter().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = all.iter().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ctxlog: first scan vs. raw-scan floor (warm cache, median)",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (xmin * 0.8..xmax * 1.25).log_scale(),
            (ymin * 0.7..ymax * 1.5).log_scale(),
        )
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("log size (entries)")
        .y_desc("seconds")
        .x_label_formatter(&|x| format!("{:.0}", x))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let palette = [BLUE, RED, GREEN, MAGENTA];
    let mut backends: Vec<&str> = rows.iter().map(|r| r.backend.as_str()).collect();
    backends.dedup();
    for (i, b) in backends.iter().enumerate() {
        let color = palette[i % palette.len()];
        let scan = points(b, |r| r.first_scan_warm.as_ref().map(|s| s.median));
        chart
            .draw_series(LineSeries::new(scan.clone(), color.stroke_width(3)))
            .map_err(|e| anyhow!("{e}"))?
            .label(format!("{b}: first scan"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
        chart
            .draw_series(scan.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
        let floor = points(b, |r| r.floor_warm.as_ref().map(|s| s.median));
        chart
            .draw_series(DashedLineSeries::new(floor.clone(), 6, 4, color.stroke_width(1)))
            .map_err(|e| anyhow!("{e}"))?
            .label(format!("{b}: raw-scan floor"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1)));
        chart
            .draw_series(floor.iter().map(|p| Cross::new(*p, 4, color.stroke_width(1))))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}
