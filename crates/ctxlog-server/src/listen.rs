//! Starting a replica and its accept loop.
//!
//! Connections are served by hyper directly (not `axum::serve`) for what a server facing
//! slow or hostile clients needs:
//!
//! - a bound on connections open at once (beyond it, new ones wait in the listen backlog);
//! - a header read timeout (a client sending its headers byte by byte loses its
//!   connection), which is also how long a new connection may take to begin its first
//!   request — TLS handshake included — whatever protocol it speaks;
//! - an idle timeout: a connection with no request in flight is closed after it;
//! - a shutdown bounded in time: stop accepting, end the watch streams, refuse waiting
//!   reads at once, give appends in flight the shutdown grace, close every connection a
//!   second after it, then give the writer a few seconds to close the shard.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::auth::Tokens;
use crate::metrics::Metrics;
use crate::view::View;
use crate::watch::Watchers;
use crate::writer::Writer;
use crate::{Replica, ServeOptions, StartError, routes};

/// A replica that serves: its address, and how to stop it.
pub struct Running {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    done: JoinHandle<()>,
}

impl Running {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop: no new connections, watch streams end, waiting reads are refused, appends in
    /// flight finish within the shutdown grace, the shard is closed (within a few seconds
    /// more). Returns when all is done.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        let _ = self.done.await;
    }
}

pub(crate) async fn start(options: ServeOptions) -> Result<Running, StartError> {
    let tokens = match &options.tokens {
        Some(path) => Tokens::load(path).map_err(|reason| StartError::Tokens {
            path: path.clone(),
            reason,
        })?,
        None => Tokens::open(),
    };
    let tokens = match &options.owner_token {
        Some(token) => tokens.with_owner(token).map_err(|reason| StartError::Tokens {
            path: options.tokens.clone().unwrap_or_default(),
            reason,
        })?,
        None => tokens,
    };
    let tls = options.tls.as_ref().map(crate::tls::acceptor).transpose()?;
    // An owner token alone is for the process that started the server, on its own host.
    if options.tokens.is_none() && !options.listen.ip().is_loopback() {
        return Err(StartError::Listen {
            addr: options.listen,
            reason: "without a tokens file the server listens on loopback only (give --tokens FILE)".into(),
        });
    }
    let listen = options.listen;
    let (replica, stop) = open(options, tokens).await?;
    let listener = TcpListener::bind(listen).await.map_err(|e| StartError::Listen {
        addr: listen,
        reason: e.to_string(),
    })?;
    let addr = listener.local_addr().map_err(|e| StartError::Listen {
        addr: listen,
        reason: e.to_string(),
    })?;
    let limits = ConnLimits {
        header: replica.options.header_read_timeout,
        idle: replica.options.idle_timeout,
        grace: replica.options.shutdown_grace,
        max: replica.options.max_connections.clamp(1, MAX_CONNECTIONS),
    };
    let mcp = axum::Router::<Arc<Replica>>::new().nest_service("/mcp", crate::mcp::service(&replica));
    let app = routes::router(replica.clone(), mcp);
    let done = tokio::spawn(accept(listener, tls, app, limits, replica.shutdown.clone(), replica));
    Ok(Running { addr, stop, done })
}

/// A replica with no listener yet: the store open, the writer's shard claimed, the view
/// refreshing until the returned sender says stop.
pub(crate) async fn open(
    options: ServeOptions,
    tokens: Tokens,
) -> Result<(Arc<Replica>, watch::Sender<bool>), StartError> {
    let store = ctxlog::open(&options.store, options.store_options.clone()).await?;
    // Tokens scope requests by bot, but a store of format 1 or 2 groups record ids across
    // bots (rule 22): one bot's tombstone or early write can still reach another's record
    // until `ctxlog upgrade` moves it to format 3. Said at start, where an operator looks.
    let format = store.format().await?;
    tracing::debug!(format, store = %ctxlog::redact_uri(&options.store), "store opened");
    // Tenants come from a tokens file; an owner token alone is one client with every bot.
    if options.tokens.is_some() && format < ctxlog::IDS_BY_BOT {
        tracing::warn!(
            format,
            "this store groups record ids across bots (format {format}): tenants are not isolated until \
             `ctxlog upgrade` moves it to format {}",
            ctxlog::IDS_BY_BOT
        );
    }
    let metrics = Arc::new(Metrics::new());
    let view = View::new(store.clone(), metrics.clone());
    let nudge = view.clone();
    let writer = Writer::start(
        store.clone(),
        options.writer.clone(),
        options.group_commit,
        metrics.clone(),
        Arc::new(move || nudge.nudge()),
    )
    .await?;
    let (stop, stopped) = watch::channel(false);
    // On SQLite a refresh that finds nothing new is one read of the shards table: poll at
    // the shortest interval always (watchers then hear of other replicas' appends within
    // it). On object storage every refresh costs requests: back off while nothing changes.
    let poll_max = if store.backend() == "sqlite" {
        options.poll_min
    } else {
        options.idle_poll_max
    };
    tokio::spawn(view.clone().run(options.poll_min, poll_max, stopped.clone()));
    let budget = crate::routes::body_budget(&options);
    let replica = Arc::new(Replica {
        store,
        writer,
        view,
        tokens,
        metrics,
        options,
        watchers: Watchers::default(),
        search: Default::default(),
        shutdown: stopped,
        body_budget: budget,
    });
    Ok((replica, stop))
}

/// Serve MCP over this process's standard input and output until the client closes them or
/// `stop` resolves, then close the shard (see [`crate::serve_mcp_stdio`]).
pub(crate) async fn mcp_stdio(
    options: ServeOptions,
    bots: Vec<String>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let (replica, stop_view) = open(options, Tokens::open()).await?;
    let tools = crate::mcp::Tools::local(replica.clone(), bots);
    let served = rmcp::ServiceExt::serve(tools, rmcp::transport::io::stdio_pipes()).await;
    let result = match served {
        Ok(running) => {
            let cancel = running.cancellation_token();
            let mut waiting = std::pin::pin!(running.waiting());
            tokio::select! {
                _ = &mut waiting => {}
                () = stop => {
                    cancel.cancel();
                    let _ = tokio::time::timeout(Duration::from_secs(2), waiting).await;
                }
            }
            Ok(())
        }
        Err(e) => Err(StartError::Mcp(e.to_string())),
    };
    stop_view.send_replace(true);
    if tokio::time::timeout(WRITER_CLOSE, replica.writer.close())
        .await
        .is_err()
    {
        tracing::warn!(after = ?WRITER_CLOSE, "the writer did not close its shard in time");
    }
    result
}

/// The most connections a semaphore can count (far above any descriptor limit).
const MAX_CONNECTIONS: usize = 1 << 24;
/// How long the writer has to close its shard once the connections are done: a commit still
/// running then is abandoned, as a kill would (its requests were answered `unknown`).
const WRITER_CLOSE: Duration = Duration::from_secs(5);

/// What bounds a connection's life.
#[derive(Clone, Copy, Debug)]
struct ConnLimits {
    /// A new connection's first request, and a closing one's last, must begin within it.
    header: Duration,
    /// An open connection with no request in flight is closed after it.
    idle: Duration,
    /// On shutdown, requests in flight have this long (and a second to write their answer).
    grace: Duration,
    /// Connections open at once.
    max: usize,
}

async fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    limits: ConnLimits,
    mut stopped: watch::Receiver<bool>,
    replica: Arc<Replica>,
) {
    let places = Arc::new(Semaphore::new(limits.max));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header);
    loop {
        // Beyond the limit a connection waits in the listen backlog, not in the process.
        let place = tokio::select! {
            place = places.clone().acquire_owned() => match place {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = crate::stopped(&mut stopped) => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors and the like: give the process a moment.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (app, builder, tls, stop) = (app.clone(), builder.clone(), tls.clone(), stopped.clone());
                tokio::spawn(async move {
                    let _place = place;
                    match tls {
                        None => serve(stream, &builder, app, limits, stop).await,
                        Some(tls) => {
                            let stream = match tokio::time::timeout(limits.header, tls.accept(stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => return,
                            };
                            serve(stream, &builder, app, limits, stop).await;
                        }
                    }
                });
            }
            _ = crate::stopped(&mut stopped) => break,
        }
    }
    drop(listener);
    // Every connection saw the same signal: it ends within the grace and a second (its
    // watch streams end, its waiting reads are refused, its appends answered).
    let all = u32::try_from(limits.max).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.grace + Duration::from_secs(2), places.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period");
    }
    if tokio::time::timeout(WRITER_CLOSE, replica.writer.close())
        .await
        .is_err()
    {
        tracing::warn!(
            after = ?WRITER_CLOSE,
            "the writer did not close its shard in time; a commit still running is abandoned"
        );
    }
}

/// Serve one connection until it ends, is idle too long, or the shutdown grace is over.
async fn serve<I>(
    io: I,
    builder: &auto::Builder<TokioExecutor>,
    app: axum::Router,
    limits: ConnLimits,
    mut stop: watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let busy = tracked.begin();
        let app = app.clone();
        async move {
            let response = tower::ServiceExt::oneshot(app, request.map(axum::body::Body::new)).await?;
            // The request is in flight until its answer's body is done (a watch stream's too).
            Ok::<_, std::convert::Infallible>(response.map(|body| axum::body::Body::new(Busy { body, _busy: busy })))
        }
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    // When the connection was told to close: it has the header timeout from then to finish
    // whatever it was beginning.
    let mut closing: Option<tokio::time::Instant> = None;
    let mut hard_stop: Option<tokio::time::Instant> = None;
    loop {
        // A connection must begin a request within the header timeout when new or closing,
        // within the idle timeout after a request.
        let idle_until = match closing {
            None => activity.idle_until(limits.idle, limits.header),
            Some(at) => activity
                .idle_until(limits.header, limits.header)
                .map(|t| t.max(at + limits.header)),
        };
        let changed = activity.changed.notified();
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = changed => {}
            _ = sleep_until_some(idle_until) => {
                if closing.is_some() {
                    return;
                }
                closing = Some(tokio::time::Instant::now());
                conn.as_mut().graceful_shutdown();
            }
            _ = crate::stopped(&mut stop), if hard_stop.is_none() => {
                hard_stop = Some(tokio::time::Instant::now() + limits.grace + Duration::from_secs(1));
                if closing.is_none() {
                    closing = Some(tokio::time::Instant::now());
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = sleep_until_some(hard_stop) => {
                tracing::debug!("a connection was closed at the end of the shutdown grace");
                return;
            }
        }
    }
}

async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Whether a connection has a request in flight, and since when it has had none.
struct Activity {
    state: std::sync::Mutex<ActivityState>,
    changed: tokio::sync::Notify,
}

struct ActivityState {
    in_flight: usize,
    idle_since: tokio::time::Instant,
    served: bool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: std::sync::Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: tokio::time::Instant::now(),
                served: false,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        // A panic while holding this lock leaves counters only: still usable.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        let mut s = self.lock();
        s.in_flight += 1;
        s.served = true;
        drop(s);
        self.changed.notify_one();
        InFlight(self.clone())
    }

    /// When the connection is idle too long: `None` while a request is in flight; `fresh`
    /// counts before its first request, `idle` after one.
    fn idle_until(&self, idle: Duration, fresh: Duration) -> Option<tokio::time::Instant> {
        let s = self.lock();
        (s.in_flight == 0).then(|| s.idle_since + if s.served { idle } else { fresh })
    }
}

/// A request in flight on a connection, until dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            s.idle_since = tokio::time::Instant::now();
        }
        drop(s);
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request counted as in flight until it is done or dropped.
struct Busy {
    body: axum::body::Body,
    _busy: InFlight,
}

impl hyper::body::Body for Busy {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
