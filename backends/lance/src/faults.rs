//! A seeded object store that injects the faults object stores really have, for tests and
//! the chaos soak. It wraps whatever store Lance uses (local disk, `memory://`, S3) through
//! lance-io's `WrappingObjectStore` hook, so every request of a store handle opened with it
//! — WAL entries, shard manifests, dataset manifests, data files, generations — passes
//! through [`Faults::decide`].
//!
//! A [`Rule`] picks requests by operation kind and path substring, fires always, on the Nth
//! matching request or with a probability (from the seeded generator, so a run replays),
//! and does one [`Action`]: fail before the request reaches storage (nothing written), fail
//! after it completed (written, but the caller sees an error), add latency, stall until the
//! caller gives up, answer as a throttled service, or pause at a [`Gate`] the test opens.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use lance_io::object_store::WrappingObjectStore;
use object_store::list::PaginatedListStore;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The kind of an object-store request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Get,
    Head,
    /// An unconditional put (or a rename onto a path).
    Put,
    /// A put that must not replace an existing object (`If-None-Match: *`).
    PutIfAbsent,
    List,
    Delete,
    /// A multipart upload (faults strike at its start, or at its completion for `FailAfter`).
    Multipart,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Get,
        Op::Head,
        Op::Put,
        Op::PutIfAbsent,
        Op::List,
        Op::Delete,
        Op::Multipart,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Head => "head",
            Op::Put => "put",
            Op::PutIfAbsent => "put_if_absent",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Multipart => "multipart",
        }
    }
}

/// When a rule fires, among the requests it matches.
#[derive(Clone, Debug)]
pub enum When {
    Always,
    /// Only the Nth matching request (1-based).
    Nth(u64),
    /// Each matching request with this probability (seeded).
    Probability(f64),
}

/// An added delay.
#[derive(Clone, Copy, Debug)]
pub enum Latency {
    Fixed(Duration),
    /// Uniform between the two bounds (seeded).
    Uniform(Duration, Duration),
}

/// What a fired rule does to its request.
#[derive(Clone, Debug)]
pub enum Action {
    /// Fail before the request reaches storage: nothing written.
    FailBefore,
    /// Let the request complete, then fail: written, but the caller cannot know.
    FailAfter,
    /// Delay the request, then let it proceed.
    Delay(Latency),
    /// Never answer: the request waits until its caller gives up (drops it).
    Stall,
    /// Answer as a throttled or unavailable service (S3 `503 SlowDown`): nothing written.
    Throttle,
    /// Wait at the gate before the request; the gate's verdict decides what happens.
    Pause(Arc<Gate>),
    /// Let the request complete, then wait at the gate; the verdict decides the answer.
    PauseAfter(Arc<Gate>),
}

impl Action {
    fn name(&self) -> &'static str {
        match self {
            Action::FailBefore => "fail_before",
            Action::FailAfter => "fail_after",
            Action::Delay(_) => "latency",
            Action::Stall => "stall",
            Action::Throttle => "throttle",
            Action::Pause(_) => "pause",
            Action::PauseAfter(_) => "pause_after",
        }
    }
}

/// One fault: which requests, when, what.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The kinds of request it applies to; empty means every kind.
    pub ops: Vec<Op>,
    /// Only requests whose path contains this.
    pub path: Option<String>,
    pub when: When,
    pub action: Action,
    /// Fire at most this many times.
    pub limit: Option<u64>,
}

impl Rule {
    pub fn new(ops: &[Op], action: Action) -> Self {
        Rule {
            ops: ops.to_vec(),
            path: None,
            when: When::Always,
            action,
            limit: None,
        }
    }

    pub fn path(mut self, contains: &str) -> Self {
        self.path = Some(contains.to_string());
        self
    }

    pub fn when(mut self, when: When) -> Self {
        self.when = when;
        self
    }

    pub fn limit(mut self, n: u64) -> Self {
        self.limit = Some(n);
        self
    }

    fn matches(&self, op: Op, path: &str) -> bool {
        (self.ops.is_empty() || self.ops.contains(&op)) && self.path.as_deref().is_none_or(|p| path.contains(p))
    }
}

/// What a paused request does once the test decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go on as if nothing happened.
    Proceed,
    /// Fail (before the request for `Pause`, after it for `PauseAfter`).
    Fail,
}

/// A point where requests wait until the test lets them go: deterministic interleavings
/// without sleeps.
#[derive(Debug)]
pub struct Gate {
    arrived: tokio::sync::watch::Sender<u64>,
    verdict: tokio::sync::watch::Sender<Option<Verdict>>,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Gate {
            arrived: tokio::sync::watch::channel(0).0,
            verdict: tokio::sync::watch::channel(None).0,
        })
    }

    /// Wait until `n` requests have arrived at the gate, at most `within`.
    pub async fn arrivals(&self, n: u64, within: Duration) -> bool {
        let mut rx = self.arrived.subscribe();
        tokio::time::timeout(within, rx.wait_for(|a| *a >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Let every waiting (and every later) request go, with this verdict.
    pub fn release(&self, verdict: Verdict) {
        self.verdict.send_replace(Some(verdict));
    }

    async fn pass(&self) -> Verdict {
        self.arrived.send_modify(|a| *a += 1);
        let mut rx = self.verdict.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.unwrap_or(Verdict::Proceed),
            // The gate is gone: nothing holds the request any more.
            Err(_) => Verdict::Proceed,
        }
    }
}

/// The error an injected fault answers with. A distinct type, so that the backend's error
/// mapping can tell a throttled answer apart by type, as it does real ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// The request never reached storage.
    FailedBefore,
    /// The request completed; its answer was lost.
    FailedAfter,
    /// The service answered 503 SlowDown.
    Throttled,
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InjectedFault::FailedBefore => "injected fault: the request failed before reaching storage",
            InjectedFault::FailedAfter => "injected fault: the request completed but its answer was lost",
            InjectedFault::Throttled => "injected fault: 503 SlowDown (the service is throttling requests)",
        })
    }
}

impl std::error::Error for InjectedFault {}

fn injected(fault: InjectedFault) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault-injection",
        source: Box::new(fault),
    }
}

/// The environment variable that makes every store a process opens inject the soaks' faults
/// ([`Faults::soak`]), seeded with its value, each injection logged (warn, `injected fault`):
/// how the serve soak faults `ctxlog serve` replicas, which it cannot hand an injector. Read
/// only by debug builds with the `env-faults` feature (which only the chaos crate enables);
/// any other build that finds it set says that it ignores it.
pub const ENV: &str = "CTXLOG_LANCE_FAULTS";

/// Beside [`ENV`]: a path whose existence ends the faults (every request passes untouched
/// once the file is there). A soak ends its storm with it before it judges whether every
/// replica recovered: a read that needs hundreds of requests, each throttled at 1 % after
/// the object store's own retries, fails most times, which tells nothing about recovery.
pub const UNTIL_ENV: &str = "CTXLOG_LANCE_FAULTS_UNTIL";

/// A set of rules, a seeded generator, and counts of what was injected.
pub struct Faults {
    seed: u64,
    /// Log each injected fault but latency (the serve soak counts them in the replicas' logs).
    announce: bool,
    /// No fault once this file exists ([`UNTIL_ENV`]).
    until: Option<std::path::PathBuf>,
    /// The file was seen: no more looks for it (a look is a syscall on every request).
    over: std::sync::atomic::AtomicBool,
    rules: Mutex<Vec<Armed>>,
    rng: Mutex<StdRng>,
    injected: Mutex<BTreeMap<(Op, &'static str), u64>>,
    requests: Mutex<BTreeMap<Op, u64>>,
    bytes_read: AtomicU64,
    next_id: AtomicU64,
}

struct Armed {
    id: u64,
    rule: Rule,
    seen: u64,
    fired: u64,
}

/// Names a rule added to a [`Faults`], to remove it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleId(u64);

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl Faults {
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(Faults::unshared(seed))
    }

    fn unshared(seed: u64) -> Self {
        Faults {
            seed,
            announce: false,
            until: None,
            over: std::sync::atomic::AtomicBool::new(false),
            rules: Mutex::new(Vec::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            injected: Mutex::new(BTreeMap::new()),
            requests: Mutex::new(BTreeMap::new()),
            bytes_read: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
        }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The chaos soaks' mix: writes failing before (2 %) and after (1 %) they reach storage,
    /// a WAL entry's conditional put stalling until its caller gives up (0.3 %), reads
    /// throttled (1 %), and up to 20 ms of latency on a tenth of all requests.
    pub fn soak(seed: u64) -> Arc<Self> {
        Arc::new(Faults::soak_mix(seed, false))
    }

    fn soak_mix(seed: u64, announce: bool) -> Self {
        let f = Faults {
            announce,
            ..Faults::unshared(seed)
        };
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
        f
    }

    /// [`Faults::soak`] seeded by [`ENV`], announcing each fault, if it is set and this is a
    /// debug build with the `env-faults` feature.
    pub(crate) fn from_env() -> Option<Arc<Self>> {
        let value = std::env::var(ENV).ok()?;
        if !(cfg!(feature = "env-faults") && cfg!(debug_assertions)) {
            tracing::warn!(
                "{ENV} is set, but this build injects no faults (a debug build with ctxlog-lance/env-faults does)"
            );
            return None;
        }
        let Ok(seed) = value.parse::<u64>() else {
            tracing::warn!("{ENV}=`{value}` is not a seed (an unsigned integer): no faults injected");
            return None;
        };
        let until = std::env::var_os(UNTIL_ENV).map(std::path::PathBuf::from);
        tracing::warn!(seed, ?until, "injecting object-store faults ({ENV} is set)");
        Some(Arc::new(Faults {
            until,
            ..Faults::soak_mix(seed, true)
        }))
    }

    /// Whether the [`UNTIL_ENV`] file has appeared (it is never taken back).
    fn storm_over(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.over.load(Ordering::Relaxed) {
            return true;
        }
        let seen = self.until.as_ref().is_some_and(|p| p.exists());
        if seen {
            self.over.store(true, Ordering::Relaxed);
        }
        seen
    }

    /// Add a rule; it applies to requests from now on.
    pub fn add(&self, rule: Rule) -> RuleId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.rules.lock().expect("not poisoned").push(Armed {
            id,
            rule,
            seen: 0,
            fired: 0,
        });
        RuleId(id)
    }

    /// Remove a rule: requests from now on pass it by.
    pub fn remove(&self, id: RuleId) {
        self.rules.lock().expect("not poisoned").retain(|a| a.id != id.0);
    }

    /// Remove every rule: requests pass untouched from now on.
    pub fn clear(&self) {
        self.rules.lock().expect("not poisoned").clear();
    }

    /// Faults injected so far, by request kind and action.
    pub fn injected(&self) -> BTreeMap<(Op, &'static str), u64> {
        self.injected.lock().expect("not poisoned").clone()
    }

    /// Requests seen so far (faulted or not).
    pub fn requests(&self) -> u64 {
        self.requests_by_op().values().sum()
    }

    /// Requests seen so far (faulted or not), by kind.
    pub fn requests_by_op(&self) -> BTreeMap<Op, u64> {
        self.requests.lock().expect("not poisoned").clone()
    }

    /// Bytes of the object ranges that gets answered so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// The action for this request, if a rule fires. Rules are tried in the order added;
    /// the first that fires wins.
    pub fn decide(&self, op: Op, path: &str) -> Option<Action> {
        *self.requests.lock().expect("not poisoned").entry(op).or_default() += 1;
        if self.storm_over() {
            return None;
        }
        let mut rules = self.rules.lock().expect("not poisoned");
        for armed in rules.iter_mut() {
            if !armed.rule.matches(op, path) || armed.rule.limit.is_some_and(|l| armed.fired >= l) {
                continue;
            }
            armed.seen += 1;
            let fire = match armed.rule.when {
                When::Always => true,
                When::Nth(n) => armed.seen == n,
                When::Probability(p) => self.rng.lock().expect("not poisoned").random_bool(p.clamp(0.0, 1.0)),
            };
            if fire {
                armed.fired += 1;
                let action = armed.rule.action.clone();
                if self.announce && !matches!(action, Action::Delay(_)) {
                    tracing::warn!(op = op.as_str(), action = action.name(), path, "injected fault");
                }
                *self
                    .injected
                    .lock()
                    .expect("not poisoned")
                    .entry((op, action.name()))
                    .or_default() += 1;
                return Some(action);
            }
        }
        None
    }

    fn latency(&self, l: Latency) -> Duration {
        match l {
            Latency::Fixed(d) => d,
            Latency::Uniform(lo, hi) if hi > lo => {
                let span = (hi - lo).as_micros() as u64;
                lo + Duration::from_micros(self.rng.lock().expect("not poisoned").random_range(0..=span))
            }
            Latency::Uniform(lo, _) => lo,
        }
    }

    /// The wrapper to put into a store's object-store parameters.
    pub fn wrapper(self: &Arc<Self>) -> Arc<dyn WrappingObjectStore> {
        Arc::new(FaultWrapper(self.clone()))
    }
}

#[derive(Debug)]
struct FaultWrapper(Arc<Faults>);

impl WrappingObjectStore for FaultWrapper {
    fn wrap(&self, _store_prefix: &str, original: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        Arc::new(FaultyStore {
            inner: original,
            faults: self.0.clone(),
        })
    }

    /// Faults must see listings too: give up the pushed-down lister.
    fn wrap_paginated(
        &self,
        _store_prefix: &str,
        _original: Arc<dyn PaginatedListStore>,
    ) -> Option<Arc<dyn PaginatedListStore>> {
        None
    }
}

/// An object store whose requests pass through [`Faults`].
#[derive(Debug)]
struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<Faults>,
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

/// Run `request` under whatever `faults` decide for it.
async fn faulted<T, F>(faults: &Faults, op: Op, path: &str, request: F) -> object_store::Result<T>
where
    F: std::future::Future<Output = object_store::Result<T>>,
{
    match faults.decide(op, path) {
        None => request.await,
        Some(action) => act(faults, action, request).await,
    }
}

/// Run `request` under `action`.
async fn act<T, F>(faults: &Faults, action: Action, request: F) -> object_store::Result<T>
where
    F: std::future::Future<Output = object_store::Result<T>>,
{
    match action {
        Action::FailBefore => Err(injected(InjectedFault::FailedBefore)),
        Action::Throttle => Err(injected(InjectedFault::Throttled)),
        Action::FailAfter => {
            request.await?;
            Err(injected(InjectedFault::FailedAfter))
        }
        Action::Delay(l) => {
            tokio::time::sleep(faults.latency(l)).await;
            request.await
        }
        Action::Stall => std::future::pending().await,
        Action::Pause(gate) => match gate.pass().await {
            Verdict::Proceed => request.await,
            Verdict::Fail => Err(injected(InjectedFault::FailedBefore)),
        },
        Action::PauseAfter(gate) => {
            let result = request.await;
            match gate.pass().await {
                Verdict::Proceed => result,
                Verdict::Fail => Err(injected(InjectedFault::FailedAfter)),
            }
        }
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let op = match opts.mode {
            PutMode::Overwrite => Op::Put,
            PutMode::Create | PutMode::Update(_) => Op::PutIfAbsent,
        };
        faulted(
            &self.faults,
            op,
            location.as_ref(),
            self.inner.put_opts(location, payload, opts),
        )
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        match self.faults.decide(Op::Multipart, location.as_ref()) {
            None => self.inner.put_multipart_opts(location, opts).await,
            Some(Action::FailAfter) => Ok(Box::new(FailAtComplete(
                self.inner.put_multipart_opts(location, opts).await?,
            ))),
            // Every other action strikes before the upload starts.
            Some(action) => act(&self.faults, action, self.inner.put_multipart_opts(location, opts)).await,
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        let op = if options.head { Op::Head } else { Op::Get };
        let got = faulted(
            &self.faults,
            op,
            location.as_ref(),
            self.inner.get_opts(location, options),
        )
        .await?;
        if op == Op::Get {
            self.faults
                .bytes_read
                .fetch_add(got.range.end - got.range.start, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let faults = self.faults.clone();
        let inner = self.inner.clone();
        locations
            .and_then(move |path| {
                let (faults, inner) = (faults.clone(), inner.clone());
                async move {
                    let p = path.clone();
                    faulted(&faults, Op::Delete, path.as_ref(), async move {
                        object_store::ObjectStoreExt::delete(inner.as_ref(), &p).await
                    })
                    .await?;
                    Ok(path)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        let listing = self.inner.list(prefix);
        let faults = self.faults.clone();
        futures::stream::once(async move { faulted(&faults, Op::List, &path, async { Ok(listing) }).await })
            .map(|r| match r {
                Ok(listing) => listing,
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .flatten()
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let path = prefix.map(|p| p.to_string()).unwrap_or_default();
        faulted(&self.faults, Op::List, &path, self.inner.list_with_delimiter(prefix)).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        let op = match options.mode {
            object_store::CopyMode::Overwrite => Op::Put,
            object_store::CopyMode::Create => Op::PutIfAbsent,
        };
        faulted(&self.faults, op, to.as_ref(), self.inner.copy_opts(from, to, options)).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        let op = match options.target_mode {
            object_store::RenameTargetMode::Overwrite => Op::Put,
            object_store::RenameTargetMode::Create => Op::PutIfAbsent,
        };
        faulted(&self.faults, op, to.as_ref(), self.inner.rename_opts(from, to, options)).await
    }
}

/// A multipart upload whose completion lands and then reports a failure.
#[derive(Debug)]
struct FailAtComplete(Box<dyn MultipartUpload>);

#[async_trait]
impl MultipartUpload for FailAtComplete {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.0.put_part(data)
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.0.complete().await?;
        Err(injected(InjectedFault::FailedAfter))
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.0.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    fn store(faults: &Arc<Faults>) -> Arc<dyn ObjectStore> {
        faults.wrapper().wrap("memory", Arc::new(InMemory::new()))
    }

    #[tokio::test]
    async fn each_action_does_what_it_says() {
        let faults = Faults::new(7);
        let s = store(&faults);
        let p = Path::from("a/wal/1.arrow");

        faults.add(Rule::new(&[Op::Put], Action::FailBefore).limit(1));
        assert!(s.put(&p, "x".into()).await.is_err());
        assert!(s.head(&p).await.is_err(), "fail-before writes nothing");

        faults.add(Rule::new(&[Op::Put], Action::FailAfter).limit(1));
        assert!(s.put(&p, "y".into()).await.is_err());
        assert!(s.head(&p).await.is_ok(), "fail-after wrote it");

        faults.add(Rule::new(&[Op::PutIfAbsent], Action::Throttle).path("/wal/").limit(1));
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let err = s
            .put_opts(&Path::from("a/wal/2.arrow"), "z".into(), create.clone())
            .await
            .unwrap_err();
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<InjectedFault>());
        assert_eq!(source, Some(&InjectedFault::Throttled));
        s.put_opts(&Path::from("a/wal/2.arrow"), "z".into(), create)
            .await
            .unwrap();

        faults.add(Rule::new(&[Op::Get], Action::Stall).limit(1));
        let stalled = tokio::time::timeout(Duration::from_millis(50), s.get(&p)).await;
        assert!(stalled.is_err(), "a stall only ends when its caller gives up");
        assert!(s.get(&p).await.is_ok(), "the limit was one");

        faults.add(Rule::new(&[Op::List], Action::FailBefore).limit(1));
        assert!(s.list(Some(&Path::from("a"))).try_collect::<Vec<_>>().await.is_err());
        assert_eq!(
            s.list(Some(&Path::from("a")))
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len(),
            2
        );

        let counts = faults.injected();
        for key in [
            (Op::Put, "fail_before"),
            (Op::Put, "fail_after"),
            (Op::PutIfAbsent, "throttle"),
            (Op::Get, "stall"),
            (Op::List, "fail_before"),
        ] {
            assert_eq!(counts.get(&key), Some(&1), "{key:?} in {counts:?}");
        }
    }

    #[tokio::test]
    async fn the_nth_request_and_probabilities_replay_with_the_seed() {
        let run = |seed| async move {
            let faults = Faults::new(seed);
            let s = store(&faults);
            faults.add(Rule::new(&[Op::Put], Action::FailBefore).when(When::Probability(0.5)));
            let mut outcomes = Vec::new();
            for i in 0..32 {
                outcomes.push(s.put(&Path::from(format!("k{i}")), "v".into()).await.is_ok());
            }
            outcomes
        };
        assert_eq!(run(1).await, run(1).await);
        assert_ne!(run(1).await, run(2).await);

        let faults = Faults::new(0);
        let s = store(&faults);
        faults.add(Rule::new(&[Op::Put], Action::FailBefore).when(When::Nth(3)));
        let outcomes: Vec<bool> = futures::future::join_all((0..5).map(|i| {
            let s = s.clone();
            async move { s.put(&Path::from(format!("n{i}")), "v".into()).await.is_ok() }
        }))
        .await;
        assert_eq!(outcomes.iter().filter(|ok| !**ok).count(), 1);
    }

    #[tokio::test]
    async fn a_gate_holds_requests_until_released() {
        let faults = Faults::new(0);
        let s = store(&faults);
        let gate = Gate::new();
        faults.add(Rule::new(&[Op::Put], Action::PauseAfter(gate.clone())).limit(1));
        let p = Path::from("g");
        let put = tokio::spawn({
            let (s, p) = (s.clone(), p.clone());
            async move { s.put(&p, "v".into()).await }
        });
        assert!(gate.arrivals(1, Duration::from_secs(5)).await);
        assert!(s.head(&p).await.is_ok(), "the request completed before the gate");
        assert!(!put.is_finished());
        gate.release(Verdict::Fail);
        assert!(put.await.unwrap().is_err(), "its answer is the verdict's");
    }
}
