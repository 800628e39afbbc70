//! What `/metrics` says, in Prometheus text: requests and their latencies by route and
//! status, append request sizes, commits (one per group commit) and their sizes, watch
//! streams, refreshes and how far the view lags, entries the searcher read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabels {
    pub(crate) route: String,
    pub(crate) status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteOnly {
    pub(crate) route: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

fn sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 8))
}

/// The server's counters.
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) requests: Family<RouteLabels, Counter>,
    pub(crate) latency: Histograms<RouteOnly>,
    pub(crate) append_records: Histogram,
    pub(crate) commits: Counter,
    pub(crate) commit_records: Histogram,
    pub(crate) commit_latency: Histogram,
    pub(crate) watchers: Gauge,
    pub(crate) refreshes: Counter,
    pub(crate) refresh_errors: Counter,
    pub(crate) refresh_latency: Histogram,
    pub(crate) search_entries_read: Counter,
    /// When the view last refreshed successfully (ms since `started`).
    last_refresh_ms: AtomicU64,
    started: Instant,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("ctxlog");
        let requests = Family::<RouteLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests by route and status", requests.clone());
        let latency: Histograms<RouteOnly> = Family::new_with_constructor(latency_buckets as fn() -> Histogram);
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            latency.clone(),
        );
        let append_records = sizes();
        registry.register(
            "append_request_records",
            "Records per append request",
            append_records.clone(),
        );
        let commits = Counter::default();
        registry.register(
            "commits",
            "Durable commits of the writer (one per group of requests)",
            commits.clone(),
        );
        let commit_records = sizes();
        registry.register("commit_records", "Records per commit", commit_records.clone());
        let commit_latency = latency_buckets();
        registry.register(
            "commit_duration_seconds",
            "Time to write one commit",
            commit_latency.clone(),
        );
        let watchers = Gauge::default();
        registry.register("watchers", "Open watch streams", watchers.clone());
        let refreshes = Counter::default();
        registry.register("refreshes", "Refreshes of the replica's view", refreshes.clone());
        let refresh_errors = Counter::default();
        registry.register("refresh_errors", "Refreshes that failed", refresh_errors.clone());
        let refresh_latency = latency_buckets();
        registry.register(
            "refresh_duration_seconds",
            "Time to refresh the view",
            refresh_latency.clone(),
        );
        let search_entries_read = Counter::default();
        registry.register(
            "search_entries_read",
            "Entries the replica's searcher read from the store (past the saved index it started from, if any)",
            search_entries_read.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            append_records,
            commits,
            commit_records,
            commit_latency,
            watchers,
            refreshes,
            refresh_errors,
            refresh_latency,
            search_entries_read,
            last_refresh_ms: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// A successful refresh, now.
    pub(crate) fn refreshed(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_refresh_ms.store(ms, Ordering::Relaxed);
    }

    /// The Prometheus text of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        // How long ago the view was last refreshed: the lag of what this replica serves.
        let lag = self.started.elapsed().as_secs_f64() - self.last_refresh_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let lag_text = format!(
            "# HELP ctxlog_refresh_lag_seconds Seconds since the view last refreshed.\n\
             # TYPE ctxlog_refresh_lag_seconds gauge\nctxlog_refresh_lag_seconds {lag:.3}\n"
        );
        match out.rfind("# EOF") {
            Some(at) => out.insert_str(at, &lag_text),
            None => out.push_str(&lag_text),
        }
        out
    }
}
