//! Connections, schema and the bounded blocking bridge.
//!
//! SQLite is synchronous. Every call runs on tokio's blocking pool under the operation's
//! deadline, and the call enforces that deadline *itself*, from inside SQLite: a busy
//! handler that gives up at the deadline (so a lock wait ends with `SQLITE_BUSY`) and a
//! progress handler that interrupts a long statement at the deadline. Nothing ever calls
//! `sqlite3_interrupt` from outside, which could hit whatever statement the connection runs
//! next; a call that missed its deadline has stopped using the connection by the time its
//! error returns.
//!
//! Opening never changes a file before it is known to be a ctxlog store (or nothing at all):
//! the file is inspected first, read-only, and only through SQLite (never with a plain
//! `open`, which would drop this process's locks on it: see [`look`]). Readers open read-only
//! connections, so they never take the write lock and never write to the store's file.

use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use ctxlog_core::{Error, Result, ShardId, Written};
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::schema::{FORMAT, Holds, SchemaError, create_schema, holds};

pub(crate) const BACKEND: &str = "sqlite";
/// What a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only: a read-only connection. A missing or empty file is `NotFound`.
    Read,
    /// Writes to an existing store. A missing or empty file is `NotFound`.
    Write,
    /// Writes, creating the store where nothing exists (or the file is empty).
    Create,
}

// ---- the per-call deadline, enforced inside SQLite --------------------------------------

/// The call running on this thread: its deadline, and whether its caller gave up.
struct Call {
    deadline: std::time::Instant,
    cancel: Arc<AtomicBool>,
}

impl Call {
    fn over(&self) -> bool {
        self.cancel.load(Ordering::Acquire) || std::time::Instant::now() >= self.deadline
    }
}

thread_local! {
    static CALL: RefCell<Option<Call>> = const { RefCell::new(None) };
}

/// Makes `call` the current call of this thread until dropped.
struct CallScope;

impl CallScope {
    fn enter(deadline: std::time::Instant, cancel: Arc<AtomicBool>) -> Self {
        CALL.with(|c| *c.borrow_mut() = Some(Call { deadline, cancel }));
        CallScope
    }
}

impl Drop for CallScope {
    fn drop(&mut self) {
        CALL.with(|c| *c.borrow_mut() = None);
    }
}

/// Run `f` on this thread as a call with `deadline`: lock waits and statements of every
/// connection it uses stop at the deadline.
pub(crate) fn within<T>(deadline: std::time::Instant, f: impl FnOnce() -> T) -> T {
    let _call = CallScope::enter(deadline, Arc::new(AtomicBool::new(false)));
    f()
}

/// The deadline of this thread's current call, if it is inside one.
pub(crate) fn call_deadline() -> Option<std::time::Instant> {
    CALL.with(|c| c.borrow().as_ref().map(|call| call.deadline))
}

/// SQLite's busy handler: wait for another connection's lock in short steps, until the
/// current call's deadline. Outside a call it never waits.
fn busy_wait(attempt: i32) -> bool {
    CALL.with(|c| {
        let c = c.borrow();
        let Some(call) = c.as_ref() else { return false };
        if call.over() {
            return false;
        }
        let step = Duration::from_millis(match attempt {
            0..=2 => 1,
            3..=9 => 2,
            10..=29 => 5,
            _ => 10,
        });
        let left = call.deadline.saturating_duration_since(std::time::Instant::now());
        std::thread::sleep(step.min(left));
        true
    })
}

/// SQLite's progress handler: interrupt the running statement once its call is over.
fn should_interrupt() -> bool {
    CALL.with(|c| c.borrow().as_ref().is_some_and(Call::over))
}

/// Virtual-machine steps between two deadline checks of a running statement.
const PROGRESS_STEPS: i32 = 1000;

fn install_handlers(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_handler(Some(busy_wait))?;
    conn.progress_handler(PROGRESS_STEPS, Some(should_interrupt));
    Ok(())
}

/// Run `f` with the busy handler off: a lock another connection holds fails at once
/// (`SQLITE_BUSY`) instead of being waited for. For maintenance steps that must never make a
/// writer or reader wait behind them.
pub(crate) fn without_waiting<T>(conn: &Connection, f: impl FnOnce(&Connection) -> T) -> rusqlite::Result<T> {
    conn.busy_handler(None)?;
    let out = f(conn);
    install_handlers(conn)?;
    Ok(out)
}

/// `deadline` moved earlier by `by` (never before now).
fn before(deadline: Instant, by: Duration) -> std::time::Instant {
    let d = deadline.into_std();
    d.checked_sub(by).unwrap_or(d).max(std::time::Instant::now())
}

/// Wait `step` inside a call (between retries), unless its deadline comes first. False when
/// the call is over.
pub(crate) fn pause(step: Duration) -> bool {
    CALL.with(|c| {
        let c = c.borrow();
        let Some(call) = c.as_ref() else { return false };
        let left = call.deadline.saturating_duration_since(std::time::Instant::now());
        if call.over() || left < step {
            return false;
        }
        std::thread::sleep(step);
        true
    })
}

/// Time kept back from a call's deadline for the call to unwind and report by itself, so
/// that the connection is free when the caller's deadline passes.
fn margin(timeout: Duration) -> Duration {
    (timeout / 8).min(Duration::from_millis(250))
}

// ---- opening ----------------------------------------------------------------------------

/// What is at a store's path, found without changing anything.
enum Found {
    Nothing,
    EmptyFile,
    /// A regular file with bytes: SQLite itself says what it is.
    File,
}

fn not_a_store(path: &Path, reason: impl Into<String>) -> Error {
    Error::NotAStore {
        location: path.display().to_string(),
        reason: reason.into(),
    }
}

/// The error of a store whose format cannot be used by `op` (before anything was written).
pub(crate) fn format_error(
    e: crate::schema::FormatError,
    op: &'static str,
    shard: Option<ShardId>,
    path: &Path,
) -> Error {
    match e {
        crate::schema::FormatError::Sql(e) => sql_error(op, shard, Written::Nothing, e),
        crate::schema::FormatError::Unknown(f) => refuse(path, Holds::OtherFormat(f)),
        crate::schema::FormatError::TooOld(f) => ctxlog_core::needs_ids_by_bot(f),
    }
}

fn not_found(path: &Path) -> Error {
    Error::NotFound {
        what: format!("no ctxlog store at {}", path.display()),
    }
}

/// Look at the path's metadata: nothing, an empty file, or a file with bytes. Anything else
/// (a directory, a FIFO, a device) is refused and never opened. A symbolic link to a file is
/// followed: the user named it.
///
/// The file itself is never opened here, only `stat`ed. POSIX record locks belong to a
/// process and a file, not to a descriptor: closing *any* descriptor of the store file drops
/// every lock this process holds on it, SQLite's included, and another process may then
/// checkpoint and delete the WAL this process still writes to (acknowledged writes lost;
/// SQLite's "How To Corrupt" §2.2). Only SQLite opens a store's files: it keeps a closed
/// connection's descriptor open while the process holds locks on the file, and it answers
/// `SQLITE_NOTADB` for a file of other bytes.
fn look(path: &Path) -> Result<Found> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Nothing),
        Err(e) => {
            return Err(Error::backend(
                BACKEND,
                "open",
                None,
                Written::Nothing,
                with_path(path, e),
            ));
        }
    };
    if !meta.is_file() {
        return Err(not_a_store(path, "not a regular file"));
    }
    Ok(if meta.len() == 0 { Found::EmptyFile } else { Found::File })
}

/// Whether `path` is a SQLite database, asked of SQLite itself through a read-only
/// connection (never by reading the file: see [`look`]). `false` for anything SQLite calls
/// not a database, and for what is not a regular file with bytes; any other answer (a lock,
/// an I/O error) is `true`, for the open that follows to report.
pub(crate) fn is_database(path: &Path) -> bool {
    if !matches!(look(path), Ok(Found::File)) {
        return false;
    }
    let answer =
        read_only(path).and_then(|c| c.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0)));
    !matches!(answer, Err(e) if e.sqlite_error_code() == Some(ErrorCode::NotADatabase))
}

pub(crate) fn read_only(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    install_handlers(&conn)?;
    Ok(conn)
}

/// The error for a file that is not a ctxlog store this build can open.
fn refuse(path: &Path, h: Holds) -> Error {
    match h {
        Holds::OtherTables(names) => {
            let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
            let more = if names.len() > 5 { ", …" } else { "" };
            not_a_store(
                path,
                format!("a SQLite database with other tables ({}{more})", shown.join(", ")),
            )
        }
        Holds::OtherFormat(f) => not_a_store(
            path,
            format!(
                "ctxlog store format {f}; this build reads formats {} (and writes format {FORMAT}): a newer release wrote it",
                crate::schema::READS.join(", ")
            ),
        ),
        Holds::Store | Holds::NoSchema => unreachable!("only refusals are refused"),
    }
}

/// A connection shared by one handle (calls queue for it).
#[derive(Clone)]
pub(crate) struct Conn {
    conn: Arc<Mutex<Connection>>,
    timeout: Duration,
}

impl Conn {
    /// Run `f` with this connection on the calling thread (for blocking callers).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        f(&mut self.conn.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Open a connection for `access`, by `deadline`. Safe when many processes create the
    /// same store at once (rule 12); never writes to a file that is not a ctxlog store.
    pub(crate) fn open(path: &Path, access: Access, timeout: Duration, deadline: std::time::Instant) -> Result<Self> {
        let _call = CallScope::enter(deadline, Arc::new(AtomicBool::new(false)));
        let create = match look(path)? {
            Found::Nothing | Found::EmptyFile if access == Access::Create => true,
            Found::Nothing | Found::EmptyFile => return Err(not_found(path)),
            Found::File => {
                let h = read_only(path)
                    .and_then(|c| holds(&c))
                    .map_err(|e| open_error(path, timeout, e))?;
                match h {
                    Holds::Store => false,
                    Holds::NoSchema if access == Access::Create => true,
                    Holds::NoSchema => return Err(not_found(path)),
                    other => return Err(refuse(path, other)),
                }
            }
        };
        // Racing creators: switching a new file to WAL mode can return BUSY at once (SQLite
        // skips the busy handler where waiting could deadlock). Such an attempt wrote
        // nothing; retry it, with a short backoff, until the deadline.
        let mut backoff = Duration::from_millis(1);
        let conn = loop {
            match open_once(path, access, create) {
                Ok(conn) => break conn,
                Err(OpenError::Sql(e)) if is_busy(&e) && std::time::Instant::now() + backoff < deadline => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(50));
                }
                Err(OpenError::Sql(e)) => return Err(open_error(path, timeout, e)),
                Err(OpenError::Refused(h)) => return Err(refuse(path, h)),
                Err(OpenError::NoWal(mode)) => {
                    return Err(Error::backend(
                        BACKEND,
                        "open",
                        None,
                        Written::Nothing,
                        with_path(path, format!("cannot use WAL journal mode (got {mode})")),
                    ));
                }
            }
        };
        Ok(Conn {
            conn: Arc::new(Mutex::new(conn)),
            timeout,
        })
    }

    /// [`Conn::open`] on the blocking pool, by `deadline`.
    pub(crate) async fn open_by(path: &Path, access: Access, timeout: Duration, deadline: Instant) -> Result<Self> {
        let p = path.to_path_buf();
        let inner = before(deadline, margin(timeout));
        let task = tokio::task::spawn_blocking(move || Conn::open(&p, access, timeout, inner));
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(Error::backend(BACKEND, "open", None, Written::Nothing, join)),
            Err(_) => Err(Error::Timeout {
                op: "open",
                after: timeout,
                shard: None,
                written: Written::Nothing,
            }),
        }
    }

    /// Run `f` on the blocking pool under the store's deadline.
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
    /// Calls queue for the connection. A call whose deadline passes while it still waits
    /// never runs. A running call stops by itself at the deadline (its lock waits and
    /// statements see it); only a step SQLite cannot interrupt (an fsync) can outlast it,
    /// and then the error says `written_on_timeout`.
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
        let cancel = Arc::new(AtomicBool::new(false));
        let (task_state, task_cancel) = (state.clone(), cancel.clone());
        let inner_deadline = before(deadline, margin(self.timeout));
        let timed_out = |written| Error::Timeout {
            op,
            after: self.timeout,
            shard,
            written,
        };
        let task = tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if task_state
                .compare_exchange(WAITING, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return None; // abandoned before it started: do nothing
            }
            let _call = CallScope::enter(inner_deadline, task_cancel);
            let r = f(&mut guard);
            task_state.store(DONE, Ordering::Release);
            Some(r)
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(Some(result))) => result.map_err(|e| with_deadline(e, self.timeout)),
            Ok(Ok(None)) => Err(timed_out(Written::Nothing)),
            Ok(Err(join)) => Err(Error::backend(BACKEND, op, shard, written_on_timeout, join)),
            Err(_) => {
                cancel.store(true, Ordering::Release);
                match state.compare_exchange(WAITING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
                    // Never started: it never will, and nothing was written.
                    Ok(_) => Err(timed_out(Written::Nothing)),
                    // Still running past its own deadline: stuck in a step SQLite cannot
                    // interrupt. Its outcome is unknown to us.
                    Err(_) => Err(timed_out(written_on_timeout)),
                }
            }
        }
    }
}

const WAITING: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const ABANDONED: u8 = 3;

/// A lock wait or an interrupted statement ended a call at its deadline: say which deadline.
fn with_deadline(e: Error, timeout: Duration) -> Error {
    match e {
        Error::Timeout { op, shard, written, .. } => Error::Timeout {
            op,
            after: timeout,
            shard,
            written,
        },
        other => other,
    }
}

pub(crate) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked)
    )
}

/// Why one attempt to open did not give a connection.
enum OpenError {
    Sql(rusqlite::Error),
    /// The file turned out to be something else once locked for writing.
    Refused(Holds),
    /// SQLite would not switch the store to WAL mode (it answered with this mode).
    NoWal(String),
}

impl From<rusqlite::Error> for OpenError {
    fn from(e: rusqlite::Error) -> Self {
        OpenError::Sql(e)
    }
}

/// One attempt to open the connection; for writers, with the schema in place and WAL mode.
fn open_once(path: &Path, access: Access, create: bool) -> std::result::Result<Connection, OpenError> {
    if access == Access::Read {
        return Ok(read_only(path)?);
    }
    let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    if create {
        flags |= OpenFlags::SQLITE_OPEN_CREATE;
    }
    let mut conn = Connection::open_with_flags(path, flags)?;
    install_handlers(&conn)?;
    // FULL: an acknowledged commit survives power loss, not only a process crash.
    conn.pragma_update(None, "synchronous", "FULL")?;
    // Every byte SQLite frees is overwritten with zeros, so that a purged body leaves no copy
    // in a free page or a free slot of a page (rule 16). An append-only log frees almost
    // nothing, so this costs writers nothing measurable.
    conn.pragma_update(None, "secure_delete", "ON")?;
    if create {
        match create_schema(&mut conn) {
            Ok(()) => {}
            Err(SchemaError::Sql(e)) => return Err(OpenError::Sql(e)),
            Err(SchemaError::Refused(h)) => return Err(OpenError::Refused(h)),
        }
    }
    // Only now is the file known to be ours: WAL mode is a persistent change.
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(OpenError::NoWal(mode));
        }
    }
    Ok(conn)
}

fn open_error(path: &Path, timeout: Duration, e: rusqlite::Error) -> Error {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => not_a_store(path, "not a SQLite database"),
        Some(ErrorCode::CannotOpen) => Error::NotFound {
            what: format!("cannot open a ctxlog store at {}: {e}", path.display()),
        },
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) | Some(ErrorCode::OperationInterrupted) => {
            Error::Timeout {
                op: "open",
                after: timeout,
                shard: None,
                written: Written::Nothing,
            }
        }
        Some(ErrorCode::DatabaseCorrupt) => Error::Corrupt {
            shard: None,
            what: format!("{}: {e}", path.display()),
        },
        _ => Error::backend(BACKEND, "open", None, Written::Nothing, with_path(path, e)),
    }
}

fn with_path(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
}

/// Map a SQLite error of operation `op`. `written` is what the caller knows: `Nothing`
/// before COMMIT was attempted, `Unknown` once it was. A lock wait or a statement that
/// reached the deadline is a `Timeout` (its real deadline is filled in by [`Conn::run_by`]).
pub(crate) fn sql_error(op: &'static str, shard: Option<ShardId>, written: Written, e: rusqlite::Error) -> Error {
    // A stored value of the wrong type or range: the store holds what ctxlog never writes.
    if matches!(
        e,
        rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::FromSqlConversionFailure(..)
    ) {
        return Error::Corrupt {
            shard,
            what: format!("{op}: a stored value is out of range or of the wrong type: {e}"),
        };
    }
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy) | Some(ErrorCode::DatabaseLocked) | Some(ErrorCode::OperationInterrupted) => {
            Error::Timeout {
                op,
                after: Duration::ZERO,
                shard,
                written,
            }
        }
        Some(ErrorCode::DatabaseCorrupt) | Some(ErrorCode::NotADatabase) => Error::Corrupt {
            shard,
            what: e.to_string(),
        },
        _ => Error::backend(BACKEND, op, shard, written, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline(after: Duration) -> std::time::Instant {
        std::time::Instant::now() + after
    }

    /// A store with a second, raw connection holding its write lock.
    fn locked_store(dir: &Path) -> (std::path::PathBuf, Connection) {
        let path = dir.join("s.db");
        Conn::open(
            &path,
            Access::Create,
            Duration::from_secs(5),
            deadline(Duration::from_secs(5)),
        )
        .unwrap();
        let raw = Connection::open(&path).unwrap();
        raw.execute_batch("BEGIN IMMEDIATE").unwrap();
        (path, raw)
    }

    /// A call that misses its deadline in a lock wait has let go of the connection by the
    /// time its error returns (the busy wait ends at the deadline, not at a busy timeout).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_lock_wait_frees_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let (path, raw) = locked_store(dir.path());
        let timeout = Duration::from_millis(300);
        let conn = Conn::open(&path, Access::Write, timeout, deadline(Duration::from_secs(5))).unwrap();
        let err = conn
            .run("write", None, Written::Nothing, |c| {
                c.execute_batch("BEGIN IMMEDIATE; COMMIT")
                    .map_err(|e| sql_error("write", None, Written::Nothing, e))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Timeout { after, written: Written::Nothing, .. } if after == timeout),
            "{err:?}"
        );
        assert!(
            conn.conn.try_lock().is_ok(),
            "the connection is free when the error returns"
        );
        drop(raw);
        conn.run("write", None, Written::Nothing, |c| {
            c.execute_batch("BEGIN IMMEDIATE; COMMIT")
                .map_err(|e| sql_error("write", None, Written::Nothing, e))
        })
        .await
        .unwrap();
    }

    /// A long statement is stopped at its deadline, and only it: the next call on the same
    /// connection runs undisturbed, every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missed_deadline_stops_only_its_own_statement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = Conn::open(
            &path,
            Access::Create,
            Duration::from_millis(40),
            deadline(Duration::from_secs(5)),
        )
        .unwrap();
        for round in 0..20 {
            let err = conn
                .run("spin", None, Written::Nothing, |c| {
                    c.query_row(
                        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .map_err(|e| sql_error("spin", None, Written::Nothing, e))
                })
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Timeout { .. }), "round {round}: {err:?}");
            assert!(conn.conn.try_lock().is_ok(), "round {round}: connection still busy");
            let n: i64 = conn
                .run("count", None, Written::Nothing, |c| {
                    c.query_row("SELECT count(*) FROM shards", [], |r| r.get(0))
                        .map_err(|e| sql_error("count", None, Written::Nothing, e))
                })
                .await
                .unwrap_or_else(|e| panic!("round {round}: the next call was hit: {e:?}"));
            assert_eq!(n, 0);
        }
    }
}
