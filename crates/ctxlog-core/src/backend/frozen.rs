//! The part of a projection index that a snapshot holds, used where it lies: fixed-width
//! records in the snapshot's own bytes, read field by field when a query or a new row needs
//! one id. Loading a snapshot therefore allocates nothing per id and decodes nothing up
//! front; it checks every record once (a linear pass without allocation), so that a crafted
//! snapshot whose checksum matches can neither make a query panic nor hide an id.
//!
//! Sections, in this order, all integers little-endian, their sizes given by [`Shape`]:
//!
//! | section | size | what |
//! |---|---|---|
//! | arena | `arena` bytes | every id's UTF-8 bytes, ids sorted, back to back |
//! | offsets | `(ids + 1) × 4` | where each id starts in the arena, then the arena's end |
//! | winners | `ids × put` | each id's earliest put (`session = u32::MAX`: none) |
//! | extras | `extras × 28` | `(id, others start, others count, tombstones start, count, embeddings start, count)`, ids ascending |
//! | others | `others × put` | the other puts, per id in the order `extras` lists them |
//! | tombstones | `tombstones × 28` | the tombstones' order keys, likewise |
//! | embeddings | `embeddings × 28` | the embeddings' order keys (rule 27), likewise |
//! | session starts | `(sessions + 1) × 4` | where each session's list starts in the next section |
//! | session ids | `session_ids × 4` | per session, the ids with a put in it |
//!
//! Summary entries (rule 21) are few: the shape lists them.
//!
//! A put is `hlc u64, shard u32, seq u64, epoch u64, session u32`, then (only when the
//! snapshot's rows carry locations, `with_at`) `at u64, u64`, then the 32-byte content hash.
//! An order key is the first four fields. Shards are numbers into the shape's shard table.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::backend::id_state::{Extra, IdState, Put, RowRef};
use crate::entry::OrderKey;
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::ShardId;

const KEY: usize = 28;
const EXTRA: usize = 28;
const NO_SESSION: u32 = u32::MAX;

/// The counts that place a snapshot's sections, and the small tables beside them.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Shape {
    /// Whether ids are scoped by bot (format 3) or store-wide (formats 1, 2): the ids in
    /// the arena are keys in the index's namespaces (`id_state::key`).
    pub(crate) ids_by_bot: bool,
    pub(crate) ids: u64,
    pub(crate) arena: u64,
    pub(crate) extras: u64,
    pub(crate) others: u64,
    pub(crate) tombstones: u64,
    /// Embedding entries (rule 27): held by their ids like tombstones.
    #[serde(default)]
    pub(crate) embeddings: u64,
    pub(crate) session_ids: u64,
    /// Whether puts carry their row location (16 bytes more each).
    pub(crate) with_at: bool,
    /// `(bot, session)` in the index's session numbering.
    pub(crate) sessions: Vec<(Box<str>, Box<str>)>,
    pub(crate) shards: Vec<[u8; 16]>,
    /// `(shard number, highest seq applied)`.
    pub(crate) positions: Vec<(u32, u64)>,
    pub(crate) entries: u64,
    /// Every summary entry: `(session, hlc, shard, seq, epoch)` (rule 21).
    pub(crate) summaries: Vec<(u32, u64, [u8; 16], u64, u64)>,
    /// Every link entry (fork or hide), as `summaries` (rule 25).
    pub(crate) links: Vec<(u32, u64, [u8; 16], u64, u64)>,
}

/// Where each section starts in the bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Layout {
    arena: usize,
    offsets: usize,
    winners: usize,
    extras: usize,
    others: usize,
    tombstones: usize,
    embeddings: usize,
    session_starts: usize,
    session_ids: usize,
    end: usize,
}

impl Layout {
    /// The sections of `shape` from `base`; `None` if their sizes overflow.
    fn of(shape: &Shape, base: usize, put: u64) -> Option<Layout> {
        let mut at = base as u64;
        let mut next = |len: u64| -> Option<usize> {
            let start = at;
            at = at.checked_add(len)?;
            usize::try_from(start).ok()
        };
        let layout = Layout {
            arena: next(shape.arena)?,
            offsets: next(shape.ids.checked_add(1)?.checked_mul(4)?)?,
            winners: next(shape.ids.checked_mul(put)?)?,
            extras: next(shape.extras.checked_mul(EXTRA as u64)?)?,
            others: next(shape.others.checked_mul(put)?)?,
            tombstones: next(shape.tombstones.checked_mul(KEY as u64)?)?,
            embeddings: next(shape.embeddings.checked_mul(KEY as u64)?)?,
            session_starts: next((shape.sessions.len() as u64 + 1).checked_mul(4)?)?,
            session_ids: next(shape.session_ids.checked_mul(4)?)?,
            end: 0,
        };
        Some(Layout {
            end: usize::try_from(at).ok()?,
            ..layout
        })
    }
}

fn put_width(with_at: bool) -> usize {
    KEY + 4 + if with_at { 16 } else { 0 } + 32
}

/// The frozen ids of an index: the snapshot's bytes and where its sections are.
#[derive(Debug, Default)]
pub(crate) struct Frozen {
    bytes: Vec<u8>,
    at: Layout,
    ids: usize,
    extras: usize,
    sessions: usize,
    put: usize,
    with_at: bool,
    shards: Vec<ShardId>,
}

impl Frozen {
    pub(crate) fn len(&self) -> usize {
        self.ids
    }

    /// Whether any frozen entry was written by `shard` (the shard table names every shard
    /// an entry or a position of the snapshot refers to).
    pub(crate) fn holds_shard(&self, shard: ShardId) -> bool {
        self.shards.contains(&shard)
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("four bytes"))
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("eight bytes"))
    }

    /// The id number extras row `row` belongs to, if there is such a row.
    fn extra_id(&self, row: usize) -> Option<usize> {
        (row < self.extras).then(|| self.u32(self.at.extras + EXTRA * row) as usize)
    }

    fn has_winner(&self, i: usize) -> bool {
        self.u32(self.at.winners + self.put * i + KEY) != NO_SESSION
    }

    fn offset(&self, i: usize) -> usize {
        self.u32(self.at.offsets + 4 * i) as usize
    }

    fn id_bytes(&self, i: usize) -> &[u8] {
        &self.bytes[self.at.arena + self.offset(i)..self.at.arena + self.offset(i + 1)]
    }

    /// Id number `i`.
    pub(crate) fn id(&self, i: usize) -> &str {
        std::str::from_utf8(self.id_bytes(i)).expect("checked when loaded")
    }

    /// The number of `id`, if the snapshot held it (binary search: UTF-8 sorts as bytes).
    pub(crate) fn find(&self, id: &str) -> Option<usize> {
        let id = id.as_bytes();
        let (mut lo, mut hi) = (0, self.ids);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.id_bytes(mid).cmp(id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn key(&self, at: usize) -> OrderKey {
        OrderKey {
            hlc: Hlc(self.u64(at)),
            shard: self.shards[self.u32(at + 8) as usize],
            seq: self.u64(at + 12),
            epoch: self.u64(at + 20),
        }
    }

    fn put_at(&self, at: usize) -> Option<Put> {
        let session = self.u32(at + KEY);
        if session == NO_SESSION {
            return None;
        }
        let (row, hash) = if self.with_at {
            (RowRef(self.u64(at + KEY + 4), self.u64(at + KEY + 12)), at + KEY + 20)
        } else {
            (RowRef::default(), at + KEY + 4)
        };
        Some(Put {
            key: self.key(at),
            hash: ContentHash(self.bytes[hash..hash + 32].try_into().expect("32 bytes")),
            session,
            at: row,
        })
    }

    /// The extras row of id `i`, if it has one.
    fn extra_row(&self, i: usize) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.extras);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.extra_id(mid).expect("a row below the count").cmp(&i) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn state_with(&self, i: usize, row: Option<usize>) -> IdState {
        let extra = row.map(|r| {
            let e = self.at.extras + EXTRA * r;
            let (os, on) = (self.u32(e + 4) as usize, self.u32(e + 8) as usize);
            let (ts, tn) = (self.u32(e + 12) as usize, self.u32(e + 16) as usize);
            let (es, en) = (self.u32(e + 20) as usize, self.u32(e + 24) as usize);
            Box::new(Extra {
                others: (os..os + on)
                    .map(|o| self.put_at(self.at.others + self.put * o).expect("checked when loaded"))
                    .collect(),
                tombstones: (ts..ts + tn).map(|t| self.key(self.at.tombstones + KEY * t)).collect(),
                embeddings: (es..es + en).map(|t| self.key(self.at.embeddings + KEY * t)).collect(),
            })
        });
        IdState {
            winner: self.put_at(self.at.winners + self.put * i),
            extra,
        }
    }

    /// The state of id number `i`.
    pub(crate) fn state(&self, i: usize) -> IdState {
        self.state_with(i, self.extra_row(i))
    }

    /// Every id's number, name and state, in id order.
    pub(crate) fn states(&self) -> impl Iterator<Item = (usize, &str, IdState)> + '_ {
        let mut next_extra = 0;
        (0..self.ids).map(move |i| {
            let row = (self.extra_id(next_extra) == Some(i)).then(|| {
                next_extra += 1;
                next_extra - 1
            });
            (i, self.id(i), self.state_with(i, row))
        })
    }

    /// The ids with a put in session number `no`.
    pub(crate) fn session_ids(&self, no: usize) -> impl Iterator<Item = u32> + '_ {
        let range = if no < self.sessions {
            self.u32(self.at.session_starts + 4 * no) as usize..self.u32(self.at.session_starts + 4 * (no + 1)) as usize
        } else {
            0..0
        };
        range.map(|k| self.u32(self.at.session_ids + 4 * k))
    }

    /// The frozen part `shape` describes, its sections in `bytes` from `base`, or what is
    /// wrong with it; and what `verify` (the snapshot's checksum) says of `bytes`, computed
    /// on another thread while every offset, count and number that refers to an id, a
    /// session, a shard or another section is checked here, once.
    pub(crate) fn load(
        shape: &Shape,
        bytes: Vec<u8>,
        base: usize,
        verify: impl FnOnce(&[u8]) -> bool + Send,
    ) -> (bool, Result<Frozen, String>) {
        let put = put_width(shape.with_at);
        let at = match Layout::of(shape, base, put as u64) {
            Some(at) if at.end == bytes.len() => at,
            Some(at) => {
                let why = format!("sections end at {}, the snapshot at {}", at.end, bytes.len());
                return (verify(&bytes), Err(why));
            }
            None => return (verify(&bytes), Err("section sizes overflow".into())),
        };
        let (Ok(ids), Ok(extras)) = (usize::try_from(shape.ids), usize::try_from(shape.extras)) else {
            return (verify(&bytes), Err("a count overflows".into()));
        };
        let frozen = Frozen {
            bytes,
            at,
            ids,
            extras,
            sessions: shape.sessions.len(),
            put,
            with_at: shape.with_at,
            shards: shape.shards.iter().map(|b| ShardId::from_bytes(*b)).collect(),
        };
        let (verified, checked) = std::thread::scope(|s| {
            let hashing = s.spawn(|| verify(&frozen.bytes));
            let checked = frozen.check(shape);
            (hashing.join().expect("hashing does not panic"), checked)
        });
        (verified, checked.map(|()| frozen))
    }

    fn check(&self, shape: &Shape) -> Result<(), String> {
        let n = self.ids;
        // Ids: offsets from 0 to the arena's end, in order, on character boundaries, and the
        // ids strictly ascending.
        let arena = std::str::from_utf8(&self.bytes[self.at.arena..self.at.offsets])
            .map_err(|e| format!("ids are not UTF-8: {e}"))?;
        if self.offset(0) != 0 || self.offset(n) != arena.len() {
            return Err("the offsets do not span the ids".into());
        }
        for i in 0..n {
            let (a, b) = (self.offset(i), self.offset(i + 1));
            if a > b || !arena.is_char_boundary(b) {
                return Err(format!("offset {b} out of order or inside a character"));
            }
            if i > 0 && self.id_bytes(i - 1) >= self.id_bytes(i) {
                return Err(format!("ids not strictly sorted at {i}"));
            }
        }
        let shard_ok = |at: usize| (self.u32(at + 8) as usize) < self.shards.len();
        let put_ok = |at: usize| {
            let s = self.u32(at + KEY);
            shard_ok(at) && (s == NO_SESSION || (s as usize) < self.sessions)
        };
        for i in 0..n {
            if !put_ok(self.at.winners + self.put * i) {
                return Err(format!("id {i}: a shard or session number out of range"));
            }
        }
        // Extras: ascending ids, each id's others, tombstones and embeddings right after the
        // previous id's (so every one belongs to exactly one id), each put with a session.
        let (mut others, mut tombs, mut embeds, mut entries) = (0usize, 0usize, 0usize, 0u64);
        for r in 0..self.extras {
            let e = self.at.extras + EXTRA * r;
            let id = self.extra_id(r).expect("a row below the count");
            if id >= n || r.checked_sub(1).and_then(|p| self.extra_id(p)).is_some_and(|p| p >= id) {
                return Err(format!("extras row {r}: id {id} out of order or range"));
            }
            let (os, on) = (self.u32(e + 4) as usize, self.u32(e + 8) as usize);
            let (ts, tn) = (self.u32(e + 12) as usize, self.u32(e + 16) as usize);
            let (es, en) = (self.u32(e + 20) as usize, self.u32(e + 24) as usize);
            if os != others || ts != tombs || es != embeds || on + tn + en == 0 {
                return Err(format!("extras row {r}: ranges not contiguous or empty"));
            }
            if on > 0 && !self.has_winner(id) {
                return Err("an id has puts but no winner".into());
            }
            others += on;
            tombs += tn;
            embeds += en;
            entries += (on + tn + en) as u64;
        }
        if others as u64 != shape.others || tombs as u64 != shape.tombstones || embeds as u64 != shape.embeddings {
            return Err("the extras do not cover the other puts, tombstones and embeddings".into());
        }
        for o in 0..others {
            let at = self.at.others + self.put * o;
            if !put_ok(at) || self.u32(at + KEY) == NO_SESSION {
                return Err(format!("other put {o}: a number out of range"));
            }
        }
        for t in 0..tombs {
            if !shard_ok(self.at.tombstones + KEY * t) {
                return Err(format!("tombstone {t}: shard number out of range"));
            }
        }
        for t in 0..embeds {
            if !shard_ok(self.at.embeddings + KEY * t) {
                return Err(format!("embedding {t}: shard number out of range"));
            }
        }
        // Every id holds an entry: a winner, or (checked above) an extras row.
        let mut next_extra = 0;
        for i in 0..n {
            let with_extra = self.extra_id(next_extra) == Some(i);
            next_extra += usize::from(with_extra);
            let has_winner = self.has_winner(i);
            if !has_winner && !with_extra {
                return Err(format!("id {i} holds no entry"));
            }
            entries += u64::from(has_winner);
        }
        if entries != shape.entries {
            return Err(format!("{entries} entries held, {} counted", shape.entries));
        }
        // Session lists: starts from 0 to the list's end, in order, ids in range.
        let starts = |no: usize| self.u32(self.at.session_starts + 4 * no) as u64;
        if starts(0) != 0 || starts(self.sessions) != shape.session_ids {
            return Err("the session lists do not span their section".into());
        }
        for no in 0..self.sessions {
            if starts(no) > starts(no + 1) {
                return Err(format!("session {no}: list out of order"));
            }
        }
        for k in 0..shape.session_ids as usize {
            let i = self.u32(self.at.session_ids + 4 * k);
            if i as usize >= n {
                return Err(format!("id number {i} out of range"));
            }
        }
        if let Some((s, _)) = shape.positions.iter().find(|(s, _)| *s as usize >= self.shards.len()) {
            return Err(format!("shard number {s} out of range"));
        }
        Ok(())
    }
}

/// Shard ids to numbers, while a snapshot is written.
#[derive(Default)]
struct Shards {
    ids: Vec<ShardId>,
    numbers: std::collections::HashMap<ShardId, u32>,
}

impl Shards {
    fn number(&mut self, s: ShardId) -> u32 {
        *self.numbers.entry(s).or_insert_with(|| {
            self.ids.push(s);
            (self.ids.len() - 1) as u32
        })
    }

    fn key(&mut self, out: &mut Vec<u8>, k: &OrderKey) {
        out.extend_from_slice(&k.hlc.0.to_le_bytes());
        out.extend_from_slice(&self.number(k.shard).to_le_bytes());
        out.extend_from_slice(&k.seq.to_le_bytes());
        out.extend_from_slice(&k.epoch.to_le_bytes());
    }

    fn put(&mut self, out: &mut Vec<u8>, p: Option<&Put>, with_at: bool) {
        let Some(p) = p else {
            out.resize(out.len() + put_width(with_at), 0);
            let session = out.len() - put_width(with_at) + KEY;
            out[session..session + 4].copy_from_slice(&NO_SESSION.to_le_bytes());
            return;
        };
        self.key(out, &p.key);
        out.extend_from_slice(&p.session.to_le_bytes());
        if with_at {
            out.extend_from_slice(&p.at.0.to_le_bytes());
            out.extend_from_slice(&p.at.1.to_le_bytes());
        }
        out.extend_from_slice(&p.hash.0);
    }
}

/// What the index holds besides its ids, for [`write`].
pub(crate) struct Tables<'a> {
    pub(crate) scope: crate::ids::IdScope,
    pub(crate) sessions: Vec<(Box<str>, Box<str>)>,
    pub(crate) positions: Vec<(ShardId, u64)>,
    pub(crate) entries: u64,
    /// `(session, summary entry)`, in order.
    pub(crate) summaries: Vec<(u32, OrderKey)>,
    /// `(session, link entry)`, in order.
    pub(crate) links: Vec<(u32, OrderKey)>,
    /// Every id and its state, sorted by key.
    pub(crate) ids: Vec<(&'a str, Cow<'a, IdState>)>,
}

/// The shape and the section bytes of a snapshot of `t`.
pub(crate) fn write(t: Tables<'_>) -> (Shape, Vec<u8>) {
    let with_at = t
        .ids
        .iter()
        .any(|(_, s)| s.winner.iter().chain(s.others()).any(|p| p.at != RowRef::default()));
    let mut shards = Shards::default();
    let mut arena = Vec::new();
    let mut offsets = Vec::with_capacity(4 * (t.ids.len() + 1));
    let mut winners = Vec::with_capacity(put_width(with_at) * t.ids.len());
    let (mut extras, mut others, mut tombs, mut embeds) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut n_others, mut n_tombs, mut n_embeds) = (0u32, 0u32, 0u32);
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); t.sessions.len()];
    offsets.extend_from_slice(&0u32.to_le_bytes());
    for (no, (id, state)) in t.ids.iter().enumerate() {
        arena.extend_from_slice(id.as_bytes());
        offsets.extend_from_slice(&(arena.len() as u32).to_le_bytes());
        shards.put(&mut winners, state.winner.as_ref(), with_at);
        if !state.others().is_empty() || !state.tombstones().is_empty() || !state.embeddings().is_empty() {
            let (on, tn, en) = (
                state.others().len() as u32,
                state.tombstones().len() as u32,
                state.embeddings().len() as u32,
            );
            for v in [no as u32, n_others, on, n_tombs, tn, n_embeds, en] {
                extras.extend_from_slice(&v.to_le_bytes());
            }
            for p in state.others() {
                shards.put(&mut others, Some(p), with_at);
            }
            for k in state.tombstones() {
                shards.key(&mut tombs, k);
            }
            for k in state.embeddings() {
                shards.key(&mut embeds, k);
            }
            n_others += on;
            n_tombs += tn;
            n_embeds += en;
        }
        let mut sessions: Vec<u32> = state.sessions().collect();
        sessions.sort_unstable();
        sessions.dedup();
        for s in sessions {
            lists[s as usize].push(no as u32);
        }
    }
    let positions = t.positions.iter().map(|(s, q)| (shards.number(*s), *q)).collect();
    let mut starts = Vec::with_capacity(4 * (lists.len() + 1));
    let mut ids = Vec::new();
    starts.extend_from_slice(&0u32.to_le_bytes());
    let mut listed = 0u32;
    for list in &lists {
        listed += list.len() as u32;
        starts.extend_from_slice(&listed.to_le_bytes());
        for i in list {
            ids.extend_from_slice(&i.to_le_bytes());
        }
    }
    let shape = Shape {
        ids: t.ids.len() as u64,
        arena: arena.len() as u64,
        extras: (extras.len() / EXTRA) as u64,
        others: u64::from(n_others),
        tombstones: u64::from(n_tombs),
        embeddings: u64::from(n_embeds),
        session_ids: u64::from(listed),
        with_at,
        ids_by_bot: t.scope == crate::ids::IdScope::Bot,
        sessions: t.sessions,
        shards: shards.ids.iter().map(|s| *s.as_bytes()).collect(),
        positions,
        entries: t.entries,
        summaries: t
            .summaries
            .iter()
            .map(|(s, k)| (*s, k.hlc.0, *k.shard.as_bytes(), k.seq, k.epoch))
            .collect(),
        links: t
            .links
            .iter()
            .map(|(s, k)| (*s, k.hlc.0, *k.shard.as_bytes(), k.seq, k.epoch))
            .collect(),
    };
    let mut out = arena;
    for section in [offsets, winners, extras, others, tombs, embeds, starts, ids] {
        out.extend_from_slice(&section);
    }
    (shape, out)
}

#[cfg(test)]
impl Frozen {
    /// Where each section starts, by name (crafting damaged snapshots in tests).
    pub(crate) fn section(shape: &Shape, base: usize, name: &str) -> usize {
        let l = Layout::of(shape, base, put_width(shape.with_at) as u64).expect("a valid shape");
        match name {
            "arena" => l.arena,
            "offsets" => l.offsets,
            "winners" => l.winners,
            "extras" => l.extras,
            "others" => l.others,
            "tombstones" => l.tombstones,
            "embeddings" => l.embeddings,
            "session_starts" => l.session_starts,
            "session_ids" => l.session_ids,
            _ => panic!("no section {name}"),
        }
    }
}
