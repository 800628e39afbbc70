//! Fault injection for the conformance suite: store an entry exactly as given, bypassing
//! the epoch check, seq assignment and hashing, to prove that the history checker finds
//! what a broken writer or a damaged file would leave behind. Not for production use.

use std::path::Path;

use ctxlog_core::canonical::canonical_json;
use ctxlog_core::{Body, Entry, Error, Result, Written};
use rusqlite::{Connection, OptionalExtension, params};

pub fn inject_raw_entry(path: &Path, e: &Entry) -> Result<()> {
    let err = |e: rusqlite::Error| Error::backend("sqlite", "inject", None, Written::Unknown, e);
    let mut c = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(err)?;
    c.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
    let tx = c.transaction().map_err(err)?;
    let shard = &e.shard.as_bytes()[..];
    let shard_no: i64 = match tx
        .query_row("SELECT shard_no FROM shards WHERE shard = ?1", [shard], |r| r.get(0))
        .optional()
        .map_err(err)?
    {
        Some(n) => n,
        None => tx
            .query_row(
                "INSERT INTO shards (shard, writer, epoch, last_seq, max_hlc) VALUES (?1, 'injected', ?2, ?3, ?4)
                 RETURNING shard_no",
                params![shard, e.epoch as i64, e.seq as i64, e.hlc.0 as i64],
                |r| r.get(0),
            )
            .map_err(err)?,
    };
    tx.execute(
        "INSERT INTO sessions (bot_id, session_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        [&e.record.bot_id, &e.record.session_id],
    )
    .map_err(err)?;
    let session_no: i64 = tx
        .query_row(
            "SELECT session_no FROM sessions WHERE bot_id = ?1 AND session_id = ?2",
            [&e.record.bot_id, &e.record.session_id],
            |r| r.get(0),
        )
        .map_err(err)?;
    let r = &e.record;
    let (text, bytes) = match &r.body {
        Body::Text(t) => (Some(t.as_str()), None),
        Body::Bytes(b) => (None, Some(b.as_slice())),
    };
    tx.execute(
        crate::conn::INSERT_ENTRY,
        params![
            shard_no,
            e.seq as i64,
            e.epoch as i64,
            e.hlc.0 as i64,
            r.kind.as_u8(),
            session_no,
            &e.content_hash.0[..],
            r.id,
            r.role,
            r.content_type,
            text,
            bytes,
            r.metadata.as_ref().map(canonical_json),
            r.created_at.and_then(|t| t.timestamp_nanos_opt()),
        ],
    )
    .map_err(err)?;
    tx.commit().map_err(err)
}

// ---- a commit whose acknowledgement is lost ------------------------------------------------

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Stores whose appends stall after their commit, and a fast check that there are any.
static STALLED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WOKEN: Condvar = Condvar::new();
static ANY_STALLED: AtomicBool = AtomicBool::new(false);

/// Longest a stalled append waits for its guard to drop: nothing hangs, even a test.
const MOST_STALL: Duration = Duration::from_secs(120);

/// While alive, every append to the store at `path` commits and then stalls, as if the
/// acknowledgement were lost on its way: the caller's deadline fires with an
/// indeterminate error although the batch landed (rule 4). Dropping the guard releases the
/// stalled appends.
pub struct WriteStall {
    path: PathBuf,
}

impl Drop for WriteStall {
    fn drop(&mut self) {
        let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = stalled.iter().position(|p| *p == self.path) {
            stalled.swap_remove(i);
        }
        ANY_STALLED.store(!stalled.is_empty(), Ordering::Release);
        WOKEN.notify_all();
    }
}

pub fn stall_writes(path: &Path) -> Result<WriteStall> {
    let path = std::fs::canonicalize(path).map_err(|e| Error::backend("sqlite", "stall", None, Written::Nothing, e))?;
    let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
    stalled.push(path.clone());
    ANY_STALLED.store(true, Ordering::Release);
    Ok(WriteStall { path })
}

/// Called by an append after its commit: waits while the store is stalled.
pub(crate) fn after_commit(path: &Path) {
    if !ANY_STALLED.load(Ordering::Acquire) {
        return;
    }
    let Ok(path) = std::fs::canonicalize(path) else { return };
    let until = Instant::now() + MOST_STALL;
    let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
    while stalled.contains(&path) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        stalled = WOKEN
            .wait_timeout(stalled, until - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
