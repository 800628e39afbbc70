//! `ctxlog`: the command-line interface of the context log.
//!
//! Exit codes: 0 ok, 1 not found, 2 usage or invalid input, 3 fenced, 4 storage error or
//! timeout. Errors go to stderr and say what failed, where, and whether anything was written.

mod demo;
mod json;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ctxlog::{CompactOptions, Error, Record, StoreOptions, WriterId};
use serde_json::json;

#[derive(Parser)]
#[command(name = "ctxlog", version, about = "A durable, append-only context log for AI agents")]
struct Cli {
    /// Store URI: `sqlite:PATH`, `PATH.db`, `lance:PATH`, `PATH.lance`, `s3://…`, `memory://…`
    /// [default: ./ctxlog.db; `demo` uses a fresh file in the temp directory]
    #[arg(long, global = true, env = "CTXLOG_STORE")]
    store: Option<String>,

    /// Deadline in seconds: for the whole operation, and for each storage call of `append`.
    #[arg(long, global = true, default_value_t = 60.0)]
    timeout: f64,

    /// A storage option for object stores (repeatable), e.g. `region=eu-west-1`.
    #[arg(long = "storage-option", global = true, value_name = "KEY=VALUE", value_parser = parse_kv)]
    storage_options: Vec<(String, String)>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Append JSON Lines records from stdin; print one JSON line per durable batch.
    Append {
        /// This process's writer identity (instance id, host name, ordinal).
        #[arg(long)]
        writer: String,
        /// Records per batch.
        #[arg(long, default_value_t = 100)]
        batch: usize,
    },
    /// Print the live record with this id, or exit 1.
    Get { id: String },
    /// Print a session's live records, one JSON object per line, in contract order.
    Session {
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
    },
    /// Print a bot's sessions, one JSON object per line.
    Sessions {
        #[arg(long)]
        bot: String,
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
    /// The quickstart: concurrent writers, a session view and a conflict report.
    Demo,
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !(cli.timeout.is_finite() && cli.timeout > 0.0) {
        eprintln!("error: --timeout must be a positive number of seconds");
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
    let timeout = Duration::from_secs_f64(cli.timeout);
    let options = |create: bool| StoreOptions {
        create_if_missing: create,
        timeout,
        storage_options: cli.storage_options.clone(),
        ..StoreOptions::default()
    };
    let store = cli.store.as_deref().unwrap_or("./ctxlog.db");
    let result = match &cli.command {
        // Appends stream for as long as stdin does; each storage call has the deadline.
        Command::Append { writer, batch } => append(store, options(true), writer, *batch).await,
        Command::Demo => demo::run(cli.store.as_deref(), options(true)).await,
        cmd => match tokio::time::timeout(timeout, read_command(store, options(false), cmd)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Store(Error::Timeout {
                op: "ctxlog command",
                after: timeout,
                shard: None,
                // Only `compact` writes; its commit may be in flight.
                written: if matches!(cmd, Command::Compact { .. }) {
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
        Error::InvalidInput { .. } | Error::UnknownScheme { .. } | Error::BackendNotCompiled { .. } => 2,
        Error::Fenced { .. } => 3,
        Error::Poisoned { .. }
        | Error::Closed { .. }
        | Error::Timeout { .. }
        | Error::Backend { .. }
        | Error::Corrupt { .. } => 4,
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

async fn append(uri: &str, options: StoreOptions, writer: &str, batch: usize) -> Result<ExitCode, Failure> {
    if batch == 0 {
        return Err(Error::invalid("batch", None, "must be at least 1").into());
    }
    let writer = WriterId::new(writer)?;
    let store = ctxlog::open(uri, options).await?;
    let mut shard = store.open_shard(&writer).await?;
    let mut written = 0u64;
    let mut pending: Vec<Record> = Vec::with_capacity(batch);
    let mut lines = stdin_lines();
    let mut line_no = 0;
    let mut stdout = std::io::stdout();
    loop {
        let line = match lines.recv().await {
            None => None,
            Some(Ok(l)) => Some(l),
            Some(Err(e)) => {
                return Err(Failure::Input {
                    line: line_no + 1,
                    error: Error::invalid("record", None, format!("cannot read stdin: {e}")),
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
            let ack = shard
                .append(records)
                .await
                .map_err(|error| Failure::Append { error, written })?;
            written += n;
            let line = json!({
                "shard": ack.shard.to_string(),
                "epoch": ack.epoch,
                "first_seq": ack.first_seq,
                "last_seq": ack.last_seq,
                "ids": ack.ids,
            });
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

/// Lines of stdin, read on a thread of their own so that a slow producer never blocks the
/// runtime's workers (the storage engine's background tasks run there).
fn stdin_lines() -> tokio::sync::mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

async fn read_command(uri: &str, options: StoreOptions, cmd: &Command) -> Result<ExitCode, Failure> {
    let store = ctxlog::open(uri, options).await?;
    let mut out = std::io::stdout().lock();
    let mut print = |v: serde_json::Value| {
        let _ = writeln!(out, "{v}");
    };
    match cmd {
        Command::Get { id } => {
            let mut p = store.projector();
            match p.get(id).await? {
                Some(e) => print(json::entry_json(&e)),
                None => {
                    eprintln!("not found: no live record with id `{id}`");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        Command::Session { bot, session } => {
            let mut p = store.projector();
            for e in p.session(bot, session).await? {
                print(json::entry_json(&e));
            }
        }
        Command::Sessions { bot } => {
            let mut p = store.projector();
            for s in p.sessions(bot).await? {
                print(json!({
                    "bot_id": s.bot_id,
                    "session_id": s.session_id,
                    "records": s.records,
                    "first_hlc": s.first_hlc.map(|h| h.0),
                    "last_hlc": s.last_hlc.map(|h| h.0),
                }));
            }
        }
        Command::Shards => {
            for s in store.shards().await? {
                print(json!({
                    "shard": s.shard.to_string(),
                    "writer": s.writer.as_str(),
                    "epoch": s.epoch,
                    "last_seq": s.last_seq,
                    "entries": s.entries,
                }));
            }
        }
        Command::Conflicts => {
            for c in store.conflict_discovery().conflicts(None).await? {
                print(serde_json::to_value(&c).expect("conflicts serialise"));
            }
        }
        Command::Stats => {
            let mut p = store.projector();
            let started = std::time::Instant::now();
            p.refresh().await?;
            let mut v = serde_json::to_value(p.stats()).expect("stats serialise");
            v["backend"] = json!(store.backend());
            v["first_scan_ms"] = json!(started.elapsed().as_secs_f64() * 1000.0);
            print(v);
        }
        Command::Compact {
            max_generations,
            max_bytes,
        } => {
            let report = store
                .compact(&CompactOptions {
                    max_generations: *max_generations,
                    max_bytes: *max_bytes,
                })
                .await?;
            print(serde_json::to_value(report).expect("report serialises"));
        }
        Command::Append { .. } | Command::Demo => unreachable!("handled in run"),
    }
    Ok(ExitCode::SUCCESS)
}
