//! The four traits every backend implements.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::hlc::{Hlc, PhysicalClock, SystemClock};
use crate::projection::{Conflict, Projection, ProjectionStats};
use crate::types::{AppendAck, Checkpoint, Entry, Epoch, Record, SessionSummary, ShardId, ShardInfo, WriterId};
use crate::validate::Limits;

/// How a store is opened. Every field has a sensible default.
#[derive(Clone)]
pub struct StoreOptions {
    /// Create the store when it does not exist (safe when many processes race, rule 12).
    pub create_if_missing: bool,
    /// Deadline of every single operation (an append, a claim, a refresh, a close).
    pub timeout: Duration,
    pub limits: Limits,
    /// The physical time source of writers' hybrid logical clocks.
    pub clock: Arc<dyn PhysicalClock>,
    /// Backend-specific settings (object-store credentials, endpoints, ...).
    pub storage_options: Vec<(String, String)>,
}

/// Storage option values are credentials more often than not: never print them.
impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.storage_options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("StoreOptions")
            .field("create_if_missing", &self.create_if_missing)
            .field("timeout", &self.timeout)
            .field("limits", &self.limits)
            .field("clock", &self.clock)
            .field("storage_options (values redacted)", &keys)
            .finish()
    }
}

impl StoreOptions {
    /// The longest deadline an operation may have: one day.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
    /// The shortest: one millisecond.
    pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

    /// Check the options before a store is opened with them.
    pub fn validate(&self) -> Result<()> {
        if !(Self::MIN_TIMEOUT..=Self::MAX_TIMEOUT).contains(&self.timeout) {
            return Err(crate::Error::invalid(
                "timeout",
                None,
                format!(
                    "{:?} is outside the allowed range {:?} to {:?}",
                    self.timeout,
                    Self::MIN_TIMEOUT,
                    Self::MAX_TIMEOUT
                ),
            ));
        }
        Ok(())
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            create_if_missing: true,
            timeout: Duration::from_secs(60),
            limits: Limits::default(),
            clock: Arc::new(SystemClock),
            storage_options: Vec::new(),
        }
    }
}

/// Bounds of one compaction pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompactOptions {
    /// Most flushed generations folded into the base table in one pass.
    pub max_generations: usize,
    /// Most bytes of flushed generations folded in one pass.
    pub max_bytes: u64,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            max_generations: 16,
            max_bytes: 256 * 1024 * 1024,
        }
    }
}

/// What a compaction pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactReport {
    /// Generations folded into the base table by this pass.
    pub generations_merged: u64,
    /// Entries folded.
    pub entries_merged: u64,
    /// Generations still waiting (run again to fold them).
    pub generations_remaining: u64,
    /// Free text for backends with nothing to fold (e.g. a SQLite WAL checkpoint).
    pub note: String,
}

/// What a refresh read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefreshReport {
    /// Entries the backend read from storage for this refresh.
    pub entries_read: u64,
    /// Entries new to the projection (the rest were already applied).
    pub new_entries: u64,
    /// True for the first scan.
    pub first_scan: bool,
}

/// A store: one log made of many shards.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"sqlite"`, `"lance"`.
    fn backend(&self) -> &'static str;

    fn options(&self) -> &StoreOptions;

    /// Claim the shard of `writer` with a new epoch, fencing any previous holder (rule 3),
    /// and recover its next seq and HLC.
    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>>;

    /// Every shard of the store, sorted by shard id.
    async fn shards(&self) -> Result<Vec<ShardInfo>>;

    /// Entries of one shard with seq greater than `after_seq`, of every epoch, ordered by
    /// `(seq, epoch)`; at most `limit` of them.
    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>>;

    /// A projector that starts with a first scan.
    fn projector(&self) -> Box<dyn Projector>;

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery>;

    /// Fold what readers would otherwise merge at read time into the base storage,
    /// bounded by `options`; never fences a live writer.
    async fn compact(&self, options: &CompactOptions) -> Result<CompactReport>;
}

/// A claimed, writable shard. Long-lived: one per writer per process.
#[async_trait]
pub trait Shard: Send + Sync {
    fn shard_id(&self) -> ShardId;

    fn writer(&self) -> &WriterId;

    /// The epoch this handle claimed.
    fn epoch(&self) -> Epoch;

    /// Move this writer's clock past `hlc` (something it has read), so that its next
    /// entries order after it (rule 8). A value more than a day ahead of this machine's clock
    /// is refused with `InvalidInput { field: "hlc" }` and moves nothing.
    fn observe(&mut self, hlc: Hlc) -> Result<()>;

    /// Append a batch, atomically and durably: Ok means every entry survives a crash
    /// (rules 1, 2). Validates the whole batch before writing (rule 11).
    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck>;

    /// Release the shard. Never hangs, also when fenced.
    async fn close(self: Box<Self>) -> Result<()>;
}

/// The deterministic view over all shards.
#[async_trait]
pub trait Projector: Send + Sync {
    /// Catch up with the store: the first call scans everything, later calls read only
    /// entries past the checkpoint.
    async fn refresh(&mut self) -> Result<RefreshReport>;

    /// Live records of a session in contract order, with bodies (rule 8).
    async fn session(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>>;

    /// The live winner of `id`, if any.
    async fn get(&mut self, id: &str) -> Result<Option<Entry>>;

    /// Sessions of a bot with live records.
    async fn sessions(&mut self, bot_id: &str) -> Result<Vec<SessionSummary>>;

    fn stats(&self) -> ProjectionStats;

    fn checkpoint(&self) -> Checkpoint;

    /// The canonical projection (rule 9).
    fn projection(&self) -> Projection;

    /// The highest HLC seen, for writers that must order after what they read.
    fn max_hlc(&self) -> Hlc;
}

/// The history checker.
#[async_trait]
pub trait ConflictDiscovery: Send + Sync {
    /// Every conflict in the log, in canonical order; with `after`, only those involving an
    /// entry past that checkpoint.
    async fn conflicts(&mut self, after: Option<&Checkpoint>) -> Result<Vec<Conflict>>;
}
