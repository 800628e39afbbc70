//! The replica's one projector, and the one task that refreshes it.
//!
//! Readers never refresh it themselves: a reader asks for a refresh that starts after its
//! request arrived (so it sees every append acknowledged before, rule 1) and waits for it;
//! all readers waiting at once share one. Without requests the task refreshes on a
//! schedule: at the shortest interval after a change, doubling while nothing changes up to
//! the longest (on object storage every refresh costs requests). After a refresh that moved
//! the view, the task reads the new entries once and hands them to every watcher
//! ([`Change`]), each marked with whether it is an event a watcher shows: a put that is its
//! id's live winner, or a tombstone. A retried or divergent put of an id already live is not
//! one.
//!
//! A hand-out goes from what was last handed out, never from where the projector stood
//! before the refresh: a refresh cut short by its deadline keeps the rows it applied, so
//! the projector can move without a hand-out (and a projector's read may refresh it
//! itself, a first scan after a failed refresh). The next hand-out then covers those rows
//! too: every entry is handed out once, in order, whatever refreshes failed.
//!
//! A failed refresh may leave the projector torn, holding less than before (a source may
//! reset its index when a catch-up fails, rather than leave it half-applied). Until a
//! refresh succeeds again, nothing is judged by it: [`View::fresh`] waits for a refresh
//! that leaves it whole, and a page read for watchers fails (a position or a clock taken
//! from an empty index would refuse a summary's coverage or order it before what it covers;
//! a record judged by one is not its id's live record, and watchers would go past it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ctxlog::{Checkpoint, Entry, Kind, Projector, ShardId, Store};
use tokio::sync::{Mutex, MutexGuard, Notify, broadcast, watch};

use crate::metrics::Metrics;
use crate::problem::Problem;

/// Entries of one refresh beyond which watchers are told to read them themselves (each from
/// its own position) instead of every one of them being handed out.
const MAX_CHANGE_ENTRIES: usize = 20_000;
/// Changes kept for watchers that fall behind; one that falls further catches up by reading.
const CHANGES_KEPT: usize = 256;
/// Entries asked of the store in one read.
pub(crate) const READ_CHUNK: usize = 2_000;

/// One entry of a change, and whether watchers show it.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) entry: Entry,
    pub(crate) shown: bool,
}

/// What the view added since the last change: its entries past `from` up to `to` (per shard
/// in seq order, shards in order) — or `None` when there were too many to hand out. Each
/// change starts where the one before ended.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) from: Checkpoint,
    pub(crate) to: Checkpoint,
    pub(crate) events: Option<Vec<Event>>,
}

/// What a refresh that a reader waited for ended with.
#[derive(Clone, Debug)]
struct Done {
    /// Every request up to this number is covered.
    covers: u64,
    failed: Option<Problem>,
}

pub(crate) struct View {
    store: Arc<dyn Store>,
    projector: Mutex<Box<dyn Projector>>,
    requested: AtomicU64,
    /// Whether the projector may hold less than it did: a refresh failed and took positions
    /// back, and none has succeeded since. Set by the refreshing task while it holds the
    /// projector: whoever takes the lock after it sees what that refresh left.
    torn: AtomicBool,
    /// Whether the last refresh succeeded. One that failed and kept every position leaves
    /// the projector consistent (not torn) but unscanned: its next read would refresh it
    /// itself, and could be cut short and empty it, so [`View::fresh`] hands it out only
    /// after a success. Set as `torn` is.
    whole: AtomicBool,
    wake: Notify,
    done: watch::Sender<Done>,
    changes: broadcast::Sender<Arc<Change>>,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

impl View {
    pub(crate) fn new(store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Arc<Self> {
        let timeout = store.options().timeout;
        Arc::new(View {
            projector: Mutex::new(store.projector()),
            store,
            requested: AtomicU64::new(0),
            // Nothing read yet.
            torn: AtomicBool::new(true),
            whole: AtomicBool::new(false),
            wake: Notify::new(),
            done: watch::Sender::new(Done {
                covers: 0,
                failed: None,
            }),
            changes: broadcast::Sender::new(CHANGES_KEPT),
            metrics,
            timeout,
        })
    }

    /// Why the last refresh failed, if it did: the replica cannot serve reads until one
    /// succeeds (`/readyz` says so).
    pub(crate) fn failing(&self) -> Option<String> {
        self.done
            .borrow()
            .failed
            .as_ref()
            .map(|p| format!("the view cannot be refreshed: {}", p.detail))
    }

    /// Ask for a refresh soon, without waiting for it (after a local commit).
    pub(crate) fn nudge(&self) {
        self.requested.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The projector, refreshed after this call began and whole: it shows every append
    /// acknowledged before. Waits at most twice the store's deadline in all.
    pub(crate) async fn fresh(&self) -> Result<MutexGuard<'_, Box<dyn Projector>>, Problem> {
        let within = self.timeout * 2;
        let waited = async {
            loop {
                self.refreshed().await?;
                let p = self.projector.lock().await;
                // A refresh after the one waited for failed before this took the lock: ask
                // for another.
                if self.whole.load(Ordering::Acquire) {
                    return Ok(p);
                }
                tracing::debug!("a refresh after the one waited for failed; waiting for another");
            }
        };
        match tokio::time::timeout(within, waited).await {
            Ok(done) => done,
            Err(_) => Err(Problem::from(&ctxlog::Error::Timeout {
                op: "refresh",
                after: within,
                shard: None,
                written: ctxlog::Written::Nothing,
            })),
        }
    }

    /// Ask for a refresh and wait until one that started after the request ended.
    async fn refreshed(&self) -> Result<(), Problem> {
        let mine = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake.notify_one();
        let mut done = self.done.subscribe();
        loop {
            {
                let d = done.borrow_and_update();
                if d.covers >= mine {
                    return d.failed.clone().map_or(Ok(()), Err);
                }
            }
            if done.changed().await.is_err() {
                return Err(Problem::replica_unavailable(
                    "the replica's view stopped",
                    ctxlog::Written::Nothing,
                ));
            }
        }
    }

    /// The projector as it is (no refresh).
    pub(crate) async fn current(&self) -> MutexGuard<'_, Box<dyn Projector>> {
        self.projector.lock().await
    }

    /// Changes from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Streams that hold a subscription to the changes (tests: a slow one lets go).
    #[cfg(test)]
    pub(crate) fn subscribed(&self) -> usize {
        self.changes.receiver_count()
    }

    /// Every entry past `from` up to `to` (per shard), read from the store, with whether
    /// watchers show it.
    async fn entries_between(&self, from: &Checkpoint, to: &Checkpoint) -> Result<Vec<Event>, Problem> {
        let mut kept = Vec::new();
        for (&shard, &end) in &to.0 {
            let mut after = from.get(shard);
            while after < end {
                let page = self.read_page(shard, after, READ_CHUNK).await?;
                // Every position names a stored entry (none is ever deleted; a hole is a
                // batch that never landed, below a later position): a read that shows
                // nothing up to `end` has not seen it, and a change that claimed to hold it
                // would move every follower past what it never handed out.
                let reached = page.iter().map(|e| e.entry.seq).filter(|seq| *seq <= end).max();
                let Some(reached) = reached.filter(|seq| *seq == end || page.last().is_some_and(|e| e.entry.seq < end))
                else {
                    return Err(Problem::replica_unavailable(
                        format!(
                            "a read of shard {shard} after seq {after} did not show seq {end}, which the view holds"
                        ),
                        ctxlog::Written::Nothing,
                    ));
                };
                kept.extend(page.into_iter().filter(|e| e.entry.seq <= end));
                after = reached;
            }
        }
        Ok(kept)
    }

    /// One page of `shard`'s entries past seq `after`, with whether watchers show each:
    /// empty when the shard holds nothing past it. A page never ends inside the entries of
    /// one seq (a fenced writer's that landed and its successor's): the next page starts
    /// after the page's last seq, so it would skip the rest of them.
    /// Fails while the projector is torn (a failed refresh emptied it): it would show nothing.
    pub(crate) async fn read_page(&self, shard: ShardId, after: u64, limit: usize) -> Result<Vec<Event>, Problem> {
        let mut page = self
            .store
            .read_shard(shard, after, limit)
            .await
            .map_err(Problem::from)?;
        if page.len() == limit
            && let (Some(first), Some(last)) = (page.first().map(|e| e.seq), page.last().map(|e| e.seq))
            && first < last
        {
            page.retain(|e| e.seq < last);
        }
        let p = self.projector.lock().await;
        if self.torn.load(Ordering::Acquire) {
            return Err(Problem::replica_unavailable(
                format!("the replica's view cannot judge shard {shard} past seq {after}: its last refresh failed"),
                ctxlog::Written::Nothing,
            ));
        }
        Ok(page.into_iter().map(|e| shown(&**p, e)).collect())
    }

    /// The refreshing task: until `stop` turns true.
    pub(crate) async fn run(self: Arc<Self>, poll_min: Duration, poll_max: Duration, mut stop: watch::Receiver<bool>) {
        let mut interval = poll_min;
        // Every entry up to here was handed out (or watchers were told to read it); `None`
        // until the first successful scan, which is no change a watcher waits for: watchers
        // start from a position they read after it.
        let mut handed: Option<Checkpoint> = None;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(interval) => {}
                _ = crate::stopped(&mut stop) => {
                    // Readers still waiting are told at once, not at their deadline.
                    self.done.send_replace(Done {
                        covers: u64::MAX,
                        failed: Some(Problem::replica_unavailable("the replica is shutting down", ctxlog::Written::Nothing)),
                    });
                    break;
                }
            }
            // Every request made before this point is covered by the refresh that follows.
            let covers = self.requested.load(Ordering::Acquire);
            let started = Instant::now();
            let mut p = self.projector.lock().await;
            let before = p.checkpoint();
            let result = p.refresh().await;
            // A failure that kept every position (SQLite's read interrupted at its deadline
            // keeps the rows it applied) leaves the projector as whole as it was.
            let lost = result.is_err() && before.first_beyond(&p.checkpoint()).is_some();
            let torn = result.is_err() && (lost || self.torn.load(Ordering::Acquire));
            self.torn.store(torn, Ordering::Release);
            self.whole.store(result.is_ok(), Ordering::Release);
            self.metrics.refreshes.inc();
            self.metrics.refresh_latency.observe(started.elapsed().as_secs_f64());
            match result {
                Ok(_) => {
                    self.metrics.refreshed();
                    let after = p.checkpoint();
                    drop(p);
                    let moved = match handed.take() {
                        // The projector holds something not handed out yet.
                        Some(from) if after.first_beyond(&from).is_some() => {
                            let to = max(&from, &after);
                            self.hand_out(from, to.clone()).await;
                            handed = Some(to);
                            true
                        }
                        Some(from) => {
                            handed = Some(max(&from, &after));
                            false
                        }
                        None => {
                            handed = Some(after);
                            false
                        }
                    };
                    interval = if moved { poll_min } else { (interval * 2).min(poll_max) };
                    self.done.send_replace(Done { covers, failed: None });
                }
                // A refresh cut short by the shutdown (its tasks cancelled) is no failure of
                // the store: nobody waits for it any more.
                Err(e) if *stop.borrow() => {
                    drop(p);
                    tracing::debug!(error = %e, "a refresh ended by the shutdown");
                    self.done.send_replace(Done {
                        covers: u64::MAX,
                        failed: Some(Problem::from(&e)),
                    });
                    break;
                }
                Err(e) => {
                    drop(p);
                    self.metrics.refresh_errors.inc();
                    // A store that keeps failing is not asked again at the shortest interval
                    // (readers still ask for refreshes of their own).
                    interval = (interval * 2).min(poll_max.max(poll_min * 100));
                    tracing::warn!(error = %e, "refreshing the replica's view failed");
                    self.done.send_replace(Done {
                        covers,
                        failed: Some(Problem::from(&e)),
                    });
                }
            }
        }
    }

    /// Read the entries between two positions once and hand them to every watcher.
    async fn hand_out(&self, from: Checkpoint, to: Checkpoint) {
        let count: u64 = to.0.iter().map(|(s, seq)| seq.saturating_sub(from.get(*s))).sum();
        let events = if usize::try_from(count).unwrap_or(usize::MAX) > MAX_CHANGE_ENTRIES {
            None
        } else {
            match self.entries_between(&from, &to).await {
                Ok(events) => Some(events),
                Err(e) => {
                    tracing::warn!(detail = %e.detail, "reading new entries for watchers failed; they read them themselves");
                    None
                }
            }
        };
        // No receiver is no error: nobody watches.
        let _ = self.changes.send(Arc::new(Change { from, to, events }));
    }
}

/// Whether watchers show `entry`, by the projection `p` holds.
fn shown(p: &dyn Projector, entry: Entry) -> Event {
    let shown = match entry.record.kind {
        Kind::Put | Kind::Summary | Kind::Fork | Kind::Hide => {
            p.live_key(&entry.record.bot_id, &entry.record.id) == Some(entry.key())
        }
        Kind::Tombstone => true,
        // In no view (rule 27): a watcher sees the record, not its vectors.
        Kind::Embedding => false,
    };
    Event { entry, shown }
}

/// Per shard, the larger of two positions.
pub(crate) fn max(a: &Checkpoint, b: &Checkpoint) -> Checkpoint {
    let mut out: BTreeMap<ShardId, u64> = a.0.clone();
    for (s, seq) in &b.0 {
        let e = out.entry(*s).or_default();
        *e = (*e).max(*seq);
    }
    Checkpoint(out)
}
