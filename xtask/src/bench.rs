//! `cargo xtask bench`: what a cold replica pays before it can serve.
//!
//! Every figure comes from a fresh `ctxlog-bench` process (release build), so the first
//! scan really is a first scan. Results are reported as medians with min–max and as ratios
//! against the raw-scan floor measured in the same run; nothing here is a pass/fail gate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cargo;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchKind,
}

#[derive(Subcommand)]
pub enum BenchKind {
    /// First scan, refresh, conflict discovery and the raw-scan floor, per backend and size.
    FirstScan(FirstScanArgs),
    /// Durable append throughput and latency per backend, batch size and writer count.
    Append(AppendArgs),
}

#[derive(Args, Clone)]
pub struct Common {
    /// Backends to measure (each must be compiled: `lance` builds Lance).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,lance")]
    pub backends: Vec<String>,
    /// Print only the JSON of every figure.
    #[arg(long)]
    pub json: bool,
    /// Use the debug build shared with the tests (for the smoke test; not for figures).
    #[arg(long)]
    pub debug: bool,
    /// Where stores, JSON and plots go [default: <target>/ctxlog-bench].
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args, Clone)]
pub struct FirstScanArgs {
    #[command(flatten)]
    pub common: Common,
    /// Log sizes in entries: 10k, 100k, 1m, 10m.
    #[arg(long, value_delimiter = ',', default_value = "10k,100k,1m")]
    pub sizes: Vec<String>,
    /// Fresh-process runs per figure.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Measure a copy of this store instead of generated logs: a SQLite file, a Lance
    /// dataset directory, a .tar/.tar.gz of either, or an object-store URI (Lance).
    #[arg(long)]
    pub restore: Option<String>,
    /// Storage options for an object-store `--restore` source (KEY=VALUE, repeatable).
    #[arg(long = "storage-option")]
    pub storage_options: Vec<String>,
}

#[derive(Args, Clone)]
pub struct AppendArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub batches: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub writers: Vec<usize>,
    /// Appends per writer process [default: 500, fewer for large batches].
    #[arg(long)]
    pub appends: Option<usize>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchKind::FirstScan(a) => first_scan(&a),
        BenchKind::Append(a) => append(&a),
    }
}

/// `10k` → 10_000, `1m` → 1_000_000.
pub fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = match s.strip_suffix('k') {
        Some(n) => (n, 1_000),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 1_000_000),
            None => (s.as_str(), 1),
        },
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("`{s}` is not a size like 10k or 1m"))?;
    Ok((n * mult as f64) as usize)
}

fn size_label(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}m", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// The `ctxlog-bench` binary for these backends: built now (release unless `--debug`).
fn bench_binary(common: &Common) -> Result<PathBuf> {
    let features = common
        .backends
        .iter()
        .map(|b| match b.as_str() {
            "sqlite" => Ok(b.clone()),
            // Lance with S3 always: one feature set, one release build (Lance takes most of
            // an hour to build), and stores on S3 can be restored and measured.
            "lance" => Ok("lance,s3".to_string()),
            other => bail!("unknown backend `{other}` (have: sqlite, lance)"),
        })
        .collect::<Result<Vec<_>>>()?
        .join(",");
    let target = cargo::target_dir()?;
    if common.debug {
        // The test build: same features, same artifacts as `cargo xtask test`.
        cargo::run(
            "build (debug)",
            &["build", "--workspace", "--all-features", "--all-targets"],
        )?;
        return Ok(target.join("debug").join("ctxlog-bench"));
    }
    cargo::run(
        "build ctxlog-bench (release)",
        &[
            "build",
            "--release",
            "-p",
            "ctxlog-benches",
            "--bin",
            "ctxlog-bench",
            "--no-default-features",
            "--features",
            &features,
        ],
    )?;
    Ok(target.join("release").join("ctxlog-bench"))
}

fn out_dir(common: &Common) -> Result<PathBuf> {
    let dir = match &common.out {
        Some(d) => d.clone(),
        None => cargo::target_dir()?.join("ctxlog-bench"),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

/// The longest any one probe may take (generating 10M entries is the slowest).
const PROBE_DEADLINE: Duration = Duration::from_secs(3600);

/// Run a child to completion within `deadline`, or kill it and fail naming it.
pub fn output_within(cmd: &mut Command, deadline: Duration) -> Result<std::process::Output> {
    use std::io::Read;
    use wait_timeout::ChildExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("start {cmd:?}"))?;
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
            bail!("{cmd:?} did not finish within {deadline:?}");
        }
    };
    let stdout = out_t.join().map_err(|_| anyhow::anyhow!("stdout reader panicked"))??;
    let stderr = err_t.join().map_err(|_| anyhow::anyhow!("stderr reader panicked"))??;
    Ok(std::process::Output { status, stdout, stderr })
}

/// One fresh-process probe.
fn probe(bin: &Path, store: &str, cold: bool, args: &[&str]) -> Result<Value> {
    let mut cmd = Command::new(bin);
    cmd.args(["--store", store]);
    if cold {
        cmd.arg("--cold");
    }
    cmd.args(args);
    let out = output_within(&mut cmd, PROBE_DEADLINE)?;
    if !out.status.success() {
        bail!(
            "ctxlog-bench {} on {store} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).with_context(|| format!("ctxlog-bench printed `{text}`"))
}

/// Median and range of repeated measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Stat {
    fn of(mut xs: Vec<f64>) -> Option<Stat> {
        if xs.is_empty() {
            return None;
        }
        xs.sort_by(|a, b| a.total_cmp(b));
        let n = xs.len();
        let median = if n % 2 == 1 {
            xs[n / 2]
        } else {
            (xs[n / 2 - 1] + xs[n / 2]) / 2.0
        };
        Some(Stat {
            median,
            min: xs[0],
            max: xs[n - 1],
            runs: n,
        })
    }

    fn show(&self) -> String {
        if self.runs == 1 {
            fmt_secs(self.median)
        } else {
            format!(
                "{} [{}–{}]",
                fmt_secs(self.median),
                fmt_secs(self.min),
                fmt_secs(self.max)
            )
        }
    }
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.1} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

/// Every figure of one (backend, size).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub backend: String,
    pub source: String,
    pub entries: u64,
    pub store_bytes: u64,
    pub first_scan_warm: Option<Stat>,
    pub first_scan_cold: Option<Stat>,
    pub floor_warm: Option<Stat>,
    pub floor_cold: Option<Stat>,
    pub refresh_warm: Option<Stat>,
    pub refresh_new_entries: u64,
    pub conflicts_warm: Option<Stat>,
    pub conflicts_found: Value,
    pub peak_rss_kb_first_scan: u64,
    pub object_reads_first_scan: Value,
    pub layout: Value,
    pub ratios: BTreeMap<String, f64>,
}

fn progress(json: bool, len: u64, what: &str) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
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
    let pb = progress(json, (runs * 6 + 2) as u64, &format!("{backend} {source}"));
    let mut series: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut last = Value::Null;
    let mut rss = 0u64;
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
        refresh_warm: stat("refresh_warm"),
        refresh_new_entries: new_entries,
        conflicts_warm: stat("conflicts_warm"),
        conflicts_found: found,
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
    ] {
        if let Some(v) = value {
            row.ratios.insert(name.to_string(), v);
        }
    }
    Ok(row)
}

fn store_uri(backend: &str, path: &Path) -> String {
    match backend {
        "sqlite" => format!("sqlite:{}", path.display()),
        _ => format!("lance:{}", path.display()),
    }
}

fn path_of(uri: &str) -> PathBuf {
    PathBuf::from(
        uri.strip_prefix("sqlite:")
            .or_else(|| uri.strip_prefix("lance:"))
            .unwrap_or(uri),
    )
}

/// Copy a local store: a SQLite file consistently (the online backup API), a dataset
/// directory file by file.
fn copy_store(bin: &Path, uri: &str, scratch: &Path) -> Result<String> {
    let src = path_of(uri);
    let name = src.file_name().context("store has a name")?;
    let dst = scratch.join(format!("refresh-{}", name.to_string_lossy()));
    remove_store(&store_uri_like(uri, &dst));
    if src.is_dir() {
        crate::restore::copy_dir(&src, &dst)?;
    } else {
        crate::restore::copy_sqlite(bin, &src, &dst)?;
    }
    Ok(store_uri_like(uri, &dst))
}

/// A store URI for `path` of the same backend as `uri`.
fn store_uri_like(uri: &str, path: &Path) -> String {
    store_uri(if uri.starts_with("sqlite:") { "sqlite" } else { "lance" }, path)
}

fn remove_store(uri: &str) {
    let p = path_of(uri);
    if p.is_dir() {
        let _ = std::fs::remove_dir_all(&p);
    } else {
        let _ = std::fs::remove_file(&p);
        for ext in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", p.display()));
        }
    }
}

fn first_scan(a: &FirstScanArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    let mut restored = Value::Null;
    if let Some(src) = &a.restore {
        let (row, report) =
            crate::restore::measure_copy(&bin, src, &a.storage_options, &scratch, |backend, uri, label| {
                measure(&bin, backend, uri, label, a.runs, a.common.json, &scratch)
            })?;
        rows.push(row);
        restored = report;
    } else {
        let sizes: Vec<usize> = a.sizes.iter().map(|s| parse_size(s)).collect::<Result<_>>()?;
        for backend in &a.common.backends {
            for &size in &sizes {
                let uri = generated_store(&bin, backend, size, a, &out)?;
                rows.push(measure(
                    &bin,
                    backend,
                    &uri,
                    &size_label(size),
                    a.runs,
                    a.common.json,
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
        crate::plot::first_scan(&rows, &svg)?;
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    if !restored.is_null() {
        println!("{}", crate::restore::describe(&restored));
    }
    println!("{}", first_scan_table(&rows));
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

/// Generate (or reuse) the store for one backend and size.
fn generated_store(bin: &Path, backend: &str, size: usize, a: &FirstScanArgs, out: &Path) -> Result<String> {
    let dir = out.join("stores");
    std::fs::create_dir_all(&dir)?;
    let name = format!("{backend}-{}-w{}-s{}", size_label(size), a.writers, a.seed);
    let path = dir.join(if backend == "sqlite" {
        format!("{name}.db")
    } else {
        format!("{name}.lance")
    });
    let uri = store_uri(backend, &path);
    let done = dir.join(format!("{name}.done"));
    if done.exists() {
        return Ok(uri);
    }
    remove_store(&uri);
    let pb = progress(a.common.json, 1, &format!("generating {backend} {}", size_label(size)));
    let mut args = vec![
        "generate".to_string(),
        "--entries".into(),
        size.to_string(),
        "--writers".into(),
        a.writers.to_string(),
        "--seed".into(),
        a.seed.to_string(),
    ];
    if backend == "lance" {
        args.push("--compact".into());
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = probe(bin, &uri, false, &argv)?;
    pb.finish_and_clear();
    std::fs::write(&done, v.to_string())?;
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
    }
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
                "- {} {}: first scan / floor = {v:.2} (goal ≤ 1.5: {})\n",
                r.backend,
                r.source,
                if *v <= 1.5 { "met" } else { "missed" }
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
                "- {} {}: time / time at a tenth of the size = {v:.2} (goal ≤ 11: {})\n",
                r.backend,
                r.source,
                if *v <= 11.0 { "met" } else { "missed" }
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
    ] {
        if let Some(s) = s {
            out.push(format!("METRIC:{name}.{key}:{:.6}:s", s.median));
        }
    }
    for (name, v) in &r.ratios {
        out.push(format!("METRIC:{name}.{key}:{v:.4}:ratio"));
    }
    out.push(format!("METRIC:peak_rss.{key}:{}:KiB", r.peak_rss_kb_first_scan));
    out.push(format!("METRIC:store_size.{key}:{}:B", r.store_bytes));
    out
}

// ---- append -------------------------------------------------------------------------------

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

fn append(a: &AppendArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    let total = (a.common.backends.len() * a.batches.len() * a.writers.len()) as u64;
    let pb = progress(a.common.json, total, "append");
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
                let uri = store_uri(backend, &path);
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

pub fn chrono_stamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H-%M-%SZ").to_string()
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(|l| l.to_string()))
        .unwrap_or_default();
    json!({"cpus": cpus, "memory": mem, "os": std::env::consts::OS})
}
