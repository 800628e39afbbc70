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
//! its answer, never the shard's consistency. After an indeterminate error the shard is
//! reopened before the next commit (rule 4). After `Fenced` — another process claimed this
//! writer id — the replica takes no more writes and never claims again (a claim loop is
//! how two replicas livelock).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

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
}

struct State {
    shard: ShardId,
    writer: WriterId,
    epoch: AtomicU64,
    fenced: AtomicBool,
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
        });
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
        Ok(Writer { tx, state, limits })
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
        self.tx
            .send(Msg::Append {
                records,
                bytes,
                after,
                reply,
            })
            .await
            .map_err(|_| Problem::replica_unavailable("the replica is shutting down", Written::Nothing))?;
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
                None => match self.rx.recv().await {
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
            match self.store.open_shard(&self.writer).await {
                Ok(s) => {
                    self.state.epoch.store(s.epoch(), Ordering::Relaxed);
                    self.shard = Some(s);
                }
                Err(e) => {
                    if matches!(e, Error::Fenced { .. }) {
                        self.state.fenced.store(true, Ordering::Release);
                    }
                    let p = Problem::from(&e);
                    for job in group {
                        let _ = job.reply.send(Err(p.clone()));
                    }
                    return;
                }
            }
        }
        let shard = self.shard.as_mut().expect("opened above");
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
                    // The handle is poisoned: reopen before the next commit.
                    e if !e.is_definite() => self.shard = None,
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
