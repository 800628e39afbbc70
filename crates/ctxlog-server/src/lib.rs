//! ctxlog over HTTP (`ctxlog serve`): one process per replica, the context log as JSON and
//! server-sent events.
//!
//! The roles, one module each:
//!
//! - [`writer`] — the replica's one shard, behind a task that takes append requests from a
//!   queue and writes whatever has queued as one durable commit (*group commit*); each
//!   request keeps its own atomic batch and its own ack. The task, not the request, owns the
//!   write: a client that goes away loses its answer, never the shard's consistency. A
//!   fenced shard stays fenced: the replica stops taking writes and never claims again.
//! - [`view`] — the replica's one projector, refreshed by one task when readers ask and on a
//!   schedule; after each refresh it hands the new entries to every watcher at once.
//! - [`watch`] — a session's (or the store's) new records as server-sent events whose event
//!   id is a resumable cursor: a client that reconnects with `Last-Event-ID` misses nothing
//!   and sees nothing twice.
//! - [`search`] — full-text search (rule 26): the replica's one searcher, caught up with the
//!   store to a fresh view's position before each search.
//! - [`auth`] — bearer tokens from a tokens file that holds their hashes, each scoped to the
//!   bots it may touch and its rights (read, write, admin).
//! - [`problem`] — every error as RFC 9457 problem details, with a stable `type` per error
//!   kind and the contract's `written` answer.
//! - [`routes`] — the HTTP routes and the OpenAPI document built from their types.
//! - [`listen`] — the accept loop: a bound on connections, idle and header timeouts,
//!   a shutdown bounded in time.
//! - [`metrics`] — what `/metrics` says, in Prometheus text.
//! - [`mcp`] — the same operations as MCP tools and resources: at `/mcp` on the server
//!   (streamable HTTP, under its tokens), and over stdio ([`serve_mcp_stdio`]).

#![warn(missing_docs)]
// A `Problem` is what a failed request answers: built once on the error path, never in a loop.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod auth;
mod cursor;
mod listen;
mod mcp;
mod metrics;
pub mod problem;
pub mod routes;
mod search;
mod tls;
#[cfg(all(test, feature = "sqlite"))]
mod two_replicas;
mod view;
mod watch;
mod writer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ctxlog::{Store, StoreOptions, WriterId};

pub use listen::Running;
pub use tls::TlsFiles;

/// Errors that keep the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened, or the writer's shard not claimed.
    #[error("{0}")]
    Store(#[from] ctxlog::Error),
    /// The tokens file is missing or malformed.
    #[error("tokens file {path}: {reason}")]
    Tokens {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS certificate or key cannot be used.
    #[error("TLS file {path}: {reason}")]
    Tls {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The MCP client did not complete its handshake on standard input and output.
    #[error("MCP over stdio: {0}")]
    Mcp(String),
    /// The listen address cannot be used as asked.
    #[error("listen on {addr}: {reason}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why not.
        reason: String,
    },
}

/// How one replica serves.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The store URI (storage options in its query).
    pub store: String,
    /// The writer identity this replica writes under: its own shard.
    pub writer: WriterId,
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The tokens file; without one (and without `owner_token`) the server listens on
    /// loopback only and every request may do all.
    pub tokens: Option<PathBuf>,
    /// One more token, with every right on every bot, beside the tokens file's (or alone):
    /// the process that started the server holds it (`ctxlog serve --owner-token`).
    pub owner_token: Option<String>,
    /// Serve TLS with this certificate and key; plain HTTP without.
    pub tls: Option<TlsFiles>,
    /// The store's options (the deadline of every operation among them).
    pub store_options: StoreOptions,
    /// Write every request as a commit of its own (off: what group commit is measured
    /// against).
    pub group_commit: bool,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The bytes of request bodies held at once, over all requests: an upload beyond it waits
    /// for room at most a header timeout, then is refused (`busy`).
    pub max_body_bytes_in_flight: usize,
    /// Requests handled at once (watch streams not counted; they have their own limit).
    pub max_concurrent_requests: usize,
    /// Watch streams open at once, per token (or in all, without tokens).
    pub max_watchers_per_token: usize,
    /// How long a client may take to send a request's headers, and a new connection to
    /// begin its first request (TLS handshake included). A body has three times as long in
    /// all, however its bytes come.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight after its last one.
    pub idle_timeout: Duration,
    /// Connections open at once (watch streams included); beyond it, new connections wait
    /// to be accepted until one closes. Keep it below the process's descriptor limit.
    pub max_connections: usize,
    /// On shutdown: how long appends in flight have to finish (then they are answered
    /// `written: unknown`); connections still open a second later are closed. Reads and
    /// uploads still sending their body are refused at once.
    pub shutdown_grace: Duration,
    /// How long a search may score before it gives up (`Timeout`, nothing written): a costly
    /// query holds a blocking thread and holds up the searcher's next catch-up (and the
    /// searches behind it) meanwhile. Reading the store to catch up is bounded by the store's
    /// own timeout.
    pub search_timeout: Duration,
    /// How often the replica refreshes its view when nobody asks: the shortest interval
    /// (always, on SQLite), doubled while nothing changes up to `idle_poll_max` (on object
    /// storage, where every refresh costs requests).
    pub poll_min: Duration,
    /// The longest interval between two refreshes when nothing changes.
    pub idle_poll_max: Duration,
}

impl ServeOptions {
    /// Defaults for `store` and `writer`, listening on 127.0.0.1:7070.
    pub fn new(store: impl Into<String>, writer: WriterId) -> Self {
        ServeOptions {
            store: store.into(),
            writer,
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            tokens: None,
            owner_token: None,
            tls: None,
            store_options: StoreOptions::default().with_create_if_missing(true),
            group_commit: true,
            max_body_bytes: 80 << 20,
            max_body_bytes_in_flight: 256 << 20,
            max_concurrent_requests: 512,
            max_watchers_per_token: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
            max_connections: 768,
            shutdown_grace: Duration::from_secs(10),
            search_timeout: Duration::from_secs(10),
            poll_min: Duration::from_millis(10),
            idle_poll_max: Duration::from_secs(2),
        }
    }
}

/// Everything a request handler reaches: the replica's writer, view, tokens and counters.
pub(crate) struct Replica {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) writer: writer::Writer,
    pub(crate) view: Arc<view::View>,
    pub(crate) tokens: auth::Tokens,
    pub(crate) metrics: Arc<metrics::Metrics>,
    pub(crate) options: ServeOptions,
    pub(crate) watchers: watch::Watchers,
    pub(crate) search: search::Search,
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
    /// The bytes of request bodies in flight, in KiB (see [`routes`]).
    pub(crate) body_budget: Arc<tokio::sync::Semaphore>,
}

/// Open the store, claim the writer's shard, and serve until [`Running::shutdown`] (or the
/// future returned by [`Running::wait`] is dropped with the process).
pub async fn start(options: ServeOptions) -> Result<Running, StartError> {
    listen::start(options).await
}

/// Serve the log as an MCP server over this process's standard input and output (what a
/// desktop MCP client launches): the replica of `options` (its store and writer; the
/// listen, token and TLS settings are not used), every right on `bots` (patterns as in a
/// tokens file, `*` for all). Returns when the client closes the streams or `stop`
/// resolves, once the shard is closed.
pub async fn serve_mcp_stdio(
    options: ServeOptions,
    bots: Vec<String>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    listen::mcp_stdio(options, bots, stop).await
}

/// Resolves once `stop` turns true (or its sender is gone). Holds no borrow of the value
/// across a wait, so the futures that select on it stay `Send`.
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}
