//! The incremental projection index that backends feed while they scan.
//!
//! It holds only what the projection needs per entry — id, kind, content hash, order key
//! and session — never bodies. Applying rows is idempotent and order-independent: the
//! result depends only on the set of rows applied, so backends may read shards in any
//! order, and a refresh may apply entries that sort before ones already seen (per-writer
//! logs commit out of order).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::hash::BuildHasher;

use indexmap::IndexMap;
use indexmap::map::raw_entry_v1::{RawEntryApiV1, RawEntryMut};

/// A fast keyed hasher, randomly seeded per map (ids are caller-chosen, so not a fixed seed).
type Hasher = foldhash::fast::RandomState;

use crate::backend::frozen::{self, Frozen, Shape, Tables};
use crate::entry::{Checkpoint, OrderKey, SessionSummary};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::projection::{Conflict, LiveRecord, Projection, ProjectionStats};
use crate::record::Kind;

/// Where a backend can find an entry again. Opaque to the index, which keeps it with each
/// put and hands it back with the keys a view needs; backends that fetch by key leave it 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RowRef(pub u64, pub u64);

/// One entry as the projection sees it. Borrowed, so that backends can feed rows straight
/// from their column buffers.
#[derive(Clone, Copy, Debug)]
pub struct IndexRow<'a> {
    /// The entry's place in the contract's order.
    pub key: OrderKey,
    /// The record id.
    pub id: &'a str,
    /// Put or tombstone.
    pub kind: Kind,
    /// The stored content hash.
    pub hash: ContentHash,
    /// The bot the record belongs to.
    pub bot_id: &'a str,
    /// The session the record belongs to.
    pub session_id: &'a str,
    /// Where the backend can fetch the entry again.
    pub at: RowRef,
}

impl<'a> IndexRow<'a> {
    /// The projection's view of a full entry.
    pub fn of(e: &'a crate::entry::Entry) -> Self {
        IndexRow {
            key: e.key(),
            id: &e.record.id,
            kind: e.record.kind,
            hash: e.content_hash,
            bot_id: &e.record.bot_id,
            session_id: &e.record.session_id,
            at: RowRef::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Put {
    pub(super) key: OrderKey,
    pub(super) hash: ContentHash,
    pub(super) session: u32,
    pub(super) at: RowRef,
}

/// One record id. Small on purpose (a first scan holds one per id): what only a few ids
/// have lives behind `extra`.
#[derive(Clone, Debug, Default)]
pub(super) struct IdState {
    /// The earliest `Put`.
    pub(super) winner: Option<Put>,
    pub(super) extra: Option<Box<Extra>>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Extra {
    /// Every other `Put` (retries and divergent writes).
    pub(super) others: Vec<Put>,
    /// Every `Tombstone`.
    pub(super) tombstones: Vec<OrderKey>,
}

impl IdState {
    pub(super) fn others(&self) -> &[Put] {
        self.extra.as_ref().map_or(&[], |e| &e.others)
    }

    pub(super) fn tombstones(&self) -> &[OrderKey] {
        self.extra.as_ref().map_or(&[], |e| &e.tombstones)
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    fn first_tombstone(&self) -> Option<OrderKey> {
        self.tombstones().iter().min().copied()
    }

    fn live(&self) -> Option<&Put> {
        if self.tombstones().is_empty() {
            self.winner.as_ref()
        } else {
            None
        }
    }

    fn has(&self, key: &OrderKey) -> bool {
        self.winner.as_ref().is_some_and(|w| w.key == *key)
            || self.others().iter().any(|p| p.key == *key)
            || self.tombstones().contains(key)
    }

    pub(super) fn sessions(&self) -> impl Iterator<Item = u32> + '_ {
        self.winner.iter().chain(self.others().iter()).map(|p| p.session)
    }

    /// This id's conflicts of rules 6 and 7.
    fn conflicts(&self, id: &str, out: &mut Vec<Conflict>) {
        if self.extra.is_none() {
            return;
        }
        let tomb = self.first_tombstone();
        let Some(w) = self.winner else { return };
        for p in std::iter::once(&w).chain(self.others().iter()) {
            match tomb {
                Some(t) if p.key > t => out.push(Conflict::WriteAfterDelete {
                    id: id.to_string(),
                    tombstone: t,
                    entry: p.key,
                }),
                _ if p.key != w.key && p.hash != w.hash => out.push(Conflict::DivergentPut {
                    id: id.to_string(),
                    winner: w.key,
                    winner_hash: w.hash,
                    entry: p.key,
                    entry_hash: p.hash,
                }),
                _ => {}
            }
        }
    }
}

#[derive(Clone, Debug, Default)]
struct SessionState {
    /// Ids that have (or had) a put in this session. Filtered at read time by the id's
    /// current winner.
    ids: Vec<u32>,
}

/// One part of an index's ids (see [`ProjectionIndex::apply_in_parallel`]).
type Ids = IndexMap<Box<str>, IdState, Hasher>;
type Sessions = IndexMap<(Box<str>, Box<str>), SessionState, Hasher>;

/// Most parts an index splits its ids into: one per core, up to this many.
const MAX_PARTS: usize = 8;
/// The low bits of an id number name its part; the rest are its place in that part.
const PART_BITS: u32 = 3;
const PART_MASK: u32 = (1 << PART_BITS) - 1;

/// The number of id `local` of part `part`.
fn id_no(local: usize, part: usize) -> u32 {
    let local = u32::try_from(local)
        .ok()
        .filter(|l| *l < 1 << (32 - PART_BITS))
        .expect("fewer than 2^29 ids in one part of an index");
    (local << PART_BITS) | part as u32
}

/// The projection of every row applied so far.
#[derive(Clone, Debug)]
pub struct ProjectionIndex {
    /// Every id, split by the hash of the id into parts that threads of their own can apply
    /// rows to at once ([`ProjectionIndex::apply_in_parallel`]). How many parts there are is
    /// fixed when the index is made; what the index answers does not depend on it.
    parts: Vec<Ids>,
    /// The hasher of every part, so that the hash that picks an id's part also finds the id
    /// in it. Randomly seeded per index: ids are caller-chosen.
    hasher: Hasher,
    sessions: Sessions,
    entries: u64,
    /// Highest seq applied per shard (a `Checkpoint` on demand: this is on the hot path).
    positions: Positions,
    last_session: Option<u32>,
    /// `(session, id number)` pairs not yet filed into their session's list. Filed on the
    /// first query that needs them: while scanning, one sequential append per put instead
    /// of a random one into one of thousands of lists.
    unfiled: Vec<(u32, u32)>,
    /// The ids a snapshot held, as it held them (empty for an index built from rows). Never
    /// changed: the first row that touches one of its ids copies that id's state into its
    /// part (and marks it `thawed`), so a snapshot loads without hashing or allocating per id.
    frozen: std::sync::Arc<Frozen>,
    /// Frozen ids copied into a part: their frozen state is stale.
    thawed: std::collections::HashSet<u32, Hasher>,
    /// Every summary entry applied (live or not), by session number (rule 21): few, so a
    /// context view finds its session's without reading bodies.
    summaries: Summaries,
}

type Summaries = BTreeSet<(u32, OrderKey)>;

/// A session's live records in contract order, with where each can be fetched, and which of
/// them are summaries (rule 21).
#[derive(Clone, Debug, Default)]
pub struct SummarisedSession {
    /// The live records, in contract order.
    pub keys: Vec<(OrderKey, RowRef)>,
    /// Which of the session's entries are summaries (live or not), sorted.
    pub summaries: Vec<OrderKey>,
}

impl SummarisedSession {
    /// Whether the entry at `key` is a summary.
    pub fn is_summary(&self, key: &OrderKey) -> bool {
        self.summaries.binary_search(key).is_ok()
    }

    /// Where the backend can fetch the live record at `key` (`None`: not live here).
    pub fn row(&self, key: &OrderKey) -> Option<RowRef> {
        self.keys
            .binary_search_by(|(k, _)| k.cmp(key))
            .ok()
            .map(|i| self.keys[i].1)
    }
}

type Positions = std::collections::HashMap<crate::ids::ShardId, crate::ids::Seq, Hasher>;

impl Default for ProjectionIndex {
    fn default() -> Self {
        // Asked once: on Linux the answer reads the process's cgroup files.
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        Self::with_parts(*CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())))
    }
}

/// A borrowed session key that hashes and compares like the owned `(Box<str>, Box<str>)`.
#[derive(Hash)]
struct SessionRef<'a>(&'a str, &'a str);

impl indexmap::Equivalent<(Box<str>, Box<str>)> for SessionRef<'_> {
    fn equivalent(&self, key: &(Box<str>, Box<str>)) -> bool {
        self.0 == &*key.0 && self.1 == &*key.1
    }
}

/// The one place a row changes an id: `ids` is the part the id's `hash` picked. Returns
/// false when the id already held the row. Files a new `(session, id)` pair in `unfiled`
/// and the number of a frozen id it copies out in `thawed`.
#[allow(clippy::too_many_arguments)]
fn apply_to(
    ids: &mut Ids,
    part: usize,
    hash: u64,
    row: &IndexRow<'_>,
    owned: Option<Box<str>>,
    session: u32,
    frozen: &Frozen,
    thawed: &mut impl Extend<u32>,
    unfiled: &mut Vec<(u32, u32)>,
) -> bool {
    let id: &str = owned.as_deref().unwrap_or(row.id);
    // One lookup per row: most ids are new, and a lookup-then-insert would probe twice.
    let (local, state) = match ids.raw_entry_mut_v1().from_key_hashed_nocheck(hash, id) {
        RawEntryMut::Occupied(e) => (e.index(), e.into_mut()),
        RawEntryMut::Vacant(e) => {
            let local = e.index();
            // The first row of an id a snapshot held starts from what the snapshot held.
            let state = match (frozen.len() > 0).then(|| frozen.find(id)).flatten() {
                Some(b) => {
                    let state = frozen.state(b);
                    let mut sessions: Vec<u32> = state.sessions().collect();
                    sessions.sort_unstable();
                    sessions.dedup();
                    unfiled.extend(sessions.into_iter().map(|s| (s, id_no(local, part))));
                    thawed.extend([b as u32]);
                    state
                }
                None => IdState::default(),
            };
            let key = owned.unwrap_or_else(|| row.id.into());
            (local, e.insert_hashed_nocheck(hash, key, state).1)
        }
    };
    if state.has(&row.key) {
        return false;
    }
    match row.kind {
        Kind::Tombstone => state.extra().tombstones.push(row.key),
        Kind::Put | Kind::Summary => {
            let known_here = state.sessions().any(|s| s == session);
            let put = Put {
                key: row.key,
                hash: row.hash,
                session,
                at: row.at,
            };
            match state.winner {
                None => state.winner = Some(put),
                Some(w) if put.key < w.key => {
                    state.extra().others.push(w);
                    state.winner = Some(put);
                }
                Some(_) => state.extra().others.push(put),
            }
            if !known_here {
                unfiled.push((session, id_no(local, part)));
            }
        }
    }
    true
}

/// Raise the highest seq applied for `shard` to `seq`.
fn raise(positions: &mut Positions, shard: crate::ids::ShardId, seq: crate::ids::Seq) {
    let pos = positions.entry(shard).or_insert(0);
    *pos = (*pos).max(seq);
}

/// Applies rows to some of an index's parts, on a thread of its own: see
/// [`ProjectionIndex::apply_in_parallel`]. Rows of ids in other parts are skipped.
pub struct PartApplier<'a> {
    /// The parts of the index, `Some` for those this applier owns.
    mine: Vec<Option<&'a mut Ids>>,
    hasher: &'a Hasher,
    frozen: &'a Frozen,
    /// The index's sessions when the parallel apply began, read-only: a session found
    /// there keeps its number. Others are numbered from `base` in `new_sessions`, and
    /// renumbered when the appliers are merged.
    sessions: &'a Sessions,
    base: u32,
    new_sessions: IndexMap<(Box<str>, Box<str>), (), Hasher>,
    last_session: Option<u32>,
    done: Finished,
}

/// What a [`PartApplier`] leaves to merge into its index.
#[derive(Default)]
struct Finished {
    parts: Vec<usize>,
    new_sessions: Vec<(Box<str>, Box<str>)>,
    unfiled: Vec<(u32, u32)>,
    thawed: Vec<u32>,
    positions: Positions,
    counts: crate::backend::projector::CatchUp,
    summaries: Vec<(u32, OrderKey)>,
}

impl PartApplier<'_> {
    /// Apply `row` if its id is in a part of this applier's.
    pub fn apply(&mut self, row: IndexRow<'_>) {
        self.apply_inner(row, None);
    }

    /// Apply a row routed to this applier's thread ([`ProjectionIndex::apply_routed`]),
    /// whose id the caller owns: the index keeps `id` instead of copying it, and ignores
    /// `row.id`. Panics if the row's id is not in a part of this applier's (it was routed
    /// to the wrong thread): skipping it would lose it.
    pub fn apply_owned(&mut self, row: IndexRow<'_>, id: Box<str>) {
        assert!(self.apply_inner(row, Some(id)), "a row routed to the wrong thread");
    }

    /// Whether the row's id is in a part of this applier's.
    fn apply_inner(&mut self, row: IndexRow<'_>, owned: Option<Box<str>>) -> bool {
        let hash = self.hasher.hash_one(owned.as_deref().unwrap_or(row.id));
        let part = part_of(hash, self.mine.len());
        if self.mine[part].is_none() {
            return false;
        }
        let session = self.session_no(row.bot_id, row.session_id);
        let ids = self.mine[part].as_deref_mut().expect("checked above");
        let d = &mut self.done;
        d.counts.read += 1;
        if apply_to(
            ids,
            part,
            hash,
            &row,
            owned,
            session,
            self.frozen,
            &mut d.thawed,
            &mut d.unfiled,
        ) {
            d.counts.applied += 1;
            raise(&mut d.positions, row.key.shard, row.key.seq);
            if row.kind == Kind::Summary {
                d.summaries.push((session, row.key));
            }
        }
        true
    }

    fn session_no(&mut self, bot_id: &str, session_id: &str) -> u32 {
        // Rows of one session tend to come together: try the last one first.
        if let Some(last) = self.last_session
            && self.session_key(last) == (bot_id, session_id)
        {
            return last;
        }
        let key = SessionRef(bot_id, session_id);
        let no = match self.sessions.get_index_of(&key) {
            Some(i) => i as u32,
            None => match self.new_sessions.get_index_of(&key) {
                Some(i) => self.base + i as u32,
                None => {
                    let owned = (Box::<str>::from(bot_id), Box::<str>::from(session_id));
                    self.base + self.new_sessions.insert_full(owned, ()).0 as u32
                }
            },
        };
        self.last_session = Some(no);
        no
    }

    fn session_key(&self, no: u32) -> (&str, &str) {
        let key = match no.checked_sub(self.base) {
            None => self.sessions.get_index(no as usize).map(|(k, _)| k),
            Some(i) => self.new_sessions.get_index(i as usize).map(|(k, _)| k),
        };
        let (b, s) = key.expect("numbered by this applier");
        (b, s)
    }

    fn finish(self) -> Finished {
        let mut done = self.done;
        done.new_sessions = self.new_sessions.into_keys().collect();
        done
    }
}

/// Which applying thread the rows of an id go to: see [`ProjectionIndex::apply_routed`].
#[derive(Clone, Debug)]
pub struct Router {
    hasher: Hasher,
    parts: usize,
    threads: usize,
}

impl Router {
    /// How many applying threads (and so queues) there are.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The thread the rows of `id` go to.
    pub fn thread_of(&self, id: &str) -> usize {
        part_of(self.hasher.hash_one(id), self.parts) % self.threads
    }
}

/// Wait for the applying threads and collect what each left, and the first error: this
/// thread's (`mine`), then theirs in order.
fn joined<E>(
    first: Finished,
    mine: Result<(), E>,
    threads: Vec<std::thread::ScopedJoinHandle<'_, (Finished, Result<(), E>)>>,
) -> (Vec<Finished>, Result<(), E>) {
    let mut results = vec![first];
    let mut result = mine;
    for t in threads {
        // A panic there is a bug: let it surface here.
        let (done, r) = t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        results.push(done);
        if result.is_ok() {
            result = r;
        }
    }
    (results, result)
}

/// The part of `parts` an id of hash `hash` is in. Not the hash's low bits (they pick the
/// id's bucket in its part) nor its high ones (its tag there).
fn part_of(hash: u64, parts: usize) -> usize {
    ((hash >> 32) as usize) % parts
}

/// Batches queued for each part's thread in [`ProjectionIndex::apply_in_parallel`].
const PART_QUEUE: usize = 4;

impl ProjectionIndex {
    /// An empty index with a part per core.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index whose ids are split into `parts` parts (at least 1, at most 8).
    pub fn with_parts(parts: usize) -> Self {
        let hasher = Hasher::default();
        ProjectionIndex {
            parts: (0..parts.clamp(1, MAX_PARTS))
                .map(|_| Ids::with_hasher(hasher.clone()))
                .collect(),
            hasher,
            sessions: Sessions::default(),
            entries: 0,
            positions: Positions::default(),
            last_session: None,
            unfiled: Vec::new(),
            frozen: Default::default(),
            thawed: Default::default(),
            summaries: Summaries::new(),
        }
    }

    /// How many parts the index's ids are split into.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Apply one entry. Returns false when the index already held it.
    pub fn apply(&mut self, row: IndexRow<'_>) -> bool {
        let session = self.session_no(row.bot_id, row.session_id);
        let hash = self.hasher.hash_one(row.id);
        let part = part_of(hash, self.parts.len());
        let ids = &mut self.parts[part];
        if !apply_to(
            ids,
            part,
            hash,
            &row,
            None,
            session,
            &self.frozen,
            &mut self.thawed,
            &mut self.unfiled,
        ) {
            return false;
        }
        self.entries += 1;
        raise(&mut self.positions, row.key.shard, row.key.seq);
        if row.kind == Kind::Summary {
            self.summaries.insert((session, row.key));
        }
        true
    }

    /// Apply every row `each` finds in `batches` on `threads` threads, each applying its
    /// share of the index's parts (at most one thread per part; only this one when
    /// `threads` is 1). `each` runs on every thread for every batch, and hands its rows to
    /// the thread's [`PartApplier`], which keeps those of its own parts: a part is only ever
    /// changed by one thread, so the threads share no lock. This thread hands the batches
    /// out and applies its share too.
    /// For a source whose batches are cheap to share and whose rows are decoded where they
    /// are applied (Arrow batches); see [`ProjectionIndex::apply_routed`] for the other kind.
    ///
    /// The first error stops the apply (this thread stops reading `batches`) and is
    /// returned; the rows applied until then stay applied and the index stays whole.
    pub fn apply_in_parallel<B, E>(
        &mut self,
        threads: usize,
        batches: impl IntoIterator<Item = B>,
        each: impl Fn(&B, &mut PartApplier<'_>) -> Result<(), E> + Sync,
    ) -> (crate::backend::projector::CatchUp, Result<(), E>)
    where
        B: Send + Sync,
        E: Send,
    {
        let each = &each;
        self.with_appliers(threads, |appliers| {
            let mut appliers = appliers.into_iter();
            let mut first = appliers.next().expect("at least one thread");
            std::thread::scope(|scope| {
                let mut queues = Vec::new();
                let mut threads = Vec::new();
                for mut a in appliers {
                    let (queue, batches) = std::sync::mpsc::sync_channel::<std::sync::Arc<B>>(PART_QUEUE);
                    queues.push(queue);
                    threads.push(scope.spawn(move || {
                        // Stops at the first error, dropping `batches`: the next send fails.
                        let r = batches.iter().try_for_each(|b| each(&b, &mut a));
                        (a.finish(), r)
                    }));
                }
                let mut mine = Ok(());
                for b in batches {
                    let b = std::sync::Arc::new(b);
                    // A part's thread that stopped has an error to say why: stop handing out.
                    if queues.iter().any(|q| q.send(b.clone()).is_err()) {
                        break;
                    }
                    mine = each(&b, &mut first);
                    if mine.is_err() {
                        break;
                    }
                }
                drop(queues);
                joined(first.finish(), mine, threads)
            })
        })
    }

    /// Which of `threads` applying threads the rows of an id go to in
    /// [`ProjectionIndex::apply_routed`].
    pub fn router(&self, threads: usize) -> Router {
        Router {
            hasher: self.hasher.clone(),
            parts: self.parts.len(),
            threads: threads.clamp(1, self.parts.len()),
        }
    }

    /// Apply what `each` makes of the batches of `queues`, one applying thread per queue
    /// (this one takes the first): the source has routed each row to its thread with
    /// [`ProjectionIndex::router`] (with `queues.len()` threads), so every thread gets only
    /// rows it keeps, and owns them ([`PartApplier::apply_owned`] keeps an id the source
    /// allocated). For a source that decodes rows on a thread of its own.
    ///
    /// The first error stops its thread (dropping its queue: the source's next send to it
    /// fails) and is returned; the rows applied until then stay applied and the index
    /// stays whole. The other threads go on with what was queued for them, so the rows
    /// applied are then no prefix of the rows sent: a source that resumes past the index's
    /// positions must not keep such an index as it is.
    pub fn apply_routed<B, E>(
        &mut self,
        queues: Vec<std::sync::mpsc::Receiver<B>>,
        each: impl Fn(B, &mut PartApplier<'_>) -> Result<(), E> + Sync,
    ) -> (crate::backend::projector::CatchUp, Result<(), E>)
    where
        B: Send,
        E: Send,
    {
        assert_eq!(
            queues.len(),
            self.router(queues.len()).threads,
            "one queue per thread of a router"
        );
        let each = &each;
        self.with_appliers(queues.len(), |appliers| {
            let mut pairs = appliers.into_iter().zip(queues);
            let (mut first, mine) = pairs.next().expect("at least one queue");
            std::thread::scope(|scope| {
                let threads: Vec<_> = pairs
                    .map(|(mut a, queue)| {
                        scope.spawn(move || {
                            let r = queue.into_iter().try_for_each(|b| each(b, &mut a));
                            (a.finish(), r)
                        })
                    })
                    .collect();
                let r = mine.into_iter().try_for_each(|b| each(b, &mut first));
                joined(first.finish(), r, threads)
            })
        })
    }

    /// Split the index's parts among `threads` appliers, let `run` run them, and merge what
    /// they leave, also when one failed.
    fn with_appliers<E>(
        &mut self,
        threads: usize,
        run: impl for<'a> FnOnce(Vec<PartApplier<'a>>) -> (Vec<Finished>, Result<(), E>),
    ) -> (crate::backend::projector::CatchUp, Result<(), E>) {
        let threads = threads.clamp(1, self.parts.len());
        let base = self.sessions.len() as u32;
        let mut appliers: Vec<PartApplier<'_>> = (0..threads)
            .map(|_| PartApplier {
                mine: Vec::new(),
                hasher: &self.hasher,
                frozen: &self.frozen,
                sessions: &self.sessions,
                base,
                new_sessions: IndexMap::with_hasher(self.hasher.clone()),
                last_session: None,
                done: Finished::default(),
            })
            .collect();
        for (p, ids) in self.parts.iter_mut().enumerate() {
            // The router's rule: part `p` is applied by thread `p % threads`.
            let owner = p % threads;
            let mut ids = Some(ids);
            for (t, a) in appliers.iter_mut().enumerate() {
                a.mine.push(if t == owner { ids.take() } else { None });
            }
            appliers[owner].done.parts.push(p);
        }
        // A panic on an applying thread (a bug) leaves its parts holding sessions the index
        // never numbered: empty the index (a later catch-up reads everything again) rather
        // than leave it torn, then let the panic go on.
        let (results, result) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(appliers))) {
            Ok(done) => done,
            Err(panic) => {
                *self = ProjectionIndex::with_parts(self.parts.len());
                std::panic::resume_unwind(panic)
            }
        };
        let mut counts = crate::backend::projector::CatchUp::default();
        for done in results {
            counts += done.counts;
            self.merge(done, base);
        }
        (counts, result)
    }

    /// Number the sessions an applier found into the index's, renumber what it applied if
    /// that changed their numbers, and take in the rest of what it left.
    fn merge(&mut self, done: Finished, base: u32) {
        let renumbered: Vec<u32> = done
            .new_sessions
            .into_iter()
            .map(|key| match self.sessions.get_index_of(&key) {
                Some(i) => i as u32,
                None => self.sessions.insert_full(key, SessionState::default()).0 as u32,
            })
            .collect();
        let renumber = |s: u32| s.checked_sub(base).map_or(s, |i| renumbered[i as usize]);
        let mut unfiled = done.unfiled;
        // The first applier merged numbers its sessions as the index does: no walk.
        if renumbered.iter().enumerate().any(|(i, s)| *s != base + i as u32) {
            for p in &done.parts {
                for state in self.parts[*p].values_mut() {
                    if let Some(w) = &mut state.winner {
                        w.session = renumber(w.session);
                    }
                    if let Some(extra) = &mut state.extra {
                        for o in &mut extra.others {
                            o.session = renumber(o.session);
                        }
                    }
                }
            }
            for u in &mut unfiled {
                u.0 = renumber(u.0);
            }
        }
        self.summaries
            .extend(done.summaries.into_iter().map(|(s, k)| (renumber(s), k)));
        self.unfiled.extend(unfiled);
        self.thawed.extend(done.thawed);
        self.entries += done.counts.applied;
        for (shard, seq) in done.positions {
            raise(&mut self.positions, shard, seq);
        }
    }

    fn session_no(&mut self, bot_id: &str, session_id: &str) -> u32 {
        // Rows of one session tend to come together: try the last one first, then look up
        // by borrowed key, allocating only for a new session.
        if let Some(last) = self.last_session {
            let ((b, s), _) = self.sessions.get_index(last as usize).expect("interned");
            if &**b == bot_id && &**s == session_id {
                return last;
            }
        }
        let no = match self.sessions.get_index_of(&SessionRef(bot_id, session_id)) {
            Some(i) => i as u32,
            None => {
                let key = (Box::<str>::from(bot_id), Box::<str>::from(session_id));
                self.sessions.insert_full(key, SessionState::default()).0 as u32
            }
        };
        self.last_session = Some(no);
        no
    }

    /// The state of every id the parts hold.
    fn held(&self) -> impl Iterator<Item = (&str, Cow<'_, IdState>)> {
        self.parts.iter().flatten().map(|(k, s)| (&**k, Cow::Borrowed(s)))
    }

    /// Every id's state: those the parts hold, then the frozen ones not thawed.
    fn all_states(&self) -> impl Iterator<Item = (&str, Cow<'_, IdState>)> {
        self.held().chain(
            self.frozen
                .states()
                .filter(|(b, _, _)| !self.thawed.contains(&(*b as u32)))
                .map(|(_, id, s)| (id, Cow::Owned(s))),
        )
    }

    /// The current state of `id`.
    fn state(&self, id: &str) -> Option<Cow<'_, IdState>> {
        let hash = self.hasher.hash_one(id);
        let part = &self.parts[part_of(hash, self.parts.len())];
        match part.raw_entry_v1().from_key_hashed_nocheck(hash, id).map(|(_, s)| s) {
            Some(s) => Some(Cow::Borrowed(s)),
            None => self.frozen.find(id).map(|b| Cow::Owned(self.frozen.state(b))),
        }
    }

    /// The highest seq applied per shard.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint(self.positions.iter().map(|(s, q)| (*s, *q)).collect())
    }

    /// The highest seq applied for `shard` (0 when none).
    pub fn position(&self, shard: crate::ids::ShardId) -> crate::ids::Seq {
        self.positions.get(&shard).copied().unwrap_or(0)
    }

    /// Make room for `ids` more record ids (a first scan knows roughly how many).
    pub fn reserve(&mut self, ids: usize) {
        // Ids spread evenly over the parts.
        let each = ids.div_ceil(self.parts.len());
        for part in &mut self.parts {
            part.reserve(each);
        }
    }

    /// Distinct entries applied.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// The live winner of `id`: its order key and where its backend can find it.
    pub fn live(&self, id: &str) -> Option<(OrderKey, RowRef)> {
        self.state(id).and_then(|s| s.live().map(|p| (p.key, p.at)))
    }

    /// File the `(session, id)` pairs applied since the last query.
    fn file(&mut self) {
        for (session, id) in std::mem::take(&mut self.unfiled) {
            self.sessions[session as usize].ids.push(id);
        }
    }

    /// The live records of one session, in contract order: keys and locations.
    pub fn session_keys(&mut self, bot_id: &str, session_id: &str) -> Vec<(OrderKey, RowRef)> {
        self.file();
        match self.sessions.get_index_of(&SessionRef(bot_id, session_id)) {
            Some(no) => self.session_keys_of(no),
            None => Vec::new(),
        }
    }

    /// Sessions of one bot with at least one live record, sorted by session id.
    pub fn sessions(&mut self, bot_id: &str) -> Vec<SessionSummary> {
        self.file();
        let mut out = Vec::new();
        for (no, ((b, s), _)) in self.sessions.iter().enumerate() {
            if &**b != bot_id {
                continue;
            }
            let keys = self.session_keys_of(no);
            if keys.is_empty() {
                continue;
            }
            out.push(SessionSummary {
                bot_id: b.to_string(),
                session_id: s.to_string(),
                records: keys.len() as u64,
                first_hlc: keys.iter().map(|k| k.0.hlc).min(),
                last_hlc: keys.iter().map(|k| k.0.hlc).max(),
            });
        }
        out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        out
    }

    fn session_keys_of(&self, no: usize) -> Vec<(OrderKey, RowRef)> {
        let mut keys: Vec<(OrderKey, RowRef)> = self.sessions[no]
            .ids
            .iter()
            .filter_map(|&i| {
                self.parts[(i & PART_MASK) as usize][(i >> PART_BITS) as usize]
                    .live()
                    .copied()
            })
            .chain(
                self.frozen
                    .session_ids(no)
                    .filter(|b| !self.thawed.contains(b))
                    .filter_map(|b| self.frozen.state(b as usize).live().copied()),
            )
            .filter(|p| p.session as usize == no)
            .map(|p| (p.key, p.at))
            .collect();
        keys.sort_by_key(|k| k.0);
        keys.dedup_by_key(|k| k.0);
        keys
    }

    /// The live records of one session in contract order, and which of them are summaries
    /// (rule 21): what a context view is chosen from.
    pub fn session_with_summaries(&mut self, bot_id: &str, session_id: &str) -> SummarisedSession {
        self.file();
        match self.sessions.get_index_of(&SessionRef(bot_id, session_id)) {
            Some(no) => self.summarised(no),
            None => SummarisedSession::default(),
        }
    }

    fn summarised(&self, no: usize) -> SummarisedSession {
        SummarisedSession {
            keys: self.session_keys_of(no),
            summaries: self.summaries_of(no as u32).collect(),
        }
    }

    fn summaries_of(&self, no: u32) -> impl Iterator<Item = OrderKey> + '_ {
        let from = OrderKey {
            hlc: Hlc::ZERO,
            shard: crate::ids::ShardId::from_bytes([0; 16]),
            seq: 0,
            epoch: 0,
        };
        self.summaries
            .range((no, from)..)
            .take_while(move |(s, _)| *s == no)
            .map(|(_, k)| *k)
    }

    /// Every session with a summary entry (the history checker's input).
    pub fn sessions_with_summaries(&mut self) -> Vec<SummarisedSession> {
        self.file();
        let mut nos: Vec<u32> = self.summaries.iter().map(|(s, _)| *s).collect();
        nos.dedup();
        nos.into_iter().map(|no| self.summarised(no as usize)).collect()
    }

    /// The highest HLC of any entry applied.
    pub fn max_hlc(&self) -> Hlc {
        self.all_states()
            .filter_map(|(_, s)| {
                s.winner
                    .iter()
                    .chain(s.others().iter())
                    .map(|p| p.key.hlc)
                    .chain(s.tombstones().iter().map(|k| k.hlc))
                    .max()
            })
            .max()
            .unwrap_or(Hlc::ZERO)
    }

    /// Counts that are pure functions of the entries applied.
    pub fn stats(&self) -> ProjectionStats {
        let mut stats = ProjectionStats {
            entries: self.entries,
            shards: self.positions.len() as u64,
            ids: (self.parts.iter().map(Ids::len).sum::<usize>() + self.frozen.len() - self.thawed.len()) as u64,
            ..Default::default()
        };
        let mut live_sessions = BTreeSet::new();
        for (_, state) in self.all_states() {
            let tomb = state.first_tombstone();
            if tomb.is_some() {
                stats.tombstoned += 1;
            }
            if let Some(p) = state.live() {
                stats.live += 1;
                live_sessions.insert(p.session);
            }
            let Some(w) = state.winner else { continue };
            for p in std::iter::once(&w).chain(state.others().iter()) {
                if tomb.is_some_and(|t| p.key > t) {
                    stats.writes_after_delete += 1;
                } else if p.key != w.key {
                    if p.hash == w.hash {
                        stats.duplicates += 1;
                    } else {
                        stats.divergent_puts += 1;
                    }
                }
            }
        }
        stats.sessions = live_sessions.len() as u64;
        stats
    }

    /// Conflicts of rules 6 and 7 (divergent puts, writes after delete).
    pub fn id_conflicts(&self) -> Vec<Conflict> {
        let mut out = Vec::new();
        for (id, state) in self.all_states() {
            state.conflicts(id, &mut out);
        }
        out
    }

    /// [`ProjectionIndex::id_conflicts`] of the ids `ids` only.
    pub(crate) fn id_conflicts_of<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<Conflict> {
        let mut out = Vec::new();
        for id in ids {
            if let Some(state) = self.state(id) {
                state.conflicts(id, &mut out);
            }
        }
        out
    }

    /// The positions `(seq, epoch)` of every entry of the shards `of`. A walk over every
    /// id held, in memory — over the live ids only when the snapshot the index was loaded
    /// from holds no entry of those shards (a check after a checkpoint in which only new
    /// writers wrote).
    pub(crate) fn positions_of(
        &self,
        of: &std::collections::HashSet<crate::ids::ShardId>,
    ) -> std::collections::HashMap<crate::ids::ShardId, Vec<(crate::ids::Seq, crate::ids::Epoch)>> {
        let mut out: std::collections::HashMap<_, Vec<_>> = of.iter().map(|s| (*s, Vec::new())).collect();
        if out.is_empty() {
            return out;
        }
        let states: Box<dyn Iterator<Item = (&str, Cow<'_, IdState>)>> =
            if of.iter().any(|s| self.frozen.holds_shard(*s)) {
                Box::new(self.all_states())
            } else {
                Box::new(self.held())
            };
        for (_, state) in states {
            let keys = state.winner.iter().chain(state.others()).map(|p| &p.key);
            for k in keys.chain(state.tombstones()) {
                if let Some(v) = out.get_mut(&k.shard) {
                    v.push((k.seq, k.epoch));
                }
            }
        }
        out
    }

    /// The canonical projection.
    pub fn projection(&self) -> Projection {
        let mut records = Vec::new();
        let mut tombstoned = Vec::new();
        for (id, state) in self.all_states() {
            if !state.tombstones().is_empty() {
                tombstoned.push(id.to_string());
            }
            if let Some(p) = state.live() {
                let ((bot, session), _) = self.sessions.get_index(p.session as usize).expect("interned");
                records.push(LiveRecord {
                    bot_id: bot.to_string(),
                    session_id: session.to_string(),
                    key: p.key,
                    id: id.to_string(),
                    content_hash: p.hash,
                });
            }
        }
        records.sort();
        tombstoned.sort();
        Projection {
            records,
            tombstoned,
            stats: self.stats(),
        }
    }
}

impl ProjectionIndex {
    /// What a snapshot stores of this index (`backend::frozen`): every id, frozen or not,
    /// in id order.
    pub(crate) fn freeze(&mut self) -> (Shape, Vec<u8>) {
        self.file();
        let mut ids: Vec<(&str, Cow<'_, IdState>)> = self.all_states().collect();
        ids.sort_unstable_by(|a, b| a.0.cmp(b.0));
        frozen::write(Tables {
            sessions: self.sessions.keys().cloned().collect(),
            positions: self.positions.iter().map(|(s, q)| (*s, *q)).collect(),
            entries: self.entries,
            summaries: self.summaries.iter().copied().collect(),
            ids,
        })
    }

    /// The index a snapshot stored, its ids frozen where they lie (`bytes` from `base`), or
    /// what is wrong with it; and what `verify` says of `bytes` (see [`Frozen::load`]).
    pub(crate) fn from_frozen(
        shape: Shape,
        bytes: Vec<u8>,
        base: usize,
        verify: impl FnOnce(&[u8]) -> bool + Send,
    ) -> (bool, Result<Self, String>) {
        let (verified, frozen) = Frozen::load(&shape, bytes, base, verify);
        (verified, frozen.and_then(|frozen| Self::around(shape, frozen)))
    }

    fn around(shape: Shape, frozen: Frozen) -> Result<Self, String> {
        let mut index = ProjectionIndex::new();
        for key in shape.sessions {
            if index.sessions.contains_key(&key) {
                return Err(format!("session {key:?} twice"));
            }
            index.sessions.insert(key, SessionState::default());
        }
        for (s, q) in shape.positions {
            let shard = crate::ids::ShardId::from_bytes(shape.shards[s as usize]);
            index.positions.insert(shard, q);
        }
        index.entries = shape.entries;
        for (session, hlc, shard, seq, epoch) in shape.summaries {
            if session as usize >= index.sessions.len() {
                return Err(format!("a summary names session {session}, which the snapshot has not"));
            }
            let shard = crate::ids::ShardId::from_bytes(shard);
            index.summaries.insert((
                session,
                OrderKey {
                    hlc: Hlc(hlc),
                    shard,
                    seq,
                    epoch,
                },
            ));
        }
        index.frozen = std::sync::Arc::new(frozen);
        Ok(index)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::entry::{Entry, OrderKey};
    use crate::ids::WriterId;
    use crate::record::{Body, Kind, Record};
    use crate::testing::model;
    use proptest::prelude::*;

    /// Random histories, including stale epochs, gaps and corrupt entries, give the same
    /// projection and conflicts through the index/checker as through the reference model.
    pub(crate) fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
        let one = (0u8..3, 1u64..8, 1u64..3, 0u64..20, 0u8..6, 0u8..3, 0u8..8, 0u8..2);
        proptest::collection::vec(one, 0..40).prop_map(|raw| {
            raw.into_iter()
                .map(|(w, seq, epoch, hlc, id, text, op, sess)| {
                    let shard = WriterId::new(format!("w{w}")).unwrap().shard_id();
                    let mut record =
                        Record::text(format!("id{id}"), "bot", format!("s{sess}"), "user", format!("t{text}"));
                    if op == 0 {
                        record.kind = Kind::Tombstone;
                    }
                    let mut content_hash = record.content_hash();
                    if op == 1 && text == 0 {
                        // a corrupt entry: stored hash of other content
                        content_hash = Record::text("other", "b", "s", "r", "x").content_hash();
                    }
                    if op == 2 {
                        record.body = Body::Bytes(vec![text; 3]);
                        content_hash = record.content_hash();
                    }
                    // A damaged clock: far past the plausible horizon, still ordered.
                    let hlc = if op == 3 { Hlc(u64::MAX - hlc) } else { Hlc(hlc) };
                    Entry {
                        shard,
                        seq,
                        epoch,
                        hlc,
                        record,
                        content_hash,
                        purged: false,
                    }
                })
                .collect()
        })
    }

    /// The first entry at each position (backends never store two at one).
    pub(crate) fn unique_positions(entries: Vec<Entry>) -> Vec<Entry> {
        let mut seen = std::collections::HashSet::new();
        entries
            .into_iter()
            .filter(|e| seen.insert((e.shard, e.seq, e.epoch)))
            .collect()
    }

    pub(crate) fn index_of(entries: &[Entry]) -> ProjectionIndex {
        let mut idx = ProjectionIndex::new();
        for e in entries {
            idx.apply(IndexRow::of(e));
        }
        idx
    }

    /// `n` puts, entry `i` of id `id{i % ids}` in session `s{i % sessions}`, in one of three
    /// shards at seq `i + 1`.
    fn puts(n: u64, ids: u64, sessions: u64) -> Vec<Entry> {
        (0..n)
            .map(|i| {
                let record = Record::text(
                    format!("id{}", i % ids),
                    "bot",
                    format!("s{}", i % sessions),
                    "user",
                    "t",
                );
                Entry {
                    shard: WriterId::new(format!("w{}", i % 3)).unwrap().shard_id(),
                    seq: i + 1,
                    epoch: 1,
                    hlc: Hlc(i),
                    content_hash: record.content_hash(),
                    record,
                    purged: false,
                }
            })
            .collect()
    }

    /// `idx` answers as one thread applying `entries` in order would.
    fn answers_as_one_pass(idx: &mut ProjectionIndex, entries: &[Entry], sessions: u64) {
        let mut whole = index_of(entries);
        assert_eq!(idx.projection().canonical_json(), whole.projection().canonical_json());
        for s in 0..sessions {
            let session = format!("s{s}");
            assert_eq!(idx.session_keys("bot", &session), whole.session_keys("bot", &session));
        }
    }

    /// An error on one thread stops the apply and is returned; what was applied until then
    /// is merged whole: the rest applied afterwards gives the index of everything.
    #[test]
    fn an_apply_that_fails_leaves_a_whole_index() {
        let entries = puts(400, 150, 23);
        for threads in [1, 2, 4] {
            let mut idx = ProjectionIndex::with_parts(4);
            let batches: Vec<&[Entry]> = entries.chunks(10).collect();
            let (counts, result) = idx.apply_in_parallel(threads, batches, |b, a| {
                if b[0].seq > 200 {
                    return Err(b[0].seq);
                }
                b.iter().for_each(|e| a.apply(IndexRow::of(e)));
                Ok(())
            });
            assert_eq!(result, Err(201), "{threads} threads");
            assert_eq!(counts.applied, 200, "{threads} threads");
            assert_eq!(idx.entries(), 200);
            for e in &entries {
                idx.apply(IndexRow::of(e));
            }
            answers_as_one_pass(&mut idx, &entries, 23);
        }
    }

    /// A panic on an applying thread reaches the caller, and the index it leaves is empty,
    /// not torn: applying everything again gives the index of everything.
    #[test]
    fn a_panic_while_applying_leaves_an_empty_index() {
        let entries = puts(300, 110, 17);
        for threads in [1, 3] {
            let mut idx = ProjectionIndex::with_parts(3);
            for e in &entries[..50] {
                idx.apply(IndexRow::of(e));
            }
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                idx.apply_in_parallel(threads, entries[50..].chunks(25), |b, a| {
                    assert!(b[0].seq <= 200, "a bug on an applying thread");
                    b.iter().for_each(|e| a.apply(IndexRow::of(e)));
                    Ok::<(), ()>(())
                })
            }));
            assert!(panicked.is_err(), "{threads} threads");
            assert_eq!(idx.entries(), 0, "{threads} threads");
            assert_eq!(idx.parts(), 3);
            for e in &entries {
                idx.apply(IndexRow::of(e));
            }
            answers_as_one_pass(&mut idx, &entries, 17);
        }
    }

    proptest! {
        #[test]
        fn index_matches_reference_model(entries in arb_entries()) {
            // The model keeps the first of repeated positions; the index must too, so feed
            // unique positions only (backends never store two entries at one position).
            let entries = unique_positions(entries);
            let mut idx = index_of(&entries);
            let model = model::project(&entries);
            prop_assert_eq!(idx.projection().canonical_json(), model.canonical_json());

            let mut reversed = entries.clone();
            reversed.reverse();
            prop_assert_eq!(index_of(&reversed).projection().canonical_json(), model.canonical_json());

            for (bot, session) in [("bot", "s0"), ("bot", "s1")] {
                let view: Vec<OrderKey> = model::session_view(&entries, bot, session).iter().map(|e| e.key()).collect();
                let keys: Vec<OrderKey> = idx.session_keys(bot, session).into_iter().map(|k| k.0).collect();
                prop_assert_eq!(keys, view);
            }
        }

        /// Invariant 3: applying an entry the index holds changes nothing (backends may
        /// read an entry twice: from a generation and again from the WAL).
        #[test]
        fn applying_an_entry_again_changes_nothing(entries in arb_entries()) {
            let entries = unique_positions(entries);
            let once = index_of(&entries);
            let mut twice = index_of(&entries);
            for e in entries.iter().rev() {
                prop_assert!(!twice.apply(IndexRow::of(e)), "an entry held was applied again");
            }
            prop_assert_eq!(twice.projection().canonical_json(), once.projection().canonical_json());
            prop_assert_eq!(twice.entries(), once.entries());
        }

        /// Rows applied in parallel, one thread per part, in batches of any size, onto an
        /// index that already holds some (so some sessions are known and some are found by
        /// several threads at once): the same index as one thread applying them in order.
        #[test]
        fn applying_in_parallel_equals_one_pass(
            entries in arb_entries(),
            sessions in proptest::collection::vec(0u8..6, 40),
            split in 0usize..40,
            parts in 1usize..5,
            threads in 1usize..5,
            batch in 1usize..6,
            routed in any::<bool>(),
        ) {
            // More sessions than the shared strategy draws, so that threads find new ones.
            let mut entries = unique_positions(entries);
            for (e, s) in entries.iter_mut().zip(&sessions) {
                e.record.session_id = format!("s{s}");
            }
            let split = split.min(entries.len());
            let mut one = index_of(&entries);
            let mut parallel = ProjectionIndex::with_parts(parts);
            for e in &entries[..split] {
                parallel.apply(IndexRow::of(e));
            }
            let (counts, result) = if routed {
                // Each row sent to its thread's queue, its id owned by the applier.
                let router = parallel.router(threads);
                let (sends, queues): (Vec<_>, Vec<_>) =
                    (0..router.threads()).map(|_| std::sync::mpsc::channel::<Vec<&Entry>>()).unzip();
                for b in entries[split..].chunks(batch) {
                    let mut routed = vec![Vec::new(); router.threads()];
                    b.iter().for_each(|e| routed[router.thread_of(&e.record.id)].push(e));
                    routed.into_iter().zip(&sends).for_each(|(r, s)| s.send(r).unwrap());
                }
                drop(sends);
                parallel.apply_routed(queues, |b, a| {
                    b.into_iter().for_each(|e| a.apply_owned(IndexRow { id: "", ..IndexRow::of(e) }, e.record.id.as_str().into()));
                    Ok::<(), ()>(())
                })
            } else {
                let rest: Vec<&[Entry]> = entries[split..].chunks(batch).collect();
                parallel.apply_in_parallel(threads, rest, |b, a| {
                    b.iter().for_each(|e| a.apply(IndexRow::of(e)));
                    Ok::<(), ()>(())
                })
            };
            prop_assert_eq!(result, Ok(()));
            prop_assert_eq!(counts.read, (entries.len() - split) as u64);
            prop_assert_eq!(counts.applied, (entries.len() - split) as u64);
            prop_assert_eq!(parallel.projection().canonical_json(), one.projection().canonical_json());
            prop_assert_eq!(parallel.stats(), one.stats());
            prop_assert_eq!(parallel.checkpoint(), one.checkpoint());
            prop_assert_eq!(parallel.entries(), one.entries());
            for s in 0..6 {
                let session = format!("s{s}");
                prop_assert_eq!(parallel.session_keys("bot", &session), one.session_keys("bot", &session));
            }
            prop_assert_eq!(parallel.sessions("bot"), one.sessions("bot"));
            let conflicts = |i: &ProjectionIndex| crate::projection::canonical_conflicts(i.id_conflicts());
            prop_assert_eq!(conflicts(&parallel), conflicts(&one));
            // Nothing applies twice afterwards, on either path.
            for e in &entries {
                prop_assert!(!parallel.apply(IndexRow::of(e)));
            }
        }

        #[test]
        fn incremental_application_equals_one_pass(entries in arb_entries(), split in 0usize..40) {
            let entries = unique_positions(entries);
            let split = split.min(entries.len());
            let mut idx = index_of(&entries[..split]);
            let _ = idx.projection();
            for e in &entries[split..] {
                idx.apply(IndexRow::of(e));
            }
            prop_assert_eq!(idx.projection().canonical_json(), index_of(&entries).projection().canonical_json());
        }
    }
}
