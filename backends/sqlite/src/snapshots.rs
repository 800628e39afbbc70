//! Projection snapshots (rule 17) in the store file: a `snapshots` table of the newest
//! [`KEEP`] snapshots, and the store's identity in `ctxlog_meta` (`store_id`), made with the
//! first snapshot. Both are created on first use, so stores from before them open unchanged.
//!
//! SQLite's projector needs no cursor beyond the index's own per-shard positions: a
//! catch-up reads each shard's rows past its position (one range of the covering index),
//! and the shard and session tables whole (they are small).

use std::path::{Path, PathBuf};

use ctxlog_core::backend::snapshot::{KEEP, read_in_parts, read_parts};
use ctxlog_core::{Result, StoreOptions, Written};
use rusqlite::{Connection, OptionalExtension, params};

use crate::conn::{Access, Conn, sql_error};

const TABLE: &str = "CREATE TABLE IF NOT EXISTS snapshots (
    snapshot_no INTEGER PRIMARY KEY,
    bytes       BLOB NOT NULL
)";

/// The store's identity, read through `reader`; with `create`, made now (through a writing
/// connection of its own) if the store has none.
pub(crate) async fn identity(
    reader: &Conn,
    path: &Path,
    options: &StoreOptions,
    create: bool,
) -> Result<Option<String>> {
    let writer;
    let conn = if create {
        writer = open(path, options, Access::Write).await?;
        &writer
    } else {
        reader
    };
    conn.run("read the store identity", None, Written::Nothing, move |c| {
        let err = |e| sql_error("read the store identity", None, Written::Nothing, e);
        if create {
            // A concurrent creator's id wins if it was first: INSERT OR IGNORE, then read.
            c.execute(
                "INSERT OR IGNORE INTO ctxlog_meta (key, value) VALUES ('store_id', ?1)",
                [uuid::Uuid::new_v4().to_string()],
            )
            .map_err(err)?;
        }
        c.query_row("SELECT value FROM ctxlog_meta WHERE key = 'store_id'", [], |r| r.get(0))
            .optional()
            .map_err(err)
    })
    .await
}

/// The stored snapshots' numbers, newest first.
pub(crate) async fn names(conn: &Conn) -> Result<Vec<String>> {
    conn.run("list snapshots", None, Written::Nothing, |c| {
        let err = |e| sql_error("list snapshots", None, Written::Nothing, e);
        if !has_table(c).map_err(err)? {
            return Ok(Vec::new());
        }
        let mut stmt = c
            .prepare("SELECT snapshot_no FROM snapshots ORDER BY snapshot_no DESC")
            .map_err(err)?;
        let numbers = stmt
            .query_map([], |r| r.get::<_, i64>(0))
            .map_err(err)?
            .collect::<rusqlite::Result<Vec<i64>>>()
            .map_err(err)?;
        Ok(numbers.into_iter().map(|n| n.to_string()).collect())
    })
    .await
}

/// The bytes of snapshot number `name`, if it is still stored.
pub(crate) async fn read(conn: &Conn, name: &str) -> Result<Option<Vec<u8>>> {
    let Ok(no) = name.parse::<i64>() else { return Ok(None) };
    conn.run("read a snapshot", None, Written::Nothing, move |c| {
        let err = |e| sql_error("read a snapshot", None, Written::Nothing, e);
        if !has_table(c).map_err(err)? {
            return Ok(None);
        }
        let Some(len) = c
            .query_row(
                "SELECT length(bytes) FROM snapshots WHERE snapshot_no = ?1",
                [no],
                |r| r.get::<_, usize>(0),
            )
            .optional()
            .map_err(err)?
        else {
            return Ok(None);
        };
        // Straight into the buffer the index will keep (incremental blob I/O: a plain column
        // read copies tens of megabytes twice), in parts read at once, each through a
        // connection of its own (`read_in_parts` says why). Each open blob holds a read
        // transaction of its own connection; a snapshot's row never changes once written
        // (a newer one is a new row), and the checksum would refuse a mix of two anyway.
        let path = c.path().filter(|p| !p.is_empty()).map(std::path::PathBuf::from);
        let deadline = crate::conn::call_deadline();
        let mut others = Vec::new();
        for _ in 1..read_parts(len) {
            match &path {
                Some(p) => others.push(crate::conn::read_only(p).map_err(err)?),
                None => break,
            }
        }
        let readers: Vec<&mut Connection> = std::iter::once(c).chain(others.iter_mut()).collect();
        let bytes = read_in_parts(len, readers, |conn, offset, part| {
            let mut read = || {
                let blob = conn.blob_open(rusqlite::MAIN_DB, "snapshots", "bytes", no, true)?;
                if blob.len() != len {
                    return Err(rusqlite::Error::BlobSizeError);
                }
                blob.read_at_exact(part, offset as usize)
            };
            // A reader on a thread of its own stops at the call's deadline too.
            match deadline {
                Some(d) if crate::conn::call_deadline().is_none() => crate::conn::within(d, read),
                _ => read(),
            }
        })
        .map_err(err)?;
        Ok(Some(bytes))
    })
    .await
}

pub(crate) fn has_table(c: &Connection) -> rusqlite::Result<bool> {
    c.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'",
        [],
        |r| r.get(0),
    )
}

/// Store a snapshot and keep only the newest [`KEEP`], in one write transaction.
pub(crate) async fn put(path: &Path, options: &StoreOptions, bytes: Vec<u8>) -> Result<()> {
    let conn = open(path, options, Access::Write).await?;
    conn.run("save a snapshot", None, Written::Unknown, move |c| {
        let err = |e| sql_error("save a snapshot", None, Written::Nothing, e);
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        tx.execute(TABLE, []).map_err(err)?;
        tx.execute("INSERT INTO snapshots (bytes) VALUES (?1)", [&bytes])
            .map_err(err)?;
        tx.execute(
            "DELETE FROM snapshots WHERE snapshot_no NOT IN
                 (SELECT snapshot_no FROM snapshots ORDER BY snapshot_no DESC LIMIT ?1)",
            params![KEEP as i64],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    })
    .await
}

async fn open(path: &Path, options: &StoreOptions, access: Access) -> Result<Conn> {
    let path: PathBuf = path.to_path_buf();
    let deadline = tokio::time::Instant::now() + options.timeout;
    Conn::open_by(&path, access, options.timeout, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A snapshot large enough to be read in parts comes back byte for byte (each part
    /// from its own offset), and one that is gone reads as none.
    #[tokio::test]
    async fn a_large_snapshot_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let options = StoreOptions::default();
        drop(crate::SqliteStore::open(&path, options.clone()).await.unwrap());
        let bytes = ctxlog_core::testing::large_snapshot_bytes();
        put(&path, &options, bytes.clone()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let conn = Conn::open_by(&path, Access::Read, options.timeout, deadline)
            .await
            .unwrap();
        let names = names(&conn).await.unwrap();
        assert_eq!(names.len(), 1);
        let read_back = read(&conn, &names[0]).await.unwrap().expect("the snapshot is stored");
        assert!(read_back == bytes, "the snapshot read back differs");
        assert_eq!(read(&conn, "999").await.unwrap(), None);
    }
}
