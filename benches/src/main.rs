//! `ctxlog-bench`: one measurement per process, one JSON object on stdout.
//!
//! `cargo xtask bench` runs this binary (release build) in fresh processes and aggregates.
//! Each subcommand opens the store through the public API, as a cold replica would.

#[cfg(feature = "sqlite")]
mod search;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ctxlog::{CompactOptions, Location, StoreOptions, WriterId};
use serde_json::{Value, json};

use crate::workload::Workload;

#[derive(Parser)]
struct Cli {
    /// Store URI.
    #[arg(long)]
    store: String,
    /// Drop the store's files from the page cache first (posix_fadvise DONTNEED).
    #[arg(long)]
    cold: bool,
    /// Storage options for object stores (KEY=VALUE, repeatable).
    #[arg(long = "storage-option")]
    storage_options: Vec<String>,
    /// Delay every object-store request of the measured handles by this many milliseconds
    /// (Lance): a stand-in for the first-byte time of a remote object store.
    #[arg(long, default_value_t = 0.0)]
    latency_ms: f64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a store through the public API (appends through shards). Not timed.
    Generate(GenerateArgs),
    /// What identifies the store `generate` with these arguments builds: the backend's
    /// store format in this build, the generator's version and its parameters (defaults
    /// included). Reads and writes nothing; `cargo xtask bench` keys reuse on it.
    StoreKey(GenerateArgs),
    /// Open the store and build the full projection.
    FirstScan,
    /// First scan, then another writer appends `extra` entries, then a timed refresh.
    Refresh {
        #[arg(long)]
        extra: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Conflict discovery over the whole log; with `--before-writer`, only what involves
    /// entries past a checkpoint: every shard's last seq but that writer's (whose entries
    /// are then all new). That check starts from a projection snapshot when one is usable.
    Conflicts {
        #[arg(long)]
        before_writer: Option<String>,
    },
    /// Read the projection's columns with the plainest code for the backend.
    Floor,
    /// Copy a store into a new local file or directory: a SQLite store through the online
    /// backup API (one snapshot, never torn), a Lance store object by object.
    Copy {
        #[arg(long)]
        to: PathBuf,
    },
    /// Copy a local Lance store to an object-store URI where nothing exists yet.
    Upload {
        #[arg(long)]
        to: String,
    },
    /// Fold every flushed generation into the base table (Lance; SQLite checkpoints).
    Compact,
    /// Reclaim passes (`Store::gc`) until one deletes nothing: their time and what they freed.
    Gc {
        /// The grace period in seconds (0: everything folded is reclaimable at once).
        #[arg(long, default_value_t = 0)]
        grace_secs: u64,
    },
    /// One retention pass ending the `sessions` longest-idle sessions (any age).
    Retain {
        #[arg(long)]
        sessions: usize,
    },
    /// Purge passes until no tombstoned id has bytes left to erase.
    Purge,
    /// Scan, and save a projection snapshot in the store (not timed as a first scan).
    Snapshot,
    /// What a cold replica pays with a snapshot in the store: open, first scan (from the
    /// snapshot, then the entries past it), and one session view.
    ColdStart {
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
    },
    /// A session view from a fresh handle: the first scan, then the view (its time and
    /// requests apart).
    Session {
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
    },
    /// Append a session of `records` records (bot `context-bench`, session `long`) and a
    /// summary covering all but its last `uncovered`, written from a view read before
    /// those: what `context-read` then reads. Not timed.
    ContextSetup {
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        #[arg(long, default_value_t = 20)]
        uncovered: usize,
    },
    /// A fresh handle's first scan and a query of another session (as a serving replica
    /// has done), then one timed read of the session `context-setup` wrote: its context
    /// view, or (`--full`) its whole session view; bytes read with it.
    ContextRead {
        #[arg(long)]
        full: bool,
    },
    /// Forks (rule 25), in one process on the store it is given: a session of `records`
    /// records is written (not timed); then, timed, a fork of it (one record) against a
    /// copy of it (its records read and written again under a new session: the peers'
    /// way), each with its entries and bytes; the fork's context view against the parent's;
    /// and a read of a session of `small` records as of a position against a current read,
    /// `runs` times each (medians).
    Forks {
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        #[arg(long, default_value_t = 100)]
        small: usize,
        #[arg(long, default_value_t = 9)]
        runs: usize,
    },
    /// Full-text search on a generated corpus of `records` records appended to a fresh
    /// store: the index a first search builds (time, memory), `queries` queries with and
    /// without a session filter, and SQLite FTS5 on the same texts as the floor.
    #[cfg(feature = "sqlite")]
    Search {
        #[arg(long, default_value_t = 100_000)]
        records: usize,
        #[arg(long, default_value_t = 500)]
        queries: usize,
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// Dimensions of each record's vector (0: none).
        #[arg(long, default_value_t = 0)]
        dims: usize,
    },
    /// How long a writer takes to learn that a successor fenced it: writer A appends
    /// `batches` batches and goes on appending while writer B (another handle, the same
    /// writer id) takes the shard over; timed from B's claim to A's first fenced append.
    Fence {
        #[arg(long, default_value_t = 20)]
        batches: usize,
    },
    /// Durable append throughput and latency of one writer.
    Append {
        #[arg(long)]
        writer: String,
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        records: usize,
        #[arg(long, default_value_t = 9)]
        seed: u64,
    },
}

#[derive(clap::Args, Clone)]
struct GenerateArgs {
    #[arg(long)]
    entries: usize,
    #[arg(long, default_value_t = 4)]
    writers: usize,
    #[arg(long, default_value_t = 10)]
    bots: usize,
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Fold every flushed generation into the base table afterwards (Lance).
    #[arg(long)]
    compact: bool,
}

impl GenerateArgs {
    fn workload(&self) -> Workload {
        Workload {
            entries: self.entries,
            writers: self.writers,
            bots: self.bots,
            sessions_per_bot: self.sessions,
            seed: self.seed,
        }
    }
}

/// Reads never create a store: a path that is not one fails with an error naming it.
fn options() -> StoreOptions {
    StoreOptions::default()
        .with_create_if_missing(false)
        // Benchmarks scan large logs: the deadline bounds hangs, not work.
        .with_timeout(Duration::from_secs(3600))
        // A first scan is a full scan, even of a restored store that holds snapshots; only
        // `cold-start` reads them.
        .with_read_snapshots(false)
}

/// [`options`] with the storage options a Lance URI carries in its query string.
#[cfg_attr(not(feature = "lance"), allow(dead_code))]
fn options_for(location: &Location) -> StoreOptions {
    match location {
        Location::Lance { storage_options, .. } => options().with_storage_options(storage_options.clone()),
        _ => options(),
    }
}

fn creating() -> StoreOptions {
    options().with_create_if_missing(true)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match rt.block_on(run(cli)) {
        Ok(v) => {
            println!("{v}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ctxlog-bench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<Value> {
    let location = Location::parse(&cli.store)?;
    if let Cmd::Copy { to } = &cli.cmd {
        return copy(&location, &cli.storage_options, to).await;
    }
    if let Cmd::Upload { to } = &cli.cmd {
        return upload(&location, to, &cli.storage_options).await;
    }
    if let Cmd::StoreKey(g) = &cli.cmd {
        return store_key(&location, g);
    }
    if cli.cold {
        drop_from_page_cache(&location)?;
    }
    measured::init(cli.latency_ms);
    let mut out = match cli.cmd {
        Cmd::Generate(g) => generate(&cli.store, &g.workload(), g.compact).await?,
        Cmd::FirstScan => first_scan(&cli.store, &location).await?,
        Cmd::Session { bot, session } => session_view(&cli.store, &location, &bot, &session).await?,
        Cmd::Fence { batches } => fence(&cli.store, &location, batches).await?,
        Cmd::Refresh { extra, seed } => refresh(&cli.store, &location, extra, seed).await?,
        Cmd::Conflicts { before_writer } => conflicts(&cli.store, &location, before_writer.as_deref()).await?,
        Cmd::Floor => floor(&cli.store, &location).await?,
        Cmd::Append {
            writer,
            batch,
            records,
            seed,
        } => append(&cli.store, &location, &writer, batch, records, seed).await?,
        Cmd::Compact => compact_all(&cli.store).await?,
        Cmd::Gc { grace_secs } => gc_all(&cli.store, Duration::from_secs(grace_secs)).await?,
        Cmd::Retain { sessions } => retain(&cli.store, sessions).await?,
        Cmd::Purge => purge_all(&cli.store).await?,
        Cmd::Snapshot => snapshot(&cli.store).await?,
        Cmd::ColdStart { bot, session } => cold_start(&cli.store, &location, &bot, &session).await?,
        Cmd::ContextSetup { records, uncovered } => context_setup(&cli.store, records, uncovered).await?,
        Cmd::ContextRead { full } => context_read(&cli.store, &location, full).await?,
        Cmd::Forks { records, small, runs } => forks(&cli.store, records, small, runs).await?,
        #[cfg(feature = "sqlite")]
        Cmd::Search {
            records,
            queries,
            seed,
            dims,
        } => search::search(&cli.store, records, queries, seed, dims).await?,
        Cmd::Copy { .. } | Cmd::Upload { .. } | Cmd::StoreKey(_) => unreachable!("handled above"),
    };
    out["requests"] = measured::requests();
    out["latency_ms"] = json!(cli.latency_ms);
    out["peak_rss_kb"] = json!(peak_rss_kb());
    out["store_bytes"] = json!(store_bytes(&location));
    out["cache"] = json!(if cli.cold { "cold" } else { "warm" });
    Ok(out)
}

/// What identifies the store `generate` builds with `g` at `location` (see `Cmd::StoreKey`).
fn store_key(location: &Location, g: &GenerateArgs) -> Result<Value> {
    let format = match location {
        #[cfg(feature = "sqlite")]
        Location::Sqlite(_) => format!(
            "sqlite {} schema {:016x}",
            ctxlog_sqlite::FORMAT,
            fnv1a(ctxlog_sqlite::SCHEMA_SQL.as_bytes())
        ),
        #[cfg(feature = "lance")]
        Location::Lance { .. } => format!("lance {}", ctxlog_lance::bench::store_format()),
        #[allow(unreachable_patterns)]
        _ => bail!("backend not compiled into ctxlog-bench"),
    };
    let w = g.workload();
    Ok(json!({
        "format": format,
        "generator": workload::GENERATOR,
        "params": {
            "entries": w.entries,
            "writers": w.writers,
            "bots": w.bots,
            "sessions_per_bot": w.sessions_per_bot,
            "seed": w.seed,
            "compact": g.compact,
            "window": workload::WINDOW,
        },
    }))
}

/// FNV-1a, 64 bits: a fingerprint stable across Rust releases (unlike `DefaultHasher`).
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn generate(uri: &str, w: &Workload, compact: bool) -> Result<Value> {
    let store = ctxlog::open(uri, creating()).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..w.writers {
        let (store, w) = (store.clone(), w.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("writer-{i}");
            let mut records = w.stream(i, &name);
            let mut shard = store.open_shard(&WriterId::new(&name)?).await?;
            let (mut written, mut logical) = (0, 0u64);
            loop {
                let chunk = records.next_chunk(100);
                if chunk.is_empty() {
                    break;
                }
                written += chunk.len();
                logical += chunk.iter().map(Workload::logical_bytes).sum::<u64>();
                shard.append(chunk).await?;
            }
            shard.close().await?;
            anyhow::Ok((written, logical))
        }));
    }
    let (mut written, mut logical) = (0, 0);
    for t in tasks {
        let (n, bytes) = t.await??;
        written += n;
        logical += bytes;
    }
    let mut folded = 0;
    if compact && store.backend() == "lance" {
        folded = fold_all(store.as_ref()).await?.1;
    }
    Ok(json!({
        "entries": written,
        "logical_bytes": logical,
        "seconds": started.elapsed().as_secs_f64(),
        "generations_folded": folded,
    }))
}

async fn first_scan(uri: &str, location: &Location) -> Result<Value> {
    let started = Instant::now();
    let store = measured::open(uri, location).await?;
    let mut p = store.projector();
    let report = p.refresh().await?;
    let seconds = started.elapsed().as_secs_f64();
    let reads = measured::reads();
    let stats = p.stats();
    Ok(json!({
        "seconds": seconds,
        "entries": stats.entries,
        "entries_read": report.entries_read,
        "live": stats.live,
        "object_reads": reads,
        "layout": layout(location).await,
    }))
}

async fn session_view(uri: &str, location: &Location, bot: &str, session: &str) -> Result<Value> {
    let started = Instant::now();
    let store = measured::open(uri, location).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let scanned = Instant::now();
    let before = measured::snapshot();
    let view = p.session(bot, session).await?;
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "view_seconds": scanned.elapsed().as_secs_f64(),
        "view_requests": measured::since(&before),
        "records": view.len(),
        "object_reads": measured::reads(),
    }))
}

const CONTEXT_BOT: &str = "context-bench";
const CONTEXT_SESSION: &str = "long";

async fn context_setup(uri: &str, records: usize, uncovered: usize) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let mut shard = store.open_shard(&WriterId::new("context-bench")?).await?;
    let record = |i: usize| {
        let text = format!(
            "message {i} of a long conversation, with enough words to look like one: {}",
            "lorem ipsum ".repeat(20)
        );
        ctxlog::Record::text(format!("long-{i:05}"), CONTEXT_BOT, CONTEXT_SESSION, "user", text)
    };
    let covered = records.saturating_sub(uncovered);
    for chunk in (0..covered).collect::<Vec<_>>().chunks(500) {
        shard.append(chunk.iter().map(|i| record(*i)).collect()).await?;
    }
    let mut p = store.projector();
    p.refresh().await?;
    let read = p.checkpoint();
    shard.observe(p.max_hlc())?;
    let summary = ctxlog::Record::summary(
        "long-summary",
        CONTEXT_BOT,
        CONTEXT_SESSION,
        "What was said so far.",
        read,
    );
    shard.append(vec![summary]).await?;
    shard.append((covered..records).map(record).collect()).await?;
    shard.close().await?;
    Ok(json!({"records": records, "uncovered": uncovered}))
}

/// The median of `times`, in seconds.
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

/// [`Cmd::Forks`].
async fn forks(uri: &str, records: usize, small: usize, runs: usize) -> Result<Value> {
    const BOT: &str = "fork-bench";
    let store = ctxlog::open(uri, options()).await?;
    let mut shard = store.open_shard(&WriterId::new("fork-bench")?).await?;
    let limits = ctxlog::Limits::default();
    let record = |session: &str, i: usize| {
        let text = format!(
            "message {i} of a long conversation, with enough words to look like one: {}",
            "lorem ipsum ".repeat(20)
        );
        ctxlog::Record::text(format!("{session}-{i:05}"), BOT, session, "user", text)
    };
    for chunk in (0..records).collect::<Vec<_>>().chunks(500) {
        shard
            .append(chunk.iter().map(|i| record("parent", *i)).collect())
            .await?;
    }
    shard.append((0..small).map(|i| record("small", i)).collect()).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let at = p.checkpoint();
    // The log goes on after the position (the small session keeps its records: the two
    // reads return the same records, one as of the position).
    shard.append((0..small).map(|i| record("later", i)).collect()).await?;

    // The fork: one record, written as a summary is (after the view's clock).
    p.refresh().await?;
    shard.observe(p.max_hlc())?;
    let fork = ctxlog::Record::fork("fork-1", BOT, "fork", "parent", p.checkpoint());
    let fork_bytes = limits.validate(&fork)?;
    let started = Instant::now();
    shard.append(vec![fork]).await?;
    let fork_secs = started.elapsed().as_secs_f64();

    // The copy: read the session, write every record again under the copy's ids.
    let started = Instant::now();
    let parent = p.session(BOT, "parent").await?;
    let copies: Vec<ctxlog::Record> = parent
        .iter()
        .map(|e| ctxlog::Record {
            id: format!("copy-{}", e.record.id),
            session_id: "copy".into(),
            ..e.record.clone()
        })
        .collect();
    let copy_bytes: usize = copies
        .iter()
        .map(|r| limits.validate(r))
        .sum::<ctxlog::Result<usize>>()?;
    for chunk in copies.chunks(500) {
        shard.append(chunk.to_vec()).await?;
    }
    let copy_secs = started.elapsed().as_secs_f64();
    shard.close().await?;

    let mut r = store.projector();
    r.refresh().await?;
    anyhow::ensure!(
        r.session(BOT, "fork").await?.len() == records && r.session(BOT, "copy").await?.len() == records,
        "the fork and the copy do not both hold the parent's {records} records"
    );
    // The four reads in turn, `runs` times: each pair measured under the same conditions.
    let mut times: [Vec<f64>; 4] = Default::default();
    for _ in 0..runs.max(1) {
        for (i, session) in ["fork", "parent"].into_iter().enumerate() {
            let started = Instant::now();
            let view = r.context(BOT, session).await?;
            times[i].push(started.elapsed().as_secs_f64());
            anyhow::ensure!(view.entries.len() == records, "the context view of {session}");
        }
        let started = Instant::now();
        let page = r.session_page_at(BOT, "small", &at, None, usize::MAX).await?.0;
        times[2].push(started.elapsed().as_secs_f64());
        anyhow::ensure!(page.len() == small, "as of the position: {} records", page.len());
        let started = Instant::now();
        let now = r.session(BOT, "small").await?;
        times[3].push(started.elapsed().as_secs_f64());
        anyhow::ensure!(now.len() == small, "now: {} records", now.len());
    }
    let [fork_context, parent_context, as_of, current] = times.map(median);
    let entries = r.stats().entries;
    Ok(json!({
        "records": records,
        "store_entries": entries,
        "fork": {"entries": 1, "bytes": fork_bytes, "seconds": fork_secs},
        "copy": {"entries": records, "bytes": copy_bytes, "seconds": copy_secs},
        "fork_over_copy_seconds": fork_secs / copy_secs,
        "fork_over_copy_bytes": fork_bytes as f64 / copy_bytes as f64,
        "context_seconds": {"fork": fork_context, "parent": parent_context},
        "fork_context_over_parent": fork_context / parent_context,
        "small_records": small,
        "read_seconds": {"as_of": as_of, "current": current},
        "as_of_over_current": as_of / current,
    }))
}

/// Bytes this process has read through system calls so far (`rchar`: page-cache hits
/// too, which is what SQLite's reads cost when the file is cached).
fn bytes_read_by_process() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("rchar: ").and_then(|n| n.trim().parse().ok()))
        })
        .unwrap_or(0)
}

async fn context_read(uri: &str, location: &Location, full: bool) -> Result<Value> {
    let store = measured::open(uri, location).await?;
    let mut p = store.projector();
    p.refresh().await?;
    // As a serving replica reads: the index's one-time work after a first scan (filing
    // every record into its session) done by an earlier query, not this one.
    p.session_tail(CONTEXT_BOT, "warm-up", 1).await?;
    let before = measured::snapshot();
    let bytes_before = (bytes_read_by_process(), measured::bytes_read());
    let started = Instant::now();
    let (records, body_bytes) = if full {
        let view = p.session(CONTEXT_BOT, CONTEXT_SESSION).await?;
        (view.len(), view.iter().map(|e| e.record.body.len()).sum::<usize>())
    } else {
        let view = p.context(CONTEXT_BOT, CONTEXT_SESSION).await?;
        anyhow::ensure!(view.summary.is_some(), "no summary governs: run context-setup first");
        (
            view.entries.len(),
            view.entries.iter().map(|e| e.record.body.len()).sum::<usize>(),
        )
    };
    let seconds = started.elapsed().as_secs_f64();
    let (io, object) = (
        bytes_read_by_process() - bytes_before.0,
        measured::bytes_read() - bytes_before.1,
    );
    Ok(json!({
        "seconds": seconds,
        "records": records,
        "body_bytes": body_bytes,
        // Lance: bytes its object store returned; SQLite: bytes the process read from files.
        "bytes_read": if matches!(location, Location::Sqlite(_)) { io } else { object },
        "view_requests": measured::since(&before),
        "view": if full { "session" } else { "context" },
    }))
}

/// Compaction passes until nothing is left to fold: (passes, generations merged).
async fn fold_all(store: &dyn ctxlog::Store) -> Result<(u64, u64)> {
    let (mut passes, mut merged) = (0u64, 0u64);
    loop {
        let r = store.compact(&CompactOptions::default()).await?;
        passes += 1;
        merged += r.generations_merged;
        if r.generations_remaining == 0 {
            return Ok((passes, merged));
        }
        if passes >= 10_000 {
            bail!("compaction did not converge in {passes} passes");
        }
    }
}

async fn compact_all(uri: &str) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let started = Instant::now();
    let (passes, merged) = fold_all(store.as_ref()).await?;
    Ok(json!({"seconds": started.elapsed().as_secs_f64(), "passes": passes, "generations_merged": merged}))
}

async fn snapshot(uri: &str) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let started = Instant::now();
    let mut p = store.projector();
    p.refresh().await?;
    let r = p.save_snapshot().await?;
    Ok(json!({"seconds": started.elapsed().as_secs_f64(), "entries": r.entries, "bytes": r.bytes}))
}

async fn cold_start(uri: &str, location: &Location, bot: &str, session: &str) -> Result<Value> {
    let started = Instant::now();
    let store = measured::open_with(uri, location, true).await?;
    let mut p = store.projector();
    let report = p.refresh().await?;
    let scanned = started.elapsed().as_secs_f64();
    let view = p.session(bot, session).await?;
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "scan_seconds": scanned,
        "from_snapshot": report.from_snapshot.is_some(),
        "entries_read": report.entries_read,
        "entries": p.stats().entries,
        "records": view.len(),
        "object_reads": measured::reads(),
    }))
}

/// Reclaim passes until one deletes nothing (at most 100).
async fn gc_all(uri: &str, grace: Duration) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let started = Instant::now();
    let (mut passes, mut deleted, mut reclaimed, mut first_pass) = (0u64, 0u64, 0u64, None);
    loop {
        let pass = Instant::now();
        let r = store.gc(&ctxlog::GcOptions::default().with_grace(grace)).await?;
        passes += 1;
        first_pass.get_or_insert(pass.elapsed().as_secs_f64());
        deleted += r.objects_deleted;
        reclaimed += r.bytes_reclaimed;
        if r.objects_deleted == 0 || passes >= 100 {
            return Ok(json!({
                "seconds": started.elapsed().as_secs_f64(),
                "first_pass_seconds": first_pass,
                "passes": passes,
                "objects_deleted": deleted,
                "bytes_reclaimed": reclaimed,
                "objects_pending": r.objects_pending,
            }));
        }
    }
}

/// One retention pass over the `sessions` longest-idle sessions.
async fn retain(uri: &str, sessions: usize) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let started = Instant::now();
    let r = ctxlog::retain(
        store.as_ref(),
        &ctxlog::RetainOptions::older_than(Duration::ZERO).with_max_sessions(sessions),
    )
    .await?;
    Ok(json!({
        "seconds": started.elapsed().as_secs_f64(),
        "sessions_ended": r.sessions_ended.len(),
        "tombstones": r.tombstones,
    }))
}

/// Purge passes until nothing tombstoned is left to erase (at most 1000).
async fn purge_all(uri: &str) -> Result<Value> {
    let store = ctxlog::open(uri, options()).await?;
    let started = Instant::now();
    let (mut passes, mut ids, mut entries) = (0u64, 0u64, 0u64);
    loop {
        let r = store.purge(&ctxlog::PurgeOptions::default()).await?;
        passes += 1;
        ids += r.ids_purged;
        entries += r.entries_purged;
        if r.ids_remaining == 0 || passes >= 1000 {
            return Ok(json!({
                "seconds": started.elapsed().as_secs_f64(),
                "passes": passes,
                "ids_purged": ids,
                "entries_purged": entries,
                "ids_remaining": r.ids_remaining,
            }));
        }
    }
}

/// Copy a local Lance store to an object-store URI.
async fn upload(location: &Location, to: &str, storage_options: &[String]) -> Result<Value> {
    #[cfg(feature = "lance")]
    if let Location::Lance { uri, .. } = location {
        let Location::Lance {
            uri: dest,
            storage_options: mut opts,
        } = Location::parse(to)?
        else {
            bail!("upload: the destination must be a Lance store URI");
        };
        for o in storage_options {
            let (k, v) = o.split_once('=').with_context(|| "a storage option is not KEY=VALUE")?;
            opts.push((k.to_string(), v.to_string()));
        }
        let (objects, bytes) = ctxlog_lance::bench::copy_from_local(uri, &dest, opts).await?;
        return Ok(json!({"objects": objects, "bytes": bytes}));
    }
    let _ = (location, to, storage_options);
    bail!("upload: only local Lance stores can be uploaded")
}

async fn fence(uri: &str, location: &Location, batches: usize) -> Result<Value> {
    let w = Workload {
        entries: (batches + 10_000) * 10,
        writers: 1,
        bots: 2,
        sessions_per_bot: 2,
        seed: 5,
    };
    let id = WriterId::new("fenced-writer")?;
    let records = w.records(0, id.as_str());
    let mut chunks = records.chunks(10).map(<[_]>::to_vec).collect::<Vec<_>>().into_iter();
    drop(ctxlog::open(uri, creating()).await?); // the store, if it is new
    let a_store = measured::open(uri, location).await?;
    let mut a = a_store.open_shard(&id).await?;
    let mut append_us = Vec::new();
    for chunk in chunks.by_ref().take(batches) {
        let t = Instant::now();
        a.append(chunk).await?;
        append_us.push(t.elapsed().as_micros() as u64);
    }
    // A goes on appending while B — another replica with the same writer id, its own
    // handle — takes the shard over. Measured: from the start of B's claim to A's first
    // append that fails as fenced.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<Instant>();
    let a_task = tokio::spawn(async move {
        let mut during = 0u64;
        let Ok(claim_started) = started_rx.await else {
            bail!("the takeover never started")
        };
        for chunk in chunks {
            match a.append(chunk).await {
                Ok(_) => during += 1,
                Err(ctxlog::Error::Fenced { .. }) => return Ok((claim_started.elapsed(), during)),
                Err(e) => bail!("the old writer failed otherwise: {e}"),
            }
        }
        bail!("the old writer was never fenced")
    });
    let b_store = measured::open(uri, location).await?;
    let before = measured::snapshot();
    let t = Instant::now();
    let _ = started_tx.send(t);
    let b = b_store.open_shard(&id).await?;
    let takeover_seconds = t.elapsed().as_secs_f64();
    let takeover_requests = measured::since(&before);
    let (learned, appended_meanwhile) = tokio::time::timeout(Duration::from_secs(600), a_task)
        .await
        .context("the old writer did not learn it was fenced within 600 s")???;
    b.close().await?;
    append_us.sort_unstable();
    Ok(json!({
        "seconds": learned.as_secs_f64(),
        "appends_acknowledged_meanwhile": appended_meanwhile,
        "takeover_seconds": takeover_seconds,
        "takeover_requests": takeover_requests,
        "append_median_us": append_us.get(append_us.len() / 2),
    }))
}

async fn refresh(uri: &str, location: &Location, extra: usize, seed: u64) -> Result<Value> {
    let store = measured::open(uri, location).await?;
    let mut p = store.projector();
    let first = Instant::now();
    p.refresh().await?;
    let first_seconds = first.elapsed().as_secs_f64();
    // Another writer (another replica, its own store handle) appends.
    let other = ctxlog::open(uri, options()).await?;
    let name = format!("late-writer-{seed}");
    let w = Workload {
        entries: extra,
        writers: 1,
        bots: 10,
        sessions_per_bot: 100,
        seed,
    };
    let mut shard = other.open_shard(&WriterId::new(&name)?).await?;
    for chunk in w.records(0, &name).chunks(100) {
        shard.append(chunk.to_vec()).await?;
    }
    let started = Instant::now();
    let report = p.refresh().await?;
    let seconds = started.elapsed().as_secs_f64();
    shard.close().await?;
    Ok(json!({
        "seconds": seconds,
        "first_scan_seconds": first_seconds,
        "new_entries": report.new_entries,
        "entries_read": report.entries_read,
    }))
}

async fn conflicts(uri: &str, location: &Location, before_writer: Option<&str>) -> Result<Value> {
    let after = match before_writer {
        None => None,
        Some(name) => {
            let skip = WriterId::new(name)?.shard_id();
            let mut cp = ctxlog::Checkpoint::default();
            for s in measured::open(uri, location).await?.shards().await? {
                if s.shard != skip {
                    cp.advance(s.shard, s.last_seq);
                }
            }
            Some(cp)
        }
    };
    let started = Instant::now();
    let store = measured::open_with(uri, location, after.is_some()).await?;
    let found = store.conflict_discovery().conflicts(after.as_ref()).await?;
    let seconds = started.elapsed().as_secs_f64();
    let mut by_kind = serde_json::Map::new();
    for c in &found {
        let n = by_kind.entry(c.kind().as_str()).or_insert(json!(0));
        *n = json!(n.as_u64().unwrap_or(0) + 1);
    }
    Ok(json!({"seconds": seconds, "conflicts": by_kind}))
}

async fn floor(uri: &str, location: &Location) -> Result<Value> {
    let started = Instant::now();
    let rows = match location {
        #[cfg(feature = "sqlite")]
        Location::Sqlite(path) => sqlite_floor(path)?,
        #[cfg(feature = "lance")]
        Location::Lance { uri: dataset, .. } => ctxlog_lance::bench::raw_scan(dataset, options_for(location)).await?,
        #[allow(unreachable_patterns)]
        _ => bail!("{uri}: backend not compiled into ctxlog-bench"),
    };
    Ok(json!({"seconds": started.elapsed().as_secs_f64(), "rows": rows}))
}

/// The same columns the projector reads, by the plainest SQL, touching every value.
#[cfg(feature = "sqlite")]
fn sqlite_floor(path: &Path) -> Result<u64> {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut stmt = conn.prepare("SELECT shard_no, seq, epoch, hlc, kind, session_no, content_hash, id FROM entries")?;
    let mut rows = stmt.query([])?;
    let (mut n, mut touched) = (0u64, 0u64);
    while let Some(r) = rows.next()? {
        touched = touched
            .wrapping_add(r.get::<_, i64>(1)? as u64)
            .wrapping_add(r.get_ref(6)?.as_blob()?.len() as u64)
            .wrapping_add(r.get_ref(7)?.as_str()?.len() as u64)
            .wrapping_add(r.get::<_, i64>(3)? as u64);
        n += 1;
    }
    std::hint::black_box(touched);
    Ok(n)
}

async fn append(
    uri: &str,
    location: &Location,
    writer: &str,
    batch: usize,
    records: usize,
    seed: u64,
) -> Result<Value> {
    let store = measured::open(uri, location).await?;
    let w = Workload {
        entries: records,
        writers: 1,
        bots: 10,
        sessions_per_bot: 100,
        seed,
    };
    let recs = w.records(0, writer);
    let mut shard = store.open_shard(&WriterId::new(writer)?).await?;
    let mut latencies_us = Vec::with_capacity(records / batch + 1);
    let started = Instant::now();
    for chunk in recs.chunks(batch) {
        let t = Instant::now();
        shard.append(chunk.to_vec()).await?;
        latencies_us.push(t.elapsed().as_micros() as u64);
    }
    let seconds = started.elapsed().as_secs_f64();
    shard.close().await?;
    Ok(json!({
        "records": records,
        "batch": batch,
        "seconds": seconds,
        "latencies_us": latencies_us,
    }))
}

async fn copy(location: &Location, storage_options: &[String], to: &Path) -> Result<Value> {
    match location {
        #[cfg(feature = "lance")]
        Location::Lance {
            uri,
            storage_options: from_uri,
        } => {
            let mut opts = from_uri.clone();
            for o in storage_options {
                let (k, v) = o.split_once('=').with_context(|| format!("`{o}` is not KEY=VALUE"))?;
                opts.push((k.to_string(), v.to_string()));
            }
            let (objects, bytes) = ctxlog_lance::bench::copy_to_local(uri, opts, to).await?;
            Ok(json!({"objects": objects, "bytes": bytes}))
        }
        #[cfg(feature = "sqlite")]
        Location::Sqlite(path) => {
            let _ = storage_options;
            let (path, to) = (path.clone(), to.to_path_buf());
            let pages =
                tokio::task::spawn_blocking(move || ctxlog_sqlite::copy_store(&path, &to, Duration::from_secs(3600)))
                    .await??;
            Ok(json!({"pages": pages}))
        }
        #[allow(unreachable_patterns)]
        other => {
            let _ = (storage_options, to);
            bail!("copy: the {} backend is not compiled into this build", other.backend())
        }
    }
}

/// Shards and generations (Lance); `null` elsewhere.
async fn layout(location: &Location) -> Value {
    match location {
        #[cfg(feature = "lance")]
        Location::Lance { uri, .. } => ctxlog_lance::bench::layout(uri, options_for(location))
            .await
            .map(|(shards, pending, total)| json!({"shards": shards, "generations_unfolded": pending, "generations": total}))
            .unwrap_or(Value::Null),
        _ => Value::Null,
    }
}

/// The handles a measurement opens: for Lance, every object-store request passes through
/// one process-wide injector that counts requests by kind and bytes read and, with
/// `--latency-ms`, delays each request.
mod measured {
    use std::sync::{Arc, OnceLock};

    use anyhow::Result;
    use ctxlog::{Location, Store};
    use serde_json::{Value, json};

    #[cfg(feature = "lance")]
    static REQUESTS: OnceLock<Arc<ctxlog_lance::faults::Faults>> = OnceLock::new();
    #[cfg(not(feature = "lance"))]
    static REQUESTS: OnceLock<()> = OnceLock::new();

    pub(super) fn init(latency_ms: f64) {
        #[cfg(feature = "lance")]
        {
            use ctxlog_lance::faults::{Action, Faults, Latency, Op, Rule};
            let f = Faults::new(0);
            if latency_ms > 0.0 {
                let d = std::time::Duration::from_secs_f64(latency_ms / 1000.0);
                f.add(Rule::new(&Op::ALL, Action::Delay(Latency::Fixed(d))));
            }
            let _ = REQUESTS.set(f);
        }
        #[cfg(not(feature = "lance"))]
        {
            let _ = (latency_ms, REQUESTS.set(()));
        }
    }

    pub(super) async fn open(uri: &str, location: &Location) -> Result<Arc<dyn Store>> {
        open_with(uri, location, false).await
    }

    /// [`open`], reading projection snapshots when `snapshots` (a cold start).
    pub(super) async fn open_with(uri: &str, location: &Location, snapshots: bool) -> Result<Arc<dyn Store>> {
        let with = |o: ctxlog::StoreOptions| o.with_read_snapshots(snapshots);
        match location {
            #[cfg(feature = "lance")]
            Location::Lance { uri: dataset, .. } => Ok(Arc::new(
                ctxlog_lance::LanceStore::open_with_faults(
                    dataset,
                    with(super::options_for(location)),
                    REQUESTS.get().cloned(),
                )
                .await?,
            )),
            _ => Ok(ctxlog::open(uri, with(super::options())).await?),
        }
    }

    /// Requests so far, by kind.
    pub(super) fn snapshot() -> std::collections::BTreeMap<String, u64> {
        #[cfg(feature = "lance")]
        if let Some(f) = REQUESTS.get() {
            return f
                .requests_by_op()
                .into_iter()
                .map(|(op, n)| (op.as_str().to_string(), n))
                .collect();
        }
        std::collections::BTreeMap::new()
    }

    /// Requests since `before`, by kind (kinds with none left out).
    pub(super) fn since(before: &std::collections::BTreeMap<String, u64>) -> Value {
        let now = snapshot();
        let diff: std::collections::BTreeMap<&String, u64> = now
            .iter()
            .map(|(k, n)| (k, n - before.get(k).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect();
        json!(diff)
    }

    /// Read requests (get, head, list) so far; `null` where nothing counts them (SQLite).
    pub(super) fn reads() -> Value {
        let s = snapshot();
        if s.is_empty() {
            return Value::Null;
        }
        json!(
            ["get", "head", "list"]
                .iter()
                .map(|k| s.get(*k).copied().unwrap_or(0))
                .sum::<u64>()
        )
    }

    /// Bytes the object store returned so far (0 where nothing counts them: SQLite).
    pub(super) fn bytes_read() -> u64 {
        #[cfg(feature = "lance")]
        if let Some(f) = REQUESTS.get() {
            return f.bytes_read();
        }
        0
    }

    /// Every request so far by kind, and bytes read; `null` for SQLite.
    pub(super) fn requests() -> Value {
        #[cfg(feature = "lance")]
        if let Some(f) = REQUESTS.get()
            && f.requests() > 0
        {
            return json!({"by_kind": snapshot(), "total": f.requests(), "bytes_read": f.bytes_read()});
        }
        Value::Null
    }
}

fn files_of(location: &Location) -> Vec<PathBuf> {
    let root = match location {
        Location::Sqlite(p) => {
            let mut out = vec![p.clone()];
            for ext in ["-wal", "-shm"] {
                out.push(PathBuf::from(format!("{}{ext}", p.display())));
            }
            return out.into_iter().filter(|p| p.exists()).collect();
        }
        Location::Lance { uri, .. } => PathBuf::from(uri.strip_prefix("file://").unwrap_or(uri)),
        // A backend the bench does not know: no files it could name.
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

fn store_bytes(location: &Location) -> u64 {
    files_of(location)
        .iter()
        .filter_map(|p| p.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Cold cache: write back, then ask the kernel to drop every page of the store's files.
fn drop_from_page_cache(location: &Location) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    for f in files_of(location) {
        let file = std::fs::File::open(&f).with_context(|| format!("open {}", f.display()))?;
        // SAFETY: a valid open descriptor; offset 0 and length 0 mean the whole file.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            bail!("posix_fadvise({}) failed: {rc}", f.display());
        }
    }
    Ok(())
}

fn peak_rss_kb() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
        usage.ru_maxrss as u64
    } else {
        0
    }
}
