//! ctxlog over SQLite: the embedded default backend.
//!
//! One file in WAL journal mode. `shards` holds each shard's writer, epoch, last seq and
//! highest HLC; `entries` holds every entry, with a covering index over exactly the columns
//! the projection reads. A claim is a short `BEGIN IMMEDIATE` that bumps the epoch; every
//! append re-checks its epoch inside its own transaction, so a fenced handle fails with a
//! definite `Fenced` and nothing of it is written. Many processes may write one file.

#![warn(missing_docs)]

mod conn;
mod read;
mod reclaim;
mod schema;
mod shard;
mod snapshots;
#[cfg(feature = "testing")]
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use ctxlog_core::backend::history::HistoryConflicts;
use ctxlog_core::backend::projector::IndexedProjector;
use ctxlog_core::{
    CompactOptions, CompactReport, ConflictDiscovery, Entry, Epoch, Error, GcOptions, GcReport, Projector,
    PurgeOptions, PurgeReport, Result, Shard, ShardId, ShardInfo, Store, StoreOptions, WriterId, Written,
};

use crate::conn::{Access, BACKEND, Conn, sql_error};
use crate::read::{SqliteHistory, SqliteIndex, read_shard};

/// The newest store format this build writes (the `format` row of `ctxlog_meta`): 3, record
/// ids scoped by bot. A store is created at format 3; one of format 1 moves to 2 in the
/// transaction of the first summary written to it, and one of format 1 or 2 to 3 only by
/// `ctxlog upgrade` (rule 22); a file of any format this build does not read is refused,
/// naming both. Benchmarks key the stores they generate on it.
pub const FORMAT: &str = schema::FORMAT;

/// Every store format this build opens.
pub const READS_FORMATS: [&str; 5] = schema::READS;

/// The schema this build creates. A change of it that [`FORMAT`] does not mark (a
/// compatible one, another index) still changes what a generated benchmark store holds, so
/// benchmarks key their stores on this text as well.
#[doc(hidden)]
pub const SCHEMA_SQL: &str = schema::SCHEMA;

/// A ctxlog store in one SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    options: StoreOptions,
    /// A read-only connection for store-level reads (`shards`, `read_shard`).
    conn: Conn,
}

impl SqliteStore {
    /// Open the store at `path`, creating it when `options.create_if_missing` and nothing
    /// (or an empty file) is there. A file that is not a ctxlog store is refused with
    /// [`ctxlog_core::Error::NotAStore`] and left exactly as it was.
    pub async fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        let path = path.as_ref().to_path_buf();
        let deadline = tokio::time::Instant::now() + options.timeout;
        if options.create_if_missing {
            Conn::open_by(&path, Access::Create, options.timeout, deadline).await?;
        }
        let conn = Conn::open_by(&path, Access::Read, options.timeout, deadline).await?;
        Ok(SqliteStore { path, options, conn })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How shard handles open their connection.
    fn write_access(&self) -> Access {
        if self.options.create_if_missing {
            Access::Create
        } else {
            Access::Write
        }
    }
}

/// Whether the regular file at `path` is a SQLite database, as SQLite itself answers through
/// a read-only connection. The file is never opened any other way: a plain `open` and
/// `close` of a store file drops every POSIX lock this process holds on it (SQLite's too),
/// which lets another process delete the WAL this one is writing. A blocking call.
pub fn is_sqlite_database(path: &Path) -> bool {
    conn::is_database(path)
}

/// Copy the store at `src` into a new file `dst` (which must not exist): one consistent
/// snapshot through SQLite's online backup API, read through a read-only connection. Writers
/// may go on (and checkpoint) meanwhile; the copy is never torn, and `src` is never written.
/// Returns the pages copied. A blocking call: bounded by `timeout`.
pub fn copy_store(src: &Path, dst: &Path, timeout: std::time::Duration) -> Result<u64> {
    let deadline = std::time::Instant::now() + timeout;
    let io = |e: std::io::Error| ctxlog_core::Error::backend(BACKEND, "copy", None, Written::Nothing, e);
    let sql = |e: rusqlite::Error| sql_error("copy", None, Written::Nothing, e);
    let source = Conn::open(src, Access::Read, timeout, deadline)?;
    if std::fs::symlink_metadata(dst).is_ok() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists: a copy never overwrites", dst.display()),
        )));
    }
    let mut target = rusqlite::Connection::open(dst).map_err(sql)?;
    conn::within(deadline, || {
        source.with(|from| {
            let backup = rusqlite::backup::Backup::new(from, &mut target).map_err(sql)?;
            loop {
                // All pages in one step: one read transaction, one snapshot.
                match backup.step(-1).map_err(sql)? {
                    rusqlite::backup::StepResult::Done => return Ok(backup.progress().pagecount as u64),
                    // Locked for a moment (a checkpoint, a writer's lock on the target).
                    _ if conn::pause(std::time::Duration::from_millis(5)) => continue,
                    _ => {
                        return Err(ctxlog_core::Error::Timeout {
                            op: "copy",
                            after: timeout,
                            shard: None,
                            written: Written::Nothing,
                        });
                    }
                }
            }
        })
    })
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
        let conn = Conn::open_by(&self.path, self.write_access(), self.options.timeout, deadline).await?;
        let shard =
            shard::SqliteShard::claim(conn, self.path.clone(), writer.clone(), &self.options, deadline, None).await?;
        Ok(Box::new(shard))
    }

    async fn reopen_shard(&self, writer: &WriterId, held: Epoch) -> Result<Box<dyn Shard>> {
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = Conn::open_by(&self.path, self.write_access(), self.options.timeout, deadline).await?;
        let shard = shard::SqliteShard::claim(
            conn,
            self.path.clone(),
            writer.clone(),
            &self.options,
            deadline,
            Some(held),
        )
        .await?;
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

    async fn format(&self) -> Result<u32> {
        let path = self.path.clone();
        self.conn
            .run("read the store format", None, Written::Nothing, move |c| {
                schema::format_number(c).map_err(|e| conn::format_error(e, "read the store format", None, &path))
            })
            .await
    }

    async fn set_format(&self, from: u32, to: u32) -> Result<()> {
        if to < from || !schema::READS.contains(&to.to_string().as_str()) {
            return Err(Error::invalid(
                "format",
                None,
                format!("cannot move format {from} to {to}"),
            ));
        }
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = Conn::open_by(&self.path, Access::Write, self.options.timeout, deadline).await?;
        let path = self.path.clone();
        let now = conn
            .run_by(deadline, "upgrade", None, Written::Unknown, move |c| {
                schema::set_format(c, from, to).map_err(|e| conn::format_error(e, "upgrade", None, &path))
            })
            .await?;
        match now {
            None => Ok(()),
            Some(now) => Err(Error::invalid(
                "format",
                None,
                format!("the store is at format {now} now, not {from}: another process moved it"),
            )),
        }
    }

    fn projector(&self) -> Box<dyn Projector> {
        Box::new(IndexedProjector::new(Arc::new(SqliteIndex::new(
            self.path.clone(),
            self.options.clone(),
        ))))
    }

    /// Files beside the store file, in `<store>.ctxlog-search/` (a saved index of a large
    /// store is larger than a SQLite value may be, and would hold the write lock while
    /// written).
    fn saved_indexes(&self) -> Option<Arc<dyn ctxlog_core::search::saved::SavedIndexes>> {
        let mut dir = self.path.clone().into_os_string();
        dir.push(".ctxlog-search");
        let identity = Arc::new(SqliteIndex::new(self.path.clone(), self.options.clone()));
        Some(Arc::new(ctxlog_core::search::saved::DirIndexes::new(
            PathBuf::from(dir),
            "sqlite",
            identity,
            self.options.clock.clone(),
        )))
    }

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery> {
        let index = SqliteIndex::new(self.path.clone(), self.options.clone());
        Box::new(HistoryConflicts::new(
            Arc::new(SqliteHistory::beside(&index)),
            Arc::new(index),
        ))
    }

    /// SQLite has nothing to fold: a compaction copies the WAL file's committed pages back
    /// into the database file. PASSIVE checkpoints only: they never take the write lock and
    /// never wait for a reader, so no writer or reader is ever blocked (rule 14). Pages a
    /// reader still needs stay in the WAL; the pass retries briefly, then reports them.
    async fn compact(&self, _options: &CompactOptions) -> Result<CompactReport> {
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = Conn::open_by(&self.path, Access::Write, self.options.timeout, deadline).await?;
        conn.run_by(deadline, "compact", None, Written::Nothing, |c| {
            let mut step = std::time::Duration::from_millis(2);
            let (mut log, mut done) = (0i64, 0i64);
            for _ in 0..8 {
                (log, done) = c
                    .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| Ok((r.get(1)?, r.get(2)?)))
                    .map_err(|e| sql_error("compact", None, Written::Nothing, e))?;
                if done >= log || !conn::pause(step) {
                    break;
                }
                step = (step * 2).min(std::time::Duration::from_millis(100));
            }
            let note = if done >= log {
                format!("sqlite WAL checkpoint: all {log} pages copied into the database file")
            } else {
                format!("sqlite WAL checkpoint: {done} of {log} pages copied; readers still use the rest (run again)")
            };
            Ok(CompactReport::default().with_note(note))
        })
        .await
    }

    /// Free pages back to the file system (bounded), the WAL truncated when no reader uses
    /// it. See `reclaim.rs`.
    async fn gc(&self, options: &GcOptions) -> Result<GcReport> {
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = Conn::open_by(&self.path, Access::Write, self.options.timeout, deadline).await?;
        let (path, options) = (self.path.clone(), options.clone());
        let report = conn
            .run_by(deadline, "gc", None, Written::Unknown, move |c| {
                reclaim::gc(c, &path, &options)
            })
            .await?;
        // Saved search indexes begun before the last purge (a save that died half-way).
        if let Some(saved) = self.saved_indexes() {
            let sweep = ctxlog_core::search::saved::sweep(&*saved);
            ctxlog_core::backend::with_deadline("gc", self.options.timeout, None, Written::Unknown, sweep).await?;
        }
        Ok(report)
    }

    /// Bodies and metadata of tombstoned ids erased in place, freed bytes zeroed, the WAL
    /// truncated when no reader uses it. See `reclaim.rs`.
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let deadline = tokio::time::Instant::now() + self.options.timeout;
        let conn = Conn::open_by(&self.path, Access::Write, self.options.timeout, deadline).await?;
        let (path, options) = (self.path.clone(), options.clone());
        let erase = conn.run_by(deadline, "purge", None, Written::Unknown, move |c| {
            reclaim::purge(c, &path, &options)
        });
        let purge = ctxlog_core::search::saved::around_purge(self.saved_indexes(), "sqlite", erase);
        ctxlog_core::backend::with_deadline("purge", self.options.timeout * 2, None, Written::Unknown, purge).await
    }
}
