//! `ctxlog-chaos`: the processes of the chaos soak (`cargo xtask chaos`), built on the
//! library.
//!
//! - `write`: one writer. Appends batches with caller-chosen ids and, after each
//!   acknowledgement, records the ids, content hashes, session, shard, epoch and seqs it was
//!   promised in an ack log (synced before going on). An indeterminate error: reopen, retry
//!   the same ids. Fenced: exit 3 (a successor took over). With `--faults` (Lance), its
//!   object store injects seeded faults of every kind. With `--hold-projector`, the process
//!   also holds a projector on the same store (opened before or after its shard, as a server
//!   holds both) and reads every few acknowledged batches back through it. Most batches go to
//!   a few hot sessions; some to a cold session written once, which retention may end. A
//!   writer that holds a projector now and then writes a summary of a hot session instead
//!   (rule 21): its coverage is what its projector read, and it observes that view's clock
//!   first (again before a retry, whose handle is new).
//! - `read`: refreshes a projector until stdin closes; a hot session's record never leaves
//!   its view.
//! - `compact`: one compaction pass.
//! - `check`: the verdict ([`judge`]): every acknowledged id is live with the acknowledged
//!   content (or, in a cold session, ended by a maintenance tombstone), the only conflicts
//!   are those the ack logs explain, two fresh readers agree byte for byte — also on every
//!   hot session's context view, which holds every live record its governing summary does
//!   not cover, and which is the reference model's view of every entry in the store (the
//!   same governing summary, entries and coverage).
//!
//! Every operation runs under the store's deadline and, around it, a watchdog: an
//! operation that outlives its deadline by more than the grace counts as a hang.

mod judge;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ctxlog::{CompactOptions, Error, Record, Shard, Store, StoreOptions, WriterId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

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
        /// Also hold a projector on the store, opened before or after the shard.
        #[arg(long, value_enum, default_value_t = Hold::None)]
        hold_projector: Hold,
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
        /// Tombstones retention passes acknowledged (all must be stored).
        #[arg(long, default_value_t = 0)]
        retained: u64,
    },
}

/// Whether a writer process also holds a projector, and which handle it opens first.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Hold {
    None,
    ProjectorFirst,
    ShardFirst,
}

/// Acknowledged batches between two reads through a writer's own projector.
const READ_BACK_EVERY: u64 = 4;

/// A writer that holds a projector writes a summary instead of a batch one time in this many.
const SUMMARY_ONE_IN: u32 = 16;

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
    let options = StoreOptions::default().with_timeout(Duration::from_secs_f64(cli.timeout));
    match cli.cmd {
        Cmd::Write {
            writer,
            acks,
            stats,
            faults,
            batches,
            hold_projector,
        } => {
            let run = WriteRun {
                writer: &writer,
                acks: &acks,
                stats: &stats,
                with_faults: faults,
                batches,
                hold: hold_projector,
            };
            Box::pin(write(&cli.store, options, cli.seed, run)).await
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
        Cmd::Check { acks, retained } => Box::pin(check(&cli.store, options, &acks, retained)).await,
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
    read_backs: u64,
    read_errors: u64,
    summaries: u64,
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
            "read_backs": self.read_backs,
            "read_errors": self.read_errors,
            "summaries": self.summaries,
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
            let options = options.with_storage_options(storage_options);
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
            Faults(ctxlog_lance::faults::Faults::soak(seed))
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
fn record(id: &str, session: &str) -> Record {
    // Cold sessions have a bot of their own: retention is run for that bot only, so that it
    // never ends a hot session that happens to go quiet (on a slow object store it may).
    let bot = if session.starts_with(judge::COLD) {
        judge::COLD_BOT
    } else {
        "chaos"
    };
    let mut r = Record::text(id, bot, session, "user", format!("message {id}"));
    r.metadata = Some(json!({"id": id}));
    r
}

/// What one writer process does.
struct WriteRun<'a> {
    writer: &'a str,
    acks: &'a Path,
    stats: &'a Path,
    with_faults: bool,
    batches: u64,
    hold: Hold,
}

/// A writer's handles: its shard, and the projector it holds beside it (if any).
struct Handles {
    shard: Box<dyn Shard>,
    projector: Option<Box<dyn ctxlog::Projector>>,
}

/// Open the store and the writer's handles, in the order `hold` says.
async fn open_handles(
    uri: &str,
    options: StoreOptions,
    faults: Option<&Faults>,
    writer: &WriterId,
    hold: Hold,
) -> ctxlog::Result<Handles> {
    let store = open(uri, options, faults).await?;
    let mut projector = (hold != Hold::None).then(|| store.projector());
    if let (Hold::ProjectorFirst, Some(p)) = (hold, projector.as_mut()) {
        p.refresh().await?;
    }
    let shard = store.open_shard(writer).await?;
    if let (Hold::ShardFirst, Some(p)) = (hold, projector.as_mut()) {
        p.refresh().await?;
    }
    Ok(Handles { shard, projector })
}

/// Exit code of a writer whose own projector did not show a batch it had acknowledged.
const EXIT_READ_BACK_MISSED: u8 = 5;

async fn write(uri: &str, options: StoreOptions, seed: u64, run: WriteRun<'_>) -> Result<u8> {
    let WriteRun {
        writer,
        acks,
        stats,
        with_faults,
        batches,
        hold,
    } = run;
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
    let mut handles: Option<Handles> = None;
    let mut pending: Option<(String, Vec<Record>)> = None;
    let mut n = 0u64;
    while c.acks < batches {
        if handles.is_none() {
            let opened = watch(
                deadline * 3,
                Box::pin(open_handles(uri, options.clone(), faults.as_ref(), &writer_id, hold)),
            )
            .await;
            match opened {
                Err(e) => {
                    c.hangs += 1;
                    c.save(stats);
                    return Err(e);
                }
                Ok(Ok(h)) => {
                    c.reopens += 1;
                    handles = Some(h);
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
        // Its first batch too, so that a short run on a slow store writes summaries at all.
        let summarise =
            hold != Hold::None && pending.is_none() && (c.summaries == 0 || rng.random_range(0..SUMMARY_ONE_IN) == 0);
        let (session, batch) = match pending.take() {
            Some(p) => p,
            None if summarise => {
                n += 1;
                let session = format!("s{}", rng.random_range(0..8));
                let p = handles.as_mut().and_then(|h| h.projector.as_mut()).expect("held");
                match watch(deadline, p.refresh()).await? {
                    Ok(_) => {}
                    Err(e) if e.is_definite() => {
                        c.read_errors += 1;
                        continue;
                    }
                    Err(e) => bail!("a refresh failed with an indeterminate error: {e}"),
                }
                let id = format!("{writer}-{incarnation}-{n}");
                let summary = Record::summary(&id, "chaos", &session, format!("summary {id}"), p.checkpoint());
                c.summaries += 1;
                (session, vec![summary])
            }
            None => {
                let k = rng.random_range(1..=20);
                // One batch in eight opens a cold session, never written again.
                let session = if rng.random_range(0..8) == 0 {
                    format!("{}{writer}-{incarnation}-{}", judge::COLD, n + 1)
                } else {
                    format!("s{}", rng.random_range(0..8))
                };
                let batch = (0..k)
                    .map(|_| {
                        n += 1;
                        record(&format!("{writer}-{incarnation}-{n}"), &session)
                    })
                    .collect();
                (session, batch)
            }
        };
        let h = handles.as_mut().expect("opened above");
        // A summary follows the clock of the view it covers (rule 21), also when it is
        // retried through a reopened handle: the projector's view holds at least that view.
        if batch[0].kind == ctxlog::Kind::Summary
            && let Some(p) = h.projector.as_mut()
        {
            match watch(deadline, p.refresh()).await? {
                Ok(_) => h.shard.observe(p.max_hlc())?,
                Err(e) if e.is_definite() => {
                    c.read_errors += 1;
                    pending = Some((session, batch));
                    continue;
                }
                Err(e) => bail!("a refresh failed with an indeterminate error: {e}"),
            }
        }
        c.appends += 1;
        let outcome = match watch(deadline, h.shard.append(batch.clone())).await {
            Ok(o) => o,
            Err(e) => {
                c.hangs += 1;
                c.save(stats);
                return Err(e);
            }
        };
        match outcome {
            Ok(ack) => {
                let line = judge::Ack {
                    hashes: batch.iter().map(|r| r.content_hash().to_hex()).collect(),
                    ids: ack.ids.clone(),
                    session: session.clone(),
                    shard: ack.shard.to_string(),
                    epoch: ack.epoch,
                    first_seq: ack.first_seq,
                    last_seq: ack.last_seq,
                };
                // The promise is on record before the writer goes on.
                writeln!(log, "{}", line.to_json()).and_then(|_| log.sync_data())?;
                c.acks += 1;
                c.acked_records += batch.len() as u64;
                if c.acks % READ_BACK_EVERY == 0
                    && let Some(p) = h.projector.as_mut()
                {
                    // Read the batch back through this process's other handle.
                    match watch(deadline, p.refresh()).await? {
                        Ok(_) => {
                            c.read_backs += 1;
                            let last = batch.last().expect("batches are not empty");
                            match watch(deadline, p.get(&last.bot_id, &last.id)).await? {
                                Ok(Some(_)) => {}
                                Ok(None) if session.starts_with(judge::COLD) => {} // ended by retention
                                Ok(None) => {
                                    eprintln!("the writer's own projector does not show {}", last.id);
                                    c.save(stats);
                                    return Ok(EXIT_READ_BACK_MISSED);
                                }
                                Err(e) if e.is_definite() => c.read_errors += 1,
                                Err(e) => bail!("a read failed with an indeterminate error: {e}"),
                            }
                        }
                        Err(e) if e.is_definite() => c.read_errors += 1,
                        Err(e) => bail!("a refresh failed with an indeterminate error: {e}"),
                    }
                }
            }
            Err(Error::Fenced { .. }) => {
                c.save(stats);
                return Ok(3);
            }
            Err(e) if e.is_definite() => {
                c.definite += 1;
                // Nothing was written; retry the same records (a retry is safe either way).
                pending = Some((session, batch));
            }
            Err(_) => {
                // Unknown outcome: reopen and retry the same ids (rule 4).
                c.indeterminate += 1;
                pending = Some((session, batch));
                handles = None;
            }
        }
        if let Some(f) = &faults {
            c.faults = f.injected();
        }
        if c.appends % 10 == 0 {
            c.save(stats);
        }
    }
    if let Some(h) = handles {
        let _ = watch(deadline, h.shard.close()).await;
    }
    c.save(stats);
    Ok(0)
}

/// Refresh one projector until stdin closes. Every refresh either fails with a definite
/// error or gives a view that holds every record of a hot session the previous one held: a
/// view never loses a record (rule 3), whatever the faults; only retention ends a (cold)
/// session, which the final check verifies.
async fn read(uri: &str, options: StoreOptions, seed: u64, stats: &Path, with_faults: bool) -> Result<u8> {
    let deadline = options.timeout;
    let faults = with_faults.then(|| Faults::new(seed));
    let store = watch(deadline, open(uri, options, faults.as_ref())).await??;
    let mut p = store.projector();
    let (mut refreshes, mut errors) = (0u64, 0u64);
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        let _ = tx.send(());
    });
    let save = |refreshes: u64, errors: u64, seen: usize, faults: &Option<Faults>| {
        let injected = faults.as_ref().map(Faults::injected).unwrap_or_default();
        let v = json!({"refreshes": refreshes, "errors": errors, "hot_ids_seen": seen, "faults": injected});
        let _ = std::fs::write(stats, v.to_string());
    };
    let started = Instant::now();
    while rx.try_recv().is_err() && started.elapsed() < Duration::from_secs(24 * 3600) {
        match watch(deadline, p.refresh()).await? {
            Ok(_) => {
                refreshes += 1;
                let hot: std::collections::HashSet<String> = p
                    .projection()
                    .records
                    .into_iter()
                    .filter(|r| !r.session_id.starts_with(judge::COLD))
                    .map(|r| r.id)
                    .collect();
                if let Some(gone) = seen.iter().find(|id| !hot.contains(*id)) {
                    bail!(
                        "a refreshed view lost a record: {gone} (it held {}, now {})",
                        seen.len(),
                        hot.len()
                    );
                }
                seen = hot;
            }
            Err(e) if e.is_definite() => errors += 1,
            Err(e) => bail!("a read failed with an indeterminate error: {e}"),
        }
        save(refreshes, errors, seen.len(), &faults);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    save(refreshes, errors, seen.len(), &faults);
    Ok(0)
}

/// The final check: read the store with fresh handles and [`judge::judge`] it against every
/// ack log in `acks`; `retained` tombstones were acknowledged by retention passes.
async fn check(uri: &str, options: StoreOptions, acks: &Path, retained: u64) -> Result<u8> {
    let deadline = options.timeout;
    let mut promised = Vec::new();
    for entry in std::fs::read_dir(acks)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "acks") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            if let Some(ack) = judge::Ack::parse(line) {
                promised.push(ack.with_context(|| format!("in {}", path.display()))?);
            }
        }
    }
    // Two fresh readers.
    let mut views = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..2 {
        let store = watch(deadline, ctxlog::open(uri, options.clone())).await??;
        let mut p = store.projector();
        watch(deadline, p.refresh()).await??;
        views.push(p.projection());
        readers.push(p);
    }
    // Every hot session's context view (rule 21), through both readers.
    let mut contexts = [Vec::new(), Vec::new()];
    let mut context_lost = Vec::new();
    let mut first_views = Vec::new();
    for (i, p) in readers.iter_mut().enumerate() {
        for s in 0..8 {
            let session = format!("s{s}");
            let view = watch(deadline, p.context("chaos", &session)).await??;
            let full = watch(deadline, p.session("chaos", &session)).await??;
            let governing = view
                .summary
                .and_then(|k| full.iter().find(|e| e.key() == k))
                .and_then(|e| e.record.covers.clone());
            let shown: std::collections::BTreeSet<_> = view.entries.iter().map(|e| e.key()).collect();
            for e in full.iter().filter(|e| e.record.kind != ctxlog::Kind::Summary) {
                let covered = governing.as_ref().is_some_and(|c| e.seq <= c.get(e.shard));
                if !covered && !shown.contains(&e.key()) {
                    context_lost.push(e.record.id.clone());
                }
            }
            contexts[i].push(format!("{view:?}"));
            if i == 0 {
                first_views.push((session, view));
            }
        }
    }
    let mut found = judge::Found {
        readers_identical: views[0].canonical_json() == views[1].canonical_json() && contexts[0] == contexts[1],
        live: views[0]
            .records
            .iter()
            .map(|r| (r.id.clone(), r.content_hash.to_hex()))
            .collect(),
        ..judge::Found::default()
    };
    let store = watch(deadline, ctxlog::open(uri, options)).await??;
    found.conflicts = watch(deadline, store.conflict_discovery().conflicts(None)).await??;
    // Every entry of every shard (nothing writes now): the reference model's input. What
    // retention ended: the maintenance shard's tombstones, every one of them.
    let mut maintenance_entries = 0u64;
    let mut all = Vec::new();
    for shard in watch(deadline, store.shards()).await?? {
        let maintenance = shard.writer.as_str() == ctxlog::MAINTENANCE_WRITER;
        let mut after = 0;
        loop {
            let page = watch(deadline, store.read_shard(shard.shard, after, 10_000)).await??;
            let Some(last) = page.last() else { break };
            after = last.seq;
            if maintenance {
                maintenance_entries += page.len() as u64;
                found.retained.extend(
                    page.iter()
                        .filter(|e| e.record.kind == ctxlog::Kind::Tombstone)
                        .map(|e| e.record.id.clone()),
                );
            }
            all.extend(page);
        }
    }
    // The governing summary and the view of every hot session are the reference model's
    // (rule 21), not only what two readers of the implementation agree on.
    let mut context_differs = Vec::new();
    for (session, view) in &first_views {
        let model = ctxlog::testing::model::context_view(&all, "chaos", session);
        let keys = |v: &ctxlog::ContextView| v.entries.iter().map(|e| e.key()).collect::<Vec<_>>();
        if model.summary != view.summary || keys(&model) != keys(view) || model.covered != view.covered {
            context_differs.push(json!({
                "session": session,
                "governing": format!("{:?}", view.summary),
                "model_governing": format!("{:?}", model.summary),
                "entries": view.entries.len(),
                "model_entries": model.entries.len(),
            }));
        }
    }
    let mut verdict = judge::judge(&promised, &found);
    verdict["context_views_checked"] = json!(16);
    verdict["governing_summaries"] = json!(first_views.iter().filter(|(_, v)| v.summary.is_some()).count());
    if !context_differs.is_empty() {
        verdict["ok"] = json!(false);
        verdict["context_differs_from_model"] = json!(context_differs);
    }
    if !context_lost.is_empty() {
        verdict["ok"] = json!(false);
        verdict["context_lost"] = json!(context_lost.len());
        verdict["context_lost_sample"] = json!(&context_lost[..context_lost.len().min(5)]);
    }
    verdict["retained_acked"] = json!(retained);
    verdict["maintenance_entries"] = json!(maintenance_entries);
    if maintenance_entries < retained {
        verdict["ok"] = json!(false);
        verdict["maintenance_lost"] = json!(retained - maintenance_entries);
    }
    let ok = verdict["ok"] == true;
    println!("{verdict}");
    Ok(if ok { 0 } else { 1 })
}
