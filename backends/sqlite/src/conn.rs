//! Connections, schema and the bounded blocking bridge.
//!
//! SQLite is synchronous. Every call runs on tokio's blocking pool under the operation's
//! deadline; when the deadline passes, the running statement is interrupted so that no
//! thread keeps working on a request nobody waits for.

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use ctxlog_core::{Error, Result, ShardId, Written};
use rusqlite::{Connection, ErrorCode, InterruptHandle, OpenFlags, OptionalExtension, TransactionBehavior};

pub(crate) const BACKEND: &str = "sqlite";
/// Bumped when the schema changes incompatibly.
const FORMAT: &str = "1";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ctxlog_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shards (
    shard_no INTEGER PRIMARY KEY,
    shard    BLOB NOT NULL UNIQUE,
    writer   TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    max_hlc  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_no INTEGER PRIMARY KEY,
    bot_id     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    UNIQUE (bot_id, session_id)
);
CREATE TABLE IF NOT EXISTS entries (
    shard_no     INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    epoch        INTEGER NOT NULL,
    hlc          INTEGER NOT NULL,
    kind         INTEGER NOT NULL,
    session_no   INTEGER NOT NULL,
    content_hash BLOB NOT NULL,
    id           TEXT NOT NULL,
    role         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body_text    TEXT,
    body_bytes   BLOB,
    metadata     TEXT,
    created_at   INTEGER
);
-- The projection's covering index: a first scan reads this b-tree only, never bodies.
-- Its (shard_no, seq, epoch) prefix is unique: appends take seqs inside the epoch-checked
-- transaction.
CREATE INDEX IF NOT EXISTS entries_projection
    ON entries (shard_no, seq, epoch, hlc, kind, session_no, content_hash, id);
";

/// A connection shared by one handle, with the means to interrupt it.
#[derive(Clone)]
pub(crate) struct Conn {
    conn: Arc<Mutex<Connection>>,
    interrupt: Arc<InterruptHandle>,
    timeout: Duration,
}

impl Conn {
    /// Open (and, if asked, create) the store file, set WAL mode and ensure the schema.
    /// Safe when many processes do it at once (rule 12).
    pub(crate) fn open(path: &Path, create: bool, timeout: Duration) -> Result<Self> {
        if !create && !path.exists() {
            return Err(Error::NotFound {
                what: format!("no ctxlog store at {}", path.display()),
            });
        }
        let mut flags =
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        if create {
            flags |= OpenFlags::SQLITE_OPEN_CREATE;
        }
        // Racing creators: switching a new file to WAL mode, or creating the schema, can
        // return BUSY at once (SQLite skips the busy handler where waiting could deadlock).
        // Such an open wrote nothing; retry it, with a short backoff, until the deadline.
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(1);
        let conn = loop {
            match open_once(path, flags, create, timeout) {
                Ok(conn) => break conn,
                Err(e) if is_busy(&e) && started.elapsed() + backoff < timeout => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                }
                Err(e) => return Err(open_error(path, e)),
            }
        };
        let interrupt = Arc::new(conn.get_interrupt_handle());
        Ok(Conn {
            conn: Arc::new(Mutex::new(conn)),
            interrupt,
            timeout,
        })
    }

    /// Run `f` on the blocking pool under the store's deadline. On a miss the statement is
    /// interrupted and the error says `written_on_timeout`.
    pub(crate) async fn run<T, F>(
        &self,
        op: &'static str,
        shard: Option<ShardId>,
        written_on_timeout: Written,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.run_by(Instant::now() + self.timeout, op, shard, written_on_timeout, f)
            .await
    }

    /// [`Conn::run`] with a deadline shared with earlier steps of the same operation.
    ///
    /// The connection may be shared: a call that misses its deadline while it still waits
    /// for the connection must neither interrupt another call's statement nor run later,
    /// when nobody waits for it. `state` says which it is: waiting, running, done or abandoned.
    pub(crate) async fn run_by<T, F>(
        &self,
        deadline: Instant,
        op: &'static str,
        shard: Option<ShardId>,
        written_on_timeout: Written,
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let conn = self.conn.clone();
        let state = Arc::new(AtomicU8::new(WAITING));
        let task_state = state.clone();
        let abandoned = || Error::Timeout {
            op,
            after: self.timeout,
            shard,
            written: Written::Nothing,
        };
        let task = tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if task_state
                .compare_exchange(WAITING, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return None; // abandoned before it started: do nothing
            }
            let r = f(&mut guard);
            task_state.store(DONE, Ordering::Release);
            Some(r)
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Some(result))) => result,
            Ok(Ok(None)) => Err(abandoned()),
            Ok(Err(join)) => Err(Error::backend(BACKEND, op, shard, written_on_timeout, join)),
            Err(_) => match state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
                // Never started: it never will, and nothing was written.
                Ok(_) => Err(abandoned()),
                // Running: stop its statement. Only ours runs on this connection now.
                Err(RUNNING) => {
                    self.interrupt.interrupt();
                    Err(Error::Timeout {
                        op,
                        after: self.timeout,
                        shard,
                        written: written_on_timeout,
                    })
                }
                // Finished just now; its result is lost to us, so say what it may have done.
                Err(_) => Err(Error::Timeout {
                    op,
                    after: self.timeout,
                    shard,
                    written: written_on_timeout,
                }),
            },
        }
    }
}

const WAITING: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const ABANDONED: u8 = 3;

/// Check the store's format, creating the schema first if the store is new. An existing
/// store is only read here, so readers never wait for (or take) the write lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked)
    )
}

/// One attempt to open the file in WAL mode with the schema in place.
fn open_once(path: &Path, flags: OpenFlags, create: bool, timeout: Duration) -> rusqlite::Result<Connection> {
    let mut conn = Connection::open_with_flags(path, flags)?;
    // The busy handler waits for other processes' locks. It outlasts the deadline on
    // purpose: a lock wait that outlives the deadline is cut by the deadline (and the
    // statement interrupted), so a BUSY error always means "gave up before writing".
    conn.busy_timeout(timeout + Duration::from_secs(1))?;
    let mut mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        mode = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    }
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "cannot use WAL journal mode (got {mode})"
        )));
    }
    // FULL: an acknowledged commit survives power loss, not only a process crash.
    conn.pragma_update(None, "synchronous", "FULL")?;
    ensure_schema(&mut conn, create)?;
    Ok(conn)
}

fn ensure_schema(conn: &mut Connection, create: bool) -> rusqlite::Result<()> {
    let has_meta: bool = conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'ctxlog_meta'",
        [],
        |r| r.get(0),
    )?;
    let existing: Option<String> = if has_meta {
        conn.query_row("SELECT value FROM ctxlog_meta WHERE key = 'format'", [], |r| r.get(0))
            .optional()?
    } else {
        None
    };
    let format = match existing {
        Some(f) => f,
        None if !create => {
            return Err(rusqlite::Error::InvalidParameterName(
                "a SQLite database, but not a ctxlog store".into(),
            ));
        }
        None => {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(SCHEMA)?;
            tx.execute(
                "INSERT INTO ctxlog_meta (key, value) VALUES ('format', ?1) ON CONFLICT (key) DO NOTHING",
                [FORMAT],
            )?;
            let format: String =
                tx.query_row("SELECT value FROM ctxlog_meta WHERE key = 'format'", [], |r| r.get(0))?;
            tx.commit()?;
            format
        }
    };
    if format != FORMAT {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "store format {format}, this build reads format {FORMAT}"
        )));
    }
    Ok(())
}

fn open_error(path: &Path, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => Error::Corrupt {
            shard: None,
            what: format!("{} is not a SQLite database", path.display()),
        },
        Some(ErrorCode::CannotOpen) => Error::NotFound {
            what: format!("cannot open a ctxlog store at {}", path.display()),
        },
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Error::Timeout {
            op: "open",
            after: Duration::ZERO,
            shard: None,
            written: Written::Nothing,
        },
        _ => match e {
            rusqlite::Error::InvalidParameterName(what) => Error::Corrupt {
                shard: None,
                what: format!("{}: {what}", path.display()),
            },
            e => Error::backend(BACKEND, "open", None, Written::Nothing, with_path(path, e)),
        },
    }
}

fn with_path(path: &Path, e: rusqlite::Error) -> String {
    format!("{}: {e}", path.display())
}

/// Map a SQLite error of operation `op`. `written` is what the caller knows: `Nothing`
/// before COMMIT was attempted, `Unknown` once it was.
pub(crate) fn sql_error(op: &'static str, shard: Option<ShardId>, written: Written, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) => Error::Timeout {
            op,
            after: Duration::ZERO,
            shard,
            written,
        },
        Some(ErrorCode::OperationInterrupted) => Error::Timeout {
            op,
            after: Duration::ZERO,
            shard,
            written,
        },
        Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => Error::Corrupt {
            shard,
            what: e.to_string(),
        },
        _ => Error::backend(BACKEND, op, shard, written, e),
    }
}
