//! One writer's shard: a long-lived MemWAL `ShardWriter`, fenced by epoch, under deadlines.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use ctxlog_core::{
    AppendAck, Epoch, Error, Hlc, HlcClock, Limits, Record, Result, Shard, ShardId, WriterId, Written, with_deadline,
};
use lance::dataset::mem_wal::{DatasetMemWalExt, ShardManifestStore, ShardWriter, ShardWriterConfig, WalTailer};
use lance_core::FenceReason;
use lance_io::object_store::ObjectStore;
use object_store::path::Path;

use crate::Inner;
use crate::error::lance_err;
use crate::read;
use crate::schema::{Stamped, to_batch};

/// How a writer sizes its memtables. A memtable becomes a flushed generation when it
/// reaches any limit, and on close. Smaller memtables mean shorter WAL tails for readers
/// and more generations for `compact` to fold. Keep these fixed for a store: MemWAL
/// refuses to replay a WAL written under larger limits.
#[derive(Clone, Debug)]
pub struct WriterTuning {
    pub max_memtable_rows: usize,
    pub max_memtable_batches: usize,
    pub max_memtable_bytes: usize,
    /// Backstop for the WAL flush ticker; every durable put also triggers its own flush.
    pub wal_flush_interval: Duration,
}

impl Default for WriterTuning {
    fn default() -> Self {
        WriterTuning {
            // Must admit the largest batch (Limits::max_batch_records).
            max_memtable_rows: 25_000,
            max_memtable_batches: 1_000,
            max_memtable_bytes: 64 * 1024 * 1024,
            wal_flush_interval: Duration::from_millis(500),
        }
    }
}

pub(crate) struct LanceShard {
    inner: Arc<Inner>,
    writer_id: WriterId,
    shard: ShardId,
    epoch: Epoch,
    writer: Option<Arc<ShardWriter>>,
    store: Arc<ObjectStore>,
    base_path: Path,
    last_seq: u64,
    clock: HlcClock,
    limits: Limits,
    poisoned: bool,
    /// A successor claimed the shard; every append fails fast.
    fenced_by: Option<Option<Epoch>>,
}

impl LanceShard {
    pub(crate) async fn open(inner: Arc<Inner>, writer_id: WriterId) -> Result<Self> {
        let shard = writer_id.shard_id();
        // A claim that misses its deadline may still land (and fence the incumbent).
        with_deadline("open shard", inner.timeout(), Some(shard), Written::Unknown, async {
            let mut ds = inner.latest().await?;
            crate::ensure_mem_wal(&mut ds).await?;
            let (store, base_path) = inner.io(&ds).await?;
            read::remember_writer(&store, &base_path, shard, &writer_id).await?;
            let manifests = ShardManifestStore::new(store.clone(), &base_path, shard.0, 2);
            let epoch_before = current_epoch(&manifests, shard).await?;
            let t = &inner.tuning;
            if inner.options.limits.max_batch_records > t.max_memtable_rows {
                return Err(Error::invalid(
                    "limits.max_batch_records",
                    None,
                    format!(
                        "{} exceeds the Lance writer's max_memtable_rows ({}): a batch must fit one memtable",
                        inner.options.limits.max_batch_records, t.max_memtable_rows
                    ),
                ));
            }
            let config = ShardWriterConfig::new(shard.0)
                .with_durable_write(true)
                // A buffer of one byte: every put starts its own WAL flush instead of
                // waiting for the ticker. Concurrent puts still share one entry.
                .with_max_wal_buffer_size(1)
                .with_max_wal_flush_interval(t.wal_flush_interval)
                .with_max_memtable_rows(t.max_memtable_rows)
                .with_max_memtable_batches(t.max_memtable_batches)
                .with_max_memtable_size(t.max_memtable_bytes);
            let writer = match ds.mem_wal_writer(shard.0, config).await {
                Ok(w) => Arc::new(w),
                Err(e) => {
                    // Lance does not say which epoch this open claimed, if any, so classify by
                    // what is proven. A failed claim against a concurrent opener of the same
                    // writer id is an I/O error in Lance, as is a lost answer to our own claim.
                    let now = current_epoch(&manifests, shard).await.ok();
                    return Err(match (e.fence_reason(), now) {
                        // Proven: Lance saw a successor's epoch past ours during replay.
                        (Some(FenceReason::PeerClaimedEpoch), now) => Error::Fenced {
                            shard,
                            writer: writer_id.to_string(),
                            epoch: epoch_before + 1,
                            current: now,
                            written: Written::Nothing,
                        },
                        // No claim landed at all: nothing changed.
                        (_, Some(now)) if now == epoch_before => {
                            lance_err("open shard", Some(shard), Written::Nothing, e)
                        }
                        // A claim landed — ours or a peer's, unknown — and may have fenced the
                        // incumbent: indeterminate. Reopening is always safe.
                        _ => lance_err("open shard", Some(shard), Written::Unknown, e),
                    });
                }
            };
            inner.register_writer(&writer);
            // The handle owns the writer from here: if anything below fails, or the
            // deadline drops this future, its `Drop` stops the writer's tasks.
            let mut handle = LanceShard {
                clock: HlcClock::new(inner.options.clock.clone(), Hlc::ZERO),
                limits: inner.options.limits.clone(),
                inner: inner.clone(),
                writer_id,
                shard,
                epoch: writer.epoch(),
                writer: Some(writer.clone()),
                store,
                base_path,
                last_seq: 0,
                poisoned: false,
                fenced_by: None,
            };
            // Seqs and HLCs are ctxlog's: recover them from what the shard holds.
            let recovered = read::recover(&inner, shard).await?;
            handle.last_seq = recovered.last_seq;
            handle.clock.resume_after(Hlc(recovered.max_hlc));
            Ok(handle)
        })
        .await
    }

    fn fenced(&self, current: Option<Epoch>, written: Written) -> Error {
        Error::Fenced {
            shard: self.shard,
            writer: self.writer_id.to_string(),
            epoch: self.epoch,
            current,
            written,
        }
    }

    /// After a peer fence hit a put that was already in the memtable: did its WAL entry
    /// land? `Some(false)` only with proof: the successor's fence sentinel sits after our
    /// last entry, so no entry of ours can land any more. `None` when it cannot tell.
    async fn landed(&self, first_seq: u64) -> Result<Option<bool>> {
        let err = |e| lance_err("check a fenced append", Some(self.shard), Written::Unknown, e);
        let tailer = WalTailer::new(self.store.clone(), self.base_path.clone(), self.shard.0);
        let mut pos = tailer.next_position().await.map_err(err)?;
        let mut successor_sentinel = false;
        while pos > 1 {
            pos -= 1;
            let Some(entry) = tailer.read_entry(pos).await.map_err(err)? else {
                continue;
            };
            if entry.writer_epoch > self.epoch {
                successor_sentinel |= entry.batches.is_empty();
                continue;
            }
            if entry.writer_epoch == self.epoch && !entry.batches.is_empty() {
                // Our newest entry: our appends are sequential, so ours is this one or none.
                let mut max_seq = 0;
                for b in &entry.batches {
                    let cols = crate::schema::Columns::new(b)?;
                    for i in 0..cols.len() {
                        max_seq = max_seq.max(cols.seq(i));
                    }
                }
                if max_seq >= first_seq {
                    return Ok(Some(true));
                }
            }
            // Our newest entry does not hold the batch (or we wrote none since our claim).
            return Ok(successor_sentinel.then_some(false));
        }
        Ok(successor_sentinel.then_some(false))
    }
}

async fn current_epoch(manifests: &ShardManifestStore, shard: ShardId) -> Result<Epoch> {
    Ok(manifests
        .latest()
        .await
        .map_err(|e| lance_err("read the shard manifest", Some(shard), Written::Nothing, e))?
        .map_or(0, |m| m.writer_epoch))
}

/// Stop a writer's background tasks without flushing (everything acknowledged is in the
/// WAL already), bounded by the deadline.
async fn abort_quietly(writer: &ShardWriter, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, writer.abort()).await;
}

#[async_trait]
impl Shard for LanceShard {
    fn shard_id(&self) -> ShardId {
        self.shard
    }

    fn writer(&self) -> &WriterId {
        &self.writer_id
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
        if let Some(current) = self.fenced_by {
            return Err(self.fenced(current, Written::Nothing));
        }
        let Some(writer) = self.writer.clone() else {
            return Err(Error::Closed { shard: self.shard });
        };
        self.limits.validate_batch(&records)?;
        let mut clock = self.clock.clone();
        let first_seq = self.last_seq + 1;
        let shard = self.shard;
        let stamped: Vec<Stamped<'_>> = records
            .iter()
            .enumerate()
            .map(|(i, record)| {
                let hlc = clock.tick().map_err(|e| match e {
                    Error::Corrupt { what, .. } => Error::Corrupt {
                        shard: Some(shard),
                        what,
                    },
                    other => other,
                })?;
                Ok(Stamped {
                    shard,
                    epoch: self.epoch,
                    seq: first_seq + i as u64,
                    hlc,
                    hash: record.content_hash(),
                    record,
                })
            })
            .collect::<Result<_>>()?;
        let (first_hlc, last_hlc) = (stamped[0].hlc, stamped[stamped.len() - 1].hlc);
        let batch = to_batch(self.writer_id.as_str(), &stamped)?;
        let last_seq = first_seq + records.len() as u64 - 1;

        // From here until an outcome is known, the handle counts as poisoned: if the caller
        // drops this future after the batch reached the memtable, the batch still becomes
        // durable, and the next append must not reuse its seqs.
        self.poisoned = true;
        let deadline = Instant::now() + self.inner.timeout();
        // `inserted` says whether the batch reached the memtable (and so may reach the WAL).
        let put = async {
            let (_, watcher) = writer.put_no_wait(vec![batch]).await.map_err(|e| (e, false))?;
            if let Some(mut watcher) = watcher {
                watcher.wait().await.map_err(|e| (e, true))?;
            }
            Ok::<(), (lance::Error, bool)>(())
        };
        let outcome = match tokio::time::timeout_at(deadline, put).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err((e, inserted))) => match e.fence_reason() {
                Some(FenceReason::PeerClaimedEpoch) => {
                    self.fenced_by = Some(None);
                    if !inserted {
                        Err(self.fenced(None, Written::Nothing))
                    } else {
                        match tokio::time::timeout_at(deadline, self.landed(first_seq)).await {
                            Ok(Ok(Some(true))) => Ok(()), // durable before the successor's claim
                            Ok(Ok(Some(false))) => Err(self.fenced(None, Written::Nothing)),
                            _ => Err(self.fenced(None, Written::Unknown)),
                        }
                    }
                }
                // Our own WAL write failed (or any other failure after the batch reached
                // the memtable): it may have landed. Reopen replays the WAL.
                _ if inserted => Err(lance_err("append", Some(self.shard), Written::Unknown, e)),
                // Refused before the memtable: nothing written. A writer poisoned by its own
                // earlier failure never recovers, though: the handle stays poisoned.
                Some(FenceReason::PersistenceFailure) => {
                    return Err(lance_err("append", Some(self.shard), Written::Nothing, e));
                }
                None if matches!(e.find_root(), lance::Error::InvalidInput { .. }) || e.is_backpressure() => {
                    Err(lance_err("append", Some(self.shard), Written::Nothing, e))
                }
                // `put_no_wait` can also fail after the insert (starting the index apply).
                None => Err(lance_err("append", Some(self.shard), Written::Unknown, e)),
            },
            Err(_) => Err(Error::Timeout {
                op: "append",
                after: self.inner.timeout(),
                shard: Some(self.shard),
                written: Written::Unknown,
            }),
        };
        match outcome {
            Ok(()) => {
                self.poisoned = false;
                self.clock = clock;
                self.last_seq = last_seq;
                Ok(AppendAck {
                    shard: self.shard,
                    epoch: self.epoch,
                    first_seq,
                    last_seq,
                    first_hlc,
                    last_hlc,
                    ids: records.into_iter().map(|r| r.id).collect(),
                })
            }
            Err(e) => {
                // Definite: nothing landed, the seqs are free again.
                self.poisoned = !e.is_definite();
                Err(e)
            }
        }
    }

    /// Flush the memtable into a generation (so readers need not read its WAL tail), then
    /// stop the writer's tasks. Never `ShardWriter::close`, whose flush-drain wait is what
    /// hangs a writer fenced mid-close: both steps share one deadline, and the tasks are
    /// stopped whatever the flush did. The writer stays in the handle until they are, so a
    /// cancelled close still stops them (on drop). A fenced handle's close says so.
    async fn close(mut self: Box<Self>) -> Result<()> {
        let Some(writer) = self.writer.clone() else {
            return Ok(());
        };
        // One deadline for the whole close; the flush leaves a reserve for stopping tasks.
        let timeout = self.inner.timeout();
        let deadline = Instant::now() + timeout;
        let flush_by = deadline - (timeout / 4).min(Duration::from_secs(2));
        let timed_out = |op| Error::Timeout {
            op,
            after: self.inner.timeout(),
            shard: Some(self.shard),
            written: Written::Nothing,
        };
        let flushed = if let Some(current) = self.fenced_by {
            Err(self.fenced(current, Written::Nothing))
        } else if self.poisoned {
            Ok(())
        } else {
            match tokio::time::timeout_at(flush_by, async { writer.force_freeze_active().await?.wait().await }).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) if e.fence_reason() == Some(FenceReason::PeerClaimedEpoch) => {
                    Err(self.fenced(None, Written::Nothing))
                }
                Ok(Err(e)) => Err(lance_err("close", Some(self.shard), Written::Nothing, e)),
                Err(_) => Err(timed_out("close (flush)")),
            }
        };
        // Whatever the flush did, the tasks stop.
        let stopped = match tokio::time::timeout_at(deadline, writer.abort()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(lance_err("close (stop tasks)", Some(self.shard), Written::Nothing, e)),
            Err(_) => Err(timed_out("close (stop tasks)")),
        };
        self.writer = None; // stopped (or given up on): nothing left for Drop to do
        flushed.and(stopped)
    }
}

impl Drop for LanceShard {
    /// A handle dropped without `close` (a poisoned one, a panic): stop its writer's
    /// background tasks, which would otherwise run for the life of the process.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let timeout = self.inner.timeout();
            rt.spawn(async move { abort_quietly(&writer, timeout).await });
        }
    }
}
