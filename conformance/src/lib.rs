//! The shared conformance suite: every rule of the contract in `DESIGN.md`, as plain public
//! async case functions over the ctxlog traits, run against every backend.
//!
//! A backend is described by a [`Backend`]: how to name a fresh store, and — as explicit
//! parameters, never silent skips — the few ways backends really differ. The
//! [`conformance_suite!`] macro turns every case into a test named `<backend>::<case>`,
//! each with a fresh root directory and a deadline; `ctxlog-conformance` (the binary) runs
//! the same cases and prints a table.

pub mod backends;
pub mod cases;
pub mod differential;
pub mod process;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::{Entry, Record, Store, StoreOptions};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A guard that keeps a fault in place until dropped.
pub type FaultGuard = Box<dyn std::any::Any + Send>;

/// How the suite reaches one backend, and how that backend really differs.
#[derive(Clone, Copy)]
pub struct Backend {
    pub name: &'static str,
    /// A store URI for a new store inside `root` (which is empty and unique per case).
    pub store_uri: fn(root: &Path) -> String,
    /// Deadline of each store operation during the suite.
    pub op_timeout: Duration,
    /// Deadline of a whole case.
    pub case_timeout: Duration,
    /// Random histories per run of the differential property test.
    pub proptest_cases: u32,
    /// Store an entry exactly as given, bypassing every check (history-check cases).
    pub inject_raw_entry: fn(uri: String, entry: Entry) -> BoxFuture<anyhow::Result<()>>,
    /// Make appends to the store fail or stall with an indeterminate outcome until the
    /// guard drops (rule 4).
    pub stall_writes: fn(uri: String) -> BoxFuture<anyhow::Result<FaultGuard>>,
}

/// What every case gets: a fresh root, a store URI inside it, and the backend's knobs.
pub struct Ctx {
    pub backend: Backend,
    pub root: PathBuf,
    pub uri: String,
    _dir: tempfile::TempDir,
}

impl Ctx {
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

    pub fn options(&self) -> StoreOptions {
        StoreOptions {
            timeout: self.backend.op_timeout,
            ..StoreOptions::default()
        }
    }

    /// Open (creating) the case's store.
    pub async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        self.store_with(self.options()).await
    }

    pub async fn store_with(&self, options: StoreOptions) -> anyhow::Result<Arc<dyn Store>> {
        Ok(ctxlog::open(&self.uri, options).await?)
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

/// Calls `callback!(args; case, case, ...)` with every case of the suite: the one list.
/// Invoked as `for_each_case!([path::to::callback] (args))`.
#[macro_export]
macro_rules! for_each_case {
    ([$($callback:tt)*] ($($args:tt)*)) => {
        $($callback)*!($($args)* ;
            durable_ack_visible_to_new_readers,
            atomic_batch_all_or_nothing,
            atomic_batch_never_half_visible,
            fencing_epochs_strictly_increase,
            fencing_stale_handle_fails_definitely,
            fencing_close_of_fenced_handle_returns,
            indeterminate_error_poisons_until_reopen,
            cancelled_append_never_reuses_seqs,
            idempotent_retry_counts_once,
            first_writer_wins_divergent_put,
            tombstone_is_final,
            session_order_follows_hlc_across_skew,
            hlc_never_goes_backwards_across_reopen,
            determinism_across_read_orders,
            history_checks_find_stale_gap_corrupt,
            conflicts_after_checkpoint,
            refresh_reads_only_new_entries,
            abandoned_refresh_leaves_reads_complete,
            bad_input_rejected_before_write,
            bad_uri_rejected,
            concurrent_create_in_process,
            differential_against_reference_model,
            multiprocess_writers_exactly_once,
            multiprocess_sigkill_keeps_acked,
            multiprocess_same_writer_fences_older,
            multiprocess_concurrent_create
        );
    };
}

/// The case table, for runners.
macro_rules! case_table {
    (; $($case:ident),* $(,)?) => {
        /// Every case, by name.
        pub const CASES: &[(&str, CaseFn)] = &[
            $((stringify!($case), |ctx| Box::pin($crate::cases::$case(ctx))),)*
        ];
    };
}
for_each_case!([case_table]());

/// Instantiate every case as a `#[test]` for one backend. Put it in a module named after
/// the backend so that tests read `<backend>::<case>`.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::for_each_case!([$crate::__conformance_tests]($backend));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($backend:expr ; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let case: $crate::CaseFn = |ctx| Box::pin($crate::cases::$case(ctx));
                if let Err(e) = $crate::run_case($backend, stringify!($case), case) {
                    panic!("{e}");
                }
            }
        )*
    };
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

/// Every entry of every shard, as stored.
pub async fn all_entries(store: &dyn Store) -> anyhow::Result<Vec<Entry>> {
    let mut out = Vec::new();
    for s in store.shards().await? {
        out.extend(store.read_shard(s.shard, 0, usize::MAX).await?);
    }
    Ok(out)
}
