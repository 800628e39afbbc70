//! Reclaim (`gc`, rule 15) and purge (rule 16) on SQLite.
//!
//! SQLite keeps no old versions a reader could still need beyond its own WAL snapshots, and
//! it protects those itself, so the grace period has nothing to hold back here. What grows
//! is the WAL file (until a checkpoint can restart it) and the free pages of deleted or
//! shrunk rows. Every connection that writes has `secure_delete` on (see `conn.rs`), so a
//! freed byte is a zero byte; gc returns free pages to the file system (stores are created
//! with incremental auto-vacuum) and truncates the WAL once no reader uses it.

use std::path::Path;

use rusqlite::Connection;

use ctxlog_core::{GcOptions, GcReport, PurgeOptions, PurgeReport, Result, Written};

use crate::conn::{is_busy, sql_error, without_waiting};

/// Rows updated per write transaction of a purge: a writer waits at most for one of these.
const PURGE_ROWS_PER_TRANSACTION: usize = 256;

/// Bytes of the store file and its WAL.
fn file_bytes(path: &Path) -> u64 {
    let wal = path.with_file_name(format!(
        "{}-wal",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
    ));
    [path, wal.as_path()]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn pragma_u64(c: &Connection, name: &str) -> rusqlite::Result<u64> {
    c.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
        .map(|v| v as u64)
}

/// Copy every committed page into the database file without waiting for anyone (PASSIVE),
/// then, if no reader still uses the WAL, truncate it to zero bytes. True when truncated.
///
/// The truncation takes the write lock for as long as it takes to cut a file whose every
/// frame is already copied: a writer that arrives meanwhile waits that long, never fails.
/// With the busy handler off, a reader holding the WAL makes it give up at once.
fn checkpoint_and_truncate(c: &Connection) -> rusqlite::Result<bool> {
    c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
    let truncated = without_waiting(c, |c| {
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0))
    })?;
    match truncated {
        Ok(busy) => Ok(busy == 0),
        Err(e) if is_busy(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One gc pass (see the module docs).
pub(crate) fn gc(c: &mut Connection, path: &Path, options: &GcOptions) -> Result<GcReport> {
    let sql = |e| sql_error("gc", None, Written::Nothing, e);
    let bytes_before = file_bytes(path);
    c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
        .map_err(sql)?;
    let incremental = pragma_u64(c, "auto_vacuum").map_err(sql)? == 2;
    let free_before = pragma_u64(c, "freelist_count").map_err(sql)?;
    if incremental && free_before > 0 {
        // Bounded: each page moved is a short write under the write lock.
        let pages = free_before.min(options.max_objects.max(1));
        // SQLite returns one page per step of this pragma: step it to the end (a single
        // step, as `execute_batch` gives, returned one page per pass).
        let mut stmt = c.prepare(&format!("PRAGMA incremental_vacuum({pages})")).map_err(sql)?;
        let mut rows = stmt.query([]).map_err(sql)?;
        while rows.next().map_err(sql)?.is_some() {}
    }
    let free_after = pragma_u64(c, "freelist_count").map_err(sql)?;
    let truncated = checkpoint_and_truncate(c).map_err(sql)?;
    let bytes_after = file_bytes(path);
    let mut note = format!(
        "sqlite: {} free pages returned to the file system; WAL {}",
        free_before - free_after,
        if truncated {
            "truncated"
        } else {
            "in use by a reader (run again)"
        }
    );
    if !incremental && free_after > 0 {
        note.push_str(&format!(
            "; {free_after} free pages stay: this store was created without incremental \
             auto-vacuum, and only a VACUUM (which blocks writers) returns them"
        ));
    }
    Ok(GcReport::default()
        .with_objects_deleted(free_before - free_after)
        .with_bytes_reclaimed(bytes_before.saturating_sub(bytes_after))
        .with_objects_pending(free_after + u64::from(!truncated))
        .with_note(note))
}

/// A record's namespace (its bot, or `""` for the whole store) and id.
type RecordKey = (String, String);

/// Ids that have a tombstone and entries whose body or metadata is still stored, each with
/// the rowids of those entries, sorted by namespace and id. An id is one record in its
/// namespace (rule 6): its bot in a store of format 3, so that a tombstone erases its own
/// bot's record and never another bot's of the same id; the whole store before. One read,
/// no lock held.
fn pending(c: &Connection, scope: ctxlog_core::IdScope) -> rusqlite::Result<Vec<(RecordKey, Vec<i64>)>> {
    let namespace = match scope {
        ctxlog_core::IdScope::Bot => "s.bot_id",
        ctxlog_core::IdScope::Store => "''",
    };
    let mut stmt = c.prepare(&format!(
        "SELECT {ns}, e.id, e.rowid FROM entries e JOIN sessions s ON s.session_no = e.session_no
         WHERE ({ns}, e.id) IN (SELECT {tns}, t.id FROM entries t JOIN sessions ts ON ts.session_no = t.session_no
                                WHERE t.kind = 1)
           AND (e.body_text IS NOT NULL OR e.body_bytes IS NOT NULL OR e.metadata IS NOT NULL)
         ORDER BY 1, e.id, e.rowid",
        ns = namespace,
        tns = namespace.replace("s.", "ts."),
    ))?;
    let mut out: Vec<(RecordKey, Vec<i64>)> = Vec::new();
    let rows = stmt.query_map([], |r| {
        Ok(((r.get::<_, String>(0)?, r.get::<_, String>(1)?), r.get::<_, i64>(2)?))
    })?;
    for row in rows {
        let (key, rowid) = row?;
        match out.last_mut() {
            Some((last, rowids)) if *last == key => rowids.push(rowid),
            _ => out.push((key, vec![rowid])),
        }
    }
    Ok(out)
}

/// One purge pass: erase the body and metadata of every entry of up to `max_ids` tombstoned
/// ids, in short write transactions, then checkpoint and truncate the WAL so that no frame
/// keeps an erased byte.
pub(crate) fn purge(c: &mut Connection, path: &std::path::Path, options: &PurgeOptions) -> Result<PurgeReport> {
    let scope = crate::schema::format_number(c)
        .map(ctxlog_core::IdScope::of_format)
        .map_err(|e| crate::conn::format_error(e, "purge", None, path))?;
    let pending = pending(c, scope).map_err(|e| sql_error("purge", None, Written::Nothing, e))?;
    let take = usize::try_from(options.max_ids)
        .unwrap_or(usize::MAX)
        .min(pending.len());
    let rowids: Vec<i64> = pending[..take].iter().flat_map(|(_, r)| r.iter().copied()).collect();
    let mut erased = 0u64;
    for chunk in rowids.chunks(PURGE_ROWS_PER_TRANSACTION) {
        // An error after the first chunk leaves some ids erased: a purge is idempotent, and
        // the next pass finishes the rest.
        let written = if erased == 0 {
            Written::Nothing
        } else {
            Written::Unknown
        };
        let sql = |e| sql_error("purge", None, written, e);
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        {
            let mut update = tx
                .prepare_cached(
                    "UPDATE entries SET body_text = NULL, body_bytes = NULL, metadata = NULL WHERE rowid = ?1",
                )
                .map_err(sql)?;
            for rowid in chunk {
                erased += update.execute([rowid]).map_err(sql)? as u64;
            }
        }
        tx.commit().map_err(sql)?;
    }
    let truncated = checkpoint_and_truncate(c).map_err(|e| sql_error("purge", None, Written::Unknown, e))?;
    Ok(PurgeReport::default()
        .with_ids_purged(take as u64)
        .with_entries_purged(erased)
        .with_ids_remaining((pending.len() - take) as u64)
        .with_erased(truncated)
        .with_note(if truncated {
            "sqlite: rows erased (freed bytes zeroed), WAL truncated"
        } else {
            "sqlite: rows erased (freed bytes zeroed); the WAL is in use by a reader and still holds \
             older frames: run `gc` again"
        }))
}
