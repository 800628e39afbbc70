//! Watch streams: a session's (or the store's) new records as server-sent events.
//!
//! Each event's id is a position (per shard, the last seq the stream has gone through).
//! Every shard is read as a prefix, so "every entry of the scope past this position" is
//! exactly what the client has not been shown: a stream that starts from a position (the
//! `Last-Event-ID` of a reconnecting client, or a page's `position`) first reads those from
//! the store, then follows the view's changes, skipping what it has already gone past. A
//! stream that falls behind the changes kept reads the gap from the store the same way.
//!
//! Events: `record` (a put that is its id's live record) and `tombstone`, each with the
//! entry as JSON; comments keep an idle connection open.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use ctxlog::{Checkpoint, Entry, Kind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::Replica;
use crate::api::EntryOut;
use crate::cursor;
use crate::problem::{Problem, types};
use crate::view::{Change, Event, max};

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

/// Events queued for a slow client before the stream waits for it.
const QUEUE: usize = 256;

/// Start a stream of `scope` from `from` (a position), or from the view's position now.
pub(crate) async fn stream(
    replica: Arc<Replica>,
    scope: Scope,
    from: Option<Checkpoint>,
    permit: OwnedSemaphorePermit,
) -> Result<Response, Problem> {
    // Subscribed before the start is read: nothing between the two is missed.
    let changes = replica.view.subscribe();
    let start = {
        let p = replica.view.fresh().await?;
        p.checkpoint()
    };
    let from = from.unwrap_or_else(|| start.clone());
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(follow(replica, scope, from, start, changes, tx, permit));
    Ok(Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

type Tx = mpsc::Sender<Result<SseEvent, Infallible>>;

/// Send the events of `events` that the stream has not gone past; move `at` along. False
/// when the client is gone.
async fn send_all(tx: &Tx, scope: &Scope, at: &mut Checkpoint, events: &[Event]) -> bool {
    // Entries of one seq (a fenced writer's that landed and its successor's) come together
    // and are gone through together.
    let mut group = None;
    for ev in events {
        let e = &ev.entry;
        let past = at.get(e.shard);
        if e.seq < past || (e.seq == past && group != Some((e.shard, e.seq))) {
            continue;
        }
        group = Some((e.shard, e.seq));
        at.0.insert(e.shard, e.seq);
        if !ev.shown || !scope.keeps(e) {
            continue;
        }
        let kind = match e.record.kind {
            Kind::Put | Kind::Summary => "record",
            Kind::Tombstone => "tombstone",
        };
        let data = serde_json::to_string(&EntryOut::from(e)).unwrap_or_default();
        let event = SseEvent::default().event(kind).id(cursor::position(at)).data(data);
        if tx.send(Ok(event)).await.is_err() {
            return false;
        }
    }
    true
}

/// Read from the store what lies between `at` and `to` for `scope`, send it, and move `at`
/// to `to`. False when the client is gone or the read failed (the stream ends; the client
/// reconnects from its last event id).
async fn catch_up(replica: &Replica, tx: &Tx, scope: &Scope, at: &mut Checkpoint, to: &Checkpoint) -> bool {
    let wanted = scope.clone();
    match replica.view.entries_between(at, to, move |e| wanted.keeps(e)).await {
        Ok(events) => {
            if !send_all(tx, scope, at, &events).await {
                return false;
            }
            *at = max(at, to);
            true
        }
        Err(p) => {
            tracing::warn!(detail = %p.detail, "a watch stream could not read what it missed; it ends");
            false
        }
    }
}

async fn follow(
    replica: Arc<Replica>,
    scope: Scope,
    from: Checkpoint,
    start: Checkpoint,
    mut changes: broadcast::Receiver<Arc<Change>>,
    tx: Tx,
    _permit: OwnedSemaphorePermit,
) {
    replica.metrics.watchers.inc();
    let mut shutdown = replica.shutdown.clone();
    let mut at = from;
    if catch_up(&replica, &tx, &scope, &mut at, &start).await {
        loop {
            let change = tokio::select! {
                c = changes.recv() => c,
                _ = tx.closed() => break,
                _ = crate::stopped(&mut shutdown) => break,
            };
            let ok = match change {
                Ok(change) => match &change.events {
                    Some(events) => {
                        let sent = send_all(&tx, &scope, &mut at, events).await;
                        at = max(&at, &change.to);
                        sent
                    }
                    None => catch_up(&replica, &tx, &scope, &mut at, &change.to).await,
                },
                // Fell behind the changes kept: read the gap up to the view's position now.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    let now = replica.view.current().await.checkpoint();
                    catch_up(&replica, &tx, &scope, &mut at, &now).await
                }
                Err(broadcast::error::RecvError::Closed) => false,
            };
            if !ok {
                break;
            }
        }
    }
    replica.metrics.watchers.dec();
}
