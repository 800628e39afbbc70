//! A claimed shard: epoch-checked, one transaction per append.

use std::collections::HashMap;

use async_trait::async_trait;
use ctxlog_core::canonical::canonical_json;
use ctxlog_core::{
    AppendAck, Body, ContentHash, Epoch, Error, Hlc, HlcClock, Limits, Record, Result, Shard, ShardId, StoreOptions,
    WriterId, Written,
};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::conn::{Conn, sql_error};

pub(crate) struct SqliteShard {
    conn: Conn,
    /// The store file (for the test-only commit stall).
    path: std::path::PathBuf,
    writer: WriterId,
    shard: ShardId,
    shard_no: i64,
    epoch: Epoch,
    clock: HlcClock,
    limits: Limits,
    /// Session rows are never deleted, so their numbers can be cached once committed.
    sessions: HashMap<(String, String), i64>,
    /// Set by an indeterminate error: the caller must reopen (rule 4).
    poisoned: bool,
}

impl SqliteShard {
    /// Claim the shard with a new epoch and recover its last seq and HLC.
    pub(crate) async fn claim(
        conn: Conn,
        path: std::path::PathBuf,
        writer: WriterId,
        options: &StoreOptions,
        deadline: tokio::time::Instant,
    ) -> Result<Self> {
        let shard = writer.shard_id();
        let w = writer.clone();
        // A claim that misses its deadline may still commit (and fence the incumbent).
        let (shard_no, epoch, max_hlc) = conn
            .run_by(deadline, "open shard", Some(shard), Written::Unknown, move |c| {
                claim(c, shard, &w)
            })
            .await?;
        let mut clock = HlcClock::new(options.clock.clone(), Hlc::ZERO);
        clock.resume_after(Hlc(max_hlc));
        Ok(SqliteShard {
            conn,
            path,
            writer,
            shard,
            shard_no,
            epoch,
            clock,
            limits: options.limits.clone(),
            sessions: HashMap::new(),
            poisoned: false,
        })
    }
}

/// Take the next epoch. Everything before COMMIT is definite (rolled back on failure).
fn claim(c: &mut Connection, shard: ShardId, writer: &WriterId) -> Result<(i64, Epoch, u64)> {
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
    let row = tx
        .query_row(
            "UPDATE shards SET epoch = epoch + 1, writer = ?2 WHERE shard = ?1
             RETURNING shard_no, epoch, max_hlc",
            params![&shard.as_bytes()[..], writer.as_str()],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)),
        )
        .map_err(before)?;
    let (shard_no, epoch, max_hlc) = row;
    if epoch < 1 {
        return Err(Error::Corrupt {
            shard: Some(shard),
            what: format!("the shard row holds epoch {epoch}"),
        });
    }
    tx.commit()
        .map_err(|e| sql_error("open shard", Some(shard), Written::Unknown, e))?;
    // HLCs are stored as the bits of a u64 in SQLite's i64.
    Ok((shard_no, epoch as u64, max_hlc as u64))
}

/// One row ready to insert: everything computed before the transaction starts.
struct Prepared {
    record: Record,
    hash: ContentHash,
    metadata: Option<String>,
}

#[async_trait]
impl Shard for SqliteShard {
    fn shard_id(&self) -> ShardId {
        self.shard
    }

    fn writer(&self) -> &WriterId {
        &self.writer
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn observe(&mut self, hlc: Hlc) -> Result<()> {
        self.clock.observe(hlc)
    }

    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck> {
        if self.poisoned {
            return Err(Error::Poisoned { shard: self.shard });
        }
        self.limits.validate_batch(&records)?;
        let prepared: Vec<Prepared> = records
            .into_iter()
            .map(|record| Prepared {
                hash: record.content_hash(),
                metadata: record.metadata.as_ref().map(canonical_json),
                record,
            })
            .collect();
        let (shard, shard_no, epoch, writer) = (self.shard, self.shard_no, self.epoch, self.writer.to_string());
        let mut clock = self.clock.clone();
        let mut sessions = self.sessions.clone();
        let path = self.path.clone();
        let result = self
            .conn
            .run("append", Some(shard), Written::Unknown, move |c| {
                let ack = append_tx(c, shard, shard_no, epoch, &writer, &mut clock, &mut sessions, prepared)?;
                crate::testing::after_commit(&path);
                Ok((ack, clock, sessions))
            })
            .await;
        match result {
            Ok((ack, clock, sessions)) => {
                self.clock = clock;
                self.sessions = sessions;
                Ok(ack)
            }
            Err(e) => {
                if !e.is_definite() {
                    self.poisoned = true;
                }
                Err(e)
            }
        }
    }

    /// Every acknowledged append is already committed: nothing to flush. Close says
    /// whether the handle had been fenced meanwhile, as on every backend.
    async fn close(self: Box<Self>) -> Result<()> {
        if self.poisoned {
            return Ok(());
        }
        let (shard, shard_no, epoch, writer) = (self.shard, self.shard_no, self.epoch, self.writer.to_string());
        let current: i64 = self
            .conn
            .run("close", Some(shard), Written::Nothing, move |c| {
                c.query_row("SELECT epoch FROM shards WHERE shard_no = ?1", [shard_no], |r| r.get(0))
                    .map_err(|e| sql_error("close", Some(shard), Written::Nothing, e))
            })
            .await?;
        if current as u64 != epoch {
            return Err(Error::Fenced {
                shard,
                writer,
                epoch,
                current: Some(current as u64),
                written: Written::Nothing,
            });
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn append_tx(
    c: &mut Connection,
    shard: ShardId,
    shard_no: i64,
    epoch: Epoch,
    writer: &str,
    clock: &mut HlcClock,
    sessions: &mut HashMap<(String, String), i64>,
    batch: Vec<Prepared>,
) -> Result<AppendAck> {
    // Everything before COMMIT is definite: a failure rolls the transaction back.
    let before = |e: rusqlite::Error| sql_error("append", Some(shard), Written::Nothing, e);
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(before)?;
    let (current, last_seq, max_hlc): (i64, i64, i64) = tx
        .query_row(
            "SELECT epoch, last_seq, max_hlc FROM shards WHERE shard_no = ?1",
            [shard_no],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(before)?;
    if current != epoch as i64 {
        // A newer claim exists: nothing of this batch is written (rule 3).
        return Err(Error::Fenced {
            shard,
            writer: writer.to_string(),
            epoch,
            current: u64::try_from(current).ok(),
            written: Written::Nothing,
        });
    }
    let Ok(last_seq) = u64::try_from(last_seq) else {
        return Err(Error::Corrupt {
            shard: Some(shard),
            what: format!("the shard row holds last seq {last_seq}"),
        });
    };
    // HLCs are stored as the bits of a u64 in SQLite's i64.
    let max_hlc = max_hlc as u64;
    // The shard's own highest HLC (another handle of this writer may have written since
    // this one read it): the next entries follow it whatever it is.
    clock.resume_after(Hlc(max_hlc));
    let first_seq = last_seq + 1;
    let mut seq = last_seq;
    let mut first_hlc = Hlc::ZERO;
    let mut last_hlc = Hlc::ZERO;
    let mut ids = Vec::with_capacity(batch.len());
    let mut new_sessions = Vec::new();
    {
        let mut insert = tx.prepare_cached(crate::conn::INSERT_ENTRY).map_err(before)?;
        for p in batch {
            let r = &p.record;
            let key = (r.bot_id.clone(), r.session_id.clone());
            let session_no = match sessions.get(&key) {
                Some(n) => *n,
                None => {
                    let n = session_no(&tx, &r.bot_id, &r.session_id).map_err(before)?;
                    new_sessions.push((key, n));
                    n
                }
            };
            seq = seq
                .checked_add(1)
                .filter(|s| *s <= i64::MAX as u64)
                .ok_or_else(|| Error::Corrupt {
                    shard: Some(shard),
                    what: format!("the shard's last seq {last_seq} leaves no room for this batch"),
                })?;
            let hlc = clock.tick().map_err(|e| match e {
                Error::Corrupt { what, .. } => Error::Corrupt {
                    shard: Some(shard),
                    what,
                },
                other => other,
            })?;
            if first_hlc == Hlc::ZERO {
                first_hlc = hlc;
            }
            last_hlc = hlc;
            let (text, bytes) = match &r.body {
                Body::Text(t) => (Some(t.as_str()), None),
                Body::Bytes(b) => (None, Some(b.as_slice())),
            };
            insert
                .execute(params![
                    shard_no,
                    seq as i64,
                    epoch as i64,
                    hlc.0 as i64,
                    r.kind.as_u8(),
                    session_no,
                    &p.hash.0[..],
                    r.id,
                    r.role,
                    r.content_type,
                    text,
                    bytes,
                    p.metadata,
                    r.created_at.and_then(|t| t.timestamp_nanos_opt()),
                ])
                .map_err(before)?;
            ids.push(p.record.id);
        }
    }
    tx.execute(
        "UPDATE shards SET last_seq = ?2, max_hlc = ?3 WHERE shard_no = ?1",
        params![shard_no, seq as i64, last_hlc.0 as i64],
    )
    .map_err(before)?;
    // From here the outcome is unknown until COMMIT answers.
    tx.commit()
        .map_err(|e| sql_error("append", Some(shard), Written::Unknown, e))?;
    sessions.extend(new_sessions);
    Ok(AppendAck {
        shard,
        epoch,
        first_seq,
        last_seq: seq,
        first_hlc,
        last_hlc,
        ids,
    })
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
