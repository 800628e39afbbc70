//! `ctxlog-chaos`: the processes of the chaos soak (`cargo xtask chaos`), built on the
//! library.
//!
//! - `write`: one writer. Appends batches with caller-chosen ids and, after each
//!   acknowledgement, records the ids and content hashes it was promised in an ack log
//!   (synced before going on). An indeterminate error: reopen, retry the same ids. Fenced:
//!   exit 3 (a successor took over). With `--faults` (Lance), its object store injects
//!   seeded faults of every kind.
//! - `read`: refreshes a projector until stdin closes.
//! - `compact`: one compaction pass.
//! - `check`: the verdict: every acknowledged id is live exactly once with the acknowledged
//!   content, seqs are dense, the only conflicts are stale epochs of fenced writers, two
//!   fresh readers agree byte for byte.
//!
//! Every operation runs under the store's deadline and, around it, a watchdog: an
//! operation that outlives its deadline by more than the grace counts as a hang.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ctxlog::{CompactOptions, ConflictKind, Error, Record, Shard, Store, StoreOptions, WriterId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    /// Store URI (storage options in its query).
    #[arg(long)]
    store: String,
    /// Deadline of every operation, in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Append until killed or until `--batches` batches are acknowledged.
    Write {
        #[arg(long)]
        writer: String,
        /// The ack log this process appends to.
        #[arg(long)]
        acks: PathBuf,
        /// Where this process keeps its counters (rewritten as it goes).
        #[arg(long)]
        stats: PathBuf,
        /// Inject seeded object-store faults (Lance).
        #[arg(long)]
        faults: bool,
        #[arg(long, default_value_t = u64::MAX)]
        batches: u64,
    },
    /// Refresh a projector until stdin closes.
    Read {
        #[arg(long)]
        stats: PathBuf,
        /// Inject seeded object-store faults (Lance).
        #[arg(long)]
        faults: bool,
    },
    /// One compaction pass.
    Compact,
    /// Check the store against every ack log in a directory.
    Check {
        #[arg(long)]
        acks: PathBuf,
    },
}

/// The grace past a deadline before an operation counts as hung.
const GRACE: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ctxlog-chaos: no runtime: {e}");
            return std::process::ExitCode::from(4);
        }
    };
    let code = rt.block_on(run(cli));
    rt.shutdown_timeout(Duration::from_millis(200));
    match code {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("ctxlog-chaos: {e:#}");
            std::process::ExitCode::from(4)
        }
    }
}

async fn run(cli: Cli) -> Result<u8> {
    let options = StoreOptions {
        timeout: Duration::from_secs_f64(cli.timeout),
        ..StoreOptions::default()
    };
    match cli.cmd {
        Cmd::Write {
            writer,
            acks,
            stats,
            faults,
            batches,
        } => {
            Box::pin(write(
                &cli.store, options, cli.seed, &writer, &acks, &stats, faults, batches,
            ))
            .await
        }
        Cmd::Read { stats, faults } => Box::pin(read(&cli.store, options, cli.seed, &stats, faults)).await,
        Cmd::Compact => {
            let store = Box::pin(ctxlog::open(&cli.store, options.clone())).await?;
            let r = watch(options.timeout, Box::pin(store.compact(&CompactOptions::default()))).await??;
            println!(
                "{}",
                json!({"merged": r.generations_merged, "remaining": r.generations_remaining})
            );
            Ok(0)
        }
        Cmd::Check { acks } => Box::pin(check(&cli.store, options, &acks)).await,
    }
}

/// Run `fut` under the watchdog: past its deadline plus the grace, it is a hang.
async fn watch<T>(deadline: Duration, fut: impl std::future::Future<Output = T>) -> Result<T> {
    match tokio::time::timeout(deadline + GRACE, fut).await {
        Ok(v) => Ok(v),
        Err(_) => bail!("HANG: an operation outlived its deadline of {deadline:?} by more than {GRACE:?}"),
    }
}

/// Counters a writer keeps, written to its stats file as it goes (a killed process leaves
/// its last counts behind).
#[derive(Default)]
struct Counters {
    appends: u64,
    acks: u64,
    acked_records: u64,
    definite: u64,
    indeterminate: u64,
    reopens: u64,
    hangs: u64,
    faults: BTreeMap<String, u64>,
}

impl Counters {
    fn save(&self, path: &Path) {
        let v = json!({
            "appends": self.appends,
            "acks": self.acks,
            "acked_records": self.acked_records,
            "definite_errors": self.definite,
            "indeterminate_errors": self.indeterminate,
            "reopens": self.reopens,
            "hangs": self.hangs,
            "faults": self.faults,
        });
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, v.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}

/// Open the store, with a seeded fault injector when asked (Lance).
async fn open(uri: &str, options: StoreOptions, faults: Option<&Faults>) -> ctxlog::Result<Arc<dyn Store>> {
    match faults {
        None => ctxlog::open(uri, options).await,
        #[cfg(feature = "lance")]
        Some(f) => {
            let (base, storage_options) = match ctxlog::Location::parse(uri)? {
                ctxlog::Location::Lance { uri, storage_options } => (uri, storage_options),
                _ => return ctxlog::open(uri, options).await,
            };
            let options = StoreOptions {
                storage_options,
                ..options
            };
            Ok(Arc::new(
                ctxlog_lance::LanceStore::open_with_faults(&base, options, Some(f.0.clone())).await?,
            ))
        }
        #[cfg(not(feature = "lance"))]
        Some(_) => ctxlog::open(uri, options).await,
    }
}

/// The seeded faults a writer's object store injects (Lance).
struct Faults(#[cfg(feature = "lance")] Arc<ctxlog_lance::faults::Faults>);

impl Faults {
    fn new(seed: u64) -> Self {
        #[cfg(feature = "lance")]
        {
            use ctxlog_lance::faults::{Action, Latency, Op, Rule, When};
            let f = ctxlog_lance::faults::Faults::new(seed);
            let f: Arc<ctxlog_lance::faults::Faults> = f;
            let writes = [Op::Put, Op::PutIfAbsent, Op::Multipart];
            let reads = [Op::Get, Op::Head, Op::List];
            f.add(Rule::new(&writes, Action::FailBefore).when(When::Probability(0.02)));
            f.add(Rule::new(&writes, Action::FailAfter).when(When::Probability(0.01)));
            f.add(
                Rule::new(&[Op::PutIfAbsent], Action::Stall)
                    .path("/wal/")
                    .when(When::Probability(0.003)),
            );
            f.add(Rule::new(&reads, Action::Throttle).when(When::Probability(0.01)));
            f.add(
                Rule::new(
                    &Op::ALL,
                    Action::Delay(Latency::Uniform(Duration::ZERO, Duration::from_millis(20))),
                )
                .when(When::Probability(0.1)),
            );
            Faults(f)
        }
        #[cfg(not(feature = "lance"))]
        {
            let _ = seed;
            Faults()
        }
    }

    fn injected(&self) -> BTreeMap<String, u64> {
        #[cfg(feature = "lance")]
        {
            self.0
                .injected()
                .into_iter()
                .map(|((op, action), n)| (format!("{}:{action}", op.as_str()), n))
                .collect()
        }
        #[cfg(not(feature = "lance"))]
        BTreeMap::new()
    }
}

/// The record with id `id`: its content is a function of the id, so a retry is a duplicate.
fn record(id: &str, session: usize) -> Record {
    let mut r = Record::text(id, "chaos", format!("s{session}"), "user", format!("message {id}"));
    r.metadata = Some(json!({"id": id}));
    r
}

#[allow(clippy::too_many_arguments)]
async fn write(
    uri: &str,
    options: StoreOptions,
    seed: u64,
    writer: &str,
    acks: &Path,
    stats: &Path,
    with_faults: bool,
    batches: u64,
) -> Result<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = with_faults.then(|| Faults::new(seed));
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(acks)
        .with_context(|| format!("open {}", acks.display()))?;
    let writer_id = WriterId::new(writer)?;
    let incarnation = std::process::id();
    let mut c = Counters::default();
    let deadline = options.timeout;
    let mut shard: Option<Box<dyn Shard>> = None;
    let mut pending: Option<Vec<Record>> = None;
    let mut n = 0u64;
    while c.acks < batches {
        if shard.is_none() {
            let opened = watch(
                deadline * 2,
                Box::pin(async {
                    let store = open(uri, options.clone(), faults.as_ref()).await?;
                    store.open_shard(&writer_id).await
                }),
            )
            .await;
            match opened {
                Err(e) => {
                    c.hangs += 1;
                    c.save(stats);
                    return Err(e);
                }
                Ok(Ok(s)) => {
                    c.reopens += 1;
                    shard = Some(s);
                }
                Ok(Err(Error::Fenced { .. })) => {
                    c.save(stats);
                    return Ok(3);
                }
                Ok(Err(_)) => {
                    c.indeterminate += 1;
                    tokio::time::sleep(Duration::from_millis(rng.random_range(5..50))).await;
                    continue;
                }
            }
        }
        let batch = pending.take().unwrap_or_else(|| {
            let k = rng.random_range(1..=20);
            let session = rng.random_range(0..8);
            (0..k)
                .map(|_| {
                    n += 1;
                    record(&format!("{writer}-{incarnation}-{n}"), session)
                })
                .collect()
        });
        let s = shard.as_mut().expect("opened above");
        c.appends += 1;
        let outcome = match watch(deadline, s.append(batch.clone())).await {
            Ok(o) => o,
            Err(e) => {
                c.hangs += 1;
                c.save(stats);
                return Err(e);
            }
        };
        match outcome {
            Ok(ack) => {
                let hashes: Vec<String> = batch.iter().map(|r| r.content_hash().to_hex()).collect();
                let line = json!({"ids": ack.ids, "hashes": hashes, "shard": ack.shard.to_string(),
                                  "first_seq": ack.first_seq, "last_seq": ack.last_seq});
                // The promise is on record before the writer goes on.
                writeln!(log, "{line}").and_then(|_| log.sync_data())?;
                c.acks += 1;
                c.acked_records += batch.len() as u64;
            }
            Err(Error::Fenced { .. }) => {
                c.save(stats);
                return Ok(3);
            }
            Err(e) if e.is_definite() => {
                c.definite += 1;
                // Nothing was written; retry the same records (a retry is safe either way).
                pending = Some(batch);
            }
            Err(_) => {
                // Unknown outcome: reopen and retry the same ids (rule 4).
                c.indeterminate += 1;
                pending = Some(batch);
                shard = None;
            }
        }
        if let Some(f) = &faults {
            c.faults = f.injected();
        }
        if c.appends % 10 == 0 {
            c.save(stats);
        }
    }
    if let Some(s) = shard {
        let _ = watch(deadline, s.close()).await;
    }
    c.save(stats);
    Ok(0)
}

/// Refresh one projector until stdin closes. Every refresh either fails with a definite
/// error or gives a view that holds everything the previous one held: a view never loses
/// a record (rule 3), whatever the faults.
async fn read(uri: &str, options: StoreOptions, seed: u64, stats: &Path, with_faults: bool) -> Result<u8> {
    let deadline = options.timeout;
    let faults = with_faults.then(|| Faults::new(seed));
    let store = watch(deadline, open(uri, options, faults.as_ref())).await??;
    let mut p = store.projector();
    let (mut refreshes, mut errors) = (0u64, 0u64);
    let mut seen: usize = 0;
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        let _ = tx.send(());
    });
    let save = |refreshes: u64, errors: u64, faults: &Option<Faults>| {
        let injected = faults.as_ref().map(Faults::injected).unwrap_or_default();
        let v = json!({"refreshes": refreshes, "errors": errors, "faults": injected});
        let _ = std::fs::write(stats, v.to_string());
    };
    let started = Instant::now();
    while rx.try_recv().is_err() && started.elapsed() < Duration::from_secs(24 * 3600) {
        match watch(deadline, p.refresh()).await? {
            Ok(_) => {
                refreshes += 1;
                let now = p.projection().records.len();
                if now < seen {
                    bail!("a refreshed view lost records: it held {seen}, now {now}");
                }
                seen = now;
            }
            Err(e) if e.is_definite() => errors += 1,
            Err(e) => bail!("a read failed with an indeterminate error: {e}"),
        }
        save(refreshes, errors, &faults);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    save(refreshes, errors, &faults);
    Ok(0)
}

async fn check(uri: &str, options: StoreOptions, acks: &Path) -> Result<u8> {
    let deadline = options.timeout;
    // What writers were promised.
    let mut promised: BTreeMap<String, String> = BTreeMap::new();
    let mut batches = 0u64;
    for entry in std::fs::read_dir(acks)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "acks") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            // A torn last line of a killed writer was never a promise (it was not synced).
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            batches += 1;
            let ids = v["ids"].as_array().context("ids")?;
            let hashes = v["hashes"].as_array().context("hashes")?;
            for (id, hash) in ids.iter().zip(hashes) {
                promised.insert(
                    id.as_str().context("id")?.to_string(),
                    hash.as_str().context("hash")?.to_string(),
                );
            }
        }
    }
    // Two fresh readers.
    let mut views = Vec::new();
    for _ in 0..2 {
        let store = watch(deadline, ctxlog::open(uri, options.clone())).await??;
        let mut p = store.projector();
        watch(deadline, p.refresh()).await??;
        views.push(p.projection());
    }
    let identical = views[0].canonical_json() == views[1].canonical_json();
    let live: BTreeMap<&str, String> = views[0]
        .records
        .iter()
        .map(|r| (r.id.as_str(), r.content_hash.to_hex()))
        .collect();
    let mut lost = Vec::new();
    let mut changed = Vec::new();
    for (id, hash) in &promised {
        match live.get(id.as_str()) {
            None => lost.push(id.clone()),
            Some(h) if h != hash => changed.push(id.clone()),
            Some(_) => {}
        }
    }
    let store = watch(deadline, ctxlog::open(uri, options)).await??;
    let conflicts = watch(deadline, store.conflict_discovery().conflicts(None)).await??;
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &conflicts {
        *by_kind.entry(c.kind().as_str()).or_default() += 1;
    }
    let unexpected: Vec<String> = conflicts
        .iter()
        .filter(|c| c.kind() != ConflictKind::StaleEpoch)
        .map(|c| format!("{c:?}"))
        .take(10)
        .collect();
    let ok = lost.is_empty() && changed.is_empty() && unexpected.is_empty() && identical;
    println!(
        "{}",
        json!({
            "ok": ok,
            "acked_batches": batches,
            "acked_ids": promised.len(),
            "live_ids": live.len(),
            "lost": lost.len(),
            "lost_examples": lost.iter().take(10).collect::<Vec<_>>(),
            "changed": changed.len(),
            "conflicts": by_kind,
            "unexpected_conflicts": unexpected,
            "readers_identical": identical,
        })
    );
    Ok(if ok { 0 } else { 1 })
}
