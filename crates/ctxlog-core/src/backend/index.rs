//! The incremental projection index that backends feed while they scan.
//!
//! It holds only what the projection needs per entry — id, kind, content hash, order key
//! and session — never bodies. Applying rows is idempotent and order-independent: the
//! result depends only on the set of rows applied, so backends may read shards in any
//! order, and a refresh may apply entries that sort before ones already seen (per-writer
//! logs commit out of order).

use std::borrow::Cow;
use std::collections::BTreeSet;

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

/// The projection of every row applied so far.
#[derive(Clone, Debug, Default)]
pub struct ProjectionIndex {
    ids: IndexMap<Box<str>, IdState, Hasher>,
    sessions: IndexMap<(Box<str>, Box<str>), SessionState, Hasher>,
    entries: u64,
    /// Highest seq applied per shard (a `Checkpoint` on demand: this is on the hot path).
    positions: std::collections::HashMap<crate::ids::ShardId, crate::ids::Seq, Hasher>,
    last_session: Option<u32>,
    /// `(session, id)` pairs not yet filed into their session's list. Filed on the first
    /// query that needs them: while scanning, one sequential append per put instead of a
    /// random one into one of thousands of lists.
    unfiled: Vec<(u32, u32)>,
    /// The ids a snapshot held, as it held them (empty for an index built from rows). Never
    /// changed: the first row that touches one of its ids copies that id's state into `ids`
    /// (and marks it `thawed`), so a snapshot loads without hashing or allocating per id.
    frozen: std::sync::Arc<Frozen>,
    /// Frozen ids copied into `ids`: their frozen state is stale.
    thawed: std::collections::HashSet<u32, Hasher>,
}

/// A borrowed session key that hashes and compares like the owned `(Box<str>, Box<str>)`.
#[derive(Hash)]
struct SessionRef<'a>(&'a str, &'a str);

impl indexmap::Equivalent<(Box<str>, Box<str>)> for SessionRef<'_> {
    fn equivalent(&self, key: &(Box<str>, Box<str>)) -> bool {
        self.0 == &*key.0 && self.1 == &*key.1
    }
}

impl ProjectionIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Apply one entry. Returns false when the index already held it.
    pub fn apply(&mut self, row: IndexRow<'_>) -> bool {
        self.apply_inner(row, None)
    }

    /// [`ProjectionIndex::apply`] for a row whose id the caller owns: the index keeps `id`
    /// instead of copying it, and ignores `row.id`.
    pub fn apply_owned(&mut self, row: IndexRow<'_>, id: Box<str>) -> bool {
        self.apply_inner(row, Some(id))
    }

    fn apply_inner(&mut self, row: IndexRow<'_>, owned: Option<Box<str>>) -> bool {
        let session = self.session_no(row.bot_id, row.session_id);
        let id: &str = owned.as_deref().unwrap_or(row.id);
        if self.frozen.len() > 0 && !self.ids.contains_key(id) {
            self.thaw(id);
        }
        // One hash per row: most ids are new, and a lookup-then-insert would hash twice.
        let (id_no, state) = match self.ids.raw_entry_mut_v1().from_key(id) {
            RawEntryMut::Occupied(e) => (e.index() as u32, e.into_mut()),
            RawEntryMut::Vacant(e) => {
                let i = e.index() as u32;
                let key = owned.unwrap_or_else(|| row.id.into());
                (i, e.insert(key, IdState::default()).1)
            }
        };
        if state.has(&row.key) {
            return false;
        }
        match row.kind {
            Kind::Tombstone => state.extra().tombstones.push(row.key),
            Kind::Put => {
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
                    self.unfiled.push((session, id_no));
                }
            }
        }
        self.entries += 1;
        let pos = self.positions.entry(row.key.shard).or_insert(0);
        *pos = (*pos).max(row.key.seq);
        true
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

    /// Copy the frozen state of `id` (if the snapshot held it) into `ids`, filed under each
    /// session it has a put in, and mark the frozen copy stale.
    fn thaw(&mut self, id: &str) {
        let Some(b) = self.frozen.find(id) else { return };
        let state = self.frozen.state(b);
        let mut sessions: Vec<u32> = state.sessions().collect();
        sessions.sort_unstable();
        sessions.dedup();
        let (no, _) = self.ids.insert_full(id.into(), state);
        self.unfiled.extend(sessions.into_iter().map(|s| (s, no as u32)));
        self.thawed.insert(b as u32);
    }

    /// Every id's state: those in `ids`, then the frozen ones not thawed.
    fn all_states(&self) -> impl Iterator<Item = (&str, Cow<'_, IdState>)> {
        self.ids.iter().map(|(k, s)| (&**k, Cow::Borrowed(s))).chain(
            self.frozen
                .states()
                .filter(|(b, _, _)| !self.thawed.contains(&(*b as u32)))
                .map(|(_, id, s)| (id, Cow::Owned(s))),
        )
    }

    /// The current state of `id`.
    fn state(&self, id: &str) -> Option<Cow<'_, IdState>> {
        match self.ids.get(id) {
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
        self.ids.reserve(ids);
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
            .filter_map(|&i| self.ids[i as usize].live().copied())
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
            ids: (self.ids.len() + self.frozen.len() - self.thawed.len()) as u64,
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
                Box::new(self.ids.iter().map(|(k, s)| (&**k, Cow::Borrowed(s))))
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
            // The owned-id path (what SQLite feeds) is the same function.
            let mut owned = ProjectionIndex::new();
            for e in &entries {
                prop_assert!(owned.apply_owned(IndexRow::of(e), e.record.id.as_str().into()));
            }
            for e in &entries {
                prop_assert!(!owned.apply_owned(IndexRow::of(e), e.record.id.as_str().into()));
            }
            prop_assert_eq!(owned.projection().canonical_json(), once.projection().canonical_json());
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
