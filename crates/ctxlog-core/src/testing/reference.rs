//! The reference store: a [`Store`] in the process's memory that keeps the whole contract: the shared writer state, the shared
//! projector and history checker, epochs and fencing, deadlines. Stores live as long as the
//! process and are found by name, so every open of one name is the same store (as several
//! processes share one SQLite file).
//!
//! It serves two purposes: the conformance suite runs on it in seconds (so the suite is
//! checked without building a storage engine), and applications use it as a test double.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::failpoint::{self, Armed};
use crate::backend::history::{HistoryChecker, HistoryConflicts, HistorySource};
use crate::backend::index::{IndexRow, ProjectionIndex, RowRef};
use crate::backend::projector::{CatchUp, IndexSource, IndexedProjector, SnapshotBlobs};
use crate::backend::snapshot::{self, Rejected};
use crate::backend::with_deadline;
use crate::backend::writer::{InFlight, WriterState};
use crate::entry::{AppendAck, Checkpoint, Entry, OrderKey, ShardInfo};
use crate::error::{Error, Result, Written};
use crate::hlc::{Hlc, HlcClock};
use crate::ids::{Epoch, ShardId, WriterId};
use crate::options::{CompactOptions, CompactReport, GcOptions, GcReport, PurgeOptions, PurgeReport, StoreOptions};
use crate::record::{Kind, Record};
use crate::traits::{ConflictDiscovery, Projector, Shard, Store};

/// One store's data.
#[derive(Default)]
struct Data {
    shards: BTreeMap<ShardId, ShardData>,
    /// Made with the first snapshot (rule 17).
    identity: Option<String>,
    /// Projection snapshots by number, oldest first.
    snapshots: Vec<(u64, Vec<u8>)>,
}

struct ShardData {
    writer: WriterId,
    epoch: Epoch,
    /// In the order stored; positions only grow (the projector's cursor counts them).
    entries: Vec<Entry>,
}

/// What every handle of one store shares.
struct Shared {
    data: Mutex<Data>,
    /// The store's name: the scope of its failpoints.
    name: String,
    /// Its saved search indexes, in memory.
    saved: Arc<crate::search::saved::MemoryIndexes>,
}

/// Where an append has stored its batch and not yet answered (a lost acknowledgement).
const AFTER_WRITE: &str = "reference.append.after_write";
/// Where a projector's catch-up waits before it reads.
const REFRESH_HOLD: &str = "reference.refresh.hold";
/// Where a projector's catch-up ends as one cut short by its deadline on SQLite does: its
/// cursor and index back at their defaults (the next refresh is a first scan).
const REFRESH_CUT: &str = "reference.refresh.cut_short";

fn registry() -> &'static Mutex<HashMap<String, Arc<Shared>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<Shared>>>> = OnceLock::new();
    STORES.get_or_init(Default::default)
}

/// The reference store (see the module docs).
#[derive(Clone)]
pub struct ReferenceStore {
    shared: Arc<Shared>,
    options: StoreOptions,
}

impl ReferenceStore {
    /// Open the store called `name`, creating it when `options.create_if_missing`.
    pub fn open(name: &str, options: StoreOptions) -> Result<Self> {
        options.validate()?;
        let mut stores = registry().lock().expect("not poisoned");
        let shared = match stores.get(name) {
            Some(s) => s.clone(),
            None if options.create_if_missing => {
                let s = Arc::new(Shared {
                    data: Mutex::new(Data::default()),
                    name: name.to_string(),
                    saved: Arc::new(crate::search::saved::MemoryIndexes::new(format!("reference:{name}"))),
                });
                stores.insert(name.to_string(), s.clone());
                s
            }
            None => {
                return Err(Error::NotFound {
                    what: format!("no reference store named `{name}`"),
                });
            }
        };
        Ok(ReferenceStore { shared, options })
    }

    /// Store an entry exactly as given, bypassing every check (what a broken writer or a
    /// damaged store leaves behind). An entry with `purged` set is stored without a body, as
    /// purge leaves one (and as damage may, on an id without a tombstone): it reads back as
    /// empty text, as on every backend; its metadata as given.
    pub fn inject_raw_entry(&self, mut entry: Entry) {
        if entry.purged {
            entry.record.body = crate::record::Body::Text(String::new());
        }
        let mut data = self.shared.data.lock().expect("not poisoned");
        let shard = data.shards.entry(entry.shard).or_insert_with(|| ShardData {
            writer: WriterId::new_unchecked("injected".into()),
            epoch: entry.epoch,
            entries: Vec::new(),
        });
        shard.entries.push(entry);
    }

    /// While the guard lives, every append commits and then waits, as if its
    /// acknowledgement were lost: the caller's deadline fires with an indeterminate error.
    pub fn stall_writes(&self) -> Armed {
        failpoint::arm(AFTER_WRITE, self.shared.name.clone(), failpoint::Action::Pause)
    }

    /// While the guard lives, the next refresh of a projector of this store waits before it
    /// reads (one refresh for each guard armed).
    pub fn hold_a_refresh(&self) -> Armed {
        failpoint::arm_once(REFRESH_HOLD, self.shared.name.clone(), failpoint::Action::Pause)
    }

    /// The next refresh of a projector of this store fails as one cut short by its deadline
    /// on SQLite does, leaving the projector empty (its next refresh is a first scan).
    pub fn cut_a_refresh_short(&self) -> Armed {
        failpoint::arm_once(REFRESH_CUT, self.shared.name.clone(), failpoint::Action::Fail)
    }

    /// Take the shard's next epoch; with `held`, only while the newest claim is `held`.
    fn claim(&self, writer: &WriterId, held: Option<Epoch>) -> Result<Box<dyn Shard>> {
        let shard = writer.shard_id();
        let (epoch, last_seq, max_hlc) = {
            let mut data = self.shared.data.lock().expect("not poisoned");
            let s = data.shards.entry(shard).or_insert_with(|| ShardData {
                writer: writer.clone(),
                epoch: 0,
                entries: Vec::new(),
            });
            if let Some(held) = held
                && s.epoch != held
            {
                return Err(Error::Fenced {
                    shard,
                    writer: writer.to_string(),
                    epoch: held,
                    current: Some(s.epoch),
                    written: Written::Nothing,
                });
            }
            s.epoch += 1;
            s.writer = writer.clone();
            let last_seq = s.entries.iter().map(|e| e.seq).max().unwrap_or(0);
            let max_hlc = s.entries.iter().map(|e| e.hlc).max().unwrap_or(Hlc::ZERO);
            (s.epoch, last_seq, max_hlc)
        };
        let clock = HlcClock::new(self.options.clock.clone(), Hlc::ZERO);
        Ok(Box::new(ReferenceShard {
            state: WriterState::new(
                writer.clone(),
                epoch,
                clock,
                self.options.limits.clone(),
                last_seq,
                max_hlc,
            ),
            store: self.clone(),
        }))
    }

    fn timeout(&self) -> Duration {
        self.options.timeout
    }
}

#[async_trait]
impl Store for ReferenceStore {
    fn backend(&self) -> &'static str {
        "reference"
    }

    fn options(&self) -> &StoreOptions {
        &self.options
    }

    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn Shard>> {
        self.claim(writer, None)
    }

    async fn reopen_shard(&self, writer: &WriterId, held: Epoch) -> Result<Box<dyn Shard>> {
        self.claim(writer, Some(held))
    }

    async fn shards(&self) -> Result<Vec<ShardInfo>> {
        let data = self.shared.data.lock().expect("not poisoned");
        Ok(data
            .shards
            .iter()
            .map(|(id, s)| ShardInfo {
                shard: *id,
                writer: s.writer.clone(),
                epoch: s.epoch,
                last_seq: s.entries.iter().map(|e| e.seq).max().unwrap_or(0),
                entries: s.entries.len() as u64,
            })
            .collect())
    }

    async fn read_shard(&self, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
        let data = self.shared.data.lock().expect("not poisoned");
        let mut out: Vec<Entry> = data
            .shards
            .get(&shard)
            .map(|s| s.entries.iter().filter(|e| e.seq > after_seq).cloned().collect())
            .unwrap_or_default();
        out.sort_by_key(|e| (e.seq, e.epoch));
        out.dedup_by_key(|e| (e.seq, e.epoch));
        out.truncate(limit);
        Ok(out)
    }

    async fn format(&self) -> Result<u32> {
        Ok(crate::upgrade::IDS_BY_BOT)
    }

    /// A reference store is always of format 3: there is nothing to move.
    async fn set_format(&self, from: u32, to: u32) -> Result<()> {
        Err(Error::invalid(
            "format",
            None,
            format!("a reference store is at format 3; cannot move {from} to {to}"),
        ))
    }

    fn projector(&self) -> Box<dyn Projector> {
        Box::new(IndexedProjector::new(Arc::new(self.clone())))
    }

    fn conflict_discovery(&self) -> Box<dyn ConflictDiscovery> {
        Box::new(HistoryConflicts::new(Arc::new(self.clone()), Arc::new(self.clone())))
    }

    fn saved_indexes(&self) -> Option<Arc<dyn crate::search::saved::SavedIndexes>> {
        Some(self.shared.saved.clone())
    }

    /// Nothing to fold: every entry is where readers read it.
    async fn compact(&self, _options: &CompactOptions) -> Result<CompactReport> {
        Ok(CompactReport {
            note: "memory: nothing to fold".into(),
            ..Default::default()
        })
    }

    /// Nothing to reclaim: no entry lives twice, and a purged body is gone at once.
    async fn gc(&self, _options: &GcOptions) -> Result<GcReport> {
        crate::search::saved::sweep(&*self.shared.saved).await?;
        Ok(GcReport {
            note: "memory: nothing to reclaim".into(),
            ..Default::default()
        })
    }

    async fn purge(&self, options: &PurgeOptions) -> Result<PurgeReport> {
        let saved: Arc<dyn crate::search::saved::SavedIndexes> = self.shared.saved.clone();
        crate::search::saved::around_purge(Some(saved), "reference", async { Ok(self.erase(options)) }).await
    }
}

impl ReferenceStore {
    /// Purge's erasing (rule 16).
    fn erase(&self, options: &PurgeOptions) -> PurgeReport {
        let mut data = self.shared.data.lock().expect("not poisoned");
        let all = || data.shards.values().flat_map(|s| s.entries.iter());
        // Ids are scoped by bot (a reference store is of format 3): a tombstone erases its
        // own bot's record only.
        let key = |e: &Entry| (e.record.bot_id.clone(), e.record.id.clone());
        let tombstoned: std::collections::BTreeSet<(String, String)> =
            all().filter(|e| e.record.kind == Kind::Tombstone).map(key).collect();
        let pending: std::collections::BTreeSet<(String, String)> = all()
            .filter(|e| !e.purged && tombstoned.contains(&key(e)))
            .map(key)
            .collect();
        let now: std::collections::BTreeSet<&(String, String)> = pending
            .iter()
            .take(usize::try_from(options.max_ids).unwrap_or(usize::MAX))
            .collect();
        let mut entries = 0;
        for e in data.shards.values_mut().flat_map(|s| s.entries.iter_mut()) {
            if !e.purged && now.contains(&key(e)) {
                e.purge();
                entries += 1;
            }
        }
        PurgeReport {
            ids_purged: now.len() as u64,
            entries_purged: entries,
            ids_remaining: (pending.len() - now.len()) as u64,
            erased: true,
            note: "memory: bodies dropped".into(),
        }
    }
}

/// How far a projector has read: per shard, how many stored entries.
#[derive(Default)]
pub struct Cursor(HashMap<ShardId, usize>);

#[async_trait]
impl IndexSource for ReferenceStore {
    type Cursor = Cursor;

    async fn catch_up(&self, cursor: &mut Cursor, index: &mut ProjectionIndex) -> Result<CatchUp> {
        let name = &self.shared.name;
        let _ = failpoint::hit(REFRESH_HOLD, || name.clone()).await;
        if failpoint::hit(REFRESH_CUT, || name.clone()).await.is_err() {
            *cursor = Cursor::default();
            *index = ProjectionIndex::scoped(index.scope());
            return Err(Error::Timeout {
                op: "refresh",
                after: self.options.timeout,
                shard: None,
                written: Written::Nothing,
            });
        }
        let data = self.shared.data.lock().expect("not poisoned");
        let mut done = CatchUp::default();
        for (id, s) in &data.shards {
            let from = cursor.0.get(id).copied().unwrap_or(0);
            for e in &s.entries[from.min(s.entries.len())..] {
                done.read += 1;
                if index.apply(IndexRow::of(e)) {
                    done.applied += 1;
                }
            }
            cursor.0.insert(*id, s.entries.len());
        }
        Ok(done)
    }

    async fn fetch(&self, _cursor: &Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        let data = self.shared.data.lock().expect("not poisoned");
        keys.iter()
            .map(|(k, _)| {
                data.shards
                    .get(&k.shard)
                    .and_then(|s| s.entries.iter().find(|e| e.key() == *k))
                    .cloned()
                    .ok_or_else(|| Error::Corrupt {
                        shard: Some(k.shard),
                        what: format!("entry seq {} epoch {} is indexed but missing", k.seq, k.epoch),
                    })
            })
            .collect()
    }

    fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// Per shard: its id and how many stored entries the cursor is past.
    async fn id_scope(&self) -> Result<crate::ids::IdScope> {
        Ok(crate::ids::IdScope::Bot)
    }

    fn save_cursor(&self, cursor: &Cursor) -> Vec<u8> {
        let mut out = Vec::with_capacity(cursor.0.len() * 24);
        for (shard, n) in &cursor.0 {
            out.extend_from_slice(shard.as_bytes());
            out.extend_from_slice(&(*n as u64).to_le_bytes());
        }
        out
    }

    async fn resume_cursor(&self, saved: &[u8]) -> std::result::Result<Cursor, Rejected> {
        if !saved.len().is_multiple_of(24) {
            return Err(Rejected::Corrupt(format!("a cursor of {} bytes", saved.len())));
        }
        Ok(Cursor(
            saved
                .chunks_exact(24)
                .map(|c| {
                    let shard = ShardId::from_bytes(c[..16].try_into().expect("16 bytes"));
                    (shard, u64::from_le_bytes(c[16..].try_into().expect("8 bytes")) as usize)
                })
                .collect(),
        ))
    }
}

#[async_trait]
impl SnapshotBlobs for ReferenceStore {
    async fn store_identity(&self, create: bool) -> Result<Option<String>> {
        let mut data = self.shared.data.lock().expect("not poisoned");
        if create && data.identity.is_none() {
            data.identity = Some(uuid::Uuid::new_v4().to_string());
        }
        Ok(data.identity.clone())
    }

    async fn snapshot_names(&self) -> Result<Vec<String>> {
        let data = self.shared.data.lock().expect("not poisoned");
        Ok(data.snapshots.iter().rev().map(|(no, _)| no.to_string()).collect())
    }

    async fn read_snapshot(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let data = self.shared.data.lock().expect("not poisoned");
        Ok(data
            .snapshots
            .iter()
            .find(|(no, _)| no.to_string() == name)
            .map(|(_, b)| b.clone()))
    }

    async fn put_snapshot(&self, bytes: Vec<u8>) -> Result<()> {
        let mut data = self.shared.data.lock().expect("not poisoned");
        let no = data.snapshots.last().map_or(1, |(n, _)| n + 1);
        data.snapshots.push((no, bytes));
        let drop = data.snapshots.len().saturating_sub(snapshot::KEEP);
        data.snapshots.drain(..drop);
        Ok(())
    }
}

impl ReferenceStore {
    /// Raw access to the stored projection snapshots (rule 17), for tests that damage them
    /// as a disk or an operator might: `f` changes each one's bytes; returns them as they
    /// were, newest first.
    pub fn tamper_with_snapshots(&self, mut f: impl FnMut(&mut Vec<u8>)) -> Vec<Vec<u8>> {
        let mut data = self.shared.data.lock().expect("not poisoned");
        let mut before = Vec::new();
        for (_, bytes) in data.snapshots.iter_mut().rev() {
            before.push(bytes.clone());
            f(bytes);
        }
        before
    }
}

#[async_trait]
impl HistorySource for ReferenceStore {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
        let data = self.shared.data.lock().expect("not poisoned");
        for s in data.shards.values() {
            for e in &s.entries {
                checker.visit(e.clone());
            }
        }
        Ok(())
    }

    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>> {
        let data = self.shared.data.lock().expect("not poisoned");
        Ok(data
            .shards
            .values()
            .flat_map(|s| &s.entries)
            .filter(|e| !quiet.contains(&e.shard) && after.is_after(e.shard, e.seq))
            .cloned()
            .collect())
    }

    fn timeout(&self) -> Duration {
        self.options.timeout
    }
}

/// A claimed shard of a [`ReferenceStore`].
struct ReferenceShard {
    state: WriterState,
    store: ReferenceStore,
}

impl ReferenceShard {
    /// The append's write: under one lock, check the epoch and store every entry.
    async fn write(&self, staged: InFlight) -> Result<InFlight> {
        let (shard_id, epoch) = (self.state.shard(), self.state.epoch());
        let entries = staged.entries.iter().map(|e| Entry {
            shard: shard_id,
            seq: e.seq,
            epoch,
            hlc: e.hlc,
            record: e.record.clone(),
            content_hash: e.hash,
            purged: false,
        });
        {
            let mut data = self.store.shared.data.lock().expect("not poisoned");
            let shard = data.shards.get_mut(&self.state.shard()).ok_or_else(|| Error::Corrupt {
                shard: Some(self.state.shard()),
                what: "the claimed shard vanished".into(),
            })?;
            if shard.epoch != self.state.epoch() {
                return Err(self.state.fenced(Some(shard.epoch), Written::Nothing));
            }
            shard.entries.extend(entries);
        }
        // Storage is an await point: a task that appends in a loop lets others run.
        tokio::task::consume_budget().await;
        // A lost acknowledgement: held while a test stalls the store (the deadline ends it).
        let name = &self.store.shared.name;
        failpoint::hit(AFTER_WRITE, || name.clone()).await.map_err(|s| {
            Error::backend(
                "reference",
                "append",
                Some(shard_id),
                Written::Unknown,
                format!("stopped at {}", s.point),
            )
        })?;
        Ok(staged)
    }
}

#[async_trait]
impl Shard for ReferenceShard {
    crate::shard_methods_from_writer_state!();

    async fn append(&mut self, records: Vec<Record>) -> Result<AppendAck> {
        let staged = self.state.stage(records)?;
        let in_flight = self.state.begin(staged);
        let outcome = with_deadline(
            "append",
            self.store.timeout(),
            Some(self.state.shard()),
            Written::Unknown,
            self.write(in_flight),
        )
        .await;
        self.state.settle(outcome)
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        self.state.mark_closed();
        if self.state.is_poisoned() {
            return Ok(());
        }
        let data = self.store.shared.data.lock().expect("not poisoned");
        let current = data.shards.get(&self.state.shard()).map(|s| s.epoch);
        if current != Some(self.state.epoch()) {
            return Err(self.state.fenced(current, Written::Nothing));
        }
        Ok(())
    }
}
