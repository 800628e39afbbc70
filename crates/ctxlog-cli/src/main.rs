//! `ctxlog`: the command-line interface of the context log.
//!
//! Exit codes: 0 ok, 1 not found, 2 usage or invalid input, 3 fenced, 4 storage error or
//! timeout. Errors go to stderr and say what failed, where, and whether anything was written.

// An application: it dates what it writes and names by the machine's clock.
#![allow(clippy::disallowed_methods)]

mod demo;
mod json;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ctxlog::{CompactOptions, Error, GcOptions, PurgeOptions, Record, RetainOptions, StoreOptions, WriterId};

#[derive(Parser)]
#[command(name = "ctxlog", version, about = "A durable, append-only context log for AI agents")]
struct Cli {
    /// Store URI: `sqlite:PATH`, `PATH.db`, `lance:PATH`, `PATH.lance`, `s3://…`, `memory://…`
    /// [default: ./ctxlog.db; `demo` uses a fresh file in the temp directory]
    #[arg(long, global = true, env = "CTXLOG_STORE")]
    store: Option<String>,

    /// Deadline in seconds (0.001 to 86400): for the whole operation, and for each storage
    /// call of `append`.
    #[arg(long, global = true, default_value = "60", value_parser = parse_timeout)]
    timeout: Duration,

    /// A storage option for object stores (repeatable), e.g. `region=eu-west-1`.
    #[arg(long = "storage-option", global = true, value_name = "KEY=VALUE", value_parser = parse_kv)]
    storage_options: Vec<(String, String)>,

    /// What to log, on stderr: a level (error, warn, info, debug, trace) or `target=level`
    /// directives (`ctxlog_server=debug,info`; no span filters). Without it: $CTXLOG_LOG, then $RUST_LOG,
    /// then `warn`.
    #[arg(long, global = true, env = "CTXLOG_LOG")]
    log_level: Option<String>,

    /// How logs are written: `text` for people, `json` (one object a line) for collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Append JSON Lines records from stdin; print one JSON line per durable batch.
    Append {
        /// This process's writer identity (instance id, host name, ordinal).
        #[arg(long)]
        writer: String,
        /// Records per batch (1 to 10000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=MAX_BATCH))]
        batch: u64,
    },
    /// Print bot `--bot`'s live record with this id, or exit 1.
    Get {
        /// The bot whose record it is: ids are scoped by bot.
        #[arg(long)]
        bot: String,
        id: String,
    },
    /// Print a session's live records, one JSON object per line, in contract order.
    Session {
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
        /// Read as of this position (what `context` printed as `position`): the view its
        /// reader saw, less what was forgotten since (rule 24).
        #[arg(long)]
        at: Option<String>,
    },
    /// Print a session's context view (one JSON object): its governing summary and every
    /// live record it does not cover, in contract order, and the `position` of the view to
    /// give as `covers` of a summary written from it (`append` a record of kind `summary`).
    Context {
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
        /// Read as of this position (what `context` printed as `position`): the view its
        /// reader saw, less what was forgotten since (rule 24).
        #[arg(long)]
        at: Option<String>,
    },
    /// Write a summary of a context view printed by `context` (saved in `--from`): it covers
    /// exactly what that view held (rule 21), never what was appended since. The text is
    /// `--text`, or else stdin. Prints the ack.
    Summarize {
        /// This process's writer identity.
        #[arg(long)]
        writer: String,
        /// A file holding what `ctxlog context` printed.
        #[arg(long)]
        from: std::path::PathBuf,
        /// The summary's record id (the idempotency key: a retry with the same id counts once).
        #[arg(long)]
        id: String,
        /// The summary's text (else stdin).
        #[arg(long)]
        text: Option<String>,
        /// Its role.
        #[arg(long, default_value = "summary")]
        role: String,
        /// Its content type.
        #[arg(long, default_value = "text/plain")]
        content_type: String,
    },
    /// Continue session `--from` as a new session `--session` as of a position (rule 25): one
    /// record, whatever the length of `--from`; nothing in `--from` changes. The position is
    /// `--at` (what `context` printed as `position`), else the store now. Prints the ack.
    Fork {
        /// This process's writer identity.
        #[arg(long)]
        writer: String,
        #[arg(long)]
        bot: String,
        /// The new session.
        #[arg(long)]
        session: String,
        /// The session it continues.
        #[arg(long)]
        from: String,
        /// The position to continue from (else the store now).
        #[arg(long)]
        at: Option<String>,
        /// The fork record's id (the idempotency key: a retry with the same id counts once).
        #[arg(long)]
        id: String,
    },
    /// Print a bot's sessions, one JSON object per line.
    Sessions {
        #[arg(long)]
        bot: String,
        /// Read as of this position (what `context` printed as `position`): the view its
        /// reader saw, less what was forgotten since (rule 24).
        #[arg(long)]
        at: Option<String>,
    },
    /// Search a bot's live records: full text (rule 26: words, "phrases" and prefix*es,
    /// BM25-ranked), a vector (rule 27: `--model` and `--vector`), or both (fused by
    /// reciprocal rank); print the hits best first, one JSON object per line (`score`,
    /// `matched`, `snippet`, `record`).
    Search {
        #[arg(long)]
        bot: String,
        /// The query.
        #[arg(long, required_unless_present = "vector")]
        query: Option<String>,
        /// The model `--vector` was made by.
        #[arg(long, requires = "vector")]
        model: Option<String>,
        /// A query vector, a JSON array of numbers (of the model's dimension).
        #[arg(long, requires = "model")]
        vector: Option<String>,
        /// Only this session's records.
        #[arg(long)]
        session: Option<String>,
        /// At most this many hits (1 to 100).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=100))]
        k: u16,
    },
    /// Print every shard, one JSON object per line.
    Shards,
    /// Print every conflict in the log, one JSON object per line.
    Conflicts,
    /// Print projection statistics.
    Stats,
    /// Fold flushed generations into the base table (Lance); checkpoint the WAL (SQLite).
    Compact {
        #[arg(long, default_value_t = CompactOptions::default().max_generations)]
        max_generations: usize,
        #[arg(long, default_value_t = CompactOptions::default().max_bytes)]
        max_bytes: u64,
    },
    /// Reclaim storage: delete what compaction folded and what no recent version refers to
    /// (Lance); return free pages and truncate the WAL (SQLite). Run it after `compact`.
    Gc {
        /// Never delete anything younger than this, so that readers on an older version
        /// finish (e.g. `10m`, `1h`, `0s`).
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// Most objects deleted in one pass; run again for the rest.
        #[arg(long, default_value_t = GcOptions::default().max_objects)]
        max_objects: u64,
    },
    /// End idle sessions: tombstone every live record of each session whose newest record is
    /// older than `--older-than`, under the writer id `ctxlog-maintenance`.
    Retain {
        /// How long a session may be idle (e.g. `30d`, `12h`).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Only this bot's sessions.
        #[arg(long)]
        bot: Option<String>,
        /// Most sessions ended in one pass; run again for the rest.
        #[arg(long, default_value_t = RetainOptions::older_than(Duration::ZERO).max_sessions)]
        max_sessions: usize,
    },
    /// Erase the body and metadata of every entry of every tombstoned id (the header stays).
    /// Older copies of the bytes are deleted by `gc` once past its grace period.
    Purge {
        /// Most tombstoned ids purged in one pass; run again for the rest.
        #[arg(long, default_value_t = PurgeOptions::default().max_ids)]
        max_ids: u64,
    },
    /// Save the projection in the store (a projection snapshot), so that new readers start
    /// from it and read only what is newer. Keeps the newest two. Run it after `compact` and
    /// `gc`: a snapshot that names what gc later removes is skipped (a full scan instead).
    Snapshot {
        /// Also save the search index (built from the newest saved one and what is past it,
        /// or from the whole log), so that a replica's first search loads it and reads only
        /// what is newer. Every purge deletes the saved indexes: run this after `purge`.
        #[arg(long)]
        search: bool,
    },
    /// Move a store written by an earlier release (format 1 or 2, record ids one namespace
    /// across bots) to format 3, where ids are scoped by bot. Run it once every process that
    /// writes the store runs this release. Prints what it found: ids under more than one bot
    /// (their views change) refuse the upgrade (exit 2) unless `--accept-changed-views`.
    Upgrade {
        /// Upgrade also when some id is under more than one bot: each bot's then stands alone.
        #[arg(long)]
        accept_changed_views: bool,
    },
    /// The quickstart: concurrent writers, a session view and a conflict report.
    Demo,
    /// Serve the store over HTTP as one replica: it writes as `--writer` (its own shard) and
    /// keeps one view fresh for its readers and watchers.
    ///
    /// Stops on SIGTERM or Ctrl-C: it stops accepting, ends watch streams (resumable), answers
    /// waiting reads and uploads still sending their body at once (503, nothing written),
    /// gives appends in flight `--shutdown-grace` (then answers them `written: unknown`),
    /// closes every connection a second later, and gives the writer 5 s more to close its
    /// shard: it exits within the grace and about 6 s (16 s by default).
    Serve {
        /// This replica's writer identity: one per process; a second process with the same
        /// one fences this one, which then takes no more writes.
        #[arg(long)]
        writer: String,
        /// Address to listen on (port 0: any free port, printed on start).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: std::net::SocketAddr,
        /// Tokens file (hashes of bearer tokens, their bots and rights; see `ctxlog token`).
        /// Without one, the server listens on loopback only and every request may do all.
        #[arg(long)]
        tokens: Option<std::path::PathBuf>,
        /// Serve TLS with this certificate chain (PEM, the server's certificate first).
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<std::path::PathBuf>,
        /// The certificate's private key (PEM).
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<std::path::PathBuf>,
        /// Write each append request as a commit of its own instead of grouping concurrent
        /// ones into one commit.
        #[arg(long)]
        no_group_commit: bool,
        /// Largest request body, in bytes.
        #[arg(long, default_value_t = 80 << 20)]
        max_body_bytes: usize,
        /// Bytes of request bodies held at once over all requests (each reserves its declared
        /// length, or `--max-body-bytes` when it declares none); an upload beyond it waits for
        /// room at most `--header-timeout`, then is refused (503 `busy`).
        #[arg(long, default_value_t = 256 << 20)]
        max_body_bytes_in_flight: usize,
        /// Seconds a client may take to send a request's headers, and a new connection to
        /// begin its first request (TLS handshake included). A body has three times as long
        /// in all, however its bytes come.
        #[arg(long, default_value = "10", value_parser = parse_timeout)]
        header_timeout: Duration,
        /// Seconds a connection may stay open with no request in flight after its last one.
        #[arg(long, default_value = "75", value_parser = parse_timeout)]
        idle_timeout: Duration,
        /// Connections open at once, watch streams included; beyond it new connections wait
        /// in the listen backlog until one closes. Keep it below the descriptor limit
        /// (`ulimit -n`), which the store's files share.
        #[arg(long, default_value_t = 768, value_parser = clap::value_parser!(u32).range(1..))]
        max_connections: u32,
        /// Seconds that appends in flight at shutdown have to finish.
        #[arg(long, default_value = "10", value_parser = parse_timeout)]
        shutdown_grace: Duration,
        /// Seconds a search may score before it gives up (504 `timeout`, nothing written).
        #[arg(long, default_value = "10", value_parser = parse_timeout)]
        search_timeout: Duration,
        /// On object storage: the longest seconds between two refreshes of an idle replica's
        /// view. Every refresh costs requests; a watcher hears of another replica's appends
        /// within it after a quiet spell.
        #[arg(long, default_value = "2", value_parser = parse_timeout)]
        idle_poll: Duration,
        /// Also shut down (as on SIGTERM) when standard input closes: a parent that holds
        /// the other end takes the server with it however it ends (`ctxlog.serve()` in
        /// Python starts its server so).
        #[arg(long)]
        until_stdin_closes: bool,
        /// Make a random token that may do everything, for this process only, and print it
        /// with the address (`"token"`): requests then need it (or one of `--tokens`). What
        /// `ctxlog.serve()` in Python uses, so that other local users cannot use its server.
        #[arg(long)]
        owner_token: bool,
    },
    /// Serve the store to an MCP client over standard input and output (what desktop MCP
    /// clients launch): tools to list sessions, read a context view or records, append,
    /// summarise, get and forget records, and each session as a resource. Writes as
    /// `--writer` (its own shard, as a replica). Logs go to standard error. Ends when the
    /// client closes the streams, or on SIGTERM or Ctrl-C.
    Mcp {
        /// This process's writer identity: one per process (a second process with the same
        /// one fences this one).
        #[arg(long)]
        writer: String,
        /// The bots the client may read and write (repeat; `team-*` is a prefix); all by
        /// default. Sessions of bots named exactly are listed as resources.
        #[arg(long = "bot", default_value = "*")]
        bots: Vec<String>,
    },
    /// Make a new bearer token: prints the token once, and the line to add to a tokens file.
    Token {
        /// A name for the token (logs and limits).
        #[arg(long)]
        name: String,
        /// Bots it may touch: names or prefixes ending in `*` (`*` for every bot).
        #[arg(long, value_delimiter = ',', required = true)]
        bots: Vec<String>,
        /// What it may do: any of read, write, admin.
        #[arg(long, value_delimiter = ',', default_value = "read,write")]
        rights: Vec<String>,
    },
}

/// The largest `--batch`: the default limit of records per append.
const MAX_BATCH: u64 = 10_000;

/// A deadline in seconds, within what every backend can wait for.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let (min, max) = (StoreOptions::MIN_TIMEOUT, StoreOptions::MAX_TIMEOUT);
    let range = || {
        format!(
            "the allowed range is {} to {} seconds",
            min.as_secs_f64(),
            max.as_secs_f64()
        )
    };
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds; {}", range()))?;
    if !secs.is_finite() || secs < min.as_secs_f64() || secs > max.as_secs_f64() {
        return Err(format!("{s} seconds is out of range; {}", range()));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Log to stderr only: stdout carries the commands' JSON output.
fn init_logging(level: Option<&str>, format: LogFormat) -> Result<(), String> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let directives = match level {
        Some(l) => l.to_string(),
        None => std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_string()),
    };
    // `Targets`, not `EnvFilter`: the same `target=level` directives without span filters,
    // and without the regex engine `EnvFilter` compiles in (14 s of the 410 s of unit time
    // of a cold release build of the CLI on 2 cores).
    let filter: tracing_subscriber::filter::Targets = directives.parse().map_err(|e| format!("`{directives}`: {e}"))?;
    // `fmt()` filters at INFO by itself: under `filter` that would hide every debug line.
    let logs = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => logs
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(filter)
            .try_init(),
        LogFormat::Json => logs.json().finish().with(filter).try_init(),
    };
    installed.map_err(|e| e.to_string())
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_level.as_deref(), cli.log_format) {
        eprintln!("error: --log-level: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(4);
        }
    };
    let code = runtime.block_on(run(cli));
    // Do not wait for blocking tasks a deadline abandoned.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn run(cli: Cli) -> ExitCode {
    let timeout = cli.timeout;
    let options = |create: bool| {
        StoreOptions::default()
            .with_create_if_missing(create)
            .with_timeout(timeout)
            .with_storage_options(cli.storage_options.clone())
    };
    let store = cli.store.as_deref().unwrap_or("./ctxlog.db");
    let result = match &cli.command {
        // Appends stream for as long as stdin does; each storage call has the deadline.
        Command::Append { writer, batch } => append(store, options(true), writer, *batch).await,
        Command::Summarize {
            writer,
            from,
            id,
            text,
            role,
            content_type,
        } => {
            let summary = SummaryArgs {
                from,
                id,
                text: text.as_deref(),
                role,
                content_type,
            };
            summarize(store, options(true), writer, summary).await
        }
        Command::Fork {
            writer,
            bot,
            session,
            from,
            at,
            id,
        } => {
            fork(
                store,
                options(true),
                writer,
                Record::fork(id, bot, session, from, Default::default()),
                at.as_deref(),
            )
            .await
        }
        Command::Demo => demo::run(cli.store.as_deref(), options(true)).await,
        Command::Serve {
            writer,
            listen,
            tokens,
            tls_cert,
            tls_key,
            no_group_commit,
            max_body_bytes,
            max_body_bytes_in_flight,
            header_timeout,
            idle_timeout,
            max_connections,
            shutdown_grace,
            search_timeout,
            idle_poll,
            until_stdin_closes,
            owner_token,
        } => {
            let mut serve = match WriterId::new(writer.as_str()) {
                Ok(w) => ctxlog_server::ServeOptions::new(store, w),
                Err(e) => return Failure::Store(e).report(),
            };
            serve.listen = *listen;
            serve.tokens = tokens.clone();
            serve.owner_token = owner_token.then(ctxlog_server::auth::new_token);
            serve.tls = tls_cert
                .clone()
                .zip(tls_key.clone())
                .map(|(cert, key)| ctxlog_server::TlsFiles { cert, key });
            serve.store_options = options(true);
            serve.group_commit = !*no_group_commit;
            serve.max_body_bytes = *max_body_bytes;
            serve.max_body_bytes_in_flight = (*max_body_bytes_in_flight).max(1);
            serve.header_read_timeout = *header_timeout;
            serve.idle_timeout = *idle_timeout;
            serve.max_connections = *max_connections as usize;
            serve.shutdown_grace = *shutdown_grace;
            serve.search_timeout = *search_timeout;
            serve.idle_poll_max = (*idle_poll).max(serve.poll_min);
            serve_replica(serve, *until_stdin_closes).await
        }
        Command::Mcp { writer, bots } => {
            let mut serve = match WriterId::new(writer.as_str()) {
                Ok(w) => ctxlog_server::ServeOptions::new(store, w),
                Err(e) => return Failure::Store(e).report(),
            };
            serve.store_options = options(true);
            mcp_stdio(serve, bots.clone()).await
        }
        Command::Token { name, bots, rights } => token(name, bots, rights),
        cmd => match tokio::time::timeout(timeout, read_command(store, options(false), cmd)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Store(Error::Timeout {
                op: "ctxlog command",
                after: timeout,
                shard: None,
                // A command that writes may have its commit in flight.
                written: if cmd.writes() {
                    ctxlog::Written::Unknown
                } else {
                    ctxlog::Written::Nothing
                },
            })),
        },
    };
    match result {
        Ok(code) => code,
        Err(f) => f.report(),
    }
}

impl Command {
    /// Whether the command may write to the store: a deadline that cuts it short then
    /// leaves its outcome unknown. Exhaustive, so that a new command has to answer.
    fn writes(&self) -> bool {
        match self {
            Command::Append { .. }
            | Command::Summarize { .. }
            | Command::Fork { .. }
            | Command::Demo
            | Command::Serve { .. }
            | Command::Mcp { .. }
            | Command::Compact { .. }
            | Command::Gc { .. }
            | Command::Retain { .. }
            | Command::Purge { .. }
            | Command::Snapshot { .. }
            | Command::Upgrade { .. } => true,
            Command::Get { .. }
            | Command::Session { .. }
            | Command::Context { .. }
            | Command::Sessions { .. }
            | Command::Search { .. }
            | Command::Shards
            | Command::Conflicts
            | Command::Stats
            | Command::Token { .. } => false,
        }
    }
}

/// Serve until SIGTERM or Ctrl-C (or, with `until_stdin_closes`, the end of standard input),
/// then shut down gracefully.
async fn serve_replica(serve: ctxlog_server::ServeOptions, until_stdin_closes: bool) -> Result<ExitCode, Failure> {
    let writer = serve.writer.as_str().to_string();
    let owner_token = serve.owner_token.clone();
    let running = match ctxlog_server::start(serve).await {
        Ok(r) => r,
        Err(ctxlog_server::StartError::Store(e)) => return Err(Failure::Store(e)),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // Before the address is printed: a script that reads it may send SIGTERM at once.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::backend("server", "signal", None, ctxlog::Written::Nothing, e))?;
    // The address first, on its own line: a script (or a test) reads it to connect.
    let mut address = serde_json::json!({"listening": running.addr().to_string(), "writer": writer});
    if let Some(token) = owner_token {
        address["token"] = token.into();
    }
    println!("{address}");
    let _ = std::io::stdout().flush();
    tracing::info!(listen = %running.addr(), writer = %writer, "serving");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        () = stdin_closed(), if until_stdin_closes => {}
    }
    tracing::info!("shutting down");
    running.shutdown().await;
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Resolves when standard input reaches its end (or cannot be read): whatever is sent on it
/// is read and dropped.
async fn stdin_closed() {
    use tokio::io::AsyncReadExt;
    // Read on a blocking thread (tokio's stdin always is), which the runtime does not wait
    // for at exit beyond its shutdown timeout.
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 1024];
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

/// `ctxlog mcp`: MCP over standard input and output until the client closes them, SIGTERM
/// or Ctrl-C.
async fn mcp_stdio(serve: ctxlog_server::ServeOptions, bots: Vec<String>) -> Result<ExitCode, Failure> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::backend("server", "signal", None, ctxlog::Written::Nothing, e))?;
    let stop = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    match ctxlog_server::serve_mcp_stdio(serve, bots, stop).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ctxlog_server::StartError::Store(e)) => Err(Failure::Store(e)),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(2))
        }
    }
}

/// A new token, and its tokens-file entry.
fn token(name: &str, bots: &[String], rights: &[String]) -> Result<ExitCode, Failure> {
    let rights: Vec<ctxlog_server::auth::Right> = rights
        .iter()
        .map(|r| serde_json::from_value(serde_json::json!(r)))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| Error::invalid("rights", None, "each right is one of read, write, admin"))?;
    let token = ctxlog_server::auth::new_token();
    let entry = ctxlog_server::auth::TokenEntry {
        name: name.to_string(),
        hash: ctxlog_server::auth::hash_token(&token),
        bots: bots.to_vec(),
        rights,
    };
    println!("{}", serde_json::json!({"token": token, "entry": entry}));
    Ok(ExitCode::SUCCESS)
}

/// A failed command.
enum Failure {
    Store(Error),
    /// Bad input on stdin line `line`; `written` records were durably appended before it.
    Input {
        line: usize,
        error: Error,
        written: u64,
    },
    /// A storage failure while appending, after `written` records were durable.
    Append {
        error: Error,
        written: u64,
    },
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Store(e)
    }
}

fn exit_code(e: &Error) -> u8 {
    match e {
        Error::NotFound { .. } => 1,
        Error::InvalidInput { .. }
        | Error::UnknownScheme { .. }
        | Error::BackendNotCompiled { .. }
        | Error::NotAStore { .. } => 2,
        Error::Fenced { .. } => 3,
        Error::Poisoned { .. }
        | Error::Closed { .. }
        | Error::Timeout { .. }
        | Error::Backend { .. }
        | Error::Corrupt { .. }
        | Error::AccessDenied { .. }
        | Error::Unavailable { .. } => 4,
        // A kind of a newer core: a storage error.
        _ => 4,
    }
}

impl Failure {
    fn report(self) -> ExitCode {
        let (error, context) = match self {
            Failure::Store(e) => (e, String::new()),
            Failure::Input { line, error, written } => (
                error,
                format!(" (stdin line {line}; {written} records before it were durably appended)"),
            ),
            Failure::Append { error, written } => (
                error,
                format!(" ({written} records before this batch were durably appended)"),
            ),
        };
        eprintln!("error: {error}{context}");
        ExitCode::from(exit_code(&error))
    }
}

async fn append(uri: &str, options: StoreOptions, writer: &str, batch: u64) -> Result<ExitCode, Failure> {
    let batch = usize::try_from(batch).unwrap_or(usize::MAX);
    let writer = WriterId::new(writer)?;
    // The longest line a valid record can take: every byte of it escaped as `\u00XX`.
    let max_line = options
        .limits
        .max_record_bytes
        .saturating_mul(6)
        .saturating_add(64 * 1024);
    let store = ctxlog::open(uri, options).await?;
    let mut shard = store.open_shard(&writer).await?;
    let mut written = 0u64;
    let mut pending: Vec<Record> = Vec::with_capacity(batch);
    let mut lines = stdin_lines(max_line);
    let mut line_no = 0;
    let mut stdout = std::io::stdout();
    loop {
        let line = match lines.recv().await {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => {
                return Err(Failure::Input {
                    line: line_no + 1,
                    error: Error::invalid("record", None, e.to_string()),
                    written,
                });
            }
        };
        let eof = line.is_none();
        if let Some(line) = line {
            line_no += 1;
            if line.trim().is_empty() {
                continue;
            }
            let record = json::parse_record(&line).map_err(|error| Failure::Input {
                line: line_no,
                error,
                written,
            })?;
            store
                .options()
                .limits
                .validate(&record)
                .map(|_size| ())
                .map_err(|error| Failure::Input {
                    line: line_no,
                    error,
                    written,
                })?;
            pending.push(record);
        }
        if pending.len() >= batch || (eof && !pending.is_empty()) {
            let records = std::mem::take(&mut pending);
            let n = records.len() as u64;
            if records.iter().any(|r| r.covers.is_some()) {
                summarised(store.as_ref(), shard.as_mut(), &records)
                    .await
                    .map_err(|error| Failure::Append { error, written })?;
            }
            let ack = shard
                .append(records)
                .await
                .map_err(|error| Failure::Append { error, written })?;
            written += n;
            let line = json::ack_json(&ack);
            // The ack line is the durability promise: flush it before reading on.
            let _ = writeln!(stdout, "{line}").and_then(|_| stdout.flush());
        }
        if eof {
            break;
        }
    }
    shard.close().await?;
    Ok(ExitCode::SUCCESS)
}

/// Before a batch with summaries: every position they cover must be in the store (a
/// position `context` printed always is), and the shard's clock moves past the view's, so
/// that every record a summary covers is older than it (rule 21).
async fn summarised(
    store: &dyn ctxlog::Store,
    shard: &mut dyn ctxlog::Shard,
    records: &[Record],
) -> ctxlog::Result<()> {
    let mut p = store.projector();
    p.refresh().await?;
    ctxlog::check_covers_held(records, &p.checkpoint())?;
    shard.observe(p.max_hlc())
}

/// What `summarize` writes.
struct SummaryArgs<'a> {
    from: &'a std::path::Path,
    id: &'a str,
    text: Option<&'a str>,
    role: &'a str,
    content_type: &'a str,
}

async fn summarize(uri: &str, options: StoreOptions, writer: &str, args: SummaryArgs<'_>) -> Result<ExitCode, Failure> {
    let writer = WriterId::new(writer)?;
    let saved = std::fs::read_to_string(args.from)
        .map_err(|e| Error::invalid("from", None, format!("cannot read {}: {e}", args.from.display())))?;
    let (bot, session, covers) = json::parse_context(&saved)?;
    let text = match args.text {
        Some(t) => t.to_string(),
        None => {
            let mut t = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut t)
                .map_err(|e| Error::invalid("text", None, format!("cannot read stdin: {e}")))?;
            t
        }
    };
    let mut record = Record::summary(args.id, bot, session, text, covers);
    record.role = args.role.to_string();
    record.content_type = args.content_type.to_string();
    write_positioned(uri, options, &writer, record).await
}

/// Write `record`, a fork (rule 25): at the position `at` names, or (none named) at the
/// store's position now.
async fn fork(
    uri: &str,
    options: StoreOptions,
    writer: &str,
    mut record: Record,
    at: Option<&str>,
) -> Result<ExitCode, Failure> {
    let writer = WriterId::new(writer)?;
    record.covers = Some(at.map(json::parse_at).transpose()?.unwrap_or_default());
    write_positioned(uri, options, &writer, record).await
}

/// Write one record that names a position (a summary, a fork) and print its ack, from one
/// read of the store: a fork's empty position becomes that read's; a position past it is refused;
/// the shard moves past its clock (rules 21, 25).
async fn write_positioned(
    uri: &str,
    options: StoreOptions,
    writer: &WriterId,
    mut record: Record,
) -> Result<ExitCode, Failure> {
    let store = ctxlog::open(uri, options).await?;
    let mut shard = store.open_shard(writer).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let is_fork = record.kind == ctxlog::Kind::Fork;
    if let Some(c) = record.covers.as_mut().filter(|c| is_fork && c.0.is_empty()) {
        *c = p.checkpoint();
    }
    let records = vec![record];
    ctxlog::check_covers_held(&records, &p.checkpoint())?;
    shard.observe(p.max_hlc())?;
    let ack = shard.append(records).await?;
    println!("{}", json::ack_json(&ack));
    shard.close().await?;
    Ok(ExitCode::SUCCESS)
}

/// Why a line of stdin could not be read.
#[derive(Debug, thiserror::Error)]
enum LineError {
    #[error("cannot read stdin: {0}")]
    Io(#[from] std::io::Error),
    #[error("the line is longer than {0} bytes, more than any valid record needs; it was not read whole")]
    TooLong(usize),
    #[error("the line is not UTF-8")]
    NotUtf8,
}

/// Lines of stdin, read on a thread of their own so that a slow producer never blocks the
/// runtime's workers (the storage engine's background tasks run there). A line longer than
/// `max_line` bytes ends the stream with an error, without being read into memory whole.
fn stdin_lines(max_line: usize) -> tokio::sync::mpsc::Receiver<Result<String, LineError>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        loop {
            let line = match read_line(&mut input, max_line) {
                Ok(None) => break,
                Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| LineError::NotUtf8),
                Err(e) => Err(e),
            };
            let stop = line.is_err();
            if tx.blocking_send(line).is_err() || stop {
                break;
            }
        }
    });
    rx
}

/// One line (without its newline), or `None` at the end of input.
fn read_line(input: &mut impl BufRead, max_line: usize) -> Result<Option<Vec<u8>>, LineError> {
    let mut line = Vec::new();
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if line.len() + chunk.len() > max_line {
            return Err(LineError::TooLong(max_line));
        }
        line.extend_from_slice(chunk);
        let used = done.unwrap_or(available.len());
        input.consume(used);
        if done.is_some() {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(line));
        }
    }
}

async fn read_command(uri: &str, options: StoreOptions, cmd: &Command) -> Result<ExitCode, Failure> {
    let store = ctxlog::open(uri, options).await?;
    let mut out = std::io::stdout().lock();
    let mut print = |v: serde_json::Value| {
        let _ = writeln!(out, "{v}");
    };
    match cmd {
        Command::Get { bot, id } => {
            let mut p = store.projector();
            match p.get(bot, id).await? {
                Some(e) => print(json::entry_json(&e)),
                None => {
                    eprintln!("not found: no live record `{id}` of bot `{bot}`");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        Command::Session { bot, session, at } => {
            let mut p = store.projector();
            let records = match at {
                None => p.session(bot, session).await?,
                Some(at) => {
                    let at = json::parse_at(at)?;
                    p.session_page_at(bot, session, &at, None, usize::MAX).await?.0
                }
            };
            for e in records {
                print(json::entry_json(&e));
            }
        }
        Command::Context { bot, session, at } => {
            let mut p = store.projector();
            p.refresh().await?;
            let (view, position) = match at {
                None => (p.context(bot, session).await?, p.checkpoint()),
                Some(at) => {
                    let at = json::parse_at(at)?;
                    (p.context_at(bot, session, &at).await?, at)
                }
            };
            print(json::context_json(bot, session, &view, &position));
        }
        Command::Sessions { bot, at } => {
            let mut p = store.projector();
            let sessions = match at {
                None => p.sessions(bot).await?,
                Some(at) => p.sessions_at(bot, &json::parse_at(at)?).await?,
            };
            for s in sessions {
                print(json::session_json(&s));
            }
        }
        Command::Search {
            bot,
            query,
            model,
            vector,
            session,
            k,
        } => {
            use ctxlog::search::{Ask, Deadline, Filter, Nearest, Query, Searcher, snippet};
            let query = query.as_deref().map(Query::parse).transpose()?;
            let near = match (model, vector) {
                (Some(model), Some(v)) => {
                    let vector: Vec<f32> = serde_json::from_str(v).map_err(|e| {
                        ctxlog::Error::invalid("vector", None, format!("not a JSON array of numbers: {e}"))
                    })?;
                    Some(Nearest::new(model.clone(), vector)?)
                }
                _ => None,
            };
            let ask = match (&query, &near) {
                (Some(q), Some(n)) => Ask::Hybrid(q, n),
                (Some(q), None) => Ask::Text(q),
                (None, Some(n)) => Ask::Vector(n),
                (None, None) => unreachable!("clap requires a query or a vector"),
            };
            let mut p = store.projector();
            p.refresh().await?;
            let mut searcher = Searcher::new();
            searcher.catch_up(&*store, &p.checkpoint()).await?;
            let filter = Filter {
                session: session.clone(),
                ..Filter::default()
            };
            let (hits, _) = searcher
                .index()
                .find_by(bot, ask, &filter, None, usize::from(*k), &Deadline::never())?;
            for h in hits {
                // The projector holds what the searcher read: the hit's record.
                let Some(e) = p.get(bot, &h.id).await? else { continue };
                let text = match &e.record.body {
                    ctxlog::Body::Text(t) => snippet(t, &h.matched),
                    ctxlog::Body::Bytes(_) => String::new(),
                };
                print(serde_json::json!({
                    "matched": h.matched,
                    "record": json::entry_json(&e),
                    "score": h.score,
                    "snippet": text,
                }));
            }
        }
        Command::Shards => {
            for s in store.shards().await? {
                print(json::shard_json(&s));
            }
        }
        Command::Conflicts => {
            for c in store.conflict_discovery().conflicts(None).await? {
                print(json::conflict_json(&c));
            }
        }
        Command::Stats => {
            let mut p = store.projector();
            let started = std::time::Instant::now();
            p.refresh().await?;
            print(json::stats_json(&p.stats(), store.backend(), started.elapsed()));
        }
        Command::Compact {
            max_generations,
            max_bytes,
        } => {
            let report = store
                .compact(
                    &CompactOptions::default()
                        .with_max_generations(*max_generations)
                        .with_max_bytes(*max_bytes),
                )
                .await?;
            print(json::compact_json(&report));
        }
        Command::Gc { grace, max_objects } => {
            let report = store
                .gc(&GcOptions::default().with_grace(*grace).with_max_objects(*max_objects))
                .await?;
            print(json::gc_json(&report));
        }
        Command::Retain {
            older_than,
            bot,
            max_sessions,
        } => {
            let options = RetainOptions::older_than(*older_than)
                .with_bot_id(bot.clone())
                .with_max_sessions(*max_sessions);
            print(json::retain_json(&ctxlog::retain(store.as_ref(), &options).await?));
        }
        Command::Purge { max_ids } => {
            let report = store.purge(&PurgeOptions::default().with_max_ids(*max_ids)).await?;
            print(json::purge_json(&report));
        }
        Command::Snapshot { search } => {
            let mut projector = store.projector();
            let refreshed = projector.refresh().await?;
            let report = projector.save_snapshot().await?;
            let mut out = json::snapshot_json(&report, &refreshed);
            if *search {
                let saved = ctxlog::search::saved::save(&mut ctxlog::search::Searcher::new(), store.as_ref()).await?;
                out["search_index"] = json::saved_index_json(&saved);
            }
            print(out);
        }
        Command::Upgrade { accept_changed_views } => {
            let report = ctxlog::upgrade_ids_by_bot(store.as_ref(), *accept_changed_views).await?;
            print(json::upgrade_json(&report));
            if report.to < ctxlog::IDS_BY_BOT {
                eprintln!(
                    "not upgraded: {} id(s) are under more than one bot, and their views would change; \
                     give --accept-changed-views to upgrade anyway",
                    report.shared_ids.len()
                );
                return Ok(ExitCode::from(2));
            }
        }
        Command::Append { .. }
        | Command::Summarize { .. }
        | Command::Fork { .. }
        | Command::Demo
        | Command::Serve { .. }
        | Command::Mcp { .. }
        | Command::Token { .. } => {
            unreachable!("handled in run")
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_longer_than_the_cap_are_refused_without_reading_them_whole() {
        let input = format!("short\r\n{}\nnever read\n", "x".repeat(100));
        let mut reader = std::io::BufReader::with_capacity(8, input.as_bytes());
        assert_eq!(read_line(&mut reader, 50).unwrap(), Some(b"short".to_vec()));
        assert!(matches!(read_line(&mut reader, 50), Err(LineError::TooLong(50))));
        let mut exact = std::io::BufReader::with_capacity(8, "12345\n123456".as_bytes());
        assert_eq!(read_line(&mut exact, 5).unwrap(), Some(b"12345".to_vec()));
        assert!(matches!(read_line(&mut exact, 5), Err(LineError::TooLong(5))));
        let mut last = std::io::BufReader::new("a\nb".as_bytes());
        assert_eq!(read_line(&mut last, 5).unwrap(), Some(b"a".to_vec()));
        assert_eq!(read_line(&mut last, 5).unwrap(), Some(b"b".to_vec()));
        assert_eq!(read_line(&mut last, 5).unwrap(), None);
    }

    #[test]
    fn timeouts_outside_the_range_are_refused_not_panicked_on() {
        for bad in ["0", "-1", "1e20", "1e308", "inf", "NaN", "86400.5", "x", ""] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_timeout("0.001").unwrap(), Duration::from_millis(1));
        assert_eq!(parse_timeout("86400").unwrap(), Duration::from_secs(86400));
    }
}
