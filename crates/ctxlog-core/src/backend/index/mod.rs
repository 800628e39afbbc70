//! The incremental projection index that backends feed while they scan.
//!
//! It holds only what the projection needs per entry — id, kind, content hash, order key
//! and session — never bodies. Applying rows is idempotent and order-independent: the
//! result depends only on the set of rows applied, so backends may read shards in any
//! order, and a refresh may apply entries that sort before ones already seen (per-writer
//! logs commit out of order).
//!
//! Names:
//! - an *id state* ([`super::id_state`]) is what the index keeps per record id: the
//!   winning put, the other puts, the tombstones; it is keyed by the id's *key*, its
//!   namespace (the bot, or the whole store in formats 1 and 2: the index's [`IdScope`])
//!   and the id;
//! - a *part* is a share of the ids, picked by the hash of the id; parts are what threads
//!   apply rows to at once (`parallel`), each part owned by one thread;
//! - a *session number* names a `(bot, session)` in the index (`apply::session_no`, one
//!   numbering for the index and its appliers); an *id number* names an id by its part and
//!   its place there ([`id_no`]);
//! - *unfiled* pairs `(session, id number)` wait to be filed into their session's list
//!   until a query needs them;
//! - *frozen* ids are those a snapshot held, read in place; an id a new row touches is
//!   *thawed* (copied into its part).
//!
//! `apply` is the one place a row changes an id; `parallel` the appliers and their merge;
//! `query` what the index answers; freezing is here.

mod apply;
mod parallel;
mod query;
#[cfg(test)]
pub(crate) mod tests;

use std::borrow::Cow;
use std::collections::BTreeSet;

use indexmap::IndexMap;
use indexmap::map::raw_entry_v1::RawEntryApiV1;

use self::apply::{Part, apply_to, session_no};
pub use self::parallel::{PartApplier, Router};
pub use super::id_state::RowRef;
use super::id_state::{self, Hasher, IdState, Put};
use crate::backend::frozen::{self, Frozen, Shape, Tables};
use crate::entry::OrderKey;
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::IdScope;
use crate::record::Kind;

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

/// What one catch-up did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Entries read from storage.
    pub read: u64,
    /// Entries the index did not hold yet.
    pub applied: u64,
}

impl std::ops::AddAssign for CatchUp {
    fn add_assign(&mut self, other: CatchUp) {
        self.read += other.read;
        self.applied += other.applied;
    }
}

#[derive(Clone, Debug, Default)]
struct SessionState {
    /// Ids that have (or had) a put in this session. Filtered at read time by the id's
    /// current winner.
    ids: Vec<u32>,
}

/// One part of an index's ids (see [`ProjectionIndex::apply_in_parallel`]), by key
/// (`id_state::key`).
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
    /// Which ids are one record: the store's format says (rule 22).
    scope: IdScope,
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
    /// Every link entry applied (fork or hide, live or not), by session number (rule 25):
    /// a session without any is read without reading a body.
    links: Summaries,
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
    /// Which of the session's entries are links (forks and hides, live or not), sorted.
    pub links: Vec<OrderKey>,
}

impl SummarisedSession {
    /// Whether the entry at `key` is a summary.
    pub fn is_summary(&self, key: &OrderKey) -> bool {
        self.summaries.binary_search(key).is_ok()
    }

    /// Whether the entry at `key` is a link (rule 25).
    pub fn is_link(&self, key: &OrderKey) -> bool {
        self.links.binary_search(key).is_ok()
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
        Self::with_parts(
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            IdScope::default(),
        )
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

/// Raise the highest seq applied for `shard` to `seq`.
fn raise(positions: &mut Positions, shard: crate::ids::ShardId, seq: crate::ids::Seq) {
    let pos = positions.entry(shard).or_insert(0);
    *pos = (*pos).max(seq);
}

/// The part of `parts` an id of hash `hash` is in. Not the hash's low bits (they pick the
/// id's bucket in its part) nor its high ones (its tag there).
fn part_of(hash: u64, parts: usize) -> usize {
    ((hash >> 32) as usize) % parts
}

impl ProjectionIndex {
    /// An empty index with a part per core, its ids scoped by bot.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index with a part per core, its ids in the namespaces of `scope`.
    pub fn scoped(scope: IdScope) -> Self {
        ProjectionIndex {
            scope,
            ..Self::default()
        }
    }

    /// Which ids are one record in this index.
    pub fn scope(&self) -> IdScope {
        self.scope
    }

    /// An empty index whose ids are split into `parts` parts (at least 1, at most 8).
    pub fn with_parts(parts: usize, scope: IdScope) -> Self {
        let hasher = Hasher::default();
        ProjectionIndex {
            scope,
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
            links: Summaries::new(),
        }
    }

    /// How many parts the index's ids are split into.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Apply one entry. Returns false when the index already held it.
    pub fn apply(&mut self, row: IndexRow<'_>) -> bool {
        let session = session_no(&mut self.sessions, &mut self.last_session, row.bot_id, row.session_id);
        let namespace = self.scope.namespace(row.bot_id);
        let hash = id_state::hash_of(&self.hasher, namespace, row.id);
        let no = part_of(hash, self.parts.len());
        let part = Part {
            ids: &mut self.parts[no],
            no,
            frozen: &self.frozen,
            thawed: &mut self.thawed,
            unfiled: &mut self.unfiled,
        };
        if !apply_to(part, hash, namespace, &row, session) {
            return false;
        }
        self.entries += 1;
        raise(&mut self.positions, row.key.shard, row.key.seq);
        if row.kind == Kind::Summary {
            self.summaries.insert((session, row.key));
        }
        if row.kind.is_link() {
            self.links.insert((session, row.key));
        }
        true
    }

    /// File the `(session, id)` pairs applied since the last query.
    fn file(&mut self) {
        for (session, id) in std::mem::take(&mut self.unfiled) {
            self.sessions[session as usize].ids.push(id);
        }
    }

    /// The state of every id the parts hold, by key.
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

    /// The current state of `id` of bot `bot_id`.
    fn state(&self, bot_id: &str, id: &str) -> Option<Cow<'_, IdState>> {
        self.state_in(self.scope.namespace(bot_id), id)
    }

    /// The current state of `id` in `namespace`.
    fn state_in(&self, namespace: &str, id: &str) -> Option<Cow<'_, IdState>> {
        let hash = id_state::hash_of(&self.hasher, namespace, id);
        let part = &self.parts[part_of(hash, self.parts.len())];
        match part
            .raw_entry_v1()
            .from_hash(hash, |k| id_state::is_key(k, namespace, id))
            .map(|(_, s)| s)
        {
            Some(s) => Some(Cow::Borrowed(s)),
            None if self.frozen.len() > 0 => self
                .frozen
                .find(&id_state::key(namespace, id))
                .map(|b| Cow::Owned(self.frozen.state(b))),
            None => None,
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
            scope: self.scope,
            sessions: self.sessions.keys().cloned().collect(),
            positions: self.positions.iter().map(|(s, q)| (*s, *q)).collect(),
            entries: self.entries,
            summaries: self.summaries.iter().copied().collect(),
            links: self.links.iter().copied().collect(),
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
        let scope = if shape.ids_by_bot { IdScope::Bot } else { IdScope::Store };
        let mut index = ProjectionIndex::scoped(scope);
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
        for (what, list) in [("a summary", shape.summaries), ("a link", shape.links)] {
            for (session, hlc, shard, seq, epoch) in list {
                if session as usize >= index.sessions.len() {
                    return Err(format!("{what} names session {session}, which the snapshot has not"));
                }
                let shard = crate::ids::ShardId::from_bytes(shard);
                let key = OrderKey {
                    hlc: Hlc(hlc),
                    shard,
                    seq,
                    epoch,
                };
                match what {
                    "a summary" => index.summaries.insert((session, key)),
                    _ => index.links.insert((session, key)),
                };
            }
        }
        index.frozen = std::sync::Arc::new(frozen);
        Ok(index)
    }
}
