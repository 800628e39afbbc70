//! The full check's machinery: stored rows as a backend reads them, their content hashed on
//! threads of their own while the backend reads on, and the checks of rule 10 (content,
//! clocks), of positions (stale epochs, seq gaps) and of rule 21 (implausible coverage).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::backend::index::{IndexRow, ProjectionIndex, RowRef};
use crate::canonical::{canonical_json, write_canonical};
use crate::entry::{Checkpoint, Entry, OrderKey};
use crate::hash::{ContentHash, Covered};
use crate::hlc::Hlc;
use crate::ids::{Epoch, Seq, ShardId};
use crate::projection::{Conflict, canonical_conflicts};
use crate::record::{Body, Kind, Record};

/// Rows handed to a hashing thread at once (or fewer, when their bytes reach `BATCH_BYTES`).
pub(super) const BATCH: usize = 256;
const BATCH_BYTES: usize = 1 << 20;

/// A stored body as a backend reads it, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredBody<'a> {
    /// UTF-8 text.
    Text(&'a str),
    /// Opaque bytes.
    Bytes(&'a [u8]),
    /// No body (both body columns empty): what a purge leaves of an entry of an id that has
    /// a tombstone (rule 16), with nothing to check against the hash. Anywhere else — its id
    /// has no tombstone in the log — damage, which the checker reports as `Corrupt`.
    Purged,
}

/// One stored entry as a full check reads it, borrowed from the backend's buffers, so that
/// reading allocates nothing per entry. The metadata is the JSON text as stored: backends
/// store canonical JSON, which is what the hash covers, so it is hashed as stored and parsed
/// only when that hash does not match.
#[derive(Clone, Copy, Debug)]
pub struct StoredRow<'a> {
    /// The shard that wrote the entry.
    pub shard: ShardId,
    /// Its position in the shard.
    pub seq: Seq,
    /// The epoch it was written under.
    pub epoch: Epoch,
    /// Its clock value.
    pub hlc: Hlc,
    /// Put or tombstone.
    pub kind: Kind,
    /// The record id.
    pub id: &'a str,
    /// The bot.
    pub bot_id: &'a str,
    /// The session.
    pub session_id: &'a str,
    /// The role.
    pub role: &'a str,
    /// The body's media type.
    pub content_type: &'a str,
    /// The body.
    pub body: StoredBody<'a>,
    /// The metadata object's JSON text as stored.
    pub metadata: Option<&'a str>,
    /// The hash stored with the entry.
    pub content_hash: ContentHash,
}

/// What a hashing thread needs of one row; its variable-length fields lie in the batch's
/// buffer, one after the other, ending at `ends`.
#[derive(Clone, Copy)]
struct Held {
    shard: ShardId,
    seq: Seq,
    epoch: Epoch,
    hlc: Hlc,
    kind: Kind,
    hash: ContentHash,
    body: HeldBody,
    has_metadata: bool,
    start: usize,
    /// Ends of id, bot, session, role, content type, body, metadata in `RowBatch::bytes`.
    ends: [usize; 7],
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum HeldBody {
    Text,
    Bytes,
    /// No body, and its id has a tombstone: erased by a purge, nothing to check.
    Purged,
    /// No body, and no tombstone of its id seen yet: corrupt unless one turns up (a purge
    /// erases only ids with a tombstone, rule 16). Hashed as a reader serves it: empty text.
    Missing,
}

/// What content checks found.
#[derive(Default)]
pub(super) struct Found {
    /// Conflicts, as found.
    conflicts: Vec<Conflict>,
    /// A `Corrupt` conflict per row without a body whose id had no tombstone when it was
    /// seen: each stands unless the id turns out to have one ([`Found::settle`]).
    bodiless: Vec<Conflict>,
}

impl Found {
    fn extend(&mut self, other: Found) {
        self.conflicts.extend(other.conflicts);
        self.bodiless.extend(other.bodiless);
    }

    /// Every conflict, once `index` holds every entry checked: a row without a body is
    /// corrupt unless its id has a tombstone somewhere in the log — in another shard, or
    /// below a checkpoint, which only the index knows of (rule 16).
    pub(super) fn settle(self, index: &ProjectionIndex) -> impl Iterator<Item = Conflict> + '_ {
        let bodiless = self.bodiless.into_iter().filter(move |c| match c {
            Conflict::Corrupt { bot_id, id, .. } => !has_tombstone(index, bot_id, id),
            _ => true,
        });
        self.conflicts.into_iter().chain(bodiless)
    }
}

/// Whether `id` of `bot_id`, which `index` holds (a row of it was applied), has a tombstone
/// in its namespace.
fn has_tombstone(index: &ProjectionIndex, bot_id: &str, id: &str) -> bool {
    index.has_tombstone(bot_id, id)
}

/// Rows on their way to a hashing thread: their fields copied into one buffer. A hashing
/// thread hands each batch back emptied, so that a full check allocates (and frees on
/// another thread than the one that allocated) per batch at most, never per entry.
#[derive(Default)]
pub(super) struct RowBatch {
    bytes: Vec<u8>,
    rows: Vec<Held>,
}

impl RowBatch {
    /// Add `r`; `tombstoned`: its id is known to have a tombstone (so a missing body was
    /// erased by a purge).
    pub(super) fn push(&mut self, r: &StoredRow<'_>, tombstoned: bool) {
        let start = self.bytes.len();
        let (body_kind, body): (HeldBody, &[u8]) = match r.body {
            StoredBody::Text(t) => (HeldBody::Text, t.as_bytes()),
            StoredBody::Bytes(b) => (HeldBody::Bytes, b),
            StoredBody::Purged if tombstoned => (HeldBody::Purged, &[]),
            StoredBody::Purged => (HeldBody::Missing, &[]),
        };
        let mut ends = [0; 7];
        let fields: [&[u8]; 7] = [
            r.id.as_bytes(),
            r.bot_id.as_bytes(),
            r.session_id.as_bytes(),
            r.role.as_bytes(),
            r.content_type.as_bytes(),
            body,
            r.metadata.unwrap_or_default().as_bytes(),
        ];
        for (end, f) in ends.iter_mut().zip(fields) {
            self.bytes.extend_from_slice(f);
            *end = self.bytes.len();
        }
        self.rows.push(Held {
            shard: r.shard,
            seq: r.seq,
            epoch: r.epoch,
            hlc: r.hlc,
            kind: r.kind,
            hash: r.content_hash,
            body: body_kind,
            has_metadata: r.metadata.is_some(),
            start,
            ends,
        });
    }

    fn is_full(&self) -> bool {
        self.rows.len() >= BATCH || self.bytes.len() >= BATCH_BYTES
    }

    /// Check every row's content, and empty the batch for reuse.
    pub(super) fn check(&mut self, out: &mut Found) {
        for h in &self.rows {
            let field = |i: usize| &self.bytes[if i == 0 { h.start } else { h.ends[i - 1] }..h.ends[i]];
            let covered = Covered {
                id: field(0),
                bot_id: field(1),
                session_id: field(2),
                role: field(3),
                content_type: field(4),
                kind: h.kind,
                // A missing body is read as empty text.
                text: h.body != HeldBody::Bytes,
                body: field(5),
            };
            content_conflicts(h, &covered, h.has_metadata.then(|| field(6)), out);
        }
        self.bytes.clear();
        self.rows.clear();
        // A body near the size limit grows one batch far past `BATCH_BYTES`; do not keep
        // that much per batch in flight for the rest of the check.
        self.bytes.shrink_to(2 * BATCH_BYTES);
    }
}

/// Collects what the history checks need while a backend streams every entry past it.
/// Checking content (hashing every body) is most of a full check's work: it runs on
/// threads of its own, one per core but the caller's, while the caller reads on.
#[derive(Default)]
pub struct HistoryChecker {
    index: ProjectionIndex,
    positions: HashMap<ShardId, Vec<(Seq, Epoch)>>,
    found: Found,
    batch: RowBatch,
    hashers: Option<Hashers>,
    /// What each summary entry covers, with its bot and id (rule 21).
    coverage: HashMap<OrderKey, Coverage>,
}

/// The threads that check content. Dropping them (a cancelled check) closes their queues:
/// each ends after the batch in hand.
struct Hashers {
    queues: Vec<std::sync::mpsc::SyncSender<RowBatch>>,
    threads: Vec<std::thread::JoinHandle<Found>>,
    /// Batches the threads checked and emptied, for the reader to fill again.
    emptied: std::sync::mpsc::Receiver<RowBatch>,
    next: usize,
}

impl Hashers {
    fn start() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1));
        let (mut queues, mut threads) = (Vec::with_capacity(n), Vec::with_capacity(n));
        // Room for every batch in flight (two queued and one in hand per thread): a thread
        // never waits to hand one back; one that finds no room drops it.
        let (give_back, emptied) = std::sync::mpsc::sync_channel::<RowBatch>(3 * n);
        for _ in 0..n {
            let (tx, rx) = std::sync::mpsc::sync_channel::<RowBatch>(2);
            let give_back = give_back.clone();
            let spawned = std::thread::Builder::new().name("ctxlog-hash".into()).spawn(move || {
                let mut out = Found::default();
                for mut batch in rx {
                    batch.check(&mut out);
                    let _ = give_back.try_send(batch);
                }
                out
            });
            // No thread to be had: check content on the caller's thread (`send` fails).
            if let Ok(t) = spawned {
                queues.push(tx);
                threads.push(t);
            }
        }
        Hashers {
            queues,
            threads,
            emptied,
            next: 0,
        }
    }

    /// Queue `batch` on the next thread (round robin); it comes back if that thread is gone.
    fn send(&mut self, batch: RowBatch) -> std::result::Result<(), RowBatch> {
        if self.queues.is_empty() {
            return Err(batch);
        }
        let i = self.next % self.queues.len();
        self.next += 1;
        self.queues[i].send(batch).map_err(|e| e.0)
    }

    /// Close the queues and collect every thread's findings.
    fn finish(self) -> Found {
        drop(self.queues);
        let mut out = Found::default();
        for t in self.threads {
            match t.join() {
                Ok(found) => out.extend(found),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    }
}

/// A summary's bot, id and coverage.
/// What the history checker keeps of a summary or a fork: its bot, id, position, and (a
/// fork's) the session it continues.
pub(super) type Coverage = (String, String, Checkpoint, Option<String>);

/// The session a fork's decoded body names (rule 25).
pub(super) fn fork_parent(kind: Kind, body: &Body) -> Option<String> {
    match (kind, body) {
        (Kind::Fork, Body::Text(t)) => Some(t.clone()),
        _ => None,
    }
}

impl HistoryChecker {
    /// An empty checker of a store whose ids are scoped by bot.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty checker of a store whose ids are in the namespaces of `scope`.
    pub fn scoped(scope: crate::ids::IdScope) -> Self {
        HistoryChecker {
            index: ProjectionIndex::scoped(scope),
            ..Self::default()
        }
    }

    /// Visit one stored entry (any order, repeats allowed).
    pub fn visit(&mut self, e: Entry) {
        let metadata = e.record.metadata.as_ref().map(canonical_json);
        let stored = e.record.stored_body();
        self.visit_row(StoredRow::of(&e, metadata.as_deref(), &stored));
    }

    /// Visit one stored entry as read (any order, repeats allowed): what backends feed a
    /// full check, without building an [`Entry`].
    pub fn visit_row(&mut self, r: StoredRow<'_>) {
        let row = IndexRow {
            key: r.key(),
            id: r.id,
            kind: r.kind,
            hash: r.content_hash,
            bot_id: r.bot_id,
            session_id: r.session_id,
            at: RowRef::default(),
        };
        if !self.index.apply(row) {
            return;
        }
        if r.kind.has_position()
            && let StoredBody::Bytes(frame) = r.body
            && let Ok((body, Some(covers))) = Record::from_stored_body(r.kind, Body::Bytes(frame.to_vec()))
        {
            let parent = fork_parent(r.kind, &body);
            self.coverage
                .insert(r.key(), (r.bot_id.to_owned(), r.id.to_owned(), covers, parent));
        }
        self.positions.entry(r.shard).or_default().push((r.seq, r.epoch));
        // A row without a body whose id has a tombstone already seen is settled now; the
        // others wait for the end, when every tombstone has been seen.
        let tombstoned = r.body == StoredBody::Purged && has_tombstone(&self.index, r.bot_id, r.id);
        self.batch.push(&r, tombstoned);
        if self.batch.is_full() {
            let hashers = self.hashers.get_or_insert_with(Hashers::start);
            let spare = hashers.emptied.try_recv().unwrap_or_default();
            let full = std::mem::replace(&mut self.batch, spare);
            if let Err(mut back) = hashers.send(full) {
                back.check(&mut self.found);
                self.batch = back;
            }
        }
    }

    /// Every conflict, canonical order; with `after`, only those past that checkpoint.
    pub fn finish(mut self, after: Option<&Checkpoint>) -> Vec<Conflict> {
        let mut out = self.index.id_conflicts();
        let mut found = std::mem::take(&mut self.found);
        self.batch.check(&mut found);
        if let Some(h) = self.hashers.take() {
            found.extend(h.finish());
        }
        out.extend(found.settle(&self.index));
        let coverage = std::mem::take(&mut self.coverage);
        out.extend(coverage_conflicts(&mut self.index, |k| coverage.get(k).cloned()));
        for (shard, positions) in self.positions {
            position_conflicts(shard, positions, &mut out);
        }
        let out = match after {
            Some(cp) => out.into_iter().filter(|c| c.involves_entries_after(cp)).collect(),
            None => out,
        };
        canonical_conflicts(out)
    }
}

impl<'a> StoredRow<'a> {
    /// The entry this row holds, as every reader sees it: the metadata parsed (`Err` when
    /// it is not JSON), a purged entry's body as empty text.
    pub fn to_entry(&self, created_at: Option<DateTime<Utc>>) -> std::result::Result<Entry, serde_json::Error> {
        let (stored, purged) = match self.body {
            StoredBody::Text(t) => (Body::Text(t.to_owned()), false),
            StoredBody::Bytes(b) => (Body::Bytes(b.to_vec()), false),
            StoredBody::Purged => (Body::Text(String::new()), true),
        };
        // A summary's frame that does not decode reads back as its raw bytes and covers
        // nothing, so it never governs; its hash no longer matches, so it is `Corrupt`.
        let (body, covers) = match (self.kind, purged) {
            (kind, true) if kind.has_position() => (stored, Some(Checkpoint::default())),
            (kind, false) => match Record::from_stored_body(kind, stored.clone()) {
                Ok(decoded) => decoded,
                Err(_) => (stored, Some(Checkpoint::default())),
            },
            (_, true) => (stored, None),
        };
        Ok(Entry {
            shard: self.shard,
            seq: self.seq,
            epoch: self.epoch,
            hlc: self.hlc,
            record: Record {
                id: self.id.to_owned(),
                bot_id: self.bot_id.to_owned(),
                session_id: self.session_id.to_owned(),
                role: self.role.to_owned(),
                content_type: self.content_type.to_owned(),
                body,
                metadata: self.metadata.map(serde_json::from_str).transpose()?,
                created_at,
                kind: self.kind,
                covers,
            },
            content_hash: self.content_hash,
            purged,
        })
    }

    fn key(&self) -> OrderKey {
        OrderKey {
            hlc: self.hlc,
            shard: self.shard,
            seq: self.seq,
            epoch: self.epoch,
        }
    }

    /// The row of a full entry, with `metadata` its metadata's canonical JSON and `stored`
    /// its body as stored ([`Record::stored_body`]).
    pub fn of(e: &'a Entry, metadata: Option<&'a str>, stored: &'a Body) -> Self {
        StoredRow {
            shard: e.shard,
            seq: e.seq,
            epoch: e.epoch,
            hlc: e.hlc,
            kind: e.record.kind,
            id: &e.record.id,
            bot_id: &e.record.bot_id,
            session_id: &e.record.session_id,
            role: &e.record.role,
            content_type: &e.record.content_type,
            body: match (stored, e.purged) {
                (_, true) => StoredBody::Purged,
                (Body::Text(t), false) => StoredBody::Text(t),
                (Body::Bytes(b), false) => StoredBody::Bytes(b),
            },
            metadata,
            content_hash: e.content_hash,
        }
    }
}

/// What one entry's content says (rule 10): a clock past the plausible horizon, or a
/// stored hash that is not its content's. `metadata` is the JSON text as stored: hashed as
/// it is first (backends store canonical JSON), and only if that does not match, parsed and
/// written canonically as a reader would see it. Text that is not JSON is corrupt. A row
/// without a body is corrupt unless its id has a tombstone (rule 16): until that is known,
/// its conflict goes to `out.bodiless`, with the hash of what a reader serves (empty text).
fn content_conflicts(at: &Held, covered: &Covered<'_>, metadata: Option<&[u8]>, out: &mut Found) {
    if at.hlc.millis() > Hlc::PLAUSIBLE_MILLIS {
        out.conflicts.push(Conflict::ImplausibleHlc {
            shard: at.shard,
            seq: at.seq,
            epoch: at.epoch,
            hlc: at.hlc,
        });
    }
    // A purged entry's content is gone (rule 16): nothing to check it against.
    if at.body == HeldBody::Purged {
        return;
    }
    let mut actual = covered.hash(metadata);
    if actual != at.hash
        && let Some(Ok(v)) = metadata.map(serde_json::from_slice::<serde_json::Value>)
    {
        let mut canonical = Vec::new();
        write_canonical(&mut canonical, &v);
        actual = covered.hash(Some(&canonical));
    }
    // A missing body is corrupt even when what a reader serves matches the hash (an empty
    // text): the stored body was not empty text, it is gone.
    let missing = at.body == HeldBody::Missing;
    if actual != at.hash || missing {
        let conflict = Conflict::Corrupt {
            shard: at.shard,
            seq: at.seq,
            epoch: at.epoch,
            bot_id: String::from_utf8_lossy(covered.bot_id).into_owned(),
            id: String::from_utf8_lossy(covered.id).into_owned(),
            stored_hash: at.hash,
            actual_hash: actual,
        };
        if missing {
            out.bodiless.push(conflict);
        } else {
            out.conflicts.push(conflict);
        }
    }
}

/// Stale epochs and seq gaps of one shard, from the positions `(seq, epoch)` of all its
/// entries (any order).
pub(super) fn position_conflicts(shard: ShardId, mut positions: Vec<(Seq, Epoch)>, out: &mut Vec<Conflict>) {
    positions.sort_unstable();
    // Stale epoch: an entry whose epoch is below the highest epoch at its seq or any lower
    // seq. Walk seqs upwards, one seq group at a time.
    let mut newest: Epoch = 0;
    let mut expected: Seq = 1;
    let mut i = 0;
    while i < positions.len() {
        let seq = positions[i].0;
        let group_end = positions[i..]
            .iter()
            .position(|p| p.0 != seq)
            .map_or(positions.len(), |n| i + n);
        let group = &positions[i..group_end];
        newest = newest.max(group.iter().map(|p| p.1).max().unwrap_or(0));
        for &(_, epoch) in group {
            if epoch < newest {
                out.push(Conflict::StaleEpoch {
                    shard,
                    seq,
                    epoch,
                    superseded_by: newest,
                });
            }
        }
        if seq > expected {
            out.push(Conflict::SeqGap {
                shard,
                missing_from: expected,
                missing_to: seq - 1,
            });
        }
        expected = seq + 1;
        i = group_end;
    }
}

/// The `ImplausibleCoverage` conflicts of the live summaries `index` holds (rule 21), given
/// each summary's bot, id and coverage.
pub(super) fn coverage_conflicts(
    index: &mut ProjectionIndex,
    coverage: impl Fn(&OrderKey) -> Option<Coverage>,
) -> Vec<Conflict> {
    let mut out = Vec::new();
    for session in index.sessions_with_summaries() {
        let live: Vec<OrderKey> = session.keys.iter().map(|(k, _)| *k).collect();
        for k in live.iter().filter(|k| session.is_summary(k)) {
            let Some((bot_id, id, covers, _)) = coverage(k) else {
                continue;
            };
            if let Some(why) = crate::context::implausible(k, &covers, &live) {
                out.push(Conflict::ImplausibleCoverage {
                    bot_id,
                    id,
                    summary: *k,
                    entry: match why {
                        crate::context::Implausible::CoversItself => None,
                        crate::context::Implausible::CoversLater(e) => Some(e),
                    },
                });
            }
        }
    }
    // Rule 25: a live fork names a position its writer read, as a summary does: not its own
    // entry or a later one of its shard, and no live record of the session it continues
    // whose clock is not below its own.
    for (bot, session) in index.sessions_with_links() {
        let s = index.session_with_summaries(&bot, &session);
        for k in s.keys.iter().map(|(k, _)| *k).filter(|k| s.is_link(k)) {
            let Some((bot_id, id, covers, Some(parent))) = coverage(&k) else {
                continue;
            };
            let continued: Vec<OrderKey> = index.session_keys(&bot, &parent).into_iter().map(|(k, _)| k).collect();
            if let Some(why) = crate::context::implausible(&k, &covers, &continued) {
                out.push(Conflict::ImplausibleCoverage {
                    bot_id,
                    id,
                    summary: k,
                    entry: match why {
                        crate::context::Implausible::CoversItself => None,
                        crate::context::Implausible::CoversLater(e) => Some(e),
                    },
                });
            }
        }
    }
    out
}
