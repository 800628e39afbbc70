//! The four traits every backend implements.

use async_trait::async_trait;

use crate::context::ContextView;
use crate::entry::{AppendAck, Checkpoint, Entry, OrderKey, SessionSummary, ShardInfo};
use crate::error::Result;
use crate::hlc::Hlc;
use crate::ids::{Epoch, ShardId, WriterId};
use crate::options::{
    CompactOptions, CompactReport, GcOptions, GcReport, PurgeOptions, PurgeReport, RefreshReport, SnapshotReport,
    StoreOptions,
};
use crate::projection::{Conflict, Projection, ProjectionStats};
use crate::record::Record;

/// A store: one log made of many shards, one shard per writer id.
///
/// # Contract
///
/// The whole contract is in `docs/contract.md`; what each method promises is on the method.
/// Every backend is checked against it by the shared conformance suite.
///
/// - **Safe creation (rule 12).** Many processes opening a missing store with
///   `create_if_missing` at the same moment all succeed and share one store. Only a missing
///   location (or an empty file) is ever created; anything else that is not a ctxlog store
///   is refused with [`Error::NotAStore`](crate::Error::NotAStore) and left exactly as it
///   was. Opening to read never writes to the store.
/// - **No hangs (rule 13).** Every method finishes or fails within
///   [`StoreOptions::timeout`]; a missed deadline is a typed
///   [`Error::Timeout`](crate::Error::Timeout) that says whether anything may have been written.
/// - **Typed errors (rules 4, 5).** Every error says whether it is definite
///   ([`Error::written`](crate::Error::written)) and names the field, shard or location at
///   fault; none shows a storage option's value.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"sqlite"`, `"lance"`, `"reference"`.
    fn backend(&self) -> &'static str;

    /// The options the store was opened with.
    fn options(&self) -> &StoreOptions;

    /// Claim the shard of `writer` and recover its next seq and clock.
    ///
    /// # Contract
    ///
    /// **Fencing (rule 3).** The returned handle's epoch is greater than every earlier epoch
    /// of the shard, and every append through an older handle that starts afterwards fails
    /// with [`Error::Fenced`](crate::Error::Fenced). The new handle continues the shard: its
    /// first seq follows every stored one and its clock follows every stored HLC (rule 8).
    /// A failed open says whether its claim may have landed (and fenced the previous holder).
    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>>;

    /// Claim `writer`'s shard again after this process's handle of epoch `held` failed
    /// indeterminately or was poisoned: like [`Store::open_shard`], but only while the
    /// shard's newest claim is still `held`.
    ///
    /// # Contract
    ///
    /// **A fenced replica never claims back (rules 3, 4).** When the shard's newest claim is
    /// `held`, this claims a new epoch as `open_shard` does (and recovers seqs and clock).
    /// When another handle claimed an epoch past `held` — a successor took the writer id —
    /// it claims nothing and fails with [`Error::Fenced`](crate::Error::Fenced) naming
    /// `held` and, when known, the newer epoch, definite (`written: nothing`). The check
    /// and the claim are one step where the storage allows it (SQLite: one transaction);
    /// where it does not (Lance claims "newest + 1" with a conditional put), a successor
    /// that claims between the two is fenced by this reopen, and, being fenced, never
    /// claims again itself: two processes with one writer id still converge to one writer.
    async fn reopen_shard(&self, writer: &WriterId, held: Epoch) -> Result<Box<dyn Shard>>;

    /// Every shard of the store, sorted by shard id.
    async fn shards(&self) -> Result<Vec<ShardInfo>>;

    /// Entries of one shard with seq greater than `after_seq`, of every epoch, ordered by
    /// `(seq, epoch)`; at most `limit` of them.
    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>>;

    /// The store's format now (rule 22): 1 and 2 group record ids across the whole store, 3
    /// scopes them by bot. A format this build does not read is refused (`NotAStore`).
    async fn format(&self) -> Result<u32>;

    /// Record format `to` in a store of format `from` (`ctxlog upgrade`, through
    /// [`upgrade_ids_by_bot`](crate::upgrade_ids_by_bot)).
    ///
    /// # Contract
    ///
    /// **Formats move up, never silently (rule 22).** A compare-and-set: when the store is no
    /// longer at `from` (another process moved it), nothing is written and the error is
    /// `InvalidInput { field: "format" }`; a marker is never moved down.
    async fn set_format(&self, from: u32, to: u32) -> Result<()>;

    /// A projector that starts with a first scan.
    fn projector(&self) -> Box<dyn Projector>;

    /// A history checker over the whole log.
    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery>;

    /// Where the store keeps saved search indexes (derived data, rule 26), if anywhere: a
    /// cold searcher loads the newest instead of reading the whole log.
    ///
    /// # Contract
    ///
    /// A store that gives one runs its `purge` through `search::saved::around_purge` (every
    /// saved index forgotten before and after erasing) and its `gc` through
    /// `search::saved::sweep`: no saved index outlives a purge.
    fn saved_indexes(&self) -> Option<std::sync::Arc<dyn SavedIndexes>> {
        None
    }

    /// Fold what readers would otherwise merge at read time into the base storage, bounded
    /// by `options`.
    ///
    /// # Contract
    ///
    /// **Maintenance never gets in the way (rule 14).** A pass never fences, blocks or fails
    /// a live writer or reader; an interrupted pass changes nothing a reader can see, and the
    /// next pass converges. No entry is lost or duplicated.
    async fn compact(&self, options: &CompactOptions) -> Result<CompactReport>;

    /// Reclaim storage: delete what compaction folded into the base storage and what no
    /// version a reader may still use refers to, bounded by `options`.
    ///
    /// # Contract
    ///
    /// **Reclaim is invisible (rule 15).** Nothing younger than `options.grace` is deleted.
    /// A pass never fences, blocks or fails a live writer or reader (rule 14); an interrupted
    /// pass leaves a store that reads the same, and the next pass converges. A reader whose
    /// position points into a reclaimed range catches up from the base storage and misses
    /// nothing; a first scan whose objects gc deleted or emptied meanwhile reads again from a
    /// newer version and never answers with part of the log; a writer reopened afterwards keeps its seqs and clock; an append a fenced
    /// writer has not yet had acknowledged can never be acknowledged and then lost.
    async fn gc(&self, options: &GcOptions) -> Result<GcReport>;

    /// Erase the body and metadata of every entry of every tombstoned id, bounded by
    /// `options`.
    ///
    /// # Contract
    ///
    /// **Forget erases (rule 16).** After a purge and a `gc` past its grace period, no copy of
    /// an erased body or metadata is left in the store's storage. What stays is each entry's
    /// header (shard, seq, epoch, hlc, id, bot, session, kind, content hash): seqs stay dense,
    /// the entry reads back with [`Entry::purged`] set, an empty text body and no metadata,
    /// and the history checker reports it as neither corrupt nor missing. The projection and
    /// the conflict list are byte-identical before and after. Ids without a tombstone are
    /// never touched. Like every maintenance pass, it never fences or fails a live writer or
    /// reader (rule 14).
    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport>;
}

/// A claimed, writable shard. Long-lived: one per writer per process, never one per call.
///
/// # Contract
///
/// - **Durable acknowledgement (rule 1).** [`Shard::append`] returning Ok means every entry
///   survives a crash of the writer and is visible to every reader that opens or refreshes
///   afterwards, in any process.
/// - **Atomic batches (rule 2).** An append becomes visible all together or not at all.
/// - **Fencing (rule 3).** Once a newer handle claimed the shard, an append through this one
///   fails with [`Error::Fenced`](crate::Error::Fenced) — definite unless the backend cannot
///   prove it, and then it says so. Neither `append` nor `close` of a fenced handle hangs.
/// - **Poisoning (rule 4).** After an indeterminate error every append fails with
///   [`Error::Poisoned`](crate::Error::Poisoned): reopen the shard and retry with the same
///   record ids (safe by rule 6).
/// - **Bad input (rule 11).** The whole batch is validated against [`Limits`](crate::Limits) before anything
///   is written; the error names the field and the record, and no seq is consumed.
#[async_trait]
pub trait Shard: Send + Sync {
    /// The shard this handle writes.
    fn shard_id(&self) -> ShardId;

    /// The writer id that owns the shard.
    fn writer(&self) -> &WriterId;

    /// The epoch this handle claimed.
    fn epoch(&self) -> Epoch;

    /// Move this writer's clock past `hlc` (something it has read), so that its next
    /// entries order after it.
    ///
    /// # Contract
    ///
    /// **Order (rule 8).** The next entry's HLC is greater than `hlc`. A value more than a day
    /// ahead of this machine's clock is refused with `InvalidInput { field: "hlc" }` and
    /// moves nothing: one damaged entry must not drag every writer into the far future.
    fn observe(&mut self, hlc: Hlc) -> Result<()>;

    /// Append a batch, atomically and durably (rules 1, 2, 3, 4, 11 above). Seqs are dense
    /// from the shard's last one; HLCs strictly increase.
    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck>;

    /// Release the shard. Never hangs, also when fenced; a fenced handle's close says so.
    async fn close(self: Box<Self>) -> Result<()>;
}

/// The deterministic view over all shards.
///
/// # Contract
///
/// - **First writer wins (rule 6).** The live record of an id is its `Put` earliest in the
///   order `(hlc, shard, seq, epoch)`; later puts never replace it.
/// - **Tombstones are final (rule 7).** A tombstone hides its id for good.
/// - **Order (rule 8).** A session lists its live records in the order of their winning
///   entries.
/// - **Determinism (rule 9).** [`Projector::projection`] is a pure function of the set of
///   entries: byte-identical canonical JSON on every backend.
/// - **Durable acknowledgement (rule 1).** A refresh sees every append acknowledged before it
///   started; a failed or abandoned refresh never leaves a partial view behind.
#[async_trait]
pub trait Projector: Send + Sync {
    /// Catch up with the store: the first call scans everything, later calls read only
    /// entries past the checkpoint.
    async fn refresh(&mut self) -> Result<RefreshReport>;

    /// Live records of a session in contract order, with bodies (rule 8).
    async fn session(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>>;

    /// The live record `id` of bot `bot_id`, if any. Ids are scoped by bot (rule 6): another
    /// bot's record of the same id is never returned, and says nothing about this one.
    async fn get(&mut self, bot_id: &str, id: &str) -> Result<Option<Entry>>;

    /// One page of a session's live records in contract order (rule 8): those whose order key
    /// is past `after` (where a previous page ended), at most `limit`, with bodies; and
    /// whether more follow. Reads the bodies of the page only.
    async fn session_page(
        &mut self,
        bot_id: &str,
        session_id: &str,
        after: Option<&OrderKey>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool)>;

    /// The last `n` live records of a session, in contract order (rule 8), with bodies; and
    /// whether older ones precede them. Reads the bodies of those `n` only.
    async fn session_tail(&mut self, bot_id: &str, session_id: &str, n: usize) -> Result<(Vec<Entry>, bool)>;

    /// The context view of a session (rule 21): its governing summary and every live record
    /// that summary does not cover, in contract order, with bodies. Reads the bodies of
    /// those records and of the summaries it considers (latest first, until one is trusted),
    /// never of the records the governing summary covers.
    ///
    /// # Contract
    ///
    /// **Summaries cover what their writer read (rule 21).** The governing summary is the
    /// session's live summary latest in contract order among those that are plausible and
    /// whose every named position this projector holds; a live record it does not cover is
    /// never left out, and the answer is a pure function of the entries held (rule 9).
    async fn context(&mut self, bot_id: &str, session_id: &str) -> Result<ContextView>;

    /// [`Projector::session_page`] as of the position `at` (rule 24): the session as a
    /// reader that held exactly `at` saw it, less every record tombstoned since.
    ///
    /// # Contract
    ///
    /// **As of a position (rule 24).** The answer is a pure function of the entries at or
    /// below `at` and of the tombstones held: the same on every replica and backend that
    /// holds the same entries. A position past what this projector holds is refused
    /// (`InvalidInput` on field `at`, nothing read): refresh first.
    async fn session_page_at(
        &mut self,
        bot_id: &str,
        session_id: &str,
        at: &Checkpoint,
        after: Option<&OrderKey>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool)>;

    /// [`Projector::context`] as of the position `at` (rule 24): a summary governs when it
    /// is at or below `at` and names no position past it, as for a reader that held `at`.
    /// Refused as [`Projector::session_page_at`] is.
    async fn context_at(&mut self, bot_id: &str, session_id: &str, at: &Checkpoint) -> Result<ContextView>;

    /// [`Projector::sessions`] as of the position `at` (rule 24). Refused as
    /// [`Projector::session_page_at`] is.
    async fn sessions_at(&mut self, bot_id: &str, at: &Checkpoint) -> Result<Vec<SessionSummary>>;

    /// The order keys of a session's view (rule 25; what [`Projector::session_page_at`]
    /// pages through), now or as of `at`, without reading a record's body. Refused as
    /// [`Projector::session_page_at`] is.
    async fn view_keys(&mut self, bot_id: &str, session_id: &str, at: Option<&Checkpoint>) -> Result<Vec<OrderKey>>;

    /// A session's own live entries, its links among them (rule 25), in contract order,
    /// with bodies: what is the session's own to end or to check, not what it inherits.
    async fn own_entries(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>>;

    /// The order key of `id`'s live winner as the projection holds it now (no refresh, no
    /// read of bodies); `None` when the id has no live record.
    fn live_key(&self, bot_id: &str, id: &str) -> Option<OrderKey>;

    /// Sessions of a bot with live records.
    async fn sessions(&mut self, bot_id: &str) -> Result<Vec<SessionSummary>>;

    /// Save this projection (its index and cursor, scanning first if it has not) in the
    /// store as a projection snapshot, and drop all but the newest two.
    ///
    /// # Contract
    ///
    /// **A snapshot is an optimisation (rule 17).** A later projector's first scan starts
    /// from the newest usable snapshot and reads only what is past it; what it answers is
    /// byte-identical to a full scan's. A missing, corrupt, foreign, stale or unknown-format
    /// snapshot is skipped with a logged reason, never an error.
    async fn save_snapshot(&mut self) -> Result<SnapshotReport>;

    /// Counts of what the projection holds.
    fn stats(&self) -> ProjectionStats;

    /// How far the projection has read, per shard.
    fn checkpoint(&self) -> Checkpoint;

    /// The canonical projection (rule 9).
    fn projection(&self) -> Projection;

    /// The highest HLC seen, for writers that must order after what they read.
    fn max_hlc(&self) -> Hlc;
}

/// The history checker.
///
/// # Contract
///
/// - **Conflicts (rules 6, 7).** Every later put of an id with other content than its winner
///   is a `DivergentPut`; every put ordered after a tombstone of its id is a
///   `WriteAfterDelete`.
/// - **History checks (rule 10).** Entries whose epoch is below one already seen at the same
///   or an earlier seq of their shard (`StaleEpoch`), missing seqs (`SeqGap`), content that
///   does not match its hash (`Corrupt`), and clocks past the plausible horizon
///   (`ImplausibleHlc`) are reported.
/// - **Determinism (rule 9).** The list is a pure function of the set of entries, in
///   canonical order, byte-identical on every backend.
#[async_trait]
pub trait ConflictDiscovery: Send + Sync {
    /// Every conflict in the log, in canonical order; with `after`, only those involving an
    /// entry past that checkpoint.
    async fn conflicts(&mut self, after: Option<&Checkpoint>) -> Result<Vec<Conflict>>;
}

/// A store's saved search indexes.
///
/// # Contract
///
/// - `put` stores the bytes whole or not at all (no reader lists or reads a part) and names
///   them `<time>-<unique>-<tag>.idx`, so that names sort by when they were put and end with
///   the purge mark's `search::saved::tag` the save began under; then it deletes all but the newest
///   `search::saved::KEEP`.
/// - `names` lists them newest first; `read` of a name deleted meanwhile is `None`.
/// - `delete` of a name that is gone succeeds.
/// - `mark` changes on every `remark`, and only then.
/// - `identity` is the store's (with `create`, made if it has none): a saved index of
///   another store is not used.
#[async_trait]
pub trait SavedIndexes: Send + Sync + 'static {
    /// The store's identity; with `create`, made if it has none yet.
    async fn identity(&self, create: bool) -> Result<Option<String>>;
    /// The saved indexes' names, newest first.
    async fn names(&self) -> Result<Vec<String>>;
    /// The bytes of the saved index `name`, if it is still there.
    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>>;
    /// Save `bytes` as the newest, named with `tag`; its name.
    async fn put(&self, bytes: Vec<u8>, tag: &str) -> Result<String>;
    /// Delete the saved index `name`.
    async fn delete(&self, name: &str) -> Result<()>;
    /// The purge mark (none before the first purge).
    async fn mark(&self) -> Result<Option<String>>;
    /// Change the purge mark.
    async fn remark(&self) -> Result<()>;
}
