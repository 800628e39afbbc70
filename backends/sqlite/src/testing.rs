//! Fault injection for the conformance suite: store an entry exactly as given, bypassing
//! the epoch check, seq assignment and hashing, to prove that the history checker finds
//! what a broken writer or a damaged file would leave behind. Not for production use.

use std::path::Path;

use ctxlog_core::{Entry, Error, Result, Written};
use rusqlite::{Connection, OptionalExtension, params};

use crate::schema::{EntryRow, INSERT_ENTRY, insert_entry};
/// Store an entry exactly as given, bypassing every check (what a broken writer or a damaged
/// file leaves behind). An entry with `purged` set is stored without a body (both body
/// columns NULL), as purge leaves one — or as damage may, on an id without a tombstone; its
/// metadata as given.
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
    {
        let mut insert = tx.prepare(INSERT_ENTRY).map_err(err)?;
        let row = EntryRow {
            shard_no,
            seq: e.seq,
            epoch: e.epoch,
            hlc: e.hlc,
            session_no,
            hash: &e.content_hash,
            record: &e.record,
        };
        insert_entry(&mut insert, row).map_err(err)?;
    }
    if e.purged {
        tx.execute(
            "UPDATE entries SET body_text = NULL, body_bytes = NULL WHERE shard_no = ?1 AND seq = ?2 AND epoch = ?3",
            params![shard_no, e.seq as i64, e.epoch as i64],
        )
        .map_err(err)?;
    }
    tx.commit().map_err(err)
}

/// While the guard lives, every append to the store at `path` commits and then stalls, as
/// if the acknowledgement were lost on its way: the caller's deadline fires with an
/// indeterminate error although the batch landed (rule 4). Dropping the guard releases the
/// stalled appends (the failpoint `sqlite.append.after_commit`).
pub fn stall_writes(path: &Path) -> Result<ctxlog_core::backend::failpoint::Armed> {
    Ok(ctxlog_core::backend::failpoint::arm(
        crate::shard::AFTER_COMMIT,
        crate::shard::failpoint_scope(path),
        ctxlog_core::backend::failpoint::Action::Pause,
    ))
}

/// Raw access to the projection snapshots stored in the store file at `path`, for tests
/// that damage them as a disk or an operator might: `f` changes each one's bytes, which are
/// written back; returns them as they were, newest first.
pub fn tamper_with_snapshots(path: &Path, mut f: impl FnMut(&mut Vec<u8>)) -> Result<Vec<Vec<u8>>> {
    let err = |e| crate::conn::sql_error("tamper with snapshots", None, Written::Unknown, e);
    let mut c = Connection::open(path).map_err(err)?;
    let tx = c.transaction().map_err(err)?;
    let mut before = Vec::new();
    {
        if !crate::snapshots::has_table(&tx).map_err(err)? {
            return Ok(before);
        }
        let mut stmt = tx
            .prepare("SELECT snapshot_no, bytes FROM snapshots ORDER BY snapshot_no DESC")
            .map_err(err)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
            .map_err(err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(err)?;
        for (no, mut bytes) in rows {
            before.push(bytes.clone());
            f(&mut bytes);
            tx.execute(
                "UPDATE snapshots SET bytes = ?1 WHERE snapshot_no = ?2",
                params![bytes, no],
            )
            .map_err(err)?;
        }
    }
    tx.commit().map_err(err)?;
    Ok(before)
}
