//! `ctxlog-serve-chaos`: the soak of what users deploy (`cargo xtask chaos --serve`).
//!
//! Three writer ids, each served by a `ctxlog serve` process on one store; one of them (the
//! *slow* one) has a small `--timeout` and is CPU-starved with SIGSTOP/SIGCONT bursts, so
//! that its refreshes and commits are cut short by their deadline. Clients append single
//! records, batches (some large), bot-wide batches, cold sessions, the same ids under two
//! bots, tombstones (`DELETE`) and summaries written from context views, through any replica,
//! with the Python client's retry rule (an answer that may have landed — `written: unknown`,
//! a timeout, a lost or client-cut connection — is retried with the same body) and a
//! deployment's (a fenced or unavailable replica: try another). Watchers on every replica,
//! on a session and on the whole store, disconnect at random and resume with
//! `Last-Event-ID`. Meanwhile: SIGKILL and SIGTERM of replicas, takeovers (a second process
//! of a writer id on another port, the first one sometimes stopped across the claim), the
//! slow replica's bursts, maintenance through `/v1/admin/…`, with `--faults` (Lance) the
//! library soak's object-store faults in every replica, and `/v1/shards` polled for the
//! shards' epochs. At the end: fence posts (a last record per watched session) that every
//! watcher must receive, what every replica serves, and a SIGTERM each. The verdict is
//! [`serve_judge::judge`] of that history; the summary (JSON, stdout) holds every check.

// A soak: it times its own history by the machine's clock.
#![allow(clippy::disallowed_methods)]

mod serve_http;
mod serve_judge;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use hyper::Method;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::serve_http::{Answer, Http};
use crate::serve_judge::{
    Attempt, EpochSeen, Final, History, Op, OpKind, Outcome, Process, Rec, Scope, Term, WatchEvent, Watcher,
};

#[derive(Parser)]
struct Cli {
    /// The `ctxlog` binary.
    #[arg(long)]
    ctxlog: PathBuf,
    /// Store URI (created if missing).
    #[arg(long)]
    store: String,
    /// Where replica logs and the history go.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `--timeout` of the replicas.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// `--timeout` of the slow replica.
    #[arg(long, default_value_t = 1.0)]
    slow_timeout: f64,
    /// Every replica's object store injects the soaks' seeded faults (Lance; the replicas
    /// must be built with `ctxlog-lance/testing`), each replica process its own seed.
    #[arg(long)]
    faults: bool,
}

/// Writer ids; the last one is the slow replica's.
const WRITERS: [&str; 3] = ["serve-w0", "serve-w1", "serve-w2"];
const SLOW: usize = 2;
const BOTS: [&str; 2] = ["alpha", "beta"];
const COLD_BOT: &str = "cold";
const HOT: [&str; 4] = ["s0", "s1", "s2", "s3"];
const CLIENTS: usize = 6;
/// How long a SIGTERMed replica may take to exit: a typical orchestrator's kill window.
const TERM_BOUND: Duration = Duration::from_secs(30);
/// How long a write is retried before it is given up as unknown.
const RETRY_FOR: Duration = Duration::from_secs(120);
/// How long a maintenance operation is asked again (a pass on a faulted store is long).
const MAINTENANCE_FOR: Duration = Duration::from_secs(240);
/// How long a replica may take, at the end, to be ready and to answer every final read.
const FINAL_PATIENCE: Duration = Duration::from_secs(120);
/// How long watchers may take to receive the fence posts.
const DRAIN: Duration = Duration::from_secs(90);
/// While draining, a watcher that received its fence posts stops after this long without
/// an event.
const QUIET: Duration = Duration::from_secs(5);

static START: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the soak began.
fn ms() -> u64 {
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A replica clients and watchers may use.
#[derive(Clone, Debug)]
struct Target {
    process: usize,
    slot: usize,
    addr: String,
    /// The newest process of its slot (an older one was taken over).
    newest: bool,
}

/// What clients, watchers and the fault loop share.
struct Shared {
    http: Http,
    targets: Mutex<Vec<Target>>,
    ops: Mutex<Vec<Op>>,
    epochs: Mutex<Vec<EpochSeen>>,
    counts: Mutex<BTreeMap<String, u64>>,
    /// The fence posts, once written: what every watcher must receive before it stops.
    posts: Mutex<Vec<Rec>>,
    stop_load: AtomicBool,
    draining: AtomicBool,
    stop_watch: AtomicBool,
    /// A request's deadline (beyond every replica's own).
    deadline: Duration,
}

impl Shared {
    fn count(&self, what: &str) {
        *self.counts.lock().unwrap().entry(what.to_string()).or_default() += 1;
    }

    fn pick(&self, rng: &mut StdRng) -> Option<Target> {
        let t = self.targets.lock().unwrap();
        (!t.is_empty()).then(|| t[rng.random_range(0..t.len())].clone())
    }

    /// The newest replica of `slot`, or any when it has none.
    fn home(&self, slot: usize, rng: &mut StdRng) -> Option<Target> {
        let found = self
            .targets
            .lock()
            .unwrap()
            .iter()
            .find(|t| t.slot == slot && t.newest)
            .cloned();
        found.or_else(|| self.pick(rng))
    }

    /// Add what `/metrics` of `addr` says of failed refreshes to the counts (a refresh cut
    /// short by its deadline is what the slow replica is for).
    async fn scrape(&self, addr: &str) {
        let url = format!("http://{addr}/metrics");
        let req = self.http.text(&url, self.deadline).await;
        for line in req.lines() {
            if let Some(n) = line.strip_prefix("refresh_errors_total ") {
                let n = n.trim().parse::<f64>().unwrap_or(0.0) as u64;
                *self.counts.lock().unwrap().entry("refresh_errors".into()).or_default() += n;
            }
        }
    }

    /// Record the shards' epochs `GET /v1/shards` of `addr` shows; the epoch of `writer`'s.
    async fn poll_shards(&self, addr: &str, writer: Option<&str>) -> Option<u64> {
        let answer = self
            .http
            .call(Method::GET, &format!("http://{addr}/v1/shards"), None, self.deadline)
            .await;
        let Answer::Status(200, Value::Array(shards)) = answer else {
            return None;
        };
        let at_ms = ms();
        let mut mine = None;
        let mut epochs = self.epochs.lock().unwrap();
        for s in shards {
            let (Some(shard), Some(epoch)) = (s["shard"].as_str(), s["epoch"].as_u64()) else {
                continue;
            };
            if Some(s["writer"].as_str().unwrap_or("")) == writer {
                mine = Some(epoch);
            }
            epochs.push(EpochSeen {
                at_ms,
                shard: shard.to_string(),
                epoch,
            });
        }
        mine
    }
}

/// One running `ctxlog serve`.
struct Proc {
    process: usize,
    addr: String,
    child: Child,
    pid: i32,
}

/// A writer id's processes: the one clients should use, and one it took over (fenced).
struct Slot {
    writer: &'static str,
    timeout: f64,
    current: Option<Proc>,
    old: Option<Proc>,
}

/// Every replica process, owned by the fault loop.
struct Cluster {
    ctxlog: PathBuf,
    store: String,
    dir: PathBuf,
    slots: Vec<Slot>,
    processes: Vec<Process>,
    terms: Vec<Term>,
    crashes: Vec<String>,
    /// Starts that failed (the last lines of their logs).
    start_failures: Vec<String>,
    /// The run's seed when the replicas inject object-store faults (`--faults`).
    faults: Option<u64>,
    /// Processes started so far (each start's faults are seeded apart).
    starts: u64,
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a child process id this soak started and has not reaped.
    unsafe {
        libc::kill(pid, sig);
    }
}

impl Cluster {
    /// Start a process for `slot` on a new port (see [`Cluster::start_once`]); one that
    /// cannot claim its shard in time (the process it takes over is stopped holding the
    /// store's lock, or the store is slow) exits, and is started again, a few times.
    async fn start(&mut self, sh: &Shared, slot: usize, pause: Option<(Duration, i32)>) -> Result<()> {
        let mut last = None;
        for attempt in 0..10 {
            match self.start_once(sh, slot, pause, attempt).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    sh.count("failed_starts");
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        // A writer id that cannot start is a finding, not the end of the soak: the slot is
        // tried again by the next reap, and judged at the end.
        self.crashes.push(format!(
            "{} could not start ten times: {:#}",
            self.slots[slot].writer,
            last.unwrap_or_else(|| anyhow::anyhow!("no start"))
        ));
        Ok(())
    }

    /// Start one process for `slot`; it becomes the slot's current one (the previous current
    /// one, if still running, its old one). With `pause`, the process `pause.1` (stopped)
    /// gets SIGCONT once the new one listens or exited, or after `pause.0`.
    /// From the fourth attempt on, the slow replica starts with the others' deadline: its
    /// claim may need longer than its own deadline on a loaded machine, and a slot that never
    /// starts would end the run's faults on that writer id (the failed starts are counted).
    async fn start_once(
        &mut self,
        sh: &Shared,
        slot: usize,
        pause: Option<(Duration, i32)>,
        attempt: usize,
    ) -> Result<()> {
        let writer = self.slots[slot].writer;
        let timeout = if attempt < 3 {
            self.slots[slot].timeout
        } else {
            self.slots.iter().map(|s| s.timeout).fold(0.0, f64::max)
        };
        // The index the process gets in the history if it starts (a failed start reuses it).
        let process = self.processes.len();
        // A log per start: a failed start's is kept (its faults are counted at the end).
        self.starts += 1;
        let log_path = self.dir.join(format!("{writer}-start{}.log", self.starts));
        let log = std::fs::File::create(&log_path)?;
        let mut child = Command::new(&self.ctxlog);
        if let Some(seed) = self.faults {
            // A seed per start: a start again with the same one would meet the same faults
            // at the same requests of its open.
            let seed = seed.wrapping_add(self.starts);
            #[cfg(feature = "lance")]
            child
                .env(ctxlog_lance::faults::ENV, seed.to_string())
                .env(ctxlog_lance::faults::UNTIL_ENV, storm_over(&self.dir));
            #[cfg(not(feature = "lance"))]
            bail!("--faults (seed {seed}) needs the `lance` feature");
        }
        let mut child = child
            .args(["--store", &self.store, "--timeout", &timeout.to_string()])
            .args(["serve", "--writer", writer, "--listen", "127.0.0.1:0"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("start ctxlog serve")?;
        let pid = child.id().context("pid")? as i32;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
        let line = {
            let first = async {
                tokio::time::timeout(Duration::from_secs(300), lines.next_line())
                    .await
                    .ok()
                    .and_then(|l| l.ok().flatten())
            };
            tokio::pin!(first);
            match pause {
                None => first.await,
                Some((after, stopped)) => {
                    tokio::select! {
                        l = &mut first => { signal(stopped, libc::SIGCONT); l }
                        _ = tokio::time::sleep(after) => { signal(stopped, libc::SIGCONT); first.await }
                    }
                }
            }
        };
        let Some(line) = line else {
            let _ = child.kill().await;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: String = log.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
            self.start_failures
                .push(format!("{writer} (attempt {process}): {tail}"));
            bail!("{writer} (process {process}) did not say it listens: {tail}");
        };
        let v: Value = serde_json::from_str(&line).with_context(|| format!("ctxlog serve said `{line}`"))?;
        let addr = v["listening"].as_str().context("listening")?.to_string();
        // Keep stdout drained (it prints nothing more, but a full pipe would block it).
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let started_ms = ms();
        // The epoch it claimed, which the judge compares its predecessors' writes with: asked
        // again (a replica between a failed refresh and the next answers 503) for a while.
        let mut start_epoch = None;
        for attempt in 0..20u32 {
            start_epoch = sh.poll_shards(&addr, Some(writer)).await;
            if start_epoch.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
        }
        self.processes.push(Process {
            writer: writer.to_string(),
            started_ms,
            start_epoch,
        });
        let older = {
            let s = &mut self.slots[slot];
            s.current.take().and_then(|prev| s.old.replace(prev))
        };
        if let Some(older) = older {
            // One superseded process per slot: the oldest goes.
            self.terms_push(sh, older).await;
        }
        self.slots[slot].current = Some(Proc {
            process,
            addr,
            child,
            pid,
        });
        self.sync(sh);
        Ok(())
    }

    /// SIGTERM `p` and wait for it within the bound (then SIGKILL).
    async fn terms_push(&mut self, sh: &Shared, mut p: Proc) {
        signal(p.pid, libc::SIGCONT);
        sh.scrape(&p.addr).await;
        let started = Instant::now();
        signal(p.pid, libc::SIGTERM);
        let code = match tokio::time::timeout(TERM_BOUND + Duration::from_secs(5), p.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = p.child.kill().await;
                None
            }
        };
        self.terms.push(Term {
            process: p.process,
            code,
            seconds: started.elapsed().as_secs_f64(),
            bound_seconds: TERM_BOUND.as_secs_f64(),
        });
    }

    /// The list clients pick from: every running process.
    fn sync(&self, sh: &Shared) {
        let mut targets = Vec::new();
        for (slot, s) in self.slots.iter().enumerate() {
            if let Some(p) = &s.current {
                targets.push(Target {
                    process: p.process,
                    slot,
                    addr: p.addr.clone(),
                    newest: true,
                });
            }
            if let Some(p) = &s.old {
                targets.push(Target {
                    process: p.process,
                    slot,
                    addr: p.addr.clone(),
                    newest: false,
                });
            }
        }
        *sh.targets.lock().unwrap() = targets;
    }

    /// Notice processes that exited on their own; start a slot again that has none.
    async fn reap(&mut self, sh: &Shared) -> Result<()> {
        for slot in 0..self.slots.len() {
            let s = &mut self.slots[slot];
            for (which, p) in [("current", &mut s.current), ("superseded", &mut s.old)] {
                if let Some(proc_) = p
                    && let Ok(Some(status)) = proc_.child.try_wait()
                {
                    // A superseded replica may stop by itself once fenced; nothing else may.
                    if which == "current" || !matches!(status.code(), Some(0 | 3)) {
                        self.crashes.push(format!(
                            "process {} ({}, {which}) exited by itself: {status}",
                            proc_.process, s.writer
                        ));
                    }
                    *p = None;
                }
            }
            if self.slots[slot].current.is_none() {
                self.sync(sh);
                self.start(sh, slot, None).await?;
                continue;
            }
            // A slot's newest process fenced, with no successor in the slot: a claim of its
            // own whose answer was lost moved its shard on (it cannot tell that from a
            // successor's, so it stays fenced for good), or a start that failed after its
            // claim. As an operator would, start the writer id again: a new process claims
            // afresh. (A superseded process that claimed back and wrote is judged by its
            // acks, `no_fenced_claim_again`.)
            let addr = self.slots[slot].current.as_ref().map(|p| p.addr.clone());
            if let Some(addr) = addr
                && let Answer::Status(503, v) = sh
                    .http
                    .call(
                        Method::GET,
                        &format!("http://{addr}/readyz"),
                        None,
                        Duration::from_secs(2),
                    )
                    .await
                && v["fenced"] == true
            {
                sh.count("fenced_restarts");
                self.start(sh, slot, None).await?;
            }
        }
        self.sync(sh);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    START.get_or_init(Instant::now);
    match soak(cli).await {
        Ok((summary, ok)) => {
            println!("{}", serde_json::to_string_pretty(&summary).unwrap_or_default());
            std::process::ExitCode::from(if ok { 0 } else { 1 })
        }
        Err(e) => {
            eprintln!("ctxlog-serve-chaos: {e:#}");
            std::process::ExitCode::from(4)
        }
    }
}

/// The faults, each chosen in turn first (so that a short run has each), then at random.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill,
    Term,
    Takeover,
    /// A takeover while the process taken over is stopped (its commits in flight time out
    /// when it goes on: where a fenced replica would claim again).
    StoppedTakeover,
    Slow,
    Maintenance,
}

const FAULTS: [Fault; 6] = [
    Fault::Kill,
    Fault::Term,
    Fault::Takeover,
    Fault::StoppedTakeover,
    Fault::Slow,
    Fault::Maintenance,
];

async fn soak(cli: Cli) -> Result<(Value, bool)> {
    std::fs::create_dir_all(&cli.dir)?;
    // A run before in the same directory ended its storm: this one's begins anew.
    match std::fs::remove_file(storm_over(&cli.dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    let sh = Arc::new(Shared {
        http: Http::new(),
        targets: Mutex::new(Vec::new()),
        ops: Mutex::new(Vec::new()),
        epochs: Mutex::new(Vec::new()),
        counts: Mutex::new(BTreeMap::new()),
        posts: Mutex::new(Vec::new()),
        stop_load: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        stop_watch: AtomicBool::new(false),
        deadline: Duration::from_secs_f64(cli.timeout * 3.0 + 5.0),
    });
    let mut cluster = Cluster {
        ctxlog: cli.ctxlog.clone(),
        store: cli.store.clone(),
        dir: cli.dir.clone(),
        slots: WRITERS
            .iter()
            .enumerate()
            .map(|(i, w)| Slot {
                writer: w,
                timeout: if i == SLOW { cli.slow_timeout } else { cli.timeout },
                current: None,
                old: None,
            })
            .collect(),
        processes: Vec::new(),
        terms: Vec::new(),
        crashes: Vec::new(),
        start_failures: Vec::new(),
        faults: cli.faults.then_some(cli.seed),
        starts: 0,
    };
    // The first replica creates the store before the others race to open it.
    for slot in 0..WRITERS.len() {
        cluster.start(&sh, slot, None).await?;
    }
    let mut rng = StdRng::seed_from_u64(cli.seed);
    let mut watchers = Vec::new();
    for slot in 0..WRITERS.len() {
        let scope = Scope::Session {
            bot: BOTS[slot % BOTS.len()].to_string(),
            session: HOT[slot % HOT.len()].to_string(),
        };
        for scope in [scope, Scope::Store] {
            let name = match &scope {
                Scope::Session { bot, session } => format!("{bot}/{session}@{}", WRITERS[slot]),
                Scope::Store => format!("store@{}", WRITERS[slot]),
            };
            watchers.push(tokio::spawn(watch(sh.clone(), name, slot, scope, rng.random())));
        }
    }
    let clients: Vec<_> = (0..CLIENTS)
        .map(|k| tokio::spawn(client(sh.clone(), k, rng.random())))
        .collect();

    let mut schedule: Vec<Fault> = FAULTS[..FAULTS.len() - 1].to_vec();
    schedule.shuffle(&mut rng);
    // Maintenance first (it runs beside the rest): on a slow store a short run may reach
    // only a few faults.
    schedule.push(Fault::Maintenance);
    // The maintenance call in flight; it says whether it succeeded.
    let mut maintenance: Option<tokio::task::JoinHandle<bool>> = None;
    let retained = Arc::new(Mutex::new((BTreeSet::new(), false)));
    let until = Instant::now() + Duration::from_secs(cli.seconds);
    // A few seconds of load before the first fault.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The run lasts its seconds and at least until every fault has happened once: on a slow
    // store (Lance on S3, where a replica's start takes seconds) a short run would otherwise
    // end with some fault never tried, and its verdict could not see what that fault breaks.
    // A maintenance call in flight is waited for too (one that fails is owed again). Never
    // past five minutes over (a slot whose replica cannot start would owe its fault for
    // ever): `progress` then names the fault that never happened.
    let overtime = until + Duration::from_secs(300);
    while Instant::now() < until || ((!schedule.is_empty() || maintenance.is_some()) && Instant::now() < overtime) {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1500))).await;
        cluster.reap(&sh).await?;
        // A maintenance call that failed (a deadline on a loaded store) is owed again: a run
        // must see one succeed beside the load.
        if maintenance.as_ref().is_some_and(|m| m.is_finished())
            && !maintenance.take().expect("finished").await.unwrap_or(false)
        {
            schedule.push(Fault::Maintenance);
            continue;
        }
        if let Some(t) = sh.pick(&mut rng) {
            sh.poll_shards(&t.addr, None).await;
        }
        // After the first round, the slow replica's faults twice as often as the others.
        let fault = schedule.pop().unwrap_or_else(|| {
            let i = rng.random_range(0..FAULTS.len() + 2);
            *FAULTS.get(i).unwrap_or(if i == FAULTS.len() {
                &Fault::Slow
            } else {
                &Fault::StoppedTakeover
            })
        });
        let slot = rng.random_range(0..WRITERS.len());
        match fault {
            // A slot between replicas (its start failed: a slow store) has nothing to kill or
            // stop: the fault stays owed, or a run could end without it (seed 822258797 on
            // lance-s3 ended with no SIGTERM, and `progress` failed).
            Fault::Kill => {
                let Some(mut p) = cluster.slots[slot].current.take() else {
                    schedule.push(fault);
                    continue;
                };
                cluster.sync(&sh);
                let _ = p.child.kill().await;
                sh.count("kills");
                cluster.start(&sh, slot, None).await?;
            }
            Fault::Term => {
                let Some(p) = cluster.slots[slot].current.take() else {
                    schedule.push(fault);
                    continue;
                };
                cluster.sync(&sh);
                cluster.terms_push(&sh, p).await;
                sh.count("sigterms");
                cluster.start(&sh, slot, None).await?;
            }
            Fault::Takeover => {
                sh.count("takeovers");
                cluster.start(&sh, slot, None).await?;
            }
            Fault::StoppedTakeover => {
                // The slow replica: its commits in flight outlive their deadline in the stop.
                let slot = SLOW;
                let Some(pid) = cluster.slots[slot].current.as_ref().map(|p| p.pid) else {
                    // Not now (the slot is between replicas): still owed to the first round.
                    schedule.push(fault);
                    continue;
                };
                let stop = Duration::from_secs_f64(cluster.slots[slot].timeout + 1.0);
                signal(pid, libc::SIGSTOP);
                sh.count("takeovers");
                sh.count("stopped_takeovers");
                cluster.start(&sh, slot, Some((stop, pid))).await?;
            }
            Fault::Slow => {
                if let Some(pid) = cluster.slots[SLOW].current.as_ref().map(|p| p.pid) {
                    sh.count("slow_bursts");
                    // Stops long enough for a backlog of several reads, and short windows
                    // between them: a catch-up begun in one window is cut in the next.
                    for _ in 0..rng.random_range(5..12) {
                        signal(pid, libc::SIGSTOP);
                        tokio::time::sleep(Duration::from_millis(rng.random_range(300..2500))).await;
                        signal(pid, libc::SIGCONT);
                        tokio::time::sleep(Duration::from_millis(rng.random_range(20..250))).await;
                    }
                }
            }
            Fault::Maintenance => {
                if maintenance.as_ref().is_none_or(|m| m.is_finished()) {
                    let op = ["compact", "gc", "purge", "retain", "snapshot"][rng.random_range(0..5)];
                    let picks = StdRng::seed_from_u64(rng.random());
                    let (sh2, retained) = (sh.clone(), retained.clone());
                    let grace = (cli.timeout * 3.0) as u64;
                    maintenance = Some(tokio::spawn(
                        async move { admin(&sh2, picks, op, grace, &retained).await },
                    ));
                }
            }
        }
    }
    let soaked = ms();
    sh.stop_load.store(true, Ordering::Release);
    for c in clients {
        let _ = tokio::time::timeout(RETRY_FOR + Duration::from_secs(60), c).await;
    }
    if let Some(m) = maintenance {
        let _ = tokio::time::timeout(Duration::from_secs(300), m).await;
    }
    // The storm is over: superseded processes go (SIGTERM), every slot has its replica.
    for slot in 0..WRITERS.len() {
        if let Some(p) = &cluster.slots[slot].current {
            signal(p.pid, libc::SIGCONT);
        }
        if let Some(p) = cluster.slots[slot].old.take() {
            cluster.sync(&sh);
            cluster.terms_push(&sh, p).await;
        }
    }
    cluster.reap(&sh).await?;
    if let Some(t) = sh.pick(&mut rng) {
        sh.poll_shards(&t.addr, None).await;
    }
    // Fence posts: a last record in every watched session, after everything else.
    let mut posts = Vec::new();
    for (b, s) in WRITERS
        .iter()
        .enumerate()
        .map(|(slot, _)| (BOTS[slot % BOTS.len()], HOT[slot % HOT.len()]))
    {
        let rec = Rec {
            bot: b.into(),
            session: s.into(),
            id: format!("post-{b}-{s}"),
            text: "the last record".into(),
        };
        let op = append(&sh, &mut rng, OpKind::Append, vec![rec.clone()]).await;
        if matches!(op.outcome, Outcome::Acked { .. }) {
            posts.push(rec);
        }
    }
    *sh.posts.lock().unwrap() = posts;
    sh.draining.store(true, Ordering::Release);
    let drain_until = Instant::now() + DRAIN;
    let mut watcher_logs = Vec::new();
    for mut w in watchers {
        // One that has not received its posts by the deadline is told to stop: its log is
        // judged all the same (what it missed is a gap).
        let log = match tokio::time::timeout(drain_until.saturating_duration_since(Instant::now()), &mut w).await {
            Ok(log) => log,
            Err(_) => {
                sh.stop_watch.store(true, Ordering::Release);
                tokio::time::timeout(Duration::from_secs(60), w)
                    .await
                    .context("a watcher did not stop within 60 s of being told to")?
            }
        };
        watcher_logs.push(log.context("a watcher failed")?);
    }
    sh.stop_watch.store(true, Ordering::Release);
    // The object stores' storm ends too: what is judged now is whether every replica
    // recovered from it (a view refreshed, no writer poisoned), not whether a read of
    // hundreds of objects, each throttled at 1 %, happens to meet none.
    if cli.faults {
        std::fs::write(storm_over(&cli.dir), b"")?;
    }
    // What every replica serves at the end.
    let finals = {
        let reads = cluster.slots.iter().filter_map(|s| s.current.as_ref()).map(|p| {
            let (sh, process, addr) = (sh.clone(), p.process, p.addr.clone());
            tokio::spawn(async move { final_read(&sh, process, &addr).await })
        });
        let mut finals = Vec::new();
        for read in reads.collect::<Vec<_>>() {
            finals.push(read.await.context("a final read panicked")?);
        }
        finals
    };
    for slot in 0..WRITERS.len() {
        if let Some(p) = cluster.slots[slot].current.take() {
            cluster.sync(&sh);
            cluster.terms_push(&sh, p).await;
        }
    }
    let (retained, retain_unknown) = retained.lock().unwrap().clone();
    if cli.faults {
        let injected = injected_faults(&cli.dir)?;
        sh.counts.lock().unwrap().insert("faults_injected".into(), injected);
    }
    let history = History {
        ops: std::mem::take(&mut *sh.ops.lock().unwrap()),
        processes: cluster.processes,
        epochs: std::mem::take(&mut *sh.epochs.lock().unwrap()),
        terms: cluster.terms,
        watchers: watcher_logs,
        finals,
        retained,
        retain_unknown,
        cold_bot: COLD_BOT.into(),
        writers: WRITERS.iter().map(|w| w.to_string()).collect(),
        counts: sh.counts.lock().unwrap().clone(),
        crashes: cluster.crashes,
        faults: cli.faults,
    };
    std::fs::write(cli.dir.join("history.json"), serde_json::to_vec(&history)?)?;
    let checks = serve_judge::judge(&history);
    let ok = checks.iter().all(|c| c.ok);
    let acked = history
        .ops
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Acked { .. }))
        .count();
    let summary = json!({
        "ok": ok,
        "seed": cli.seed,
        "store": ctxlog::redact_uri(&cli.store),
        "seconds": soaked as f64 / 1000.0,
        "writes": history.ops.len(),
        "acked_writes": acked,
        "records_acked": history.ops.iter().filter(|o| matches!(o.outcome, Outcome::Acked { .. })).map(|o| o.records.len()).sum::<usize>(),
        "processes": history.processes.len(),
        "counts": history.counts,
        "failed_starts": cluster.start_failures,
        "checks": checks,
        "history": cli.dir.join("history.json"),
    });
    Ok((summary, ok))
}

/// The file whose existence ends every replica's object-store faults.
fn storm_over(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("storm-over")
}

/// The object-store faults the replicas injected, as their logs say (each is logged).
fn injected_faults(dir: &std::path::Path) -> Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            let log = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
            n += faults_in(&log);
        }
    }
    Ok(n)
}

/// The injection events in one replica's log: the event itself (`injected fault op=…`), not
/// the errors that quote an injected fault's message (`…: injected fault: 503 SlowDown`).
fn faults_in(log: &str) -> u64 {
    log.lines().filter(|l| l.contains("injected fault op=")).count() as u64
}

/// One maintenance operation, as an operator's script runs it: asked again of any replica
/// (counted as `maintenance_retries`, by answer) after a 5xx, 409, 429 or no answer, for up
/// to [`MAINTENANCE_FOR`]; any other answer is final.
/// A long pass on a faulted store meets a throttled read now and then, and a replica may be
/// killed under it: one attempt each time left a short CI run with no maintenance done
/// (2026-12-06, seed 2250869633: six failed). Retention's report says which cold sessions
/// it ended; one whose answer may have been lost leaves them unknown.
async fn admin(sh: &Shared, mut rng: StdRng, op: &str, grace: u64, retained: &Mutex<(BTreeSet<String>, bool)>) -> bool {
    let body = Bytes::from(
        match op {
            "gc" => json!({"grace_seconds": grace}),
            "retain" => json!({"older_than_seconds": 3, "bot": COLD_BOT}),
            _ => json!({}),
        }
        .to_string(),
    );
    let give_up = Instant::now() + MAINTENANCE_FOR;
    let mut pause = Duration::from_millis(200);
    while Instant::now() < give_up {
        let Some(t) = sh.pick(&mut rng) else {
            tokio::time::sleep(pause).await;
            continue;
        };
        // An attempt ends with the operation's time, not a whole `MAINTENANCE_FOR` later.
        let left = give_up.saturating_duration_since(Instant::now());
        let answer = sh
            .http
            .call(
                Method::POST,
                &format!("http://{}/v1/admin/{op}", t.addr),
                Some(body.clone()),
                left,
            )
            .await;
        let v = match answer {
            Answer::Status(200, v) => v,
            other => {
                // By answer, so a verdict without a maintenance that succeeded says why.
                let why = match &other {
                    Answer::Status(status, v) => format!(
                        "{status}_{}",
                        v["type"].as_str().and_then(|t| t.rsplit(':').next()).unwrap_or("?")
                    ),
                    Answer::Lost(_) => "lost".into(),
                    Answer::TimedOut => "timed_out".into(),
                };
                eprintln!(
                    "ctxlog-serve-chaos: maintenance {op} through {} (process {}) failed: {other:?}",
                    t.addr, t.process
                );
                let definite = matches!(&other, Answer::Status(_, v) if v["written"] == "nothing");
                if op == "retain" && !definite {
                    retained.lock().unwrap().1 = true;
                }
                // A pass is idempotent: one that may have run (a 504, no answer) is run again
                // as well; a refusal of the request itself (400, 403, 404) is final.
                let again = match &other {
                    Answer::Status(s, _) => *s >= 500 || matches!(s, 409 | 429),
                    Answer::Lost(_) | Answer::TimedOut => true,
                };
                if !again {
                    sh.count("maintenance_failed");
                    sh.count(&format!("maintenance_failed_{op}_{why}"));
                    return false;
                }
                sh.count("maintenance_retries");
                sh.count(&format!("maintenance_retries_{op}_{why}"));
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        sh.count("maintenance_ok");
        sh.count(&format!("maintenance_{op}"));
        if op == "retain" {
            let mut r = retained.lock().unwrap();
            for s in v["report"]["sessions_ended"].as_array().into_iter().flatten() {
                r.0.insert(format!(
                    "{}/{}",
                    s["bot_id"].as_str().unwrap_or(""),
                    s["session_id"].as_str().unwrap_or("")
                ));
            }
        }
        return true;
    }
    sh.count("maintenance_failed");
    sh.count(&format!("maintenance_failed_{op}_gave_up"));
    false
}

/// The body of an append of `records` (with `session_id` for the bot-wide route).
fn append_body(records: &[Rec], bot_wide: bool) -> Bytes {
    let rs: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut v = json!({"id": r.id, "role": "user", "text": r.text});
            if bot_wide {
                v["session_id"] = json!(r.session);
            }
            v
        })
        .collect();
    Bytes::from(json!({ "records": rs }).to_string())
}

/// Append `records` (one session's, or one bot's for [`OpKind::BotAppend`]).
async fn append(sh: &Shared, rng: &mut StdRng, kind: OpKind, records: Vec<Rec>) -> Op {
    let path = match kind {
        OpKind::BotAppend => format!("/v1/bots/{}/records", records[0].bot),
        _ => format!("/v1/bots/{}/sessions/{}/records", records[0].bot, records[0].session),
    };
    let body = append_body(&records, kind == OpKind::BotAppend);
    write(sh, rng, kind, records, Method::POST, path, Some(body)).await
}

/// One write through the replicas until it is acknowledged: an answer that may have
/// landed (`written: unknown`, a timeout, a lost connection — also one this client cut) is
/// retried with the same body, as the Python client does; a definite "nothing" of a fenced
/// or unavailable replica is retried elsewhere; any other refusal ends it. Logged.
async fn write(
    sh: &Shared,
    rng: &mut StdRng,
    kind: OpKind,
    records: Vec<Rec>,
    method: Method,
    path: String,
    body: Option<Bytes>,
) -> Op {
    let first_sent_ms = ms();
    let give_up = Instant::now() + RETRY_FOR;
    let mut attempts = Vec::new();
    let mut wait = Duration::from_millis(50);
    let outcome = loop {
        if Instant::now() > give_up {
            break if attempts.iter().any(|a| matches!(a, Attempt::Indeterminate(_))) {
                Outcome::Unknown
            } else {
                Outcome::Refused(format!(
                    "no replica took it within {RETRY_FOR:?}: {:?}",
                    attempts.last()
                ))
            };
        }
        if let Some(t) = sh.pick(rng) {
            // A client that goes away mid-request, now and then (never for the fence posts).
            let cut = !sh.draining.load(Ordering::Acquire) && rng.random_ratio(1, 30);
            let deadline = if cut {
                Duration::from_millis(rng.random_range(1..40))
            } else {
                sh.deadline
            };
            let sent_ms = ms();
            let url = format!("http://{}{path}", t.addr);
            match sh.http.call(method.clone(), &url, body.clone(), deadline).await {
                Answer::Status(200, v) => {
                    attempts.push(Attempt::Acked);
                    break Outcome::Acked {
                        process: t.process,
                        shard: v["shard"].as_str().unwrap_or("").to_string(),
                        epoch: v["epoch"].as_u64().unwrap_or(0),
                        first_seq: v["first_seq"].as_u64().unwrap_or(0),
                        sent_ms,
                    };
                }
                Answer::Status(404, _)
                    if kind == OpKind::Delete && attempts.iter().any(|a| matches!(a, Attempt::Indeterminate(_))) =>
                {
                    attempts.push(Attempt::Nothing("404 after an attempt that may have landed".into()));
                    break Outcome::Gone;
                }
                Answer::Status(status, v) => {
                    let what = format!("{status} {} (process {})", v["type"].as_str().unwrap_or("?"), t.process);
                    if v["written"].as_str() != Some("nothing") {
                        attempts.push(Attempt::Indeterminate(what));
                    } else if status >= 500 || status == 409 || status == 429 {
                        attempts.push(Attempt::Nothing(what));
                    } else {
                        attempts.push(Attempt::Nothing(what.clone()));
                        break Outcome::Refused(format!("{what}: {}", v["detail"].as_str().unwrap_or("")));
                    }
                }
                Answer::Lost(e) => attempts.push(Attempt::Indeterminate(format!("lost (process {}): {e}", t.process))),
                Answer::TimedOut => {
                    if cut {
                        sh.count("disconnects");
                    }
                    attempts.push(Attempt::Indeterminate(format!(
                        "{} (process {})",
                        if cut { "cut by the client" } else { "timed out" },
                        t.process
                    )));
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(1));
    };
    let op = Op {
        kind,
        records,
        first_sent_ms,
        attempts,
        outcome,
    };
    sh.ops.lock().unwrap().push(op.clone());
    op
}

/// One client: writes of every kind until the load stops.
async fn client(sh: Arc<Shared>, k: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    // Its acknowledged records of hot sessions: what it may delete.
    let mut mine: Vec<Rec> = Vec::new();
    let mut n = 0u64;
    let hot = |rng: &mut StdRng| {
        (
            BOTS[rng.random_range(0..BOTS.len())],
            HOT[rng.random_range(0..HOT.len())],
        )
    };
    while !sh.stop_load.load(Ordering::Acquire) {
        n += 1;
        let mk = |bot: &str, session: &str, i: usize| Rec {
            bot: bot.into(),
            session: session.into(),
            id: format!("c{k}-{n}-{i}"),
            text: format!("{bot} {session} c{k} #{n}.{i}"),
        };
        let roll = rng.random_range(0..100);
        let ops: Vec<Op> = match roll {
            // One record, a batch, a large batch (long refreshes for the slow replica).
            0..63 => {
                let (b, s) = hot(&mut rng);
                let size = match roll {
                    0..35 => 1,
                    35..60 => rng.random_range(2..20),
                    _ => rng.random_range(200..800),
                };
                let recs = (0..size).map(|i| mk(b, s, i)).collect();
                vec![append(&sh, &mut rng, OpKind::Append, recs).await]
            }
            // The bot-wide append: one batch across sessions of one bot.
            63..73 => {
                let b = BOTS[rng.random_range(0..BOTS.len())];
                let recs = (0..rng.random_range(2..10))
                    .map(|i| mk(b, HOT[rng.random_range(0..HOT.len())], i))
                    .collect();
                vec![append(&sh, &mut rng, OpKind::BotAppend, recs).await]
            }
            73..81 if !mine.is_empty() => {
                let r = mine.swap_remove(rng.random_range(0..mine.len()));
                let path = format!("/v1/bots/{}/records/{}", r.bot, r.id);
                vec![write(&sh, &mut rng, OpKind::Delete, vec![r], Method::DELETE, path, None).await]
            }
            73..89 => {
                let (b, s) = hot(&mut rng);
                summarize(&sh, &mut rng, b, s, format!("c{k}-{n}-sum"))
                    .await
                    .into_iter()
                    .collect()
            }
            // A cold session: written once, then idle (retention may end it).
            89..94 => {
                let s = format!("cold-c{k}-{n}");
                let recs = (0..rng.random_range(1..5)).map(|i| mk(COLD_BOT, &s, i)).collect();
                vec![append(&sh, &mut rng, OpKind::Append, recs).await]
            }
            // The same ids under both bots (ids derived from names, as adapters make them).
            _ => {
                let mut out = Vec::new();
                for b in BOTS {
                    let s = HOT[rng.random_range(0..HOT.len())];
                    let recs = (0..rng.random_range(1..4)).map(|i| mk(b, s, i)).collect();
                    out.push(append(&sh, &mut rng, OpKind::Append, recs).await);
                }
                out
            }
        };
        for op in ops {
            if op.kind != OpKind::Delete && matches!(op.outcome, Outcome::Acked { .. }) {
                mine.extend(op.records.into_iter().filter(|r| r.bot != COLD_BOT));
            }
        }
    }
}

/// A summary of a session from its context view (read through one replica, written
/// through any): `covers` is the view's covers token, or its position.
async fn summarize(sh: &Shared, rng: &mut StdRng, bot: &str, session: &str, id: String) -> Option<Op> {
    let t = sh.pick(rng)?;
    let url = format!("http://{}/v1/bots/{bot}/sessions/{session}/context", t.addr);
    let Answer::Status(200, v) = sh.http.call(Method::GET, &url, None, sh.deadline).await else {
        sh.count("context_read_errors");
        return None;
    };
    let covers = v["covers"].as_str().or(v["position"].as_str())?.to_string();
    let seen = v["records"].as_array().map_or(0, Vec::len) as u64 + v["covered"].as_u64().unwrap_or(0);
    let rec = Rec {
        bot: bot.into(),
        session: session.into(),
        id,
        text: format!("a summary of {seen} records"),
    };
    let body = json!({"records": [{"id": rec.id, "role": "assistant", "kind": "summary", "covers": covers, "text": rec.text}]});
    let path = format!("/v1/bots/{bot}/sessions/{session}/records");
    Some(
        write(
            sh,
            rng,
            OpKind::Summary,
            vec![rec],
            Method::POST,
            path,
            Some(Bytes::from(body.to_string())),
        )
        .await,
    )
}

/// A watcher of `scope`, homed on `slot`'s replica: it starts from a position it read,
/// holds each stream for a random while, and resumes with `Last-Event-ID`; once the soak
/// drains, until it received every fence post of its scope.
async fn watch(sh: Arc<Shared>, name: String, slot: usize, scope: Scope, seed: u64) -> Watcher {
    let mut rng = StdRng::seed_from_u64(seed);
    let (position_path, watch_path) = match &scope {
        Scope::Session { bot, session } => (
            format!("/v1/bots/{bot}/sessions/{session}/records?last=1"),
            format!("/v1/bots/{bot}/sessions/{session}/watch"),
        ),
        Scope::Store => ("/v1/stats".to_string(), "/v1/watch".to_string()),
    };
    let mut log = Watcher {
        name,
        scope,
        start_ms: 0,
        events: Vec::new(),
        reconnects: 0,
    };
    let mut resume = loop {
        if sh.stop_watch.load(Ordering::Acquire) {
            return log;
        }
        if let Some(t) = sh.home(slot, &mut rng) {
            let url = format!("http://{}{position_path}", t.addr);
            if let Answer::Status(200, v) = sh.http.call(Method::GET, &url, None, sh.deadline).await
                && let Some(p) = v["position"].as_str()
            {
                log.start_ms = ms();
                break p.to_string();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let done = |seen: &BTreeSet<(String, String)>, scope: &Scope| {
        sh.draining.load(Ordering::Acquire)
            && sh
                .posts
                .lock()
                .unwrap()
                .iter()
                .filter(|p| match scope {
                    Scope::Session { bot, session } => p.bot == *bot && p.session == *session,
                    Scope::Store => true,
                })
                .all(|p| seen.contains(&(p.bot.clone(), p.id.clone())))
    };
    // Drained: every fence post of its scope received, and then nothing more for a while.
    // A post is no last event: a catch-up sends shard by shard, and the post's shard may
    // come before others whose records are older.
    let mut finished = false;
    while !sh.stop_watch.load(Ordering::Acquire) && !finished {
        let Some(t) = sh.home(slot, &mut rng) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let hold = Duration::from_millis(rng.random_range(300..4000));
        let url = format!("http://{}{watch_path}", t.addr);
        match sh.http.watch(&url, Some(&resume), sh.deadline).await {
            Err(_) => {
                sh.count("watch_connect_errors");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(mut events) => {
                let until = tokio::time::Instant::now() + hold;
                loop {
                    // While draining, no more random disconnects: a stream that is behind
                    // gets all the time it needs to catch up.
                    let draining = sh.draining.load(Ordering::Acquire);
                    if sh.stop_watch.load(Ordering::Acquire) {
                        break;
                    }
                    let wait = if draining {
                        QUIET
                    } else {
                        until.saturating_duration_since(tokio::time::Instant::now())
                    };
                    let ev = tokio::select! {
                        ev = events.next() => ev,
                        _ = tokio::time::sleep(wait) => {
                            if draining && done(&seen, &log.scope) {
                                finished = true;
                                break;
                            }
                            if draining {
                                continue;
                            }
                            break;
                        }
                    };
                    let Ok(Some(ev)) = ev else { break };
                    match ev.event.as_str() {
                        "record" | "tombstone" => {
                            let d = &ev.data;
                            let rec = Rec {
                                bot: d["bot_id"].as_str().unwrap_or("").into(),
                                session: d["session_id"].as_str().unwrap_or("").into(),
                                id: d["id"].as_str().unwrap_or("").into(),
                                text: d["text"].as_str().unwrap_or("").into(),
                            };
                            seen.insert((rec.bot.clone(), rec.id.clone()));
                            log.events.push(WatchEvent {
                                event: ev.event.clone(),
                                rec,
                                shard: d["shard"].as_str().unwrap_or("").into(),
                                seq: d["seq"].as_u64().unwrap_or(0),
                                epoch: d["epoch"].as_u64().unwrap_or(0),
                            });
                            resume = ev.id;
                        }
                        // The stream's start, or its resumable end: go on from there.
                        "position" => resume = ev.id,
                        "end" => {
                            resume = ev.id;
                            break;
                        }
                        _ => {}
                    }
                }
            }
        }
        log.reconnects += 1;
    }
    log
}

/// `GET path` of the replica at `addr` until it answers 200, asked again (counted as
/// `final_retries`) after a refusal that wrote nothing (503, 429) or no answer, never past
/// `until`; any other answer is final.
async fn patient(sh: &Shared, addr: &str, path: &str, until: Instant) -> Result<Value, String> {
    let mut pause = Duration::from_millis(100);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "GET {path}: no answer {FINAL_PATIENCE:?} after the final read began"
            ));
        }
        let last = match sh
            .http
            .call(
                Method::GET,
                &format!("http://{addr}{path}"),
                None,
                sh.deadline.min(left),
            )
            .await
        {
            Answer::Status(200, v) => return Ok(v),
            // Fenced for good: no wait makes it ready.
            Answer::Status(503, v) if v["fenced"] == true => return Err(format!("GET {path}: 503 {v}")),
            Answer::Status(s @ (503 | 429), v) => {
                format!("{s}: {}", v["reason"].as_str().or(v["detail"].as_str()).unwrap_or(""))
            }
            Answer::Status(s, v) => return Err(format!("GET {path}: {s} {v}")),
            other => format!("{other:?}"),
        };
        if Instant::now() + pause >= until {
            return Err(format!(
                "GET {path} still refused {FINAL_PATIENCE:?} after the final read began: {last}"
            ));
        }
        sh.count("final_retries");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// What one replica serves at the end: ready or why not, every bot's records, the context
/// view of every hot session.
async fn final_read(sh: &Shared, process: usize, addr: &str) -> Final {
    let mut f = Final {
        process,
        ..Final::default()
    };
    // Ready, and every read answered, within FINAL_PATIENCE in all: a replica whose object
    // store injects faults may be between a failed refresh and the next one (503, nothing
    // written); one that stays unready or refuses (a poisoned writer, a view that cannot be
    // refreshed) is a finding, and so is any other answer.
    let until = Instant::now() + FINAL_PATIENCE;
    match patient(sh, addr, "/readyz", until).await {
        Ok(_) => f.ready = true,
        Err(e) => f.reason = e,
    }
    let get = |path: String| async move { patient(sh, addr, &path, until).await };
    let mut errors = Vec::new();
    for bot in BOTS.iter().chain([&COLD_BOT]) {
        let mut after: Option<String> = None;
        loop {
            let q = after.as_ref().map_or(String::new(), |a| format!("&after={a}"));
            let page = match get(format!("/v1/bots/{bot}/sessions?limit=1000{q}")).await {
                Ok(p) => p,
                Err(e) => {
                    errors.push(e);
                    break;
                }
            };
            for s in page["sessions"].as_array().into_iter().flatten() {
                let session = s["session_id"].as_str().unwrap_or("");
                let mut after: Option<String> = None;
                loop {
                    let q = after.as_ref().map_or(String::new(), |a| format!("&after={a}"));
                    let Ok(p) = get(format!("/v1/bots/{bot}/sessions/{session}/records?limit=1000{q}"))
                        .await
                        .map_err(|e| errors.push(e))
                    else {
                        break;
                    };
                    for r in p["records"].as_array().into_iter().flatten() {
                        f.records.push(Rec {
                            bot: bot.to_string(),
                            session: r["session_id"].as_str().unwrap_or("").into(),
                            id: r["id"].as_str().unwrap_or("").into(),
                            text: r["text"].as_str().unwrap_or("").into(),
                        });
                    }
                    match p["next"].as_str() {
                        Some(n) => after = Some(n.to_string()),
                        None => break,
                    }
                }
            }
            match page["next"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => break,
            }
        }
    }
    for bot in BOTS {
        for s in HOT {
            if let Ok(v) = get(format!("/v1/bots/{bot}/sessions/{s}/context"))
                .await
                .map_err(|e| errors.push(e))
            {
                let records: Vec<Value> = v["records"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| json!([r["id"], r["text"]]))
                    .collect();
                f.contexts.insert(
                    format!("{bot}/{s}"),
                    json!({"summary": v["summary"], "covered": v["covered"], "records": records}),
                );
            }
        }
    }
    if !errors.is_empty() {
        f.ready = false;
        f.reason = format!("{} {}", f.reason, errors.join("; "));
        f.unread = errors;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::faults_in;

    #[test]
    fn a_fault_is_counted_once_not_with_every_error_that_quotes_it() {
        let log = concat!(
            "2026-12-05T08:48:37.175254Z  WARN ctxlog_lance::faults: injecting object-store faults (CTXLOG_LANCE_FAULTS is set) seed=8\n",
            "2026-12-05T08:48:37.307737Z  WARN ctxlog_lance::faults: injected fault op=\"list\" action=\"throttle\" path=\"serve.lance/_versions\"\n",
            "2026-12-05T08:48:37.307901Z  WARN ctxlog_server::view: refreshing the replica's view failed error=list failed: Generic fault-injection error: injected fault: 503 SlowDown (the service is throttling requests)\n",
            "2026-12-05T08:48:38.1Z  WARN ctxlog_lance::faults: injected fault op=\"put\" action=\"fail_after\" path=\"serve.lance/_mem_wal/x/wal/1.arrow\"\n",
            // Cut by a SIGKILL: the fault was decided before its line was written.
            "2026-12-05T08:48:38.2Z  WARN ctxlog_lance::faults: injected fault op=\"put\" act",
        );
        assert_eq!(faults_in(log), 3);
    }
}
