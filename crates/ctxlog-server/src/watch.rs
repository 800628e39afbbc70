//! Watch streams: a session's (or the store's) new records as server-sent events.
//!
//! Each event's id is a position (per shard, the last seq the stream has gone through).
//! Every shard is read as a prefix, so "every entry of the scope past this position" is
//! exactly what the client has not been shown. The first event is `position`: where the
//! stream starts (the `Last-Event-ID` of a reconnecting client, a page's `position`, or the
//! view's position now), so that a client whose connection drops before any record arrives
//! resumes from there. A position past what the store holds (a fresh view's) is refused:
//! it would hide every record of its shard up to it.
//!
//! A stream reads what it has not been shown from the store first, then follows the view's
//! changes, skipping what it has already gone past. A change that starts past the stream's
//! position (it never does, but a stream does not rely on that), one too large to hand out,
//! a stream that fell behind the changes kept, and a client that has not taken
//! [`QUEUED_BYTES`] of events yet all send the stream back to the store: it lets go of the
//! view's changes (so a client that never reads pins none of them) and reads the gap in
//! pages, each sent as the client takes the one before.
//!
//! Events: `position`, `record` (a put that is its id's live record) and `tombstone`, each
//! with the entry as JSON, and `end` when the stream must stop (shutdown, a store read that
//! failed): its id is the position the stream went through, its data `{"reason": …,
//! "resume": true}`: reconnect with that id as `Last-Event-ID`. Comments keep an idle
//! connection open.
//!
//! A stream given `until` (a position the view holds) is the changes between two positions
//! (rule 24): it reads what lies past its start and at or below `until` from the store, as
//! any stream catches up, and ends with `end` of reason [`UNTIL`] and `"resume": false`.
//!
//! A stream also sends `position` when it went through entries its scope does not show
//! (another session's): after each page read from the store, and at most every [`PROGRESS`]
//! while it follows the view's changes. A session watcher on a busy store that reconnects
//! then resumes past what it was shown nothing of, instead of reading it all again (with
//! reconnects more frequent than a page read, it would never move).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ctxlog::{Checkpoint, Entry, Kind, ShardId};
use futures::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::Replica;
use crate::api::EntryOut;
use crate::cursor;
use crate::metrics::Metrics;
use crate::problem::{Problem, types};
use crate::view::{Change, Event, READ_CHUNK, View};

/// The fewest entries a stream reads of one shard at a time, however many shards it is
/// behind on.
const MIN_PAGE: usize = 64;

/// While a stream follows the view's changes, how often it says where it went through
/// entries it showed nothing of (a `position` event).
const PROGRESS: Duration = Duration::from_secs(5);

/// The reason of the `end` of a stream that went through its `until`: done, not resumable.
pub(crate) const UNTIL: &str = "until";

/// Page reads of a catch-up in flight at once (one per shard behind): a stream behind on
/// several shards waits for the slowest read, not their sum, before its first event.
const PAGE_READS: usize = 4;

/// What a stream shows.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// One session of one bot.
    Session { bot: String, session: String },
    /// Every record of the store.
    Store,
}

impl Scope {
    fn keeps(&self, e: &Entry) -> bool {
        match self {
            Scope::Session { bot, session } => e.record.bot_id == *bot && e.record.session_id == *session,
            Scope::Store => true,
        }
    }
}

/// Watch streams open, per token.
#[derive(Default)]
pub(crate) struct Watchers {
    per_token: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Watchers {
    /// A place for one more stream of `token`, or a problem when it has its maximum.
    pub(crate) fn admit(&self, token: &str, max: usize) -> Result<OwnedSemaphorePermit, Problem> {
        let sem = self
            .per_token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(token.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(max)))
            .clone();
        sem.try_acquire_owned().map_err(|_| {
            Problem::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                types::TOO_MANY_WATCHERS,
                "Too many watch streams",
                format!("this token has {max} watch streams open already"),
            )
        })
    }
}

/// Bytes of events queued for one client (sent, not yet taken by its connection) beyond
/// which a stream stops following the view's changes and reads from the store as the client
/// takes what it was sent: what a client that never reads costs the replica. One event
/// larger than this is still sent, alone.
pub(crate) const QUEUED_BYTES: usize = 4 << 20;

/// One event of a stream, before it is written out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    /// The first: the position the stream starts from, and the `until` it ends at (said
    /// back, so that a client knows the replica took it); later, where it went through.
    Position { id: String, until: Option<String> },
    /// A `record` or `tombstone` (`kind`): the entry as JSON, and the position through it.
    Entry {
        kind: &'static str,
        id: String,
        data: String,
    },
    /// The last, when the stream must stop: the position it went through, and why.
    End { id: String, reason: &'static str },
}

impl Out {
    fn bytes(&self) -> usize {
        let body = match self {
            Out::Entry { id, data, .. } => id.len() + data.len(),
            Out::Position { id, until } => 2 * id.len() + until.as_ref().map_or(0, String::len),
            Out::End { id, .. } => 2 * id.len(),
        };
        body + 32
    }

    fn into_sse(self) -> SseEvent {
        match self {
            Out::Position { id, until } => {
                let data = match until {
                    Some(until) => json!({ "position": id, "until": until }),
                    None => json!({ "position": id }),
                };
                SseEvent::default().event("position").data(data.to_string()).id(id)
            }
            Out::Entry { kind, id, data } => SseEvent::default().event(kind).id(id).data(data),
            Out::End { id, reason } => SseEvent::default()
                .event("end")
                .id(id)
                .data(json!({ "reason": reason, "resume": reason != UNTIL }).to_string()),
        }
    }
}

/// Why a stream stops.
enum Stop {
    /// The client is gone: nobody to tell.
    Gone,
    /// The stream ends with an `end` event of this reason.
    End(&'static str),
}

/// The sending side of one stream: events and their sizes, and the bytes not yet taken.
struct Outbox {
    tx: mpsc::UnboundedSender<(Out, usize)>,
    queued: Arc<watch::Sender<usize>>,
    /// The id of the last event pushed (a position).
    told: Mutex<String>,
    /// How often a stream that follows the view's changes says where it went through
    /// ([`PROGRESS`]).
    every: Duration,
}

impl Outbox {
    fn room_for(queued: usize, n: usize) -> bool {
        queued == 0 || queued + n <= QUEUED_BYTES
    }

    fn has_room(&self, n: usize) -> bool {
        Self::room_for(*self.queued.borrow(), n)
    }

    fn push(&self, out: Out) -> Result<(), Stop> {
        let n = out.bytes();
        let (Out::Position { id, .. } | Out::Entry { id, .. } | Out::End { id, .. }) = &out;
        id.clone_into(&mut self.told.lock().unwrap_or_else(|p| p.into_inner()));
        self.queued.send_modify(|q| *q += n);
        self.tx.send((out, n)).map_err(|_| Stop::Gone)
    }

    /// Wait until `n` bytes more fit (the client has taken enough of what it was sent).
    async fn wait_for_room(&self, n: usize, shutdown: &mut watch::Receiver<bool>) -> Result<(), Stop> {
        let mut queued = self.queued.subscribe();
        let room = async { queued.wait_for(|q| Self::room_for(*q, n)).await.is_ok() };
        tokio::select! {
            ok = room => if !ok { return Err(Stop::Gone) },
            _ = self.tx.closed() => return Err(Stop::Gone),
            _ = crate::stopped(shutdown) => return Err(Stop::End("shutdown")),
        }
        Ok(())
    }

    /// Push a `position` event for `at`, unless the last event pushed already said it, and
    /// only into room (news of progress waits for nobody): where a client that reconnects
    /// resumes, past entries of other scopes it was shown nothing of.
    fn progress(&self, at: &Checkpoint) -> Result<(), Stop> {
        let id = cursor::position(at);
        let told = *self.told.lock().unwrap_or_else(|p| p.into_inner()) == id;
        let out = Out::Position { id, until: None };
        if told || !self.has_room(out.bytes()) {
            return Ok(());
        }
        self.push(out)
    }
}

/// Start a stream of `scope` from `from` (a position, and the field that gave it), or from
/// the view's position now.
pub(crate) async fn stream(
    replica: Arc<Replica>,
    scope: Scope,
    from: Option<(&'static str, Checkpoint)>,
    until: Option<Checkpoint>,
    permit: OwnedSemaphorePermit,
) -> Result<Response, Problem> {
    // A fresh view holds every position any replica gave out (rule 1).
    let start = replica.view.fresh().await?.checkpoint();
    let held = |field: &'static str, at: &Checkpoint| match at.first_beyond(&start) {
        Some((shard, seq)) => Err(Problem::invalid(
            field,
            None,
            format!("names seq {seq} of shard {shard}, past what the store holds: not a position of this store"),
        )),
        None => Ok(()),
    };
    let from = match (from, &until) {
        (Some((field, from)), _) => {
            held(field, &from)?;
            from
        }
        // From now until a position the view holds would be nothing, always: a caller who
        // forgot where the changes start would read "nothing changed".
        (None, Some(_)) => {
            return Err(Problem::invalid(
                "after",
                None,
                "`until` needs where the changes start: `after` or `Last-Event-ID`",
            ));
        }
        (None, None) => start.clone(),
    };
    if let Some(until) = &until {
        held("until", until)?;
    }
    let (events, _) = open(
        replica.view.clone(),
        replica.metrics.clone(),
        replica.shutdown.clone(),
        scope,
        Span { from, start, until },
        permit,
        PROGRESS,
    );
    Ok(Sse::new(events.map(|out| Ok::<_, Infallible>(out.into_sse())))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Where a stream starts, and where it ends if it does.
struct Span {
    /// The position the stream starts from.
    from: Checkpoint,
    /// The view's position when the stream was opened (at or past `from`).
    start: Checkpoint,
    /// The position the stream ends at (held by the view), if it is the changes between
    /// two positions.
    until: Option<Checkpoint>,
}

/// The events of a stream of `span`: its `position` at once, then what follows, from a task
/// of its own; and the bytes of them not yet taken.
fn open(
    view: Arc<View>,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
    scope: Scope,
    span: Span,
    permit: OwnedSemaphorePermit,
    every: Duration,
) -> (impl Stream<Item = Out> + Send + 'static, watch::Receiver<usize>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(watch::Sender::new(0usize));
    let out = Outbox {
        tx,
        queued: queued.clone(),
        told: Mutex::new(String::new()),
        every,
    };
    let _ = out.push(Out::Position {
        id: cursor::position(&span.from),
        until: span.until.as_ref().map(cursor::position),
    });
    tokio::spawn(async move {
        metrics.watchers.inc();
        follow(&view, shutdown, &scope, span, &out).await;
        metrics.watchers.dec();
        drop(permit);
    });
    let waiting = queued.subscribe();
    let events = UnboundedReceiverStream::new(rx).map(move |(out, n)| {
        queued.send_modify(|q| *q = q.saturating_sub(n));
        out
    });
    (events, waiting)
}

/// Run a stream of `scope` over `span`: through `span.until` if it has one, else until it
/// must stop.
async fn follow(view: &View, mut shutdown: watch::Receiver<bool>, scope: &Scope, span: Span, out: &Outbox) {
    let mut at = span.from;
    let stop = if let Some(until) = span.until {
        // The changes between two positions: read from the store, never the view's changes.
        match catch_up(view, out, scope, &mut at, &until, &mut shutdown).await {
            Err(s) => s,
            // Through `until` on every shard: every change is sent.
            Ok(()) if until.first_beyond(&at).is_none() => Stop::End(UNTIL),
            // A catch-up that stopped short (it never does) must not say "done".
            Ok(()) => Stop::End("unavailable"),
        }
    } else {
        follow_view(view, &mut shutdown, scope, &mut at, span.start, out).await
    };
    if let Stop::End(reason) = stop {
        if reason != "shutdown" && reason != UNTIL {
            tracing::warn!(reason, "a watch stream ends; its client resumes from its last event id");
        }
        let _ = out.push(Out::End {
            id: cursor::position(&at),
            reason,
        });
    }
}

/// Follow the view from `at` (the view being at `start` or later) until the stream must
/// stop, and why.
async fn follow_view(
    view: &View,
    shutdown: &mut watch::Receiver<bool>,
    scope: &Scope,
    at: &mut Checkpoint,
    start: Checkpoint,
    out: &Outbox,
) -> Stop {
    let mut target = Some(start);
    loop {
        // Behind the view: read from the store, holding none of the view's changes.
        let to = match target.take() {
            Some(t) => t,
            None => view.current().await.checkpoint(),
        };
        if let Err(s) = catch_up(view, out, scope, at, &to, shutdown).await {
            break s;
        }
        let mut changes = view.subscribe();
        // What the view took between the read above and the subscription: when anything,
        // read it from the store again first, without the subscription. A subscription held
        // while a client does not read pins the view's kept changes (up to 256 commits), so
        // it is taken only by a stream that is where the view is.
        let now = view.current().await.checkpoint();
        if now.first_beyond(at).is_some() {
            drop(changes);
            continue;
        }
        match follow_changes(out, scope, at, &mut changes, shutdown).await {
            // Behind again: back to the store.
            Ok(()) => continue,
            Err(s) => break s,
        }
    }
}

/// Where a stream is: the position it went through, and per shard the seq it is in
/// (entries of one seq — a fenced writer's that landed and its successor's — come together
/// and are gone through together).
struct Through<'a> {
    at: &'a mut Checkpoint,
    groups: BTreeMap<ShardId, u64>,
}

impl<'a> Through<'a> {
    fn new(at: &'a mut Checkpoint) -> Self {
        Through {
            at,
            groups: BTreeMap::new(),
        }
    }

    /// The position through `e`, when the stream has not gone past it.
    fn next(&self, e: &Entry) -> Option<Checkpoint> {
        let past = self.at.get(e.shard);
        if e.seq < past || (e.seq == past && !self.in_group(e)) {
            return None;
        }
        let mut next = self.at.clone();
        next.0.insert(e.shard, e.seq);
        Some(next)
    }

    fn in_group(&self, e: &Entry) -> bool {
        self.groups.get(&e.shard) == Some(&e.seq)
    }

    fn went_through(&mut self, e: &Entry, next: Checkpoint) {
        self.groups.insert(e.shard, e.seq);
        *self.at = next;
    }
}

/// The event a stream of `scope` sends for `ev`, at position `through`; `None` when it
/// shows none.
fn event(scope: &Scope, ev: &Event, through: &Checkpoint) -> Option<Out> {
    let e = &ev.entry;
    if !ev.shown || !scope.keeps(e) {
        return None;
    }
    let kind = match e.record.kind {
        Kind::Put | Kind::Summary => "record",
        Kind::Tombstone => "tombstone",
        // A fork or hide of the session: its view changed shape (rule 25).
        Kind::Fork | Kind::Hide => "link",
        Kind::Embedding => return None,
    };
    Some(Out::Entry {
        kind,
        id: cursor::position(through),
        data: serde_json::to_string(&EntryOut::from(e)).unwrap_or_default(),
    })
}

/// Read from the store what lies between `at` and `to`, a page of each shard at a time,
/// and send what `scope` shows as the client takes it, in the log's order across shards
/// (each shard's entries in seq order): a client that reconnects often, or a replica slow
/// to read, still moves on every shard (shard after shard, the last would wait for every
/// other to be caught up, for as long as they keep growing). `at` reaches `to` only by
/// going through every entry up to it.
async fn catch_up(
    view: &View,
    out: &Outbox,
    scope: &Scope,
    at: &mut Checkpoint,
    to: &Checkpoint,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), Stop> {
    // Per shard still behind `to`, what was read of it and not yet gone through; pages
    // share one read's worth of entries (what a stream holds does not grow with the
    // store's shards).
    let mut read: BTreeMap<ShardId, VecDeque<Event>> = BTreeMap::new();
    let behind = to.0.iter().filter(|(shard, end)| at.get(**shard) < **end).count();
    let limit = (READ_CHUNK / behind.max(1)).max(MIN_PAGE);
    let mut through = Through::new(at);
    loop {
        // Every shard behind whose page is gone through: its next page, read at once.
        let wanted: Vec<(ShardId, u64, u64)> = to
            .0
            .iter()
            .filter(|(shard, end)| through.at.get(**shard) < **end && read.get(shard).is_none_or(VecDeque::is_empty))
            .map(|(&shard, &end)| (shard, through.at.get(shard), end))
            .collect();
        let asks: Vec<(ShardId, u64)> = wanted.iter().map(|w| (w.0, w.1)).collect();
        let reads = futures::stream::iter(asks)
            .map(|(shard, after)| view.read_page(shard, after, limit))
            .buffered(PAGE_READS)
            .collect::<Vec<_>>();
        let pages = tokio::select! {
            r = reads => r,
            _ = out.tx.closed() => return Err(Stop::Gone),
            _ = crate::stopped(shutdown) => return Err(Stop::End("shutdown")),
        };
        for ((shard, after, end), page) in wanted.into_iter().zip(pages) {
            let page: VecDeque<Event> = match page {
                Ok(page) => page.into_iter().filter(|ev| ev.entry.seq <= end).collect(),
                Err(p) => {
                    tracing::warn!(detail = %p.detail, "a watch stream could not read what it has not been shown");
                    return Err(Stop::End("unavailable"));
                }
            };
            if page.is_empty() {
                // Every position names a stored entry (none is ever deleted; a hole is a
                // batch that never landed, below a later position): this read skipped the
                // one at `end`, and going past it would skip it for good.
                tracing::warn!(%shard, after, end, "a watch stream's read skipped what the view holds");
                return Err(Stop::End("unavailable"));
            }
            read.insert(shard, page);
        }
        // The oldest entry read, by the log's order.
        let oldest = read
            .iter()
            .filter_map(|(shard, r)| r.front().map(|ev| (ev.entry.key(), *shard)))
            .min();
        let Some((_, shard)) = oldest else {
            out.progress(through.at)?;
            return Ok(());
        };
        // It and the rest of its seq (a page never ends inside one), together: another
        // shard's entry between them would carry a position past the seq, and a client
        // resuming from it would never get the rest.
        let Some(pending) = read.get_mut(&shard) else {
            return Ok(());
        };
        let Some(first) = pending.pop_front() else {
            return Ok(());
        };
        let seq = first.entry.seq;
        let mut group = vec![first];
        while let Some(ev) = pending.pop_front_if(|ev| ev.entry.seq == seq) {
            group.push(ev);
        }
        let page_done = pending.is_empty();
        // The group's events, then room for all of them at once: a stream that stopped
        // between two (shutdown, a client gone) would have said a position through the seq
        // with the rest of it unsent, and a client resuming there never gets it.
        let before = (through.at.clone(), through.groups.clone());
        let mut events = Vec::with_capacity(group.len());
        for ev in group {
            let Some(next) = through.next(&ev.entry) else { continue };
            if let Some(o) = event(scope, &ev, &next) {
                events.push(o);
            }
            through.went_through(&ev.entry, next);
        }
        if let Err(stop) = out.wait_for_room(events.iter().map(Out::bytes).sum(), shutdown).await {
            // Stopped before the group went out: the stream did not go through it.
            (*through.at, through.groups) = before;
            return Err(stop);
        }
        for o in events {
            out.push(o)?;
        }
        if page_done {
            out.progress(through.at)?;
        }
    }
}

/// Follow the view's changes while the client keeps up. `Ok` when the stream must read
/// from the store again (it fell behind the changes or the client's queue is full, or a
/// change does not start where the stream is); `Err` when it stops.
async fn follow_changes(
    out: &Outbox,
    scope: &Scope,
    at: &mut Checkpoint,
    changes: &mut broadcast::Receiver<Arc<Change>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), Stop> {
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + out.every, out.every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let change = tokio::select! {
            c = changes.recv() => c,
            _ = every.tick() => {
                out.progress(at)?;
                continue;
            }
            _ = out.tx.closed() => return Err(Stop::Gone),
            _ = crate::stopped(shutdown) => return Err(Stop::End("shutdown")),
        };
        let change = match change {
            Ok(change) => change,
            Err(broadcast::error::RecvError::Lagged(_)) => return Ok(()),
            Err(broadcast::error::RecvError::Closed) => return Err(Stop::End("stopped")),
        };
        // A change past the stream's position would skip what lies between.
        if change.from.first_beyond(at).is_some() {
            return Ok(());
        }
        let Some(events) = &change.events else { return Ok(()) };
        let mut through = Through::new(&mut *at);
        for ev in events {
            let Some(next) = through.next(&ev.entry) else { continue };
            if let Some(o) = event(scope, ev, &next) {
                // The rest of one seq goes with it, whatever the queue holds.
                if !through.in_group(&ev.entry) && !out.has_room(o.bytes()) {
                    return Ok(());
                }
                out.push(o)?;
            }
            through.went_through(&ev.entry, next);
        }
        // The change holds every entry up to its end, and the stream went through them.
        for (&shard, &seq) in &change.to.0 {
            at.advance(shard, seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxlog::testing::ReferenceStore;
    use ctxlog::{Record, Shard, Store, StoreOptions, WriterId};
    use futures::stream::BoxStream;

    const WITHIN: Duration = Duration::from_secs(30);

    /// A view of a reference store that refreshes only when asked (no schedule decides what
    /// a test sees), a shard to append to, and the replica's shutdown switch.
    struct Rig {
        store: ReferenceStore,
        view: Arc<View>,
        shard: Box<dyn Shard>,
        stop: watch::Sender<bool>,
    }

    async fn rig(name: &str) -> Rig {
        let options = StoreOptions::default().with_timeout(Duration::from_secs(10));
        let reference = ReferenceStore::open(name, options).unwrap();
        let store: Arc<dyn Store> = Arc::new(reference.clone());
        let view = View::new(store.clone(), Arc::new(Metrics::new()));
        let (stop, stopped) = watch::channel(false);
        let hour = Duration::from_secs(3600);
        tokio::spawn(view.clone().run(hour, hour, stopped));
        drop(view.fresh().await.unwrap());
        let shard = store.open_shard(&WriterId::new("w").unwrap()).await.unwrap();
        Rig {
            store: reference,
            view,
            shard,
            stop,
        }
    }

    fn recs(prefix: &str, n: usize, text: &str) -> Vec<Record> {
        (0..n)
            .map(|i| Record::text(format!("{prefix}-{i}"), "bot", "s", "user", text))
            .collect()
    }

    impl Rig {
        /// Refresh the view (a hand-out to watchers follows when it moved).
        async fn refreshed(&self) {
            drop(self.view.fresh().await.unwrap());
        }

        /// A stream of session `s` from the view's position now.
        async fn watch(&self) -> (BoxStream<'static, Out>, watch::Receiver<usize>) {
            let start = self.view.fresh().await.unwrap().checkpoint();
            self.watch_from(start.clone(), start).await
        }

        /// A stream of session `s` from `from`, the view being at `start` or later.
        async fn watch_from(
            &self,
            from: Checkpoint,
            start: Checkpoint,
        ) -> (BoxStream<'static, Out>, watch::Receiver<usize>) {
            self.watch_span(from, start, None).await
        }

        /// A stream of session `s` from `from` to `until` if given.
        async fn watch_span(
            &self,
            from: Checkpoint,
            start: Checkpoint,
            until: Option<Checkpoint>,
        ) -> (BoxStream<'static, Out>, watch::Receiver<usize>) {
            let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
            let scope = Scope::Session {
                bot: "bot".into(),
                session: "s".into(),
            };
            let (events, queued) = open(
                self.view.clone(),
                Arc::new(Metrics::new()),
                self.stop.subscribe(),
                scope,
                Span { from, start, until },
                permit,
                // Progress is told within a test's patience.
                Duration::from_millis(20),
            );
            let mut events = events.boxed();
            assert!(matches!(next(&mut events).await, Out::Position { .. }));
            (events, queued)
        }
    }

    async fn next(events: &mut BoxStream<'static, Out>) -> Out {
        tokio::time::timeout(WITHIN, events.next())
            .await
            .expect("an event within the deadline")
            .expect("the stream goes on")
    }

    /// The ids of the next `n` record events, and the position of the last (progress
    /// `position` events between them are passed over).
    async fn ids(events: &mut BoxStream<'static, Out>, n: usize) -> (Vec<String>, String) {
        let (mut ids, mut position) = (Vec::new(), String::new());
        while ids.len() < n {
            match next(events).await {
                Out::Position { .. } => {}
                Out::Entry {
                    kind: "record",
                    id,
                    data,
                } => {
                    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
                    ids.push(v["id"].as_str().unwrap().to_string());
                    position = id;
                }
                other => panic!("expected a record after {ids:?}, got {other:?}"),
            }
        }
        (ids, position)
    }

    /// Seq 1 of `writer`'s shard, written at `epoch` (a fenced writer's and its successor's
    /// share it).
    fn seq_one(writer: &str, epoch: u64, hlc: u64, id: &str, text: &str) -> Entry {
        let record = Record::text(id, "bot", "s", "user", text);
        Entry {
            shard: WriterId::new(writer).unwrap().shard_id(),
            seq: 1,
            epoch,
            hlc: ctxlog::Hlc(hlc),
            content_hash: record.content_hash(),
            record,
            purged: false,
        }
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    /// Issue 32 §2: the projector moves without a hand-out — a refresh outside the refresh
    /// task (a read's first scan after a failed refresh), or one cut short by its deadline
    /// that kept the rows it applied (the task hands out nothing after a failure) — and the
    /// next hand-out must still bring those entries: a watcher sees every record once, in
    /// order, with nothing skipped.
    #[tokio::test]
    async fn a_watch_gets_every_record_once_whatever_moved_the_view() {
        let mut rig = rig("watch-no-skip").await;
        let (mut events, _) = rig.watch().await;
        let mut changes = rig.view.subscribe();
        rig.shard.append(recs("a", 3, "x")).await.unwrap();
        // The projector takes `a` outside the refresh task.
        rig.view.current().await.refresh().await.unwrap();
        rig.shard.append(recs("b", 2, "x")).await.unwrap();
        rig.refreshed().await;
        // The hand-out itself holds `a` (a stream also reads from the store a change that
        // does not start where it is, but it must not have to).
        let change = tokio::time::timeout(WITHIN, changes.recv()).await.unwrap().unwrap();
        let handed: Vec<String> = change
            .events
            .as_ref()
            .expect("a small change is handed out")
            .iter()
            .map(|e| e.entry.record.id.clone())
            .collect();
        assert_eq!(
            handed,
            [names("a", 3), names("b", 2)].concat(),
            "the hand-out skipped a gap"
        );
        let (seen, _) = ids(&mut events, 5).await;
        assert_eq!(
            seen,
            [names("a", 3), names("b", 2)].concat(),
            "the watcher skipped a gap"
        );
        rig.shard.append(recs("c", 1, "x")).await.unwrap();
        rig.refreshed().await;
        assert_eq!(ids(&mut events, 1).await.0, names("c", 1), "and nothing twice");
    }

    /// Rule 24's changes between two positions: a stream from `a` until `b` sends what was
    /// appended and tombstoned in between, in the log's order, and ends there — nothing
    /// before `a`, nothing after `b` (also when the view has moved past it), and an end that
    /// says not to resume.
    #[tokio::test]
    async fn a_stream_until_a_position_sends_the_changes_between_and_ends() {
        let mut rig = rig("watch-until").await;
        rig.shard.append(recs("a", 3, "x")).await.unwrap();
        let a = rig.view.fresh().await.unwrap().checkpoint();
        rig.shard.append(recs("b", 2, "x")).await.unwrap();
        rig.shard
            .append(vec![Record::tombstone("a-1", "bot", "s")])
            .await
            .unwrap();
        let b = rig.view.fresh().await.unwrap().checkpoint();
        rig.shard.append(recs("c", 2, "x")).await.unwrap();
        rig.refreshed().await;
        let now = rig.view.fresh().await.unwrap().checkpoint();
        let (mut events, _) = rig.watch_span(a, now, Some(b.clone())).await;
        let mut seen = Vec::new();
        let end = loop {
            match next(&mut events).await {
                Out::Position { .. } => {}
                Out::Entry { kind, data, .. } => {
                    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
                    seen.push(format!("{kind} {}", v["id"].as_str().unwrap()));
                }
                Out::End { id, reason } => break (id, reason),
            }
        };
        assert_eq!(seen, ["record b-0", "record b-1", "tombstone a-1"]);
        assert_eq!(end, (cursor::position(&b), UNTIL), "the stream ends at `until`");
        let done = tokio::time::timeout(WITHIN, events.next())
            .await
            .expect("the stream ends");
        assert!(done.is_none(), "nothing follows the end");
    }

    /// A refresh that fails may leave the projector empty (SQLite's catch-up cut short by
    /// its deadline starts over). A stream that reads from the store meanwhile must not
    /// judge what it read by that projector (no record is its id's live one there, and the
    /// stream would go past all of them): it ends, and the client that resumes from its
    /// last event gets every record once, in order.
    #[tokio::test]
    async fn a_watch_judges_nothing_by_a_view_a_failed_refresh_emptied() {
        let mut rig = rig("watch-torn-view").await;
        rig.shard.append(recs("a", 3, "x")).await.unwrap();
        rig.refreshed().await;
        let start = rig.view.current().await.checkpoint();
        let cut = rig.store.cut_a_refresh_short();
        assert!(rig.view.fresh().await.is_err(), "the cut refresh failed");
        drop(cut);
        // A client resuming from before `a` while the projector is empty: the stream ends
        // at once (the view refreshes only when asked), where it started.
        let (mut events, _) = rig.watch_from(Checkpoint::default(), start).await;
        let resume = match next(&mut events).await {
            Out::End { id, reason } => {
                assert_eq!(reason, "unavailable");
                id
            }
            other => panic!("a stream over an emptied view ends, got {other:?}"),
        };
        rig.shard.append(recs("b", 1, "x")).await.unwrap();
        rig.refreshed().await;
        // Resumed once, on a whole view.
        let from = cursor::parse_position("Last-Event-ID", &resume).unwrap();
        assert_eq!(from, Checkpoint::default(), "the end names where the stream started");
        let start = rig.view.fresh().await.unwrap().checkpoint();
        let (mut events, _) = rig.watch_from(from, start).await;
        let (seen, _) = ids(&mut events, 4).await;
        assert_eq!(
            seen,
            [names("a", 3), names("b", 1)].concat(),
            "the watcher skipped records"
        );
    }

    /// A session watcher on a busy store learns where it went through what it was shown
    /// nothing of (another session's records), from a catch-up and while it follows: one
    /// that reconnected more often than it received a record of its own resumed from the
    /// same place again and again (a 10-minute Lance soak, 2026-12-05, seed 106: a session
    /// watcher read the same pages from seq 81 for minutes, and ended thousands behind).
    #[tokio::test]
    async fn a_watch_tells_where_it_went_through_what_it_showed_nothing_of() {
        let mut rig = rig("watch-progress").await;
        let others = |prefix: &str, n: usize| -> Vec<Record> {
            (0..n)
                .map(|i| Record::text(format!("{prefix}-{i}"), "bot", "other", "user", "x"))
                .collect()
        };
        rig.shard.append(others("o", 5)).await.unwrap();
        rig.refreshed().await;
        let start = rig.view.current().await.checkpoint();
        let (mut events, _) = rig.watch_from(Checkpoint::default(), start.clone()).await;
        match next(&mut events).await {
            Out::Position { id, .. } => assert_eq!(id, cursor::position(&start), "a catch-up's page went through"),
            other => panic!("expected where the catch-up went through, got {other:?}"),
        }
        // Following the view's changes: told within `PROGRESS`.
        rig.shard.append(others("p", 3)).await.unwrap();
        rig.refreshed().await;
        let now = rig.view.current().await.checkpoint();
        assert_ne!(now, start);
        match next(&mut events).await {
            Out::Position { id, .. } => assert_eq!(id, cursor::position(&now), "a change went through"),
            other => panic!("expected where the stream went through, got {other:?}"),
        }
        // Told once: the next event is the session's own record.
        rig.shard.append(recs("mine", 1, "x")).await.unwrap();
        rig.refreshed().await;
        assert!(matches!(next(&mut events).await, Out::Entry { kind: "record", .. }));
    }

    /// A stream that reads from the store sends what it read in the log's order across
    /// shards, not shard after shard: there, a client that reconnects every few events (or
    /// a replica slow to read) never reached the last shard while the others grew (a store
    /// watcher on a slow Lance replica received none of one shard's records in a 10-minute
    /// soak, 2026-12-03, seed 105).
    #[tokio::test]
    async fn a_catch_up_goes_in_the_log_order_across_shards() {
        let rig = rig("watch-merge").await;
        let mut a = rig.store.open_shard(&WriterId::new("wa").unwrap()).await.unwrap();
        let mut b = rig.store.open_shard(&WriterId::new("wb").unwrap()).await.unwrap();
        // The older records in the shard read last.
        let (read_first, read_last) = if a.shard_id() < b.shard_id() {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let old = read_last.append(recs("old", 2, "x")).await.unwrap();
        read_first.observe(old.last_hlc).unwrap();
        read_first.append(recs("new", 2, "x")).await.unwrap();
        rig.refreshed().await;
        let start = rig.view.current().await.checkpoint();
        let (mut events, _) = rig.watch_from(Checkpoint::default(), start).await;
        let (seen, _) = ids(&mut events, 4).await;
        assert_eq!(seen, [names("old", 2), names("new", 2)].concat());
    }

    /// The entries of one seq (a fenced writer's that landed and its successor's) go out
    /// together in a catch-up, whatever other shards hold between their clocks: an event of
    /// another shard between them would carry a position through the seq, and a client
    /// resuming from it would never get the rest of it.
    #[tokio::test]
    async fn a_catch_up_sends_one_seqs_entries_together() {
        let rig = rig("watch-merge-group").await;
        // Seq 1 of `wx` twice, a clock of `wy` between them.
        for e in [
            seq_one("wx", 1, 100, "fenced", "x"),
            seq_one("wx", 2, 300, "successor", "x"),
            seq_one("wy", 1, 200, "between", "x"),
        ] {
            rig.store.inject_raw_entry(e);
        }
        rig.refreshed().await;
        let start = rig.view.current().await.checkpoint();
        let (mut events, _) = rig.watch_from(Checkpoint::default(), start).await;
        let (seen, _) = ids(&mut events, 3).await;
        assert_eq!(seen, ["fenced", "successor", "between"]);
    }

    /// A stream that stops while one seq's entries wait for the client's room (shutdown, a
    /// client gone) names a position before the seq, never through it with the rest unsent:
    /// a client resuming there gets every entry of the seq once.
    #[tokio::test]
    async fn a_stop_inside_one_seqs_entries_names_a_position_before_it() {
        let rig = rig("watch-group-stop").await;
        // Two of one seq too large to queue together behind anything, and one after them.
        let big = "x".repeat(3 << 20);
        for e in [
            seq_one("wx", 1, 100, "fenced", &big),
            seq_one("wx", 2, 200, "successor", &big),
            seq_one("wy", 1, 300, "after", "x"),
        ] {
            rig.store.inject_raw_entry(e);
        }
        rig.refreshed().await;
        let start = rig.view.current().await.checkpoint();
        let (mut events, mut queued) = rig.watch_from(Checkpoint::default(), start.clone()).await;
        // The client reads nothing until the stream waits for room, then the replica stops.
        let waiting = tokio::time::timeout(WITHIN, queued.wait_for(|q| *q >= 3 << 20))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(waiting, "the stream never queued the seq");
        rig.stop.send_replace(true);
        let mut seen = Vec::new();
        let resume = loop {
            match next(&mut events).await {
                Out::Entry { data, .. } => {
                    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
                    seen.push(v["id"].as_str().unwrap().to_string());
                }
                Out::Position { .. } => {}
                Out::End { id, reason } => {
                    assert_eq!(reason, "shutdown");
                    break id;
                }
            }
        };
        rig.stop.send_replace(false);
        let from = cursor::parse_position("Last-Event-ID", &resume).unwrap();
        let (mut events, _) = rig.watch_from(from, start).await;
        // Up to the last record, which arrives whatever came before it.
        while seen.last().is_none_or(|id| id != "after") {
            seen.extend(ids(&mut events, 1).await.0);
        }
        assert_eq!(
            seen,
            ["fenced", "successor", "after"],
            "a resume from where the stopped stream said it was lost or repeated part of a seq"
        );
    }

    /// `fresh` hands out a projector that a refresh after the one it waited for emptied:
    /// that refresh failed between the success it waited for and its taking the lock. A
    /// summary's coverage checked against it would be refused ("past what the store
    /// holds"), and its clock would order the summary before what it covers.
    #[tokio::test]
    async fn a_fresh_view_is_never_one_a_failed_refresh_emptied() {
        let mut rig = rig("view-fresh-torn").await;
        rig.shard.append(recs("a", 3, "x")).await.unwrap();
        let shard = rig.shard.shard_id();
        let (first, second) = (rig.store.hold_a_refresh(), rig.store.hold_a_refresh());
        let view = rig.view.clone();
        let reader = tokio::spawn(async move { view.fresh().await.map(|p| p.checkpoint()) });
        assert!(first.reached(WITHIN).await, "the reader's refresh began");
        // Another refresh is asked for while that one runs: it follows at once.
        rig.view.nudge();
        drop(first);
        assert!(second.reached(WITHIN).await, "the next refresh began");
        // The reader saw its refresh succeed and waits for the projector.
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        let cut = rig.store.cut_a_refresh_short();
        drop(second);
        let seen = tokio::time::timeout(WITHIN, reader).await.unwrap().unwrap().unwrap();
        drop(cut);
        assert_eq!(
            seen.get(shard),
            3,
            "a fresh view that lacks what was acknowledged before"
        );
    }

    /// Issue 32 §5: a client that does not read holds at most its bound of queued events,
    /// never the view's changes; once it reads, every record arrives once, in order, and it
    /// follows live again. Shutdown ends the stream at once with a resumable `end` through
    /// the last record it was sent.
    #[tokio::test]
    async fn a_watcher_that_does_not_read_holds_its_bound_and_misses_nothing() {
        let mut rig = rig("watch-bounded").await;
        let (mut events, mut queued) = rig.watch().await;
        let big = "x".repeat(256 << 10);
        // Each batch its own change; together far more than the bound.
        for i in 0..40 {
            rig.shard.append(recs(&format!("big{i:02}"), 1, &big)).await.unwrap();
            rig.refreshed().await;
        }
        let full = QUEUED_BYTES - (300 << 10);
        let filled = tokio::time::timeout(WITHIN, queued.wait_for(|q| *q >= full))
            .await
            .is_ok_and(|r| r.is_ok());
        assert!(filled, "the stream never queued up to its bound");
        let held = *queued.borrow();
        assert!(
            held <= QUEUED_BYTES,
            "{held} bytes queued for a client that does not read"
        );
        // It let go of the view's changes: it reads the rest from the store as the client
        // takes what it was sent.
        // (Falling back happens in the poll that met the full queue; give the stream's task
        // its turns, no time.)
        for _ in 0..16 {
            if rig.view.subscribed() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(rig.view.subscribed(), 0, "a slow stream still holds the view's changes");
        let want: Vec<String> = (0..40).map(|i| format!("big{i:02}-0")).collect();
        assert_eq!(ids(&mut events, 40).await.0, want);
        // Caught up, it follows the view's changes again.
        rig.shard.append(recs("live", 2, "x")).await.unwrap();
        rig.refreshed().await;
        let (live, through) = ids(&mut events, 2).await;
        assert_eq!(live, names("live", 2));
        rig.stop.send_replace(true);
        match next(&mut events).await {
            Out::End { id, reason } => {
                assert_eq!(reason, "shutdown");
                assert_eq!(id, through, "the end names the position through the last record sent");
            }
            other => panic!("expected the end, got {other:?}"),
        }
        assert!(tokio::time::timeout(WITHIN, events.next()).await.unwrap().is_none());
    }
}
