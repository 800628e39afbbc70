//! ctxlog over SQLite: the embedded default backend.
//!
//! One file in WAL journal mode. `shards` holds each shard's writer, epoch, last seq and
//! highest HLC; `entries` holds every entry, with a covering index over exactly the columns
//! the projection reads. A claim is a short `BEGIN IMMEDIATE` that bumps the epoch; every
//! append re-checks its epoch inside its own transaction, so a fenced handle fails with a
//! definite `Fenced` and nothing of it is written. Many processes may write one file.

mod conn;
mod read;
mod shard;
#[doc(hidden)]
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use ctxlog_core::engine::{IndexedProjector, ScanConflictDiscovery};
use ctxlog_core::{
    CompactOptions, CompactReport, ConflictDiscovery, Entry, Projector, Result, Shard, ShardId, ShardInfo, Store,
    StoreOptions, WriterId, Written,
};

use crate::conn::{BACKEND, Conn, sql_error};
use crate::read::{SqliteHistory, SqliteIndex, read_shard};

/// A ctxlog store in one SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    options: StoreOptions,
    /// For store-level calls (`shards`, `read_shard`, `compact`).
    conn: Conn,
}

impl SqliteStore {
    /// Open the store at `path`, creating it when `options.create_if_missing`.
    pub async fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let conn = open_conn(&path, &options, tokio::time::Instant::now() + options.timeout).await?;
        Ok(SqliteStore { path, options, conn })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Open a connection on the blocking pool, by `deadline`.
async fn open_conn(path: &Path, options: &StoreOptions, deadline: tokio::time::Instant) -> Result<Conn> {
    let (p, create, timeout) = (path.to_path_buf(), options.create_if_missing, options.timeout);
    let task = tokio::task::spawn_blocking(move || Conn::open(&p, create, timeout));
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(join)) => Err(ctxlog_core::Error::backend(
            BACKEND,
            "open",
            None,
            Written::Nothing,
            join,
        )),
        Err(_) => Err(ctxlog_core::Error::Timeout {
            op: "open",
            after: options.timeout,
            shard: None,
            written: Written::Nothing,
        }),
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn options(&self) -> &StoreOptions {
        &self.options
    }

    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>> {
        // Each shard handle owns its connection: appends of different writers in one
        // process do not queue behind one mutex. One deadline for opening and claiming.
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = open_conn(&self.path, &self.options, deadline).await?;
        let shard = shard::SqliteShard::claim(conn, writer.clone(), &self.options, deadline).await?;
        Ok(Box::new(shard))
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        self.conn
            .run("list shards", None, Written::Nothing, |c| {
                read::shards(c).map_err(|e| sql_error("list shards", None, Written::Nothing, e))
            })
            .await
    }

    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
        self.conn
            .run("read shard", Some(shard), Written::Nothing, move |c| {
                read_shard(c, shard, after_seq, limit)
            })
            .await
    }

    fn projector(&self) -> Box<dyn Projector> {
        Box::new(IndexedProjector::new(Arc::new(SqliteIndex::new(
            self.path.clone(),
            self.options.clone(),
        ))))
    }

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery> {
        Box::new(ScanConflictDiscovery::new(Arc::new(SqliteHistory::new(
            self.path.clone(),
            self.options.clone(),
        ))))
    }

    /// SQLite has nothing to fold: a compaction checkpoints and truncates the WAL file.
    async fn compact(&self, _options: &CompactOptions) -> Result<CompactReport> {
        self.conn
            .run("compact", None, Written::Nothing, |c| {
                let (busy, log, done): (i64, i64, i64) = c
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .map_err(|e| sql_error("compact", None, Written::Nothing, e))?;
                Ok(CompactReport {
                    note: format!(
                        "sqlite WAL checkpoint: {done} of {log} pages copied{}",
                        if busy != 0 {
                            " (readers kept it from finishing)"
                        } else {
                            ""
                        }
                    ),
                    ..Default::default()
                })
            })
            .await
    }
}
