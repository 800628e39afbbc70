//! Fault injection for the conformance suite: store an entry exactly as given, bypassing
//! the epoch check, seq assignment and hashing, to prove that the history checker finds
//! what a broken writer or a damaged file would leave behind. Not for production use.

use std::path::Path;

use ctxlog_core::canonical::canonical_json;
use ctxlog_core::{Body, Entry, Error, Result, Written};
use rusqlite::{Connection, OptionalExtension, params};

pub fn inject_raw_entry(path: &Path, e: &Entry) -> Result<()> {
    let err = |e: rusqlite::Error| Error::backend("sqlite", "inject", None, Written::Unknown, e);
    let mut c = Connection::open(path).map_err(err)?;
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
        "INSERT INTO entries (shard_no, seq, epoch, hlc, kind, session_no, content_hash, id, role, content_type,
                              body_text, body_bytes, metadata, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
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

/// Hold SQLite's write lock until the guard drops, so that appends stall past their
/// deadline (an indeterminate outcome, rule 4).
pub struct WriteStall {
    conn: Connection,
}

impl Drop for WriteStall {
    fn drop(&mut self) {
        let _ = self.conn.execute_batch("ROLLBACK");
    }
}

pub fn stall_writes(path: &Path) -> Result<WriteStall> {
    let err = |e: rusqlite::Error| Error::backend("sqlite", "stall", None, Written::Nothing, e);
    let conn = Connection::open(path).map_err(err)?;
    conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
    conn.execute_batch("BEGIN EXCLUSIVE").map_err(err)?;
    Ok(WriteStall { conn })
}
