//! A claimed shard: epoch-checked, one transaction per append, on the shared writer state.

use std::collections::HashMap;

use async_trait::async_trait;
use ctxlog_core::backend::HlcClock;
use ctxlog_core::backend::failpoint;
use ctxlog_core::backend::writer::{InFlight, WriterState};
use ctxlog_core::{AppendAck, Epoch, Error, Hlc, Record, Result, Shard, ShardId, StoreOptions, WriterId, Written};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::conn::{Conn, sql_error};
use crate::schema::{EntryRow, INSERT_ENTRY, insert_entry};

pub(crate) struct SqliteShard {
    conn: Conn,
    /// The store file (for the test-only commit stall).
    path: std::path::PathBuf,
    state: WriterState,
    shard_no: i64,
    /// Session rows are never deleted, so their numbers can be cached once committed.
    sessions: Sessions,
}

impl SqliteShard {
    /// Claim the shard with a new epoch and recover its last seq and HLC.
    pub(crate) async fn claim(
        conn: Conn,
        path: std::path::PathBuf,
        writer: WriterId,
        options: &StoreOptions,
        deadline: tokio::time::Instant,
        held: Option<Epoch>,
    ) -> Result<Self> {
        let shard = writer.shard_id();
        let w = writer.clone();
        // A claim that misses its deadline may still commit (and fence the incumbent).
        let claimed = conn
            .run_by(deadline, "open shard", Some(shard), Written::Unknown, move |c| {
                claim(c, shard, &w, held)
            })
            .await?;
        let clock = HlcClock::new(options.clock.clone(), Hlc::ZERO);
        Ok(SqliteShard {
            conn,
            path,
            state: WriterState::new(
                writer,
                claimed.epoch,
                clock,
                options.limits.clone(),
                claimed.last_seq,
                claimed.max_hlc,
            ),
            shard_no: claimed.shard_no,
            sessions: HashMap::new(),
        })
    }
}

/// What a claim read back.
struct Claimed {
    shard_no: i64,
    epoch: Epoch,
    last_seq: u64,
    max_hlc: Hlc,
}

/// Take the next epoch; with `held`, only while the shard's epoch is still `held` (checked
/// in the claim's own transaction, so no claim can come between). Everything before COMMIT
/// is definite (rolled back on failure).
fn claim(c: &mut Connection, shard: ShardId, writer: &WriterId, held: Option<Epoch>) -> Result<Claimed> {
    let before = |e| sql_error("open shard", Some(shard), Written::Nothing, e);
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(before)?;
    tx.execute(
        "INSERT INTO shards (shard, writer, epoch, last_seq, max_hlc) VALUES (?1, ?2, 0, 0, 0)
         ON CONFLICT (shard) DO NOTHING",
        params![&shard.as_bytes()[..], writer.as_str()],
    )
    .map_err(before)?;
    if let Some(held) = held {
        let current: i64 = tx
            .query_row(
                "SELECT epoch FROM shards WHERE shard = ?1",
                params![&shard.as_bytes()[..]],
                |r| r.get(0),
            )
            .map_err(before)?;
        if u64::try_from(current).ok() != Some(held) {
            // Rolled back on drop: nothing claimed.
            return Err(Error::Fenced {
                shard,
                writer: writer.to_string(),
                epoch: held,
                current: u64::try_from(current).ok(),
                written: Written::Nothing,
            });
        }
    }
    let (shard_no, epoch, last_seq, max_hlc): (i64, i64, i64, i64) = tx
        .query_row(
            "UPDATE shards SET epoch = epoch + 1, writer = ?2 WHERE shard = ?1
             RETURNING shard_no, epoch, last_seq, max_hlc",
            params![&shard.as_bytes()[..], writer.as_str()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .map_err(before)?;
    let (Ok(epoch), Ok(last_seq)) = (u64::try_from(epoch), u64::try_from(last_seq)) else {
        return Err(Error::Corrupt {
            shard: Some(shard),
            what: format!("the shard row holds epoch {epoch} and last seq {last_seq}"),
        });
    };
    tx.commit()
        .map_err(|e| sql_error("open shard", Some(shard), Written::Unknown, e))?;
    Ok(Claimed {
        shard_no,
        epoch,
        last_seq,
        // HLCs are stored as the bits of a u64 in SQLite's i64.
        max_hlc: Hlc(max_hlc as u64),
    })
}

/// Where an append has committed and not yet answered (a lost acknowledgement, in tests).
pub(crate) const AFTER_COMMIT: &str = "sqlite.append.after_commit";

/// The scope of a store's failpoints: its file's canonical path.
pub(crate) fn failpoint_scope(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

#[async_trait]
impl Shard for SqliteShard {
    ctxlog_core::shard_methods_from_writer_state!();

    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck> {
        let staged = self.state.stage(records)?;
        let tx = AppendTx {
            path: self.path.clone(),
            shard: self.state.shard(),
            shard_no: self.shard_no,
            epoch: self.state.epoch(),
            writer: self.state.writer().to_string(),
            sessions: self.sessions.clone(),
        };
        let (path, shard) = (self.path.clone(), self.state.shard());
        let in_flight = self.state.begin(staged);
        let outcome = self
            .conn
            .run("append", Some(tx.shard), Written::Unknown, move |c| {
                let (staged, sessions) = tx.run(c, in_flight)?;
                // Committed: a test may hold the answer here, as if it were lost.
                failpoint::hit_blocking(AFTER_COMMIT, || failpoint_scope(&path)).map_err(|s| {
                    Error::backend(
                        "sqlite",
                        "append",
                        Some(shard),
                        Written::Unknown,
                        format!("stopped at {}", s.point),
                    )
                })?;
                Ok((staged, sessions))
            })
            .await;
        let outcome = outcome.map(|(staged, sessions)| {
            self.sessions = sessions;
            staged
        });
        self.state.settle(outcome)
    }

    /// Every acknowledged append is already committed: nothing to flush. Close says
    /// whether the handle had been fenced meanwhile, as on every backend.
    async fn close(mut self: Box<Self>) -> Result<()> {
        let poisoned = self.state.is_poisoned();
        self.state.mark_closed();
        if poisoned {
            return Ok(());
        }
        let (shard, shard_no) = (self.state.shard(), self.shard_no);
        let current: i64 = self
            .conn
            .run("close", Some(shard), Written::Nothing, move |c| {
                c.query_row("SELECT epoch FROM shards WHERE shard_no = ?1", [shard_no], |r| r.get(0))
                    .map_err(|e| sql_error("close", Some(shard), Written::Nothing, e))
            })
            .await?;
        if current != self.state.epoch() as i64 {
            return Err(self.state.fenced(u64::try_from(current).ok(), Written::Nothing));
        }
        Ok(())
    }
}

/// Session numbers by (bot, session), cached per handle.
type Sessions = HashMap<(String, String), i64>;

/// One append's transaction: everything it needs, movable to the blocking pool.
struct AppendTx {
    /// The store file, for errors.
    path: std::path::PathBuf,
    shard: ShardId,
    shard_no: i64,
    epoch: Epoch,
    writer: String,
    sessions: Sessions,
}

impl AppendTx {
    /// Write the staged batch in one transaction that first checks the epoch (rule 3) and
    /// that the shard is where this handle left it. Everything before COMMIT is definite.
    fn run(mut self, c: &mut Connection, staged: InFlight) -> Result<(InFlight, Sessions)> {
        let shard = self.shard;
        let before = |e: rusqlite::Error| sql_error("append", Some(shard), Written::Nothing, e);
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(before)?;
        let (current, last_seq): (i64, i64) = tx
            .query_row(
                "SELECT epoch, last_seq FROM shards WHERE shard_no = ?1",
                [self.shard_no],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(before)?;
        if current != self.epoch as i64 {
            // A newer claim exists: nothing of this batch is written (rule 3).
            return Err(Error::Fenced {
                shard,
                writer: self.writer,
                epoch: self.epoch,
                current: u64::try_from(current).ok(),
                written: Written::Nothing,
            });
        }
        if last_seq != staged.first_seq() as i64 - 1 {
            return Err(Error::Corrupt {
                shard: Some(shard),
                what: format!(
                    "the shard's last seq is {last_seq}, but this handle (epoch {}) continues after {}",
                    self.epoch,
                    staged.first_seq() - 1
                ),
            });
        }
        // The store's format, in this transaction: a store another release moved on is
        // never written (rule 22). The first summary, link or embedding needs the format that
        // holds it: upgraded here, so the batch and the format number land together or not
        // at all.
        let needs = staged.needs_format();
        let upgraded = match needs {
            1 => crate::schema::format_in(&tx).map(|_| ()),
            2 => crate::schema::upgrade(&tx, crate::schema::SUMMARIES),
            to => crate::schema::upgrade_scoped(&tx, to),
        };
        upgraded.map_err(|e| crate::conn::format_error(e, "append", Some(shard), &self.path))?;
        let mut new_sessions = Vec::new();
        {
            let mut insert = tx.prepare_cached(INSERT_ENTRY).map_err(before)?;
            for e in &staged.entries {
                let r = &e.record;
                let key = (r.bot_id.clone(), r.session_id.clone());
                let session_no = match self.sessions.get(&key) {
                    Some(n) => *n,
                    None => {
                        let n = session_no(&tx, &r.bot_id, &r.session_id).map_err(before)?;
                        new_sessions.push((key, n));
                        n
                    }
                };
                let row = EntryRow {
                    shard_no: self.shard_no,
                    seq: e.seq,
                    epoch: self.epoch,
                    hlc: e.hlc,
                    session_no,
                    hash: &e.hash,
                    record: r,
                };
                insert_entry(&mut insert, row).map_err(before)?;
            }
        }
        let last_hlc = staged.entries.last().map_or(Hlc::ZERO, |e| e.hlc);
        tx.execute(
            "UPDATE shards SET last_seq = ?2, max_hlc = ?3 WHERE shard_no = ?1",
            params![self.shard_no, staged.last_seq() as i64, last_hlc.0 as i64],
        )
        .map_err(before)?;
        // From here the outcome is unknown until COMMIT answers.
        tx.commit()
            .map_err(|e| sql_error("append", Some(shard), Written::Unknown, e))?;
        self.sessions.extend(new_sessions);
        Ok((staged, self.sessions))
    }
}

fn session_no(tx: &rusqlite::Transaction<'_>, bot_id: &str, session_id: &str) -> rusqlite::Result<i64> {
    let found = tx
        .prepare_cached("SELECT session_no FROM sessions WHERE bot_id = ?1 AND session_id = ?2")?
        .query_row([bot_id, session_id], |r| r.get(0))
        .optional()?;
    if let Some(n) = found {
        return Ok(n);
    }
    tx.prepare_cached("INSERT INTO sessions (bot_id, session_id) VALUES (?1, ?2) RETURNING session_no")?
        .query_row([bot_id, session_id], |r| r.get(0))
}
