//! The incremental projection index that backends feed while they scan.
//!
//! It holds only what the projection needs per entry — id, kind, content hash, order key
//! and session — never bodies. Applying rows is idempotent and order-independent: the
//! result depends only on the set of rows applied, so backends may read shards in any
//! order, and a refresh may apply entries that sort before ones already seen (per-writer
//! logs commit out of order).

use std::collections::BTreeSet;

use indexmap::IndexMap;
use indexmap::map::raw_entry_v1::{RawEntryApiV1, RawEntryMut};

/// A fast keyed hasher, randomly seeded per map (ids are caller-chosen, so not a fixed seed).
type Hasher = foldhash::fast::RandomState;

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
struct Put {
    key: OrderKey,
    hash: ContentHash,
    session: u32,
    at: RowRef,
}

/// One record id. Small on purpose (a first scan holds one per id): what only a few ids
/// have lives behind `extra`.
#[derive(Clone, Debug, Default)]
struct IdState {
    /// The earliest `Put`.
    winner: Option<Put>,
    extra: Option<Box<Extra>>,
}

#[derive(Clone, Debug, Default)]
struct Extra {
    /// Every other `Put` (retries and divergent writes).
    others: Vec<Put>,
    /// Every `Tombstone`.
    tombstones: Vec<OrderKey>,
}

impl IdState {
    fn others(&self) -> &[Put] {
        self.extra.as_ref().map_or(&[], |e| &e.others)
    }

    fn tombstones(&self) -> &[OrderKey] {
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

    fn sessions(&self) -> impl Iterator<Item = u32> + '_ {
        self.winner.iter().chain(self.others().iter()).map(|p| p.session)
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
        self.ids.get(id).and_then(|s| s.live()).map(|p| (p.key, p.at))
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
            .filter_map(|&i| self.ids[i as usize].live())
            .filter(|p| p.session as usize == no)
            .map(|p| (p.key, p.at))
            .collect();
        keys.sort_by_key(|k| k.0);
        keys.dedup_by_key(|k| k.0);
        keys
    }

    /// The highest HLC of any entry applied.
    pub fn max_hlc(&self) -> Hlc {
        self.ids
            .values()
            .flat_map(|s| {
                s.winner
                    .iter()
                    .chain(s.others().iter())
                    .map(|p| p.key.hlc)
                    .chain(s.tombstones().iter().map(|k| k.hlc))
            })
            .max()
            .unwrap_or(Hlc::ZERO)
    }

    /// Counts that are pure functions of the entries applied.
    pub fn stats(&self) -> ProjectionStats {
        let mut stats = ProjectionStats {
            entries: self.entries,
            shards: self.positions.len() as u64,
            ids: self.ids.len() as u64,
            ..Default::default()
        };
        let mut live_sessions = BTreeSet::new();
        for state in self.ids.values() {
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
        for (id, state) in &self.ids {
            if state.extra.is_none() {
                continue;
            }
            let tomb = state.first_tombstone();
            let Some(w) = state.winner else { continue };
            for p in std::iter::once(&w).chain(state.others().iter()) {
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
        out
    }

    /// The canonical projection.
    pub fn projection(&self) -> Projection {
        let mut records = Vec::new();
        let mut tombstoned = Vec::new();
        for (id, state) in &self.ids {
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

/// The index as a snapshot stores it (`backend::snapshot`): ids and sessions in their
/// interned order, so that the numbers that refer to them stay valid.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct IndexImage {
    ids: Vec<IdImage>,
    sessions: Vec<SessionImage>,
    entries: u64,
    positions: Vec<([u8; 16], u64)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct IdImage {
    id: Box<str>,
    winner: Option<PutImage>,
    others: Vec<PutImage>,
    tombstones: Vec<KeyImage>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SessionImage {
    bot: Box<str>,
    session: Box<str>,
    ids: Vec<u32>,
}

#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
struct PutImage {
    key: KeyImage,
    hash: [u8; 32],
    session: u32,
    at: (u64, u64),
}

#[derive(Clone, Copy, serde::Serialize, serde::Deserialize)]
struct KeyImage {
    hlc: u64,
    shard: [u8; 16],
    seq: u64,
    epoch: u64,
}

impl KeyImage {
    fn of(k: OrderKey) -> Self {
        KeyImage {
            hlc: k.hlc.0,
            shard: *k.shard.as_bytes(),
            seq: k.seq,
            epoch: k.epoch,
        }
    }

    fn key(self) -> OrderKey {
        OrderKey {
            hlc: Hlc(self.hlc),
            shard: crate::ids::ShardId::from_bytes(self.shard),
            seq: self.seq,
            epoch: self.epoch,
        }
    }
}

impl PutImage {
    fn of(p: &Put) -> Self {
        PutImage {
            key: KeyImage::of(p.key),
            hash: p.hash.0,
            session: p.session,
            at: (p.at.0, p.at.1),
        }
    }

    fn put(self) -> Put {
        Put {
            key: self.key.key(),
            hash: ContentHash(self.hash),
            session: self.session,
            at: RowRef(self.at.0, self.at.1),
        }
    }
}

#[cfg(test)]
impl IndexImage {
    /// Point the first put at a session that does not exist (a crafted snapshot).
    pub(crate) fn break_a_session_number(&mut self) {
        let n = self.sessions.len() as u32;
        if let Some(p) = self.ids.iter_mut().find_map(|i| i.winner.as_mut()) {
            p.session = n + 7;
        }
    }
}

impl ProjectionIndex {
    /// What a snapshot stores of this index.
    pub(crate) fn image(&mut self) -> IndexImage {
        self.file();
        IndexImage {
            ids: self
                .ids
                .iter()
                .map(|(id, s)| IdImage {
                    id: id.clone(),
                    winner: s.winner.as_ref().map(PutImage::of),
                    others: s.others().iter().map(PutImage::of).collect(),
                    tombstones: s.tombstones().iter().map(|k| KeyImage::of(*k)).collect(),
                })
                .collect(),
            sessions: self
                .sessions
                .iter()
                .map(|((bot, session), st)| SessionImage {
                    bot: bot.clone(),
                    session: session.clone(),
                    ids: st.ids.clone(),
                })
                .collect(),
            entries: self.entries,
            positions: self.positions.iter().map(|(s, q)| (*s.as_bytes(), *q)).collect(),
        }
    }

    /// The index a snapshot stored, or what is wrong with it. Every number that refers to
    /// an id or a session is checked, so that a crafted snapshot cannot make a query panic.
    pub(crate) fn from_image(image: IndexImage) -> Result<Self, String> {
        let sessions = image.sessions.len();
        let ids = image.ids.len();
        let too_many = |what: &str, n: usize| format!("{what} {n} out of range");
        let mut index = ProjectionIndex::new();
        index.ids.reserve(ids);
        let mut entries = 0u64;
        for s in image.sessions {
            if let Some(&i) = s.ids.iter().find(|&&i| i as usize >= ids) {
                return Err(too_many("id number", i as usize));
            }
            let key = (s.bot, s.session);
            if index.sessions.contains_key(&key) {
                return Err(format!("session {:?} twice", key));
            }
            index.sessions.insert(key, SessionState { ids: s.ids });
        }
        for i in image.ids {
            let puts = i.winner.iter().chain(i.others.iter());
            if let Some(p) = puts.clone().find(|p| p.session as usize >= sessions) {
                return Err(too_many("session number", p.session as usize));
            }
            if i.winner.is_none() && !i.others.is_empty() {
                return Err(format!("id {:?} has puts but no winner", i.id));
            }
            entries += (puts.count() + i.tombstones.len()) as u64;
            let extra = (!i.others.is_empty() || !i.tombstones.is_empty()).then(|| {
                Box::new(Extra {
                    others: i.others.into_iter().map(PutImage::put).collect(),
                    tombstones: i.tombstones.into_iter().map(KeyImage::key).collect(),
                })
            });
            let state = IdState {
                winner: i.winner.map(PutImage::put),
                extra,
            };
            if index.ids.insert(i.id.clone(), state).is_some() {
                return Err(format!("id {:?} twice", i.id));
            }
        }
        if entries != image.entries {
            return Err(format!("{entries} entries held, {} counted", image.entries));
        }
        index.entries = entries;
        index.positions = image
            .positions
            .into_iter()
            .map(|(s, q)| (crate::ids::ShardId::from_bytes(s), q))
            .collect();
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
