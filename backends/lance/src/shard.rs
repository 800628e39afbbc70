//! One writer's shard: a long-lived MemWAL `ShardWriter`, fenced by epoch, under deadlines.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use ctxlog_core::backend::writer::{Staged, WriterState};
use ctxlog_core::backend::{HlcClock, failpoint, with_deadline};
use ctxlog_core::{AppendAck, Epoch, Error, Hlc, Record, Result, Shard, ShardId, WriterId, Written};
use lance::dataset::mem_wal::{DatasetMemWalExt, FreezeFence, ShardWriter, ShardWriterConfig};
use lance_core::FenceReason;
use lance_io::object_store::ObjectStore;
use lance_table::system_index::mem_wal::ShardManifest;
use object_store::path::Path;

use crate::error::lance_err;
use crate::open::ensure_mem_wal;
use crate::schema::{Stamped, to_batch};
use crate::store::Shared;
use crate::wal::read_entry;
use crate::{tiers, writers};

pub(crate) struct LanceShard {
    shared: Arc<Shared>,
    state: WriterState,
    writer: Option<Arc<ShardWriter>>,
    store: Arc<ObjectStore>,
    base_path: Path,
    /// Appends since this handle last froze its memtable (see `WriterTuning::max_wal_tail`).
    since_freeze: u64,
    /// When this handle last read its shard's epoch (see `WriterTuning::fence_check_interval`).
    fence_checked: Instant,
    /// The flushes outstanding at this handle's last freeze (see `LanceShard::flushes_landed`).
    flushing: Option<FreezeFence>,
    /// A wait for them failed: the next append first waits for every flush outstanding.
    flushes_behind: bool,
}

/// Where an open recovers seqs and clocks, after its claim landed (failpoint).
pub(crate) const RECOVER_AFTER_CLAIM: &str = "lance.open.recover_after_claim";

/// Seqs and clocks of `shard`, read after this open's claim landed: only this open knows the
/// epoch it took. Given up on a failed read, its caller would still hold the epoch before
/// (which is no longer the newest), and a reopen from there would find itself fenced by its
/// own claim — a replica fenced with no successor. So the reads (which write nothing) are
/// tried again until they succeed, within the open's deadline (whose miss says the claim may
/// have landed). An error reading again cannot cure (denied, damaged) is returned at once.
async fn recover_after_claim(inner: &Shared, shard: ShardId) -> Result<tiers::Recovered> {
    let mut pause = Duration::from_millis(50);
    loop {
        let read = match failpoint::hit(RECOVER_AFTER_CLAIM, || inner.uri.clone()).await {
            Ok(()) => tiers::recover(inner, shard).await,
            Err(stopped) => Err(Error::Unavailable {
                op: "recover seqs and clocks",
                shard: Some(shard),
                reason: ctxlog_core::Unavailability::Throttled,
                what: format!("stopped at {}", stopped.point),
                written: Written::Nothing,
            }),
        };
        match read {
            Ok(r) => return Ok(r),
            // What reading again may cure: a throttled or unreachable store, a storage error
            // (Lance's, its cause unknown), a read that missed its deadline.
            Err(e @ (Error::Unavailable { .. } | Error::Backend { .. } | Error::Timeout { .. })) => {
                tracing::warn!(%shard, error = %e, "reading seqs and clocks after the claim failed; reading again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            // What it cannot (denied, damaged, not a store): said at once. The claim landed,
            // so the open may have written.
            Err(e) => {
                tracing::warn!(%shard, error = %e, "reading seqs and clocks after the claim failed for good");
                return Err(e);
            }
        }
    }
}

impl LanceShard {
    /// Claim the shard; with `held`, only while its newest claim is `held` (a reopen).
    pub(crate) async fn open(inner: Arc<Shared>, writer_id: WriterId, held: Option<Epoch>) -> Result<Self> {
        let shard = writer_id.shard_id();
        let steps = OpenSteps::new();
        // A claim that misses its deadline may still land (and fence the incumbent).
        let opened = with_deadline("open shard", inner.timeout(), Some(shard), Written::Unknown, async {
            let mut ds = inner.latest().await?;
            ensure_mem_wal(&mut ds).await?;
            let (store, base_path) = inner.io(&ds).await?;
            steps.done("read the dataset");
            let before = latest_manifest(&store, &base_path, shard).await?;
            let epoch_before = before.as_ref().map_or(0, |m| m.writer_epoch);
            steps.tail(before.as_ref().map(|m| (m.replay_after_wal_entry_position, m.wal_entry_position_last_seen)));
            steps.done("read the shard manifest");
            if let Some(held) = held
                && epoch_before != held
            {
                // A successor holds the writer id: claiming would fence it (a claim war).
                return Err(Error::Fenced {
                    shard,
                    writer: writer_id.to_string(),
                    epoch: held,
                    current: Some(epoch_before),
                    written: Written::Nothing,
                });
            }
            writers::remember(&store, &base_path, shard, &writer_id).await?;
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
            steps.done("record the writer id");
            let writer = match ds.mem_wal_writer(shard.0, config).await {
                Ok(w) => Arc::new(w),
                Err(e) => {
                    // Lance does not say which epoch this open claimed, if any, so classify by
                    // what is proven. A failed claim against a concurrent opener of the same
                    // writer id is an I/O error in Lance, as is a lost answer to our own claim.
                    let now = current_epoch(&store, &base_path, shard).await.ok();
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
            if let Some(held) = held
                && writer.epoch() != held + 1
            {
                // Lance claims "newest + 1": a peer claimed between the check above and
                // ours, and ours fenced it. That peer, fenced, never claims again, so the two
                // still converge to this one writer.
                tracing::warn!(%shard, held, claimed = writer.epoch(), "a reopen raced another claim of this writer id");
            }
            steps.done("claim and replay the WAL tail");
            inner.register_writer(&writer);
            let clock = || HlcClock::new(inner.options.clock.clone(), Hlc::ZERO);
            let limits = inner.options.limits.clone();
            // The handle owns the writer from here: if anything below fails, or the
            // deadline drops this future, its `Drop` stops the writer's tasks.
            let mut handle = LanceShard {
                state: WriterState::new(writer_id.clone(), writer.epoch(), clock(), limits.clone(), 0, Hlc::ZERO),
                shared: inner.clone(),
                writer: Some(writer.clone()),
                store,
                base_path,
                since_freeze: 0,
                fence_checked: Instant::now(),
                flushing: None,
                flushes_behind: false,
            };
            // Seqs and HLCs are ctxlog's: recover them from what the shard holds.
            let recovered = recover_after_claim(&inner, shard).await?;
            handle.state = WriterState::new(
                writer_id,
                writer.epoch(),
                clock(),
                limits,
                recovered.last_seq,
                Hlc(recovered.max_hlc),
            );
            steps.done("recover seqs and clocks");
            // The WAL tail this open replayed counts against the handle's budget: writers
            // replaced before they froze (killed, taken over) leave a tail longer than any
            // one of them wrote, and every open replays all of it. Unbounded, it grows until
            // no open fits the deadline and the writer id can never claim again.
            let replayed_from = before.as_ref().map_or(0, |m| m.replay_after_wal_entry_position) + 1;
            // The first append freezes when the tail is long (not the open: a freeze here
            // could cost the open its deadline after its claim landed).
            let tail = writer.wal_stats().next_wal_entry_position.saturating_sub(replayed_from);
            handle.since_freeze = tail.min(t.max_wal_tail.saturating_sub(1));
            Ok(handle)
        })
        .await;
        // Every open says where its time went: a claim that misses its deadline again and
        // again (a long WAL tail to replay on a slow store) is diagnosed from this line.
        match &opened {
            // Slower than half the deadline: the next open may not fit it.
            Ok(h) if steps.took() * 2 > inner.timeout() => {
                tracing::warn!(%shard, epoch = h.state.epoch(), steps = %steps, "claiming the shard took more than half the deadline")
            }
            Ok(h) => tracing::info!(%shard, epoch = h.state.epoch(), steps = %steps, "claimed the shard"),
            Err(e) => tracing::warn!(%shard, steps = %steps, "claiming the shard failed: {e}"),
        }
        opened
    }

    /// After a peer fence hit a put that was already in the memtable: did its WAL entry
    /// land? `Some(false)` only with proof: the successor's fence sentinel sits after our
    /// last entry, so no entry of ours can land any more. `None` when it cannot tell.
    async fn landed(&self, first_seq: u64) -> Result<Option<bool>> {
        let shard = self.state.shard();
        let mut pos = crate::wal::next_wal_position(
            &self.store,
            &self.base_path,
            shard,
            "check a fenced append",
            Written::Unknown,
        )
        .await?;
        let mut successor_sentinel = false;
        while pos > 1 {
            pos -= 1;
            let read = read_entry(
                &self.store,
                &self.base_path,
                shard,
                pos,
                "check a fenced append",
                Written::Unknown,
            );
            let Some(entry) = read.await? else {
                continue;
            };
            if entry.epoch > self.state.epoch() {
                successor_sentinel |= entry.batches.is_empty();
                continue;
            }
            if entry.epoch == self.state.epoch() && !entry.batches.is_empty() {
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

/// The steps of one open and how long each took (see `LanceShard::open`).
struct OpenSteps {
    at: std::sync::Mutex<Steps>,
}

/// When the last step ended, the steps done, and the WAL positions the manifest held.
type Steps = (Instant, Vec<(&'static str, Duration)>, Option<(u64, u64)>);

impl OpenSteps {
    fn new() -> Self {
        Self {
            at: std::sync::Mutex::new((Instant::now(), Vec::new(), None)),
        }
    }

    fn done(&self, step: &'static str) {
        let mut at = self.at.lock().expect("open steps");
        let now = Instant::now();
        let took = now - at.0;
        at.0 = now;
        at.1.push((step, took));
    }

    /// How long the steps done took.
    fn took(&self) -> Duration {
        self.at.lock().expect("open steps").1.iter().map(|(_, d)| *d).sum()
    }

    /// The WAL positions the manifest held before the claim: replay starts after the first.
    fn tail(&self, positions: Option<(u64, u64)>) {
        self.at.lock().expect("open steps").2 = positions;
    }
}

impl std::fmt::Display for OpenSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.at.lock().expect("open steps");
        for (step, took) in &at.1 {
            write!(f, "{step} {:.2} s, ", took.as_secs_f64())?;
        }
        write!(f, "{:.2} s since", at.0.elapsed().as_secs_f64())?;
        if let Some((after, seen)) = at.2 {
            write!(f, " (WAL replay from position {}, last seen {seen})", after + 1)?;
        }
        Ok(())
    }
}

async fn latest_manifest(store: &ObjectStore, base_path: &Path, shard: ShardId) -> Result<Option<ShardManifest>> {
    crate::wal::latest_manifest(store, base_path, shard, "read the shard manifest", Written::Nothing).await
}

async fn current_epoch(store: &ObjectStore, base_path: &Path, shard: ShardId) -> Result<Epoch> {
    Ok(latest_manifest(store, base_path, shard)
        .await?
        .map_or(0, |m| m.writer_epoch))
}

/// Stop a writer's background tasks without flushing (everything acknowledged is in the
/// WAL already), bounded by the deadline.
async fn abort_quietly(writer: &ShardWriter, timeout: Duration) {
    let _ = tokio::time::timeout(timeout, writer.abort()).await;
}

#[async_trait]
impl Shard for LanceShard {
    ctxlog_core::shard_methods_from_writer_state!();

    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck> {
        self.state.check_usable()?;
        let Some(writer) = self.writer.clone() else {
            return Err(Error::Closed {
                shard: self.state.shard(),
            });
        };
        self.check_fence().await?;
        self.flushes_landed(&writer).await?;
        let staged = self.state.stage(records)?;
        // The first summary needs the format that holds summaries (rule 22): recorded
        // before the batch is written, so no summary is ever in a store of format 1.
        if staged
            .entries
            .iter()
            .any(|e| e.record.kind == ctxlog_core::Kind::Summary)
        {
            crate::format::upgrade_for_summaries(&self.shared).await?;
        }
        // The first link or embedding likewise needs the format that holds it (rules 25, 27).
        let needs = staged.needs_format();
        if needs > crate::format::IDS_BY_BOT {
            crate::format::upgrade_scoped(&self.shared, needs).await?;
        }
        // From here until an outcome is known the handle counts as poisoned: if the caller
        // drops this future after the batch reached the memtable, the batch still becomes
        // durable, and the next append must not reuse its seqs.
        let in_flight = self.state.begin(staged);
        let outcome = self.put(&writer, &in_flight).await;
        let writer_dead = matches!(outcome, Err(Refusal::WriterPoisoned(_)));
        let result = self
            .state
            .settle(outcome.map_err(Refusal::into_error).map(|()| in_flight));
        if writer_dead {
            // Refused before the memtable (nothing written), but Lance's writer itself is
            // poisoned by an earlier failure of its own and never recovers: so is the handle.
            self.state.poison();
        }
        if result.is_ok() {
            self.bound_wal_tail(&writer).await;
        }
        result
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
        let shard = self.state.shard();
        // One deadline for the whole close; the flush leaves a reserve for stopping tasks.
        let timeout = self.shared.timeout();
        let deadline = Instant::now() + timeout;
        let flush_by = deadline - (timeout / 4).min(Duration::from_secs(2));
        let timed_out = |op| Error::Timeout {
            op,
            after: timeout,
            shard: Some(shard),
            written: Written::Nothing,
        };
        let flushed = if let Some(current) = self.state.fenced_by() {
            Err(self.state.fenced(current, Written::Nothing))
        } else if self.state.is_poisoned() {
            Ok(())
        } else {
            match tokio::time::timeout_at(flush_by, async { writer.force_freeze_active().await?.wait().await }).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) if e.fence_reason() == Some(FenceReason::PeerClaimedEpoch) => {
                    Err(self.state.fenced(None, Written::Nothing))
                }
                Ok(Err(e)) => Err(lance_err("close", Some(shard), Written::Nothing, e)),
                Err(_) => Err(timed_out("close (flush)")),
            }
        };
        // Whatever the flush did, the tasks stop.
        let stopped = match tokio::time::timeout_at(deadline, writer.abort()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(lance_err("close (stop tasks)", Some(shard), Written::Nothing, e)),
            Err(_) => Err(timed_out("close (stop tasks)")),
        };
        self.writer = None; // stopped (or given up on): nothing left for Drop to do
        self.state.mark_closed();
        flushed.and(stopped)
    }
}

/// Why a put failed, as far as the handle's state is concerned.
enum Refusal {
    /// Any failure, already classified.
    Failed(Error),
    /// Refused before the memtable because Lance's writer is poisoned for good.
    WriterPoisoned(Error),
}

impl Refusal {
    fn into_error(self) -> Error {
        match self {
            Refusal::Failed(e) | Refusal::WriterPoisoned(e) => e,
        }
    }
}

impl LanceShard {
    /// Every `fence_check_interval`, read the shard's epoch: a successor's claim fences
    /// this handle before anything is put. Best effort: if the read fails or is slow, the
    /// append goes on, and the successor's sentinel still fences it at the WAL.
    async fn check_fence(&mut self) -> Result<()> {
        if self.fence_checked.elapsed() < self.shared.tuning.fence_check_interval {
            return Ok(());
        }
        self.fence_checked = Instant::now();
        let shard = self.state.shard();
        let budget = self.shared.timeout() / 4;
        // The store's format with the fence: a store another release moved on is not
        // written (rule 22). Read beside the epoch: one round trip for both.
        let (format, epoch) = tokio::join!(
            tokio::time::timeout(budget, crate::format::check(&self.shared)),
            tokio::time::timeout(budget, current_epoch(&self.store, &self.base_path, shard)),
        );
        match format {
            Ok(Err(e @ Error::NotAStore { .. })) => return Err(e),
            Ok(Err(e)) => tracing::debug!(%shard, error = %e, "reading the store format failed"),
            Ok(Ok(found)) => crate::format::keep_floor(&self.shared, &found).await?,
            Err(_) => {}
        }
        match epoch {
            Ok(Ok(now)) if now > self.state.epoch() => {
                self.state.mark_fenced(Some(now));
                Err(self.state.fenced(Some(now), Written::Nothing))
            }
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                tracing::debug!(%shard, error = %e, "reading the shard epoch failed");
                Ok(())
            }
            Err(_) => {
                tracing::debug!(%shard, "reading the shard epoch timed out");
                Ok(())
            }
        }
    }

    /// Every `max_wal_tail` appends, freeze the memtable: its flush to a generation runs in
    /// the background and moves the shard's replay point (and its published WAL cursor)
    /// past the entries it holds. Best effort and bounded: the batch is already durable,
    /// and a failure here (a fence, say) is for the next append to report.
    async fn bound_wal_tail(&mut self, writer: &ShardWriter) {
        self.since_freeze += 1;
        if self.since_freeze < self.shared.tuning.max_wal_tail {
            return;
        }
        let shard = self.state.shard();
        // Counted from a freeze that happened: one that failed is tried by the next append.
        match tokio::time::timeout(self.shared.timeout(), writer.force_freeze_active()).await {
            Ok(Ok(fence)) => {
                self.since_freeze = 0;
                self.flushing = Some(fence);
            }
            Ok(Err(e)) => tracing::warn!(%shard, error = %e, "freezing the memtable failed"),
            Err(_) => tracing::warn!(%shard, "freezing the memtable timed out"),
        }
    }

    /// Before the append that makes the next freeze due, the flushes of the last one must
    /// have landed (waited for within the deadline), so the WAL tail an open replays is
    /// never more than two memtables' worth, however far the store's flushes fall behind.
    /// Unbounded, a slow replica on a loaded store grew a tail that no successor could
    /// replay within its deadline: its writer id could never claim again. Nothing is
    /// written when the wait fails; the next append waits for every flush outstanding.
    async fn flushes_landed(&mut self, writer: &ShardWriter) -> Result<()> {
        let due = self.since_freeze + 1 >= self.shared.tuning.max_wal_tail;
        if !due && !self.flushes_behind {
            return Ok(());
        }
        let shard = self.state.shard();
        // Half the deadline: the put that follows has its own.
        let timeout = self.shared.timeout() / 2;
        let behind = self.flushes_behind;
        let fence = match (self.flushing.take(), behind) {
            (Some(f), false) => Some(f),
            // A failed wait used its fence up: a freeze now covers every flush still
            // outstanding (and starts one of what the memtable holds).
            (_, true) => None,
            // This handle has frozen nothing yet: nothing of its own is outstanding.
            (None, false) => return Ok(()),
        };
        self.flushes_behind = true;
        let wait = async {
            let fence = match fence {
                Some(f) => f,
                None => writer.force_freeze_active().await?,
            };
            fence.wait().await
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => {
                self.flushes_behind = false;
                if behind {
                    self.since_freeze = 0;
                }
                Ok(())
            }
            Ok(Err(e)) if e.fence_reason() == Some(FenceReason::PeerClaimedEpoch) => {
                self.state.mark_fenced(None);
                Err(self.state.fenced(None, Written::Nothing))
            }
            // A flush that failed for good (its generation may never become one) or a
            // poisoned writer: the handle is unusable; a reopen replays the WAL, which holds
            // every acknowledged batch.
            Ok(Err(e)) => {
                tracing::warn!(%shard, error = %e, "a flush of the shard failed: the handle must be reopened");
                self.state.poison();
                Err(lance_err(
                    "wait for the shard's flushes",
                    Some(shard),
                    Written::Nothing,
                    e,
                ))
            }
            Err(_) => {
                tracing::warn!(%shard, after = ?timeout, "the shard's flushes are behind: an append is refused");
                Err(Error::Timeout {
                    op: "wait for the shard's flushes",
                    after: timeout,
                    shard: Some(shard),
                    written: Written::Nothing,
                })
            }
        }
    }

    /// One durable put of the staged batch, under the deadline, its outcome classified: a
    /// definite error only with proof that nothing can land.
    async fn put(&self, writer: &ShardWriter, staged: &Staged) -> std::result::Result<(), Refusal> {
        let shard = self.state.shard();
        let stamped: Vec<Stamped<'_>> = staged
            .entries
            .iter()
            .map(|e| Stamped {
                shard,
                epoch: self.state.epoch(),
                seq: e.seq,
                hlc: e.hlc,
                hash: e.hash,
                record: &e.record,
            })
            .collect();
        let batch = to_batch(self.state.writer().as_str(), &stamped).map_err(Refusal::Failed)?;
        let first_seq = staged.first_seq();
        let deadline = Instant::now() + self.shared.timeout();
        // `inserted` says whether the batch reached the memtable (and so may reach the WAL).
        let put = async {
            let (_, watcher) = writer.put_no_wait(vec![batch]).await.map_err(|e| (e, false))?;
            if let Some(mut watcher) = watcher {
                watcher.wait().await.map_err(|e| (e, true))?;
            }
            Ok::<(), (lance::Error, bool)>(())
        };
        let fenced = |written| self.state.fenced(None, written);
        match tokio::time::timeout_at(deadline, put).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err((e, inserted))) => Err(match e.fence_reason() {
                Some(FenceReason::PeerClaimedEpoch) if !inserted => Refusal::Failed(fenced(Written::Nothing)),
                Some(FenceReason::PeerClaimedEpoch) => {
                    match tokio::time::timeout_at(deadline, self.landed(first_seq)).await {
                        Ok(Ok(Some(true))) => return Ok(()), // durable before the successor's claim
                        Ok(Ok(Some(false))) => Refusal::Failed(fenced(Written::Nothing)),
                        _ => Refusal::Failed(fenced(Written::Unknown)),
                    }
                }
                // Our own WAL write failed (or any other failure after the batch reached
                // the memtable): it may have landed. Reopen replays the WAL.
                _ if inserted => Refusal::Failed(lance_err("append", Some(shard), Written::Unknown, e)),
                Some(FenceReason::PersistenceFailure) => {
                    Refusal::WriterPoisoned(lance_err("append", Some(shard), Written::Nothing, e))
                }
                None if matches!(e.find_root(), lance::Error::InvalidInput { .. }) || e.is_backpressure() => {
                    Refusal::Failed(lance_err("append", Some(shard), Written::Nothing, e))
                }
                // `put_no_wait` can also fail after the insert (starting the index apply).
                None => Refusal::Failed(lance_err("append", Some(shard), Written::Unknown, e)),
            }),
            Err(_) => Err(Refusal::Failed(Error::Timeout {
                op: "append",
                after: self.shared.timeout(),
                shard: Some(shard),
                written: Written::Unknown,
            })),
        }
    }
}

impl Drop for LanceShard {
    /// A handle dropped without `close` (a poisoned one, a panic): stop its writer's
    /// background tasks, which would otherwise run for the life of the process.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let timeout = self.shared.timeout();
            rt.spawn(async move { abort_quietly(&writer, timeout).await });
        }
    }
}
