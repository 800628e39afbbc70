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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
const READ_CHUNK: usize = 2_000;

/// One entry of a change, and whether watchers show it.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    pub(crate) entry: Entry,
    pub(crate) shown: bool,
}

/// What one refresh added: the view's position after it, and its entries (per shard in seq
/// order, shards in order) — or `None` when there were too many to hand out.
#[derive(Debug)]
pub(crate) struct Change {
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

    /// Ask for a refresh soon, without waiting for it (after a local commit).
    pub(crate) fn nudge(&self) {
        self.requested.fetch_add(1, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The projector, refreshed after this call began: it shows every append acknowledged
    /// before. Waits at most the store's deadline for the refresh.
    pub(crate) async fn fresh(&self) -> Result<MutexGuard<'_, Box<dyn Projector>>, Problem> {
        let mine = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        self.wake.notify_one();
        let mut done = self.done.subscribe();
        let covered = async {
            loop {
                {
                    let d = done.borrow_and_update();
                    if d.covers >= mine {
                        return Some(d.failed.clone());
                    }
                }
                if done.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(self.timeout * 2, covered).await {
            Ok(Some(None)) => {}
            Ok(Some(Some(failed))) => return Err(failed),
            Ok(None) => {
                return Err(Problem::replica_unavailable(
                    "the replica's view stopped",
                    ctxlog::Written::Nothing,
                ));
            }
            Err(_) => {
                return Err(Problem::from(&ctxlog::Error::Timeout {
                    op: "refresh",
                    after: self.timeout * 2,
                    shard: None,
                    written: ctxlog::Written::Nothing,
                }));
            }
        }
        Ok(self.projector.lock().await)
    }

    /// The projector as it is (no refresh).
    pub(crate) async fn current(&self) -> MutexGuard<'_, Box<dyn Projector>> {
        self.projector.lock().await
    }

    /// Changes from now on.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Every entry past `from` up to `to` (per shard), read from the store, with whether
    /// watchers show it; `keep` picks the ones of a watcher's scope.
    pub(crate) async fn entries_between(
        &self,
        from: &Checkpoint,
        to: &Checkpoint,
        keep: impl Fn(&Entry) -> bool,
    ) -> Result<Vec<Event>, Problem> {
        let mut kept = Vec::new();
        for (&shard, &end) in &to.0 {
            let mut after = from.get(shard);
            while after < end {
                let page = self
                    .store
                    .read_shard(shard, after, READ_CHUNK)
                    .await
                    .map_err(Problem::from)?;
                let Some(last) = page.last().map(|e| e.seq) else { break };
                kept.extend(page.into_iter().filter(|e| e.seq <= end && keep(e)));
                after = last;
            }
        }
        let p = self.projector.lock().await;
        Ok(kept.into_iter().map(|e| shown(&**p, e)).collect())
    }

    /// The refreshing task: until `stop` turns true.
    pub(crate) async fn run(self: Arc<Self>, poll_min: Duration, poll_max: Duration, mut stop: watch::Receiver<bool>) {
        let mut interval = poll_min;
        let mut scanned = false;
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(interval) => {}
                _ = crate::stopped(&mut stop) => break,
            }
            // Every request made before this point is covered by the refresh that follows.
            let covers = self.requested.load(Ordering::Acquire);
            let started = Instant::now();
            let mut p = self.projector.lock().await;
            let before = p.checkpoint();
            let result = p.refresh().await;
            self.metrics.refreshes.inc();
            self.metrics.refresh_latency.observe(started.elapsed().as_secs_f64());
            match result {
                Ok(_) => {
                    self.metrics.refreshed();
                    let after = p.checkpoint();
                    drop(p);
                    let moved = after != before;
                    interval = if moved { poll_min } else { (interval * 2).min(poll_max) };
                    // The first scan is no change a watcher waits for: watchers start from
                    // a position they read after it.
                    if moved && scanned {
                        self.hand_out(before, after).await;
                    }
                    scanned = true;
                    self.done.send_replace(Done { covers, failed: None });
                }
                Err(e) => {
                    drop(p);
                    self.metrics.refresh_errors.inc();
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
    async fn hand_out(&self, before: Checkpoint, after: Checkpoint) {
        let count: u64 = after.0.iter().map(|(s, seq)| seq.saturating_sub(before.get(*s))).sum();
        let events = if usize::try_from(count).unwrap_or(usize::MAX) > MAX_CHANGE_ENTRIES {
            None
        } else {
            match self.entries_between(&before, &after, |_| true).await {
                Ok(events) => Some(events),
                Err(e) => {
                    tracing::warn!(detail = %e.detail, "reading new entries for watchers failed; they read them themselves");
                    None
                }
            }
        };
        // No receiver is no error: nobody watches.
        let _ = self.changes.send(Arc::new(Change { to: after, events }));
    }
}

/// Whether watchers show `entry`, by the projection `p` holds.
fn shown(p: &dyn Projector, entry: Entry) -> Event {
    let shown = match entry.record.kind {
        Kind::Put | Kind::Summary => p.live_key(&entry.record.bot_id, &entry.record.id) == Some(entry.key()),
        Kind::Tombstone => true,
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
