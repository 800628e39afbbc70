//! Every task's arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
pub(crate) struct Cli {
    /// Print every command in full, and its output.
    #[arg(long, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub task: Task,
}

#[derive(Subcommand)]
pub(crate) enum Task {
    /// fmt --check, clippy -D warnings, tidy, then every test (nextest with timeouts), doc
    /// tests and the bench harness end to end.
    Test {
        /// Extra arguments for nextest / cargo test (e.g. a filter).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Benchmarks: `first-scan` (generated logs or `--restore SRC`) and `append`.
    Bench(BenchArgs),
    /// Run the conformance suite and print a table grouped by rule.
    Conformance {
        /// Only this backend (`memory`, `sqlite`, `lance`).
        #[arg(long)]
        backend: Option<String>,
        /// Only cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Write results as JSON to FILE.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Check that docs and code are in step (also part of `test`).
    Tidy,
    /// Mutation testing of the core and the SQLite backend against the fast suite.
    Mutants(MutantsArgs),
    /// A seeded soak: writers killed, taken over and faulted while they append; compaction
    /// and a reader beside them; then every acknowledgement checked.
    Chaos(ChaosArgs),
    /// The Python distribution: a wheel carrying the `ctxlog` binary, and an sdist, into
    /// `target/dist` (maturin).
    Dist(DistArgs),
}

#[derive(Args, Clone)]
pub(crate) struct DistArgs {
    /// The cargo profile of the binary in the wheel.
    #[arg(long, default_value = "release")]
    pub profile: String,
    /// Features of the CLI beyond the default (SQLite), e.g. `lance,s3`.
    #[arg(long, value_delimiter = ',')]
    pub features: Vec<String>,
    /// The wheel only.
    #[arg(long)]
    pub no_sdist: bool,
}

#[derive(Args, Clone)]
pub(crate) struct ChaosArgs {
    /// `sqlite`, `lance` (a local directory) or `lance-s3` (the loopback S3 server); with
    /// `--serve`, `sqlite`, `lance-s3` or `all` (both).
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
    /// How long to run.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// How long to run, in minutes (instead of `--seconds`).
    #[arg(long)]
    pub minutes: Option<u64>,
    /// Soak `ctxlog serve` replicas through HTTP (clients, watchers, kills, takeovers, a
    /// slowed replica, maintenance) instead of library writers.
    #[arg(long)]
    pub serve: bool,
    /// The seed of the soak's decisions and of every writer's faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchKind,
}

#[derive(Subcommand)]
pub(crate) enum BenchKind {
    /// First scan, refresh, conflict discovery and the raw-scan floor, per backend and size.
    FirstScan(FirstScanArgs),
    /// Durable append throughput and latency per backend, batch size and writer count.
    Append(AppendArgs),
    /// Lance's first scan on the S3 server on loopback with latency added to every
    /// request, against the same log on the local disk; compacted and not.
    ObjectStore(ObjectStoreArgs),
    /// Bounded storage: store size against the records' logical size before and after
    /// compact + gc, the time of gc, the first scan before and after it, and retention and
    /// purge of 1 % of the sessions.
    Reclaim(ReclaimArgs),
    /// `ctxlog serve` replicas on loopback: append throughput and latency through HTTP (with
    /// and without group commit) against the library, a session read, watch latency across
    /// replicas, memory of idle watchers.
    Serve(ServeArgs),
    /// The context view of a long session with a summary covering all but its last records,
    /// against a full read of that session, in a generated log (rule 21).
    Context(ContextArgs),
    /// Forks (rule 25): a fork of a long session against a copy of it, the fork's context
    /// view against its parent's, and a read as of a position against a current read, in a
    /// generated log.
    Forks(ForksArgs),
    /// Full-text search (rule 26): the index a first search builds and query latency on a
    /// generated Zipf corpus, against SQLite FTS5 on the same texts.
    Search(SearchArgs),
}

#[derive(Args, Clone)]
pub(crate) struct ForksArgs {
    #[command(flatten)]
    pub common: Common,
    /// Entries of the generated log the sessions are added to.
    #[arg(long, default_value = "1m")]
    pub size: String,
    /// Records of the session forked and copied.
    #[arg(long, default_value_t = 10_000)]
    pub records: usize,
    /// Records of the session read as of a position.
    #[arg(long, default_value_t = 100)]
    pub small: usize,
    /// Reads per figure (medians).
    #[arg(long, default_value_t = 9)]
    pub runs: usize,
}

#[derive(Args, Clone)]
pub(crate) struct SearchArgs {
    #[command(flatten)]
    pub common: Common,
    /// Corpus sizes in records: 10k, 100k, 1m.
    #[arg(long, value_delimiter = ',', default_value = "100k,1m")]
    pub sizes: Vec<String>,
    /// Dimensions of each record's vector (rule 27; 0: no vectors).
    #[arg(long, default_value_t = 384)]
    pub dims: usize,
    /// Queries per figure.
    #[arg(long, default_value_t = 500)]
    pub queries: usize,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

#[derive(Args, Clone)]
pub(crate) struct ContextArgs {
    #[command(flatten)]
    pub common: Common,
    /// Entries of the generated log the session is added to.
    #[arg(long, default_value = "1m")]
    pub size: String,
    /// Records of the session.
    #[arg(long, default_value_t = 10_000)]
    pub records: usize,
    /// Its last records the summary does not cover.
    #[arg(long, default_value_t = 20)]
    pub uncovered: usize,
    /// Fresh-process runs per figure.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

#[derive(Args, Clone)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub clients: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,100")]
    pub batches: Vec<usize>,
    /// Records appended through HTTP per figure (at least 5 requests per client).
    #[arg(long, default_value_t = 20_000)]
    pub http_records: usize,
    /// Records the library writer appends per batch size.
    #[arg(long, default_value_t = 20_000)]
    pub library_records: usize,
    /// Entries of the store the session read is measured in.
    #[arg(long, default_value = "1m")]
    pub read_store_size: String,
    /// Reads of the session.
    #[arg(long, default_value_t = 500)]
    pub reads: usize,
    /// Records whose watch latency is measured.
    #[arg(long, default_value_t = 300)]
    pub watch_records: usize,
    /// Idle watch streams for the memory figure.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Calls of each framework adapter's hot call (and of the bare client).
    #[arg(long, default_value_t = 300)]
    pub adapter_calls: usize,
    /// With `lance`: also Lance on a loopback S3 server whose every request waits this long
    /// (0: not measured).
    #[arg(long, default_value_t = 20)]
    pub s3_latency_ms: u64,
    /// Seconds the idle replicas' object-store requests are counted for.
    #[arg(long, default_value_t = 60)]
    pub idle_seconds: u64,
}

#[derive(Args, Clone)]
pub(crate) struct Common {
    /// Backends to measure (each must be compiled: `lance` builds Lance).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,lance")]
    pub backends: Vec<String>,
    /// Print only the JSON of every figure.
    #[arg(long)]
    pub json: bool,
    /// Use the debug build shared with the tests (for the smoke test; not for figures).
    #[arg(long)]
    pub debug: bool,
    /// Where stores, JSON and plots go [default: <target>/ctxlog-bench].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the files, print nothing (the smoke test).
    #[arg(skip)]
    pub quiet: bool,
}

#[derive(Args, Clone)]
pub(crate) struct FirstScanArgs {
    #[command(flatten)]
    pub common: Common,
    /// Log sizes in entries: 10k, 100k, 1m, 10m.
    #[arg(long, value_delimiter = ',', default_value = "10k,100k,1m")]
    pub sizes: Vec<String>,
    /// Fresh-process runs per figure.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Measure a copy of this store instead of generated logs: a SQLite file, a Lance
    /// dataset directory, a .tar/.tar.gz of either, or an object-store URI (Lance).
    #[arg(long)]
    pub restore: Option<String>,
    /// Storage options for an object-store `--restore` source (KEY=VALUE, repeatable).
    #[arg(long = "storage-option")]
    pub storage_options: Vec<String>,
}

#[derive(Args, Clone)]
pub(crate) struct AppendArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    pub batches: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub writers: Vec<usize>,
    /// Appends per writer process [default: 500, fewer for large batches].
    #[arg(long)]
    pub appends: Option<usize>,
}

#[derive(Args, Clone)]
pub(crate) struct MutantsArgs {
    /// Only this pass: `core`, `sqlite`, `server` or `lance`.
    #[arg(long)]
    pub only: Option<String>,
    /// Only mutate files matching this glob (cargo-mutants `--file`): a file name such as
    /// `index.rs`, or a path from the workspace root such as `crates/*/src/backend/*.rs`;
    /// may be given more than once.
    #[arg(long)]
    pub file: Vec<String>,
    /// Parallel jobs (each builds its own copy: memory and CPU heavy).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Test again only what the previous run did not catch (cargo-mutants `--iterate`):
    /// after adding tests, the counts that changed, in minutes instead of a whole run.
    #[arg(long)]
    pub iterate: bool,
    /// Only one share of the mutants (cargo-mutants `--shard K/N`, dealt round-robin, so
    /// that a share samples every file): a pass too long for one sitting, in N sittings or
    /// as a sample of 1/N.
    #[arg(long)]
    pub shard: Option<String>,
    /// Only mutants whose name matches this regex (cargo-mutants `--re`), such as the
    /// functions a change touched: `--re 'recover_after_claim|next_wal_position'`.
    #[arg(long)]
    pub re: Vec<String>,
}

#[derive(Args, Clone)]
pub(crate) struct ObjectStoreArgs {
    #[command(flatten)]
    pub common: Common,
    /// Log sizes in entries.
    #[arg(long, value_delimiter = ',', default_value = "100k,1m")]
    pub sizes: Vec<String>,
    /// Writer counts (one shard each).
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    pub writers: Vec<usize>,
    /// Added to every object-store request, in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    pub latency_ms: f64,
    /// Fresh-process runs per figure.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

#[derive(Args, Clone)]
pub(crate) struct ReclaimArgs {
    #[command(flatten)]
    pub common: Common,
    /// Log sizes in entries.
    #[arg(long, value_delimiter = ',', default_value = "100k,1m")]
    pub sizes: Vec<String>,
    /// Fresh-process first scans before and after gc.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Percent of the sessions that retention ends and purge erases.
    #[arg(long, default_value_t = 1.0)]
    pub percent: f64,
}
