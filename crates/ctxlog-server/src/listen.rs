//! Starting a replica and its accept loop.
//!
//! Connections are served by hyper directly (not `axum::serve`) for what a server facing
//! slow or hostile clients needs: a header read timeout (a client sending its headers byte by
//! byte loses its connection), and a graceful shutdown — stop accepting, end the watch
//! streams, let requests in flight finish within a bound, then close the shard. With TLS,
//! the handshake has the header read timeout as its deadline too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
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

    /// Stop: no new connections, watch streams end, requests in flight finish (within the
    /// store's deadline and a few seconds), the shard is closed. Returns when all is done.
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
    let tls = options.tls.as_ref().map(crate::tls::acceptor).transpose()?;
    if !tokens.required() && !options.listen.ip().is_loopback() {
        return Err(StartError::Listen {
            addr: options.listen,
            reason: "without a tokens file the server listens on loopback only (give --tokens FILE)".into(),
        });
    }
    let store = ctxlog::open(&options.store, options.store_options.clone()).await?;
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
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| StartError::Listen {
            addr: options.listen,
            reason: e.to_string(),
        })?;
    let addr = listener.local_addr().map_err(|e| StartError::Listen {
        addr: options.listen,
        reason: e.to_string(),
    })?;
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
    let grace = options.store_options.timeout + Duration::from_secs(5);
    let header_timeout = options.header_read_timeout;
    let replica = Arc::new(Replica {
        store,
        writer,
        view,
        tokens,
        metrics,
        options,
        watchers: Watchers::default(),
        shutdown: stopped.clone(),
    });
    let app = routes::router(replica.clone());
    let done = tokio::spawn(accept(listener, tls, app, header_timeout, stopped, grace, replica));
    Ok(Running { addr, stop, done })
}

async fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    header_timeout: Duration,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
    replica: Arc<Replica>,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
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
                let service = TowerToHyperService::new(app.clone());
                match &tls {
                    None => {
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).into_owned();
                        let conn = graceful.watch(conn);
                        tokio::spawn(async move {
                            let _ = conn.await;
                        });
                    }
                    Some(tls) => {
                        let (tls, builder) = (tls.clone(), builder.clone());
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            let stream = match tokio::time::timeout(header_timeout, tls.accept(stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => return,
                            };
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            let _ = watcher.watch(conn.into_owned()).await;
                        });
                    }
                }
            }
            _ = crate::stopped(&mut stopped) => break,
        }
    }
    drop(listener);
    // Watch streams saw the same signal and end; other requests finish.
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after the shutdown grace period");
    }
    if tokio::time::timeout(grace, replica.writer.close()).await.is_err() {
        tracing::warn!("the writer did not close its shard within the shutdown grace period");
    }
}
