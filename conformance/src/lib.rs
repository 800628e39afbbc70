//! The shared conformance suite: every rule of the contract (`docs/contract.md`) as plain
//! public async case functions over the `ctxlog-core` traits, run against every backend.
//!
//! The suite depends on `ctxlog-core` only. Each backend crate owns a `tests/conformance.rs`
//! (`harness = false`) that describes itself with a [`Backend`] — how to name and open a
//! fresh store, and, as explicit fields, never silent skips, the few ways backends really
//! differ (how to inject a raw entry, how to make writes fail) — and hands it to [`main`],
//! which runs every case as a test named `<backend>::<case>`, each with a fresh root
//! directory and a deadline.
//!
//! The cases live in [`rules`], one module per rule or group of rules, each listing its own
//! cases next to their functions. Every failing step says which step failed and with what
//! values.

#![warn(missing_docs)]

pub mod differential;
pub mod rules;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxlog_core::{Entry, Record, Store, StoreOptions, WriterId};

/// What every case module uses.
pub mod prelude {
    pub use std::collections::BTreeSet;
    pub use std::sync::Arc;
    pub use std::time::{Duration, Instant};

    pub use anyhow::{Context, anyhow, bail, ensure};
    pub use ctxlog_core::testing::{SkewedClock, model};
    pub use ctxlog_core::{
        Body, Checkpoint, CompactOptions, Conflict, ConflictKind, Entry, Error, Hlc, Record, Store, StoreOptions,
        WriterId, Written,
    };

    pub use crate::{
        Case, Ctx, Fault, Need, SnapshotDamage, all_entries, append_beside, bounded, case, ids, ids_of, kinds, rec,
        recs, w,
    };
}

/// A boxed, sendable future: what descriptors and cases return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A guard that keeps a fault in place until dropped.
pub type FaultGuard = Box<dyn std::any::Any + Send>;

/// What a fault case asks of the object store under a backend (rule 18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every write of an append fails before it reaches storage.
    AppendFailsBefore,
    /// The next write of an append lands, and its answer is lost.
    AppendLandsUnanswered,
    /// Every write of an append never answers (until its caller gives up).
    AppendStalls,
    /// Reads are answered "503 SlowDown" one time in fifty.
    ReadsThrottled,
    /// Writes of data and manifests fail before reaching storage, one time in two.
    WritesFailOften,
    /// Conditional writes (creation markers, claims, commits) fail, before or after they
    /// land, one time in ten each.
    ConditionalWritesFlaky,
}

/// Make the object store under the store at `uri` misbehave as `fault` says until the guard
/// drops. Only stores opened through the descriptor's `open` are affected.
pub type FaultHook = fn(uri: String, fault: Fault) -> BoxFuture<anyhow::Result<FaultGuard>>;

/// How a case damages a stored projection snapshot (rule 17), as a disk fault, an operator
/// or a copy from elsewhere might.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotDamage {
    /// One byte in the middle flipped.
    FlipByte,
    /// Cut to half its length.
    Truncate,
    /// The format number of another build.
    OtherFormat,
    /// Bytes that are no snapshot at all.
    NotASnapshot,
    /// These bytes instead (another store's snapshot).
    Replace(Vec<u8>),
}

impl SnapshotDamage {
    /// Damage one snapshot's bytes.
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            SnapshotDamage::FlipByte => {
                let mid = bytes.len() / 2;
                if let Some(b) = bytes.get_mut(mid) {
                    *b ^= 0x20;
                }
            }
            SnapshotDamage::Truncate => bytes.truncate(bytes.len() / 2),
            SnapshotDamage::OtherFormat => {
                let other = (ctxlog_core::backend::snapshot::FORMAT + 1).to_le_bytes();
                if bytes.len() >= 12 {
                    bytes[8..12].copy_from_slice(&other);
                }
            }
            SnapshotDamage::NotASnapshot => *bytes = b"this is not a projection snapshot".to_vec(),
            SnapshotDamage::Replace(with) => bytes.clone_from(with),
        }
    }
}

/// Raw access to the projection snapshots stored in the store at `uri`: every one's bytes,
/// newest first, as they were before `damage` (if any) was done to each.
pub type TamperSnapshots = fn(uri: String, damage: Option<SnapshotDamage>) -> BoxFuture<anyhow::Result<Vec<Vec<u8>>>>;

/// Where the store at `uri` still holds `needle`, found by reading what it stores with the
/// backend's own decoders (so also inside compressed or encoded files): one description per
/// place, e.g. a table version and row, a generation, a write-ahead-log entry. Empty when the
/// needle is nowhere.
pub type DecodedSearch = fn(uri: String, needle: String) -> BoxFuture<anyhow::Result<Vec<String>>>;

/// How a backend opens the store at a URI.
pub type OpenFn = fn(uri: String, options: StoreOptions) -> BoxFuture<ctxlog_core::Result<Arc<dyn Store>>>;

/// How the suite reaches one backend, and how that backend really differs.
#[derive(Clone, Copy)]
pub struct Backend {
    /// The name tests carry: `<name>::<case>`.
    pub name: &'static str,
    /// A store URI for a new store inside `root` (which is empty and unique per case).
    pub store_uri: fn(root: &Path) -> String,
    /// Open (or create) the store at a URI of [`Backend::store_uri`].
    pub open: OpenFn,
    /// Deadline of each store operation during the suite.
    pub op_timeout: Duration,
    /// Deadline of a whole case.
    pub case_timeout: Duration,
    /// Random histories per run of the differential property test.
    pub proptest_cases: u32,
    /// Store an entry exactly as given, bypassing every check (history-check cases). An
    /// entry with `purged` set is stored without a body (both body columns empty), as a
    /// purge leaves one or as damage may; it reads back as purged, empty text.
    pub inject_raw_entry: fn(uri: String, entry: Entry) -> BoxFuture<anyhow::Result<()>>,
    /// Make appends to the store fail or stall with an indeterminate outcome until the
    /// guard drops (rule 4).
    pub stall_writes: fn(uri: String) -> BoxFuture<anyhow::Result<FaultGuard>>,
    /// The faults of the object store under the backend; `None` for a backend that has no
    /// object store (its fault cases are reported as not applicable, never skipped silently).
    pub faults: Option<FaultHook>,
    /// Read (and damage) the store's projection snapshots, below the API (rule 17).
    pub tamper_snapshots: TamperSnapshots,
    /// Whether every byte of a store lives in files under the case's root directory (a
    /// local disk), so that a case can read them as an auditor would. False for in-memory
    /// and object stores: their secret-scan case relies on
    /// [`Backend::decoded_values_containing`], or is reported as not applicable without it.
    pub files_in_root: bool,
    /// Search every value the store still holds — every stored version, flushed generation
    /// and log entry, decoded — for a needle (rule 16's audit where a byte scan cannot see:
    /// compressed files, object stores). `None` where it does not apply: a backend whose
    /// files a byte scan reads as they are (SQLite), or that keeps only the values themselves,
    /// in memory (memory).
    pub decoded_values_containing: Option<DecodedSearch>,
}

/// What a case needs of a backend beyond the traits. A backend without it reports the case
/// as not applicable and says why; it is never skipped silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The object-store faults ([`Backend::faults`]).
    Faults,
    /// The store's bytes in files under the case's root ([`Backend::files_in_root`]).
    Files,
    /// A way to audit erasure: the store's bytes in files under the case's root, or a search
    /// of its decoded values ([`Backend::decoded_values_containing`]), or both.
    Erasure,
}

impl Backend {
    /// Why `case` does not apply to this backend, if it does not.
    pub fn lacks(&self, case: &Case) -> Option<&'static str> {
        case.needs.iter().find_map(|need| match need {
            Need::Faults if self.faults.is_none() => Some("not applicable: the backend has no object store to fault"),
            Need::Files if !self.files_in_root => Some("not applicable: the store's bytes are not in local files"),
            Need::Erasure if !self.files_in_root && self.decoded_values_containing.is_none() => Some(
                "not applicable: the store's bytes are not in local files and the backend cannot search its \
                 decoded values",
            ),
            _ => None,
        })
    }
}

/// What every case gets: a fresh root, a store URI inside it, and the backend's knobs.
pub struct Ctx {
    /// The backend under test.
    pub backend: Backend,
    /// The case's own, empty, root directory.
    pub root: PathBuf,
    /// The URI of the case's store inside `root`.
    pub uri: String,
    _dir: tempfile::TempDir,
}

impl Ctx {
    /// A fresh root for `backend`.
    pub fn new(backend: Backend) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("ctxlog-{}-", backend.name))
            .tempdir()?;
        let root = dir.path().to_path_buf();
        Ok(Ctx {
            uri: (backend.store_uri)(&root),
            root,
            backend,
            _dir: dir,
        })
    }

    /// The options the case's stores open with: the backend's deadline.
    pub fn options(&self) -> StoreOptions {
        StoreOptions::default().with_timeout(self.backend.op_timeout)
    }

    /// Open (creating) the case's store.
    pub async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        self.store_with(self.options()).await
    }

    /// Open the case's store with other options.
    pub async fn store_with(&self, options: StoreOptions) -> anyhow::Result<Arc<dyn Store>> {
        self.open(&self.uri, options).await
    }

    /// Open the store at another URI of this backend.
    pub async fn open(&self, uri: &str, options: StoreOptions) -> anyhow::Result<Arc<dyn Store>> {
        (self.backend.open)(uri.to_string(), options)
            .await
            // Typed (a case may downcast it), and never with a storage option's value.
            .map_err(|e| anyhow::Error::new(e).context(format!("opening {}", ctxlog_core::redact_uri(uri))))
    }

    /// A second, independent store at another URI under the same root.
    pub fn other_uri(&self, name: &str) -> String {
        let sub = self.root.join(name);
        std::fs::create_dir_all(&sub).expect("create a sub-root");
        (self.backend.store_uri)(&sub)
    }
}

/// A case: an async function of a [`Ctx`].
pub type CaseFn = fn(Ctx) -> BoxFuture<anyhow::Result<()>>;

/// One case of the suite: its name, the rule(s) it checks, its function.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's function name.
    pub name: &'static str,
    /// The rule(s) it checks, as the report groups them.
    pub rule: &'static str,
    /// The case itself.
    pub run: CaseFn,
    /// What it needs of a backend beyond the traits.
    pub needs: &'static [Need],
}

/// A [`Case`] for an async function `f(ctx) -> anyhow::Result<()>` of a rule module (which
/// defines `RULE`).
#[macro_export]
macro_rules! case {
    ($f:ident) => {
        $crate::Case {
            name: stringify!($f),
            rule: RULE,
            run: |ctx| Box::pin($f(ctx)),
            needs: &[],
        }
    };
    ($f:ident, needs $($need:ident),+) => {
        $crate::Case {
            needs: &[$($crate::Need::$need),+],
            ..$crate::case!($f)
        }
    };
}

/// Every case of the suite, grouped by rule, in the contract's order.
pub fn cases() -> Vec<Case> {
    rules::all()
}

/// Run one case on a fresh runtime and root, under the backend's case deadline. A panic,
/// an error and a missed deadline are all failures, and the message names the case.
pub fn run_case(backend: Backend, name: &str, case: CaseFn) -> Result<Duration, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .map_err(|e| format!("{}::{name}: cannot start a runtime: {e}", backend.name))?;
    let started = Instant::now();
    let result = runtime.block_on(async {
        let ctx = Ctx::new(backend).map_err(|e| format!("cannot create a root: {e:#}"))?;
        let task = tokio::spawn(case(ctx));
        match tokio::time::timeout(backend.case_timeout, task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!("{e:#}")),
            Ok(Err(join)) if join.is_panic() => {
                let panic = join.into_panic();
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                Err(format!("panicked: {msg}"))
            }
            Ok(Err(join)) => Err(format!("task failed: {join}")),
            Err(_) => Err(format!("hung: missed the case deadline of {:?}", backend.case_timeout)),
        }
    });
    // Never wait on work a failed case left behind.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
        .map(|()| started.elapsed())
        .map_err(|e| format!("{}::{name}: {e}", backend.name))
}

/// Where a run writes its results for `cargo xtask conformance` (JSON lines, appended).
pub const REPORT_ENV: &str = "CTXLOG_CONFORMANCE_REPORT";

/// The test runner of a backend's `tests/conformance.rs` (`harness = false`): every case
/// for every backend given, as tests named `<backend>::<case>`, through libtest-mimic (so
/// `cargo test` and nextest filters, listing and timeouts work as usual).
pub fn main(backends: &[Backend]) -> std::process::ExitCode {
    run_trials(backends, &cases())
}

/// [`main`] for any list of cases (a backend's own extra cases, say).
pub fn run_trials(backends: &[Backend], cases: &[Case]) -> std::process::ExitCode {
    let args = libtest_mimic::Arguments::from_args();
    let results: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let mut trials = Vec::new();
    for backend in backends {
        for case in cases {
            let (backend, case, results) = (*backend, *case, results.clone());
            let name = format!("{}::{}", backend.name, case.name);
            if let Some(why) = backend.lacks(&case) {
                // Not applicable, and visibly so (the report says why).
                results.lock().expect("not poisoned").push(serde_json::json!({
                    "backend": backend.name,
                    "rule": case.rule,
                    "case": case.name,
                    "passed": serde_json::Value::Null,
                    "seconds": 0.0,
                    "error": why,
                }));
                trials.push(libtest_mimic::Trial::test(name, || Ok(())).with_ignored_flag(true));
                continue;
            }
            trials.push(libtest_mimic::Trial::test(name, move || {
                let outcome = run_case(backend, case.name, case.run);
                results.lock().expect("not poisoned").push(serde_json::json!({
                    "backend": backend.name,
                    "rule": case.rule,
                    "case": case.name,
                    "passed": outcome.is_ok(),
                    "seconds": outcome.as_ref().map(|d| d.as_secs_f64()).unwrap_or(0.0),
                    "error": outcome.as_ref().err(),
                }));
                outcome.map(|_| ()).map_err(libtest_mimic::Failed::from)
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if let Some(path) = std::env::var_os(REPORT_ENV) {
        use std::io::Write;
        let lines: String = results
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|r| format!("{r}\n"))
            .collect();
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(lines.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "cannot write the conformance report {}: {e}",
                PathBuf::from(path).display()
            );
        }
    }
    conclusion.exit_code()
}

// ---- helpers the cases share -------------------------------------------------------------

/// A writer id, for names the cases choose.
pub fn w(name: &str) -> WriterId {
    WriterId::new(name).expect("valid writer id")
}

/// A realistic text record.
pub fn rec(id: impl Into<String>, session: &str, text: impl Into<String>) -> Record {
    Record::text(id, "bot", session, "user", text)
}

/// `n` records `prefix-0 ..` in one session.
pub fn recs(prefix: &str, session: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| rec(format!("{prefix}-{i}"), session, format!("message {i} of {prefix}")))
        .collect()
}

/// The record ids of entries, in order.
pub fn ids(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| e.record.id.clone()).collect()
}

/// The ids of records, in order.
pub fn ids_of(records: &[Record]) -> Vec<String> {
    records.iter().map(|r| r.id.clone()).collect()
}

/// The kinds of conflicts, in order.
pub fn kinds(conflicts: &[ctxlog_core::Conflict]) -> Vec<ctxlog_core::ConflictKind> {
    conflicts.iter().map(ctxlog_core::Conflict::kind).collect()
}

/// Run `fut` under `after`, naming `what` when it hangs (rule 13).
pub async fn bounded<T>(what: &str, after: Duration, fut: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(after, fut)
        .await
        .map_err(|_| anyhow::anyhow!("{what} hung past {after:?}"))
}

/// Append batch `n` (five records of session `s`) while `what` (a maintenance pass) runs:
/// it must succeed within the backend's deadline, under the handle's own epoch (rule 14).
/// Returns the ids appended.
pub async fn append_beside(
    ctx: &Ctx,
    shard: &mut dyn ctxlog_core::Shard,
    what: &str,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    use anyhow::Context as _;
    let batch = recs(&format!("during{n}"), "s", 5);
    let ack = bounded(
        &format!("an append beside {what}"),
        ctx.backend.op_timeout,
        shard.append(batch.clone()),
    )
    .await?
    .with_context(|| format!("append {n} beside {what} failed"))?;
    let epoch = shard.epoch();
    anyhow::ensure!(
        ack.epoch == epoch,
        "expected epoch {epoch}, got {}: {what} fenced the writer",
        ack.epoch
    );
    Ok(ids_of(&batch))
}

/// Every entry of every shard, as stored.
pub async fn all_entries(store: &dyn Store) -> anyhow::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for s in store.shards().await? {
        out.extend(store.read_shard(s.shard, 0, usize::MAX).await?);
    }
    Ok(out)
}

/// The suite on the reference store: a backend descriptor for it.
pub mod reference {
    use super::*;
    use ctxlog_core::testing::ReferenceStore;

    /// The case's store, which must exist.
    fn existing(uri: &str) -> ctxlog_core::Result<ReferenceStore> {
        ReferenceStore::open(uri, StoreOptions::default().with_create_if_missing(false))
    }

    /// The reference store of `ctxlog-core`'s `testing` module, named by the case's root.
    pub const REFERENCE: Backend = Backend {
        name: "reference",
        store_uri: |root| root.display().to_string(),
        open: |uri, options| {
            Box::pin(async move { Ok(Arc::new(ReferenceStore::open(&uri, options)?) as Arc<dyn Store>) })
        },
        op_timeout: Duration::from_secs(5),
        case_timeout: Duration::from_secs(60),
        proptest_cases: 32,
        inject_raw_entry: |uri, entry| {
            Box::pin(async move {
                existing(&uri)?.inject_raw_entry(entry);
                Ok(())
            })
        },
        stall_writes: |uri| {
            Box::pin(async move {
                let store = ReferenceStore::open(&uri, StoreOptions::default())?;
                Ok(Box::new(store.stall_writes()) as FaultGuard)
            })
        },
        tamper_snapshots: |uri, damage| {
            Box::pin(async move {
                Ok(existing(&uri)?.tamper_with_snapshots(|b| {
                    if let Some(d) = &damage {
                        d.apply(b)
                    }
                }))
            })
        },
        faults: None,
        files_in_root: false,
        // The reference store keeps the values themselves, in memory: nothing to decode.
        decoded_values_containing: None,
    };
}
