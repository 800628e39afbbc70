//! The replica's one shard and its group commit.
//!
//! Append requests go into a queue; one task owns the shard and, each time it is free,
//! takes every request that has queued meanwhile (within the core's batch limits) and
//! writes them as one append: one durable commit (one SQLite transaction, one Lance WAL
//! put). Each request stays its own atomic batch — the commit is all or nothing — and gets
//! its own ack, the seqs its records took. A commit that fails fails every request in it
//! with the same answer (`written` nothing or unknown). Requests that arrive while a commit
//! runs wait for the next: the window is the commit itself, never a timer.
//!
//! The task, not the request, runs the write to its end: a client that disconnects loses
//! its answer, never the shard's consistency. After an indeterminate error, or a handle
//! that answers `Poisoned`, the shard is reopened before the next commit (rule 4) — with
//! [`Store::reopen_shard`], which claims only while the shard's newest claim is still this
//! replica's: a successor that took the writer id meanwhile is never fenced back. After
//! `Fenced` — another process claimed this writer id — the replica takes no more writes and
//! never claims again (a claim loop is how two replicas livelock). A reopen that fails
//! otherwise leaves the replica unready (`/readyz` says why) until one succeeds: the task
//! tries again at each commit and, while idle, every second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctxlog::{AppendAck, Error, Hlc, Limits, Record, Shard, ShardId, Store, WriterId, Written};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;
use crate::problem::Problem;

/// Requests waiting for the writer: beyond this, a request waits to be queued.
const QUEUE: usize = 4096;

type Reply = oneshot::Sender<Result<AppendAck, Problem>>;

enum Msg {
    Append {
        records: Vec<Record>,
        bytes: usize,
        /// A clock the commit must follow (a summary's view, rule 21; else zero).
        after: Hlc,
        reply: Reply,
    },
    Close(oneshot::Sender<()>),
}

/// What the rest of the server sees of the writer.
pub(crate) struct Writer {
    tx: mpsc::Sender<Msg>,
    state: Arc<State>,
    limits: Limits,
    /// The store's deadline: the longest a request waits to enter the queue.
    timeout: Duration,
}

struct State {
    shard: ShardId,
    writer: WriterId,
    /// The epoch of the newest claim this replica made (a reopen claims only while the
    /// shard's newest claim is this one).
    epoch: AtomicU64,
    fenced: AtomicBool,
    /// Why the writer cannot write now (a reopen failed), until a reopen succeeds.
    unusable: Mutex<Option<String>>,
}

impl State {
    fn fenced_problem(&self) -> Problem {
        Problem::from(&Error::Fenced {
            shard: self.shard,
            writer: self.writer.as_str().to_string(),
            epoch: self.epoch.load(Ordering::Relaxed),
            current: None,
            written: Written::Nothing,
        })
    }
}

impl Writer {
    /// Claim `writer`'s shard and start the task. `committed` runs after every successful
    /// commit (the view refreshes soon after).
    pub(crate) async fn start(
        store: Arc<dyn Store>,
        writer: WriterId,
        group_commit: bool,
        metrics: Arc<Metrics>,
        committed: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<Self, Error> {
        let shard = store.open_shard(&writer).await?;
        let limits = store.options().limits.clone();
        let state = Arc::new(State {
            shard: shard.shard_id(),
            writer: writer.clone(),
            epoch: AtomicU64::new(shard.epoch()),
            fenced: AtomicBool::new(false),
            unusable: Mutex::new(None),
        });
        let timeout = store.options().timeout;
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = Task {
            store,
            writer,
            shard: Some(shard),
            rx,
            group_commit,
            limits: limits.clone(),
            state: state.clone(),
            metrics,
            committed,
            held: None,
        };
        tokio::spawn(task.run());
        Ok(Writer {
            tx,
            state,
            limits,
            timeout,
        })
    }

    /// Append one request's records as one atomic batch, ordered after `after` (rule 8: a
    /// summary follows the clock of the view it summarises). Validated here, before
    /// anything is queued: a bad request never fails the others of its commit.
    pub(crate) async fn append(&self, records: Vec<Record>, after: Hlc) -> Result<AppendAck, Problem> {
        self.limits.validate_batch(&records).map_err(Problem::from)?;
        if self.fenced() {
            return Err(self.state.fenced_problem());
        }
        let bytes = records.iter().map(|r| self.limits.validate(r).unwrap_or(0)).sum();
        let (reply, answer) = oneshot::channel();
        let msg = Msg::Append {
            records,
            bytes,
            after,
            reply,
        };
        // A full queue is waited for within the store's deadline, never longer: a request
        // (its body held) whose client may be long gone does not wait without bound.
        match tokio::time::timeout(self.timeout, self.tx.send(msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(Problem::replica_unavailable(
                    "the replica is shutting down",
                    Written::Nothing,
                ));
            }
            Err(_) => {
                return Err(Problem::from(&Error::Timeout {
                    op: "queue for the writer",
                    after: self.timeout,
                    shard: Some(self.state.shard),
                    written: Written::Nothing,
                }));
            }
        }
        // The task answers every request it took; a dropped answer means it stopped before
        // this one's commit was tried.
        answer
            .await
            .map_err(|_| Problem::replica_unavailable("the replica's writer stopped", Written::Unknown))?
    }

    /// Whether another process claimed this writer id.
    pub(crate) fn fenced(&self) -> bool {
        self.state.fenced.load(Ordering::Acquire)
    }

    /// Why the writer cannot write now, when it cannot: fenced, or its shard could not be
    /// reopened (it tries again).
    pub(crate) fn unready(&self) -> Option<String> {
        if self.fenced() {
            return Some(
                "fenced: another process claimed this writer id; this replica takes no more writes".to_string(),
            );
        }
        self.state.unusable.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The writer identity.
    pub(crate) fn writer(&self) -> &WriterId {
        &self.state.writer
    }

    /// Finish what is queued, close the shard, and stop taking requests.
    pub(crate) async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.tx.send(Msg::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
    }
}

struct Task {
    store: Arc<dyn Store>,
    writer: WriterId,
    /// `None` after an indeterminate error (reopened before the next commit) or when fenced.
    shard: Option<Box<dyn Shard>>,
    rx: mpsc::Receiver<Msg>,
    group_commit: bool,
    limits: Limits,
    state: Arc<State>,
    metrics: Arc<Metrics>,
    committed: Arc<dyn Fn() + Send + Sync>,
    /// A message taken from the queue that did not fit the group before it.
    held: Option<Msg>,
}

/// One request in a group.
struct Job {
    records: Vec<Record>,
    after: Hlc,
    reply: Reply,
}

impl Task {
    async fn run(mut self) {
        loop {
            let first = match self.held.take() {
                Some(m) => m,
                None => match self.next().await {
                    Some(m) => m,
                    None => break,
                },
            };
            let (group, close) = self.gather(first);
            if !group.is_empty() {
                self.commit(group).await;
            }
            if let Some(done) = close {
                if let Some(shard) = self.shard.take() {
                    let _ = shard.close().await;
                }
                self.rx.close();
                let _ = done.send(());
                break;
            }
        }
        if let Some(shard) = self.shard.take() {
            let _ = shard.close().await;
        }
    }

    /// The next request; while the shard waits to be reopened, a reopen is tried every
    /// second meanwhile, so that an idle replica becomes ready again by itself.
    async fn next(&mut self) -> Option<Msg> {
        loop {
            let waiting = self.shard.is_none() && !self.state.fenced.load(Ordering::Acquire);
            if !waiting {
                return self.rx.recv().await;
            }
            tokio::select! {
                m = self.rx.recv() => return m,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    let _ = self.reopen().await;
                }
            }
        }
    }

    /// Claim the shard again after an indeterminate error or a poisoned handle — only while
    /// its newest claim is still ours (`reopen_shard`): a successor is never fenced back.
    async fn reopen(&mut self) -> Result<(), Error> {
        let held = self.state.epoch.load(Ordering::Acquire);
        match self.store.reopen_shard(&self.writer, held).await {
            Ok(s) => {
                self.state.epoch.store(s.epoch(), Ordering::Release);
                self.shard = Some(s);
                *self.state.unusable.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::Fenced { .. }) {
                    self.state.fenced.store(true, Ordering::Release);
                } else {
                    // Tried again later, still from `held`: a claim of ours whose answer was
                    // lost moved the shard past it, and the next reopen then finds itself
                    // fenced (it cannot tell that claim from a successor's; a restart claims
                    // afresh).
                    *self.state.unusable.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("the writer's shard could not be reopened: {e}"));
                }
                tracing::warn!(error = %e, "reopening the replica's shard failed");
                Err(e)
            }
        }
    }

    /// `first` and, with group commit, every request queued behind it that fits the batch
    /// limits; and a close request if one came.
    fn gather(&mut self, first: Msg) -> (Vec<Job>, Option<oneshot::Sender<()>>) {
        let mut group = Vec::new();
        let (mut records, mut bytes) = (0usize, 0usize);
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Close(done) => return (group, Some(done)),
                Msg::Append {
                    records: r,
                    bytes: b,
                    after,
                    reply,
                } => {
                    let fits = group.is_empty()
                        || (records + r.len() <= self.limits.max_batch_records
                            && bytes + b <= self.limits.max_batch_bytes);
                    if !fits {
                        self.held = Some(Msg::Append {
                            records: r,
                            bytes: b,
                            after,
                            reply,
                        });
                        break;
                    }
                    records += r.len();
                    bytes += b;
                    group.push(Job {
                        records: r,
                        after,
                        reply,
                    });
                }
            }
            if self.group_commit {
                next = self.rx.try_recv().ok();
            }
        }
        (group, None)
    }

    async fn commit(&mut self, group: Vec<Job>) {
        if self.state.fenced.load(Ordering::Acquire) {
            let p = self.state.fenced_problem();
            for job in group {
                let _ = job.reply.send(Err(p.clone()));
            }
            return;
        }
        if self.shard.is_none() {
            // Reopened after an indeterminate error: the claim recovers the shard's seqs and
            // clock (rule 4). Once, for this group; a failure answers it and the next group
            // tries again.
            if let Err(e) = self.reopen().await {
                // Only the claim may have landed; nothing of these requests was written.
                let p = if e.is_definite() {
                    Problem::from(&e)
                } else {
                    Problem::replica_unavailable(
                        format!("the writer's shard could not be reopened: {e}"),
                        Written::Nothing,
                    )
                };
                for job in group {
                    let _ = job.reply.send(Err(p.clone()));
                }
                return;
            }
        }
        let shard = self.shard.as_mut().expect("reopened above");
        let after = group.iter().map(|j| j.after).max().unwrap_or(Hlc::ZERO);
        if after > Hlc::ZERO
            && let Err(e) = shard.observe(after)
        {
            // A view whose clock is implausible: the summary may then not be trusted (it
            // shows its records raw), never wrong.
            tracing::warn!(error = %e, "a summary's view clock was not observed");
        }
        let sizes: Vec<usize> = group.iter().map(|j| j.records.len()).collect();
        let mut replies = Vec::with_capacity(group.len());
        let mut all = Vec::with_capacity(sizes.iter().sum());
        for job in group {
            all.extend(job.records);
            replies.push(job.reply);
        }
        let started = Instant::now();
        match shard.append(all).await {
            Ok(ack) => {
                self.metrics.commits.inc();
                self.metrics.commit_records.observe(ack.ids.len() as f64);
                self.metrics.commit_latency.observe(started.elapsed().as_secs_f64());
                let mut offset = 0usize;
                for (n, reply) in sizes.into_iter().zip(replies) {
                    let part = AppendAck {
                        shard: ack.shard,
                        epoch: ack.epoch,
                        first_seq: ack.first_seq + offset as u64,
                        last_seq: ack.first_seq + (offset + n) as u64 - 1,
                        first_hlc: ack.first_hlc,
                        last_hlc: ack.last_hlc,
                        ids: ack.ids[offset..offset + n].to_vec(),
                    };
                    offset += n;
                    let _ = reply.send(Ok(part));
                }
                (self.committed)();
            }
            Err(e) => {
                match &e {
                    Error::Fenced { .. } => {
                        self.state.fenced.store(true, Ordering::Release);
                        self.shard = None;
                    }
                    // The handle is poisoned (now or already): reopen before the next commit.
                    e if !e.is_definite() || matches!(e, Error::Poisoned { .. }) => self.shard = None,
                    _ => {}
                }
                let p = Problem::from(&e);
                for reply in replies {
                    let _ = reply.send(Err(p.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{WrittenAnswer, types};
    use ctxlog::StoreOptions;
    use ctxlog::testing::ReferenceStore;

    fn rec(id: &str) -> Record {
        Record::text(id, "bot", "s", "user", "x")
    }

    /// Rule 3 through the writer: a successor claims the writer id while this replica's
    /// commit hangs after it landed (a lost acknowledgement); the commit fails
    /// indeterminately. The replica must not take the shard back: its next append is
    /// refused as fenced, it says so, and the successor keeps writing.
    #[tokio::test]
    async fn an_indeterminate_error_after_a_takeover_never_claims_back() {
        let options = StoreOptions::default().with_timeout(Duration::from_secs(1));
        let store = ReferenceStore::open("writer-no-claim-back", options).unwrap();
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let w = WriterId::new("same").unwrap();
        let writer = Writer::start(
            shared.clone(),
            w.clone(),
            true,
            Arc::new(Metrics::new()),
            Arc::new(|| {}),
        )
        .await
        .unwrap();
        writer.append(vec![rec("a")], Hlc::ZERO).await.unwrap();

        let stall = store.stall_writes();
        let writer = Arc::new(writer);
        let appending = {
            let writer = writer.clone();
            tokio::spawn(async move { writer.append(vec![rec("lost")], Hlc::ZERO).await })
        };
        assert!(stall.reached(Duration::from_secs(30)).await, "the append never wrote");
        // The successor claims while the append's answer is lost.
        let mut successor = shared.open_shard(&w).await.unwrap();
        let lost = tokio::time::timeout(Duration::from_secs(30), appending)
            .await
            .expect("the stalled append ends at its deadline")
            .unwrap()
            .expect_err("an append whose answer was lost fails");
        assert_eq!(lost.written, WrittenAnswer::Unknown, "{lost:?}");
        drop(stall);

        let refused = writer
            .append(vec![rec("late")], Hlc::ZERO)
            .await
            .expect_err("a replica whose writer id was taken must not write again");
        assert_eq!(refused.kind, types::FENCED, "{refused:?}");
        assert_eq!(refused.written, WrittenAnswer::Nothing, "{refused:?}");
        assert!(writer.unready().is_some_and(|why| why.contains("fenced")));
        // The successor was never fenced back.
        successor.append(vec![rec("new")]).await.unwrap();
    }

    /// A reference store whose first claim gives a handle that answers `Poisoned` for good
    /// (as a Lance handle does once Lance's own writer is poisoned behind a definite error);
    /// later claims are healthy. Counts reopens.
    struct PoisonsFirstClaim {
        inner: ReferenceStore,
        reopens: std::sync::atomic::AtomicUsize,
    }

    struct Poisoned(Box<dyn Shard>);

    #[async_trait::async_trait]
    impl Shard for Poisoned {
        fn shard_id(&self) -> ShardId {
            self.0.shard_id()
        }
        fn writer(&self) -> &WriterId {
            self.0.writer()
        }
        fn epoch(&self) -> ctxlog::Epoch {
            self.0.epoch()
        }
        fn observe(&mut self, hlc: Hlc) -> ctxlog::Result<()> {
            self.0.observe(hlc)
        }
        async fn append(&mut self, _records: Vec<Record>) -> ctxlog::Result<AppendAck> {
            Err(Error::Poisoned {
                shard: self.0.shard_id(),
            })
        }
        async fn close(self: Box<Self>) -> ctxlog::Result<()> {
            self.0.close().await
        }
    }

    #[async_trait::async_trait]
    impl Store for PoisonsFirstClaim {
        fn backend(&self) -> &'static str {
            "reference"
        }
        fn options(&self) -> &StoreOptions {
            self.inner.options()
        }
        async fn open_shard(&self, writer: &WriterId) -> ctxlog::Result<Box<dyn Shard>> {
            Ok(Box::new(Poisoned(self.inner.open_shard(writer).await?)))
        }
        async fn reopen_shard(&self, writer: &WriterId, held: ctxlog::Epoch) -> ctxlog::Result<Box<dyn Shard>> {
            self.reopens.fetch_add(1, Ordering::AcqRel);
            self.inner.reopen_shard(writer, held).await
        }
        async fn shards(&self) -> ctxlog::Result<Vec<ctxlog::ShardInfo>> {
            self.inner.shards().await
        }
        async fn format(&self) -> ctxlog::Result<u32> {
            self.inner.format().await
        }
        async fn set_format(&self, from: u32, to: u32) -> ctxlog::Result<()> {
            self.inner.set_format(from, to).await
        }
        async fn read_shard(&self, shard: ShardId, after: u64, limit: usize) -> ctxlog::Result<Vec<ctxlog::Entry>> {
            self.inner.read_shard(shard, after, limit).await
        }
        fn projector(&self) -> Box<dyn ctxlog::Projector> {
            self.inner.projector()
        }
        fn conflict_discovery(&self) -> Box<dyn ctxlog::ConflictDiscovery> {
            self.inner.conflict_discovery()
        }
        async fn compact(&self, o: &ctxlog::CompactOptions) -> ctxlog::Result<ctxlog::CompactReport> {
            self.inner.compact(o).await
        }
        async fn gc(&self, o: &ctxlog::GcOptions) -> ctxlog::Result<ctxlog::GcReport> {
            self.inner.gc(o).await
        }
        async fn purge(&self, o: &ctxlog::PurgeOptions) -> ctxlog::Result<ctxlog::PurgeReport> {
            self.inner.purge(o).await
        }
    }

    /// Issue 32 §3: a handle that answers `Poisoned` (behind a definite error) is reopened
    /// — from the epoch it held — before the next commit, so the replica serves again
    /// instead of refusing every append until a restart.
    #[tokio::test]
    async fn a_poisoned_handle_is_reopened_not_kept() {
        let inner = ReferenceStore::open("writer-poisoned", StoreOptions::default()).unwrap();
        let store = Arc::new(PoisonsFirstClaim {
            inner,
            reopens: std::sync::atomic::AtomicUsize::new(0),
        });
        let shared: Arc<dyn Store> = store.clone();
        let writer = Writer::start(
            shared,
            WriterId::new("p").unwrap(),
            true,
            Arc::new(Metrics::new()),
            Arc::new(|| {}),
        )
        .await
        .unwrap();
        let refused = writer
            .append(vec![rec("first")], Hlc::ZERO)
            .await
            .expect_err("the handle is poisoned");
        assert_eq!(refused.written, WrittenAnswer::Nothing, "{refused:?}");
        // The retry the answer asks for goes through a reopened handle.
        let ack = writer.append(vec![rec("first")], Hlc::ZERO).await;
        assert!(ack.is_ok(), "a poisoned handle was kept: {ack:?}");
        assert_eq!(store.reopens.load(Ordering::Acquire), 1);
        assert_eq!(writer.unready(), None);
    }

    /// Issue 32 §5: a request that cannot enter the writer's queue (full behind a commit
    /// that hangs) waits at most its deadline, then answers `timeout` with nothing written —
    /// never holding its body without bound.
    #[tokio::test]
    async fn a_request_waits_for_the_queue_within_its_deadline() {
        let options = StoreOptions::default().with_timeout(Duration::from_secs(60));
        let store = ReferenceStore::open("writer-queue-bound", options).unwrap();
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let w = WriterId::new("queue").unwrap();
        let mut writer = Writer::start(shared, w, false, Arc::new(Metrics::new()), Arc::new(|| {}))
            .await
            .unwrap();
        // Shorter than the store's deadline, which holds the commit below.
        writer.timeout = Duration::from_millis(200);
        let stall = store.stall_writes();
        let (reply, _stalled) = oneshot::channel();
        writer
            .tx
            .try_send(Msg::Append {
                records: vec![rec("first")],
                bytes: 0,
                after: Hlc::ZERO,
                reply,
            })
            .unwrap();
        assert!(stall.reached(Duration::from_secs(30)).await, "the commit never started");
        let mut waiting = Vec::new();
        loop {
            let (reply, answer) = oneshot::channel();
            let msg = Msg::Append {
                records: vec![rec("queued")],
                bytes: 0,
                after: Hlc::ZERO,
                reply,
            };
            if writer.tx.try_send(msg).is_err() {
                break;
            }
            waiting.push(answer);
        }
        assert_eq!(waiting.len(), QUEUE, "the queue is full");
        let refused = tokio::time::timeout(Duration::from_secs(30), writer.append(vec![rec("late")], Hlc::ZERO))
            .await
            .expect("a request that cannot be queued answers within its deadline")
            .expect_err("it was never queued");
        assert_eq!(refused.kind, types::TIMEOUT, "{refused:?}");
        assert_eq!(refused.written, WrittenAnswer::Nothing, "{refused:?}");
        drop(stall);
    }
}
