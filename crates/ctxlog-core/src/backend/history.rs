//! The history checker (rules 6, 7, 10) generic over how a backend reads its entries: the
//! backend streams stored entries ([`HistorySource`]) and feeds a projection index
//! ([`IndexSource`]); the checks live here, once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::backend::index::{IndexRow, ProjectionIndex, RowRef};
use crate::backend::projector::{IndexSource, IndexedProjector};
use crate::canonical::{canonical_json, write_canonical};
use crate::entry::{Checkpoint, Entry, OrderKey};
use crate::error::{Result, Written, with_deadline};
use crate::hash::{ContentHash, Covered};
use crate::hlc::Hlc;
use crate::ids::{Epoch, Seq, ShardId};
use crate::projection::{Conflict, canonical_conflicts};
use crate::record::{Body, Kind, Record};
use crate::traits::ConflictDiscovery;
use crate::traits::Projector;

/// Rows handed to a hashing thread at once (or fewer, when their bytes reach `BATCH_BYTES`).
const BATCH: usize = 256;
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
struct Found {
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
    fn settle(self, index: &ProjectionIndex) -> impl Iterator<Item = Conflict> + '_ {
        let bodiless = self.bodiless.into_iter().filter(move |c| match c {
            Conflict::Corrupt { id, .. } => !has_tombstone(index, id),
            _ => true,
        });
        self.conflicts.into_iter().chain(bodiless)
    }
}

/// Whether `id`, which `index` holds (a row of it was applied), has a tombstone: an id is
/// held for a put or a tombstone of it, and a held id without a live winner has a tombstone.
fn has_tombstone(index: &ProjectionIndex, id: &str) -> bool {
    index.live(id).is_none()
}

/// Rows on their way to a hashing thread: their fields copied into one buffer. A hashing
/// thread hands each batch back emptied, so that a full check allocates (and frees on
/// another thread than the one that allocated) per batch at most, never per entry.
#[derive(Default)]
struct RowBatch {
    bytes: Vec<u8>,
    rows: Vec<Held>,
}

impl RowBatch {
    /// Add `r`; `tombstoned`: its id is known to have a tombstone (so a missing body was
    /// erased by a purge).
    fn push(&mut self, r: &StoredRow<'_>, tombstoned: bool) {
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
    fn check(&mut self, out: &mut Found) {
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
    /// What each summary entry covers, with its id (rule 21).
    coverage: HashMap<OrderKey, (String, Checkpoint)>,
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

impl HistoryChecker {
    /// An empty checker.
    pub fn new() -> Self {
        Self::default()
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
        if r.kind == Kind::Summary
            && let StoredBody::Bytes(frame) = r.body
            && let Ok((_, Some(covers))) = Record::from_stored_body(Kind::Summary, Body::Bytes(frame.to_vec()))
        {
            self.coverage.insert(r.key(), (r.id.to_owned(), covers));
        }
        self.positions.entry(r.shard).or_default().push((r.seq, r.epoch));
        // A row without a body whose id has a tombstone already seen is settled now; the
        // others wait for the end, when every tombstone has been seen.
        let tombstoned = r.body == StoredBody::Purged && has_tombstone(&self.index, r.id);
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
            (Kind::Summary, true) => (stored, Some(Checkpoint::default())),
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
fn position_conflicts(shard: ShardId, mut positions: Vec<(Seq, Epoch)>, out: &mut Vec<Conflict>) {
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
/// each summary's id and coverage.
fn coverage_conflicts(
    index: &mut ProjectionIndex,
    coverage: impl Fn(&OrderKey) -> Option<(String, Checkpoint)>,
) -> Vec<Conflict> {
    let mut out = Vec::new();
    for session in index.sessions_with_summaries() {
        let live: Vec<OrderKey> = session.keys.iter().map(|(k, _)| *k).collect();
        for k in live.iter().filter(|k| session.is_summary(k)) {
            let Some((id, covers)) = coverage(k) else { continue };
            if let Some(why) = crate::context::implausible(k, &covers, &live) {
                out.push(Conflict::ImplausibleCoverage {
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
    out
}

/// How a backend feeds its history checker: stored entries, full content.
#[async_trait]
pub trait HistorySource: Send + Sync + 'static {
    /// Show every stored entry to `checker` (any order, repeats allowed).
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()>;

    /// Every stored entry past `after` — its seq above `after`'s position for its shard,
    /// every entry of a shard `after` does not name — in any order, repeats allowed, except
    /// in the shards `quiet` names: shards of `after` in which the caller knew of no entry
    /// past it, which the source may skip. It may return older entries too (they are
    /// ignored), but reads should cost what is past `after`, not the whole log.
    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>>;

    /// The deadline of one pass.
    fn timeout(&self) -> Duration;
}

/// A [`ConflictDiscovery`] over a backend's [`HistorySource`] and [`IndexSource`].
///
/// A full check (no `after`) reads every entry with its content, in one pass. A check
/// `after` a checkpoint reads with content only the entries past it: what it must know of
/// older entries — the other entries of the ids the new ones touch (a winner's hash, a
/// tombstone), the positions of their shards — comes from a projection index that it keeps
/// as a projector does (from a usable snapshot, then only what is new; kept between calls).
/// Its answer is the full check's, restricted to conflicts involving entries past `after`.
/// Under concurrent appends, it is the full check of the entries its index held at its
/// refresh together with the entries past `after` it read next, in every shard but those in
/// which its index held nothing past `after`: an entry landing in between at or below
/// `after` (a fenced writer's late write), or in such a shard, is seen by the next call.
pub struct HistoryConflicts<H: HistorySource, I: IndexSource> {
    history: Arc<H>,
    projector: IndexedProjector<I>,
}

impl<H: HistorySource, I: IndexSource> HistoryConflicts<H, I> {
    /// A history checker reading entries through `history` and its index through `index`.
    pub fn new(history: Arc<H>, index: Arc<I>) -> Self {
        HistoryConflicts {
            history,
            projector: IndexedProjector::new(index),
        }
    }

    async fn full(&self) -> Result<Vec<Conflict>> {
        let mut checker = HistoryChecker::new();
        with_deadline(
            "conflict discovery",
            self.history.timeout(),
            None,
            Written::Nothing,
            self.history.visit_all(&mut checker),
        )
        .await?;
        Ok(checker.finish(None))
    }

    async fn after(&mut self, after: &Checkpoint) -> Result<Vec<Conflict>> {
        self.projector.refresh().await?;
        // Shards in which the index, complete at its refresh, holds nothing past `after`: no
        // need to read them again (an entry landing there since is seen by the next call).
        let quiet: HashSet<ShardId> = after
            .0
            .iter()
            .filter(|(shard, seq)| self.projector.index().position(**shard) <= **seq)
            .map(|(shard, _)| *shard)
            .collect();
        let newer = self.history.read_after(after, &quiet).await?;
        // Entries appended since the refresh join the index: it then holds every entry the
        // content checks below saw, and the answer is a function of one set of entries.
        let index = self.projector.index_mut();
        let mut seen = HashSet::new();
        let mut ids = BTreeSet::new();
        let mut shards = HashSet::new();
        let mut content = RowBatch::default();
        for e in &newer {
            if !after.is_after(e.shard, e.seq) || !seen.insert((e.shard, e.seq, e.epoch)) {
                continue;
            }
            index.apply(IndexRow::of(e));
            let metadata = e.record.metadata.as_ref().map(canonical_json);
            // Whether a missing body's id has a tombstone is settled below, once the index
            // holds every new entry too.
            let stored = e.record.stored_body();
            content.push(&StoredRow::of(e, metadata.as_deref(), &stored), false);
            ids.insert(e.record.id.as_str());
            shards.insert(e.shard);
        }
        let mut found = Found::default();
        content.check(&mut found);
        // A missing body's id may have its tombstone below the checkpoint or in another
        // shard: the index, which holds every entry, answers for it.
        let mut out: Vec<Conflict> = found.settle(index).collect();
        out.extend(index.id_conflicts_of(ids));
        for (shard, positions) in index.positions_of(&shards) {
            position_conflicts(shard, positions, &mut out);
        }
        // Rule 21: every live summary's coverage, checked against the index as it is now
        // (whether a summary is implausible depends on the records of its session): those
        // read just now from what was read, the others (few) read again.
        let mut coverage: HashMap<OrderKey, (String, Checkpoint)> = newer
            .iter()
            .filter_map(|e| Some((e.key(), (e.record.id.clone(), e.record.covers.clone()?))))
            .collect();
        let wanted: Vec<(OrderKey, RowRef)> = index
            .sessions_with_summaries()
            .into_iter()
            .flat_map(|s| {
                s.keys
                    .iter()
                    .filter(|(k, _)| s.is_summary(k))
                    .copied()
                    .collect::<Vec<_>>()
            })
            .filter(|(k, _)| !coverage.contains_key(k))
            .collect();
        for e in self.projector.fetch(&wanted).await? {
            if let Some(c) = e.record.covers.clone() {
                coverage.insert(e.key(), (e.record.id.clone(), c));
            }
        }
        out.extend(coverage_conflicts(self.projector.index_mut(), |k| {
            coverage.get(k).cloned()
        }));
        out.retain(|c| c.involves_entries_after(after));
        Ok(canonical_conflicts(out))
    }
}

#[async_trait]
impl<H: HistorySource, I: IndexSource> ConflictDiscovery for HistoryConflicts<H, I> {
    async fn conflicts(&mut self, after: Option<&Checkpoint>) -> Result<Vec<Conflict>> {
        match after {
            None => self.full().await,
            // One deadline for the refresh and the reads after it.
            Some(cp) => {
                let timeout = self.history.timeout();
                with_deadline("conflict discovery", timeout, None, Written::Nothing, self.after(cp)).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::index::tests::arb_entries;
    use crate::ids::WriterId;
    use crate::testing::model;
    use proptest::prelude::*;

    /// A history source over a memory store that lets another writer append once between a
    /// check's refresh and its reads past the checkpoint: the race no backend can exclude.
    struct AppendsInBetween {
        store: crate::testing::MemoryStore,
        late: tokio::sync::Mutex<Option<Box<dyn crate::traits::Shard>>>,
    }

    #[async_trait]
    impl HistorySource for AppendsInBetween {
        async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
            self.store.visit_all(checker).await
        }

        async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>> {
            if let Some(mut late) = self.late.lock().await.take() {
                late.append(vec![Record::text("x", "bot", "s", "user", "other text")])
                    .await?;
                late.append(vec![Record::text("y", "bot", "s", "user", "late")]).await?;
            }
            self.store.read_after(after, quiet).await
        }

        fn timeout(&self) -> Duration {
            HistorySource::timeout(&self.store)
        }
    }

    /// Entries appended after a check's refresh are added to its index before id conflicts
    /// are taken from it: another writer's puts of `x` and `y` in that window diverge from
    /// winners the index held (`x` at the checkpoint, `y` past it), and both are reported.
    #[tokio::test]
    async fn entries_appended_during_a_check_after_a_checkpoint_are_checked_together() {
        use crate::traits::Store;
        let options = crate::options::StoreOptions {
            create_if_missing: true,
            ..Default::default()
        };
        let store = crate::testing::MemoryStore::open(&format!("race-{}", uuid::Uuid::new_v4()), options).unwrap();
        let mut first = store.open_shard(&WriterId::new("a").unwrap()).await.unwrap();
        first
            .append(vec![Record::text("x", "bot", "s", "user", "first text")])
            .await
            .unwrap();
        let mut reader = store.projector();
        reader.refresh().await.unwrap();
        let cp = reader.checkpoint();
        first
            .append(vec![Record::text("y", "bot", "s", "user", "early")])
            .await
            .unwrap();
        let late = store.open_shard(&WriterId::new("b").unwrap()).await.unwrap();
        let source = AppendsInBetween {
            store: store.clone(),
            late: tokio::sync::Mutex::new(Some(late)),
        };
        let mut discovery = HistoryConflicts::new(Arc::new(source), Arc::new(store.clone()));
        // The check's refresh sees `y` (early) but not what `b` writes next.
        let found = discovery.conflicts(Some(&cp)).await.unwrap();
        let mut divergent: Vec<&str> = found
            .iter()
            .filter_map(|c| match c {
                Conflict::DivergentPut { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        divergent.sort_unstable();
        assert_eq!(
            divergent,
            ["x", "y"],
            "expected divergent puts of x and y, got {found:?}"
        );
    }

    proptest! {
        /// The checker reports exactly what the reference model does, whatever the order
        /// and repeats of the entries it is shown.
        #[test]
        fn checker_matches_reference_model(entries in arb_entries()) {
            let mut seen = std::collections::HashSet::new();
            let entries: Vec<Entry> = entries.into_iter().filter(|e| seen.insert((e.shard, e.seq, e.epoch))).collect();
            let mut checker = HistoryChecker::new();
            for e in entries.iter().rev().chain(entries.iter()) {
                checker.visit(e.clone());
            }
            prop_assert_eq!(checker.finish(None), model::conflicts(&entries));
        }

        /// The same with rows without a body among them — of ids with a tombstone (what a
        /// purge leaves) and without (damage) — in a full check, and in a check after a
        /// checkpoint (the full check's conflicts that involve an entry past it).
        #[test]
        fn checker_matches_reference_model_with_missing_bodies(
            entries in arb_entries(),
            erase in proptest::collection::vec(any::<bool>(), 40),
            below in 0u64..8,
        ) {
            let mut entries = crate::backend::index::tests::unique_positions(entries);
            for (e, erase) in entries.iter_mut().zip(erase) {
                if erase {
                    e.purge();
                }
            }
            let expected = model::conflicts(&entries);
            let mut checker = HistoryChecker::new();
            for e in entries.iter().rev().chain(entries.iter()) {
                checker.visit(e.clone());
            }
            prop_assert_eq!(checker.finish(None), expected.clone());

            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let got = runtime.block_on(async {
                let options = crate::options::StoreOptions {
                    create_if_missing: true,
                    ..Default::default()
                };
                let store = crate::testing::MemoryStore::open(&format!("bodiless-{}", uuid::Uuid::new_v4()), options)?;
                let mut cp = Checkpoint::default();
                for e in &entries {
                    store.inject_raw_entry(e.clone());
                    cp.advance(e.shard, below);
                }
                let mut discovery = crate::traits::Store::conflict_discovery(&store);
                Ok::<_, crate::Error>((discovery.conflicts(Some(&cp)).await?, cp))
            });
            let (got, cp) = got.unwrap();
            let want: Vec<Conflict> = expected.into_iter().filter(|c| c.involves_entries_after(&cp)).collect();
            prop_assert_eq!(got, want);
        }
    }

    /// Enough entries that content is checked on the hashing threads, corrupt ones spread
    /// over many batches (and one in the last, partial batch): every one is reported.
    #[test]
    fn content_checked_on_other_threads_is_all_reported() {
        let s = WriterId::new("w").unwrap().shard_id();
        let entries: Vec<Entry> = (1..=BATCH as u64 * 5 + 3)
            .map(|seq| {
                let record = Record::text(format!("id{seq}"), "b", "s", "r", "text");
                let mut content_hash = record.content_hash();
                if seq % 97 == 0 || seq == BATCH as u64 * 5 + 2 {
                    content_hash = Record::text("other", "b", "s", "r", "x").content_hash();
                }
                Entry {
                    shard: s,
                    seq,
                    epoch: 1,
                    hlc: Hlc(seq),
                    record,
                    content_hash,
                    purged: false,
                }
            })
            .collect();
        let mut checker = HistoryChecker::new();
        for e in &entries {
            checker.visit(e.clone());
        }
        let found = checker.finish(None);
        assert_eq!(found.len(), (BATCH * 5 + 3) / 97 + 1);
        assert_eq!(found, model::conflicts(&entries));
    }

    /// A full check hashes stored metadata text as it is; text that is not canonical but
    /// means the same object (what a reader would parse) is not corrupt, changed text is,
    /// and so is text that is not JSON at all — in a batch of one and on the hashing threads.
    #[test]
    fn stored_metadata_is_checked_as_a_reader_would_read_it() {
        let s = WriterId::new("w").unwrap().shard_id();
        let mut record = Record::text("id", "b", "s", "r", "body");
        record.metadata = Some(serde_json::json!({"a": 1, "b": [true, "x"]}));
        let entry = Entry {
            shard: s,
            seq: 1,
            epoch: 1,
            hlc: Hlc(1),
            content_hash: record.content_hash(),
            record,
            purged: false,
        };
        let stored = [
            (r#"{"a":1,"b":[true,"x"]}"#, false),
            (r#"{ "b": [true, "x"], "a": 1 }"#, false),
            (r#"{"a":2,"b":[true,"x"]}"#, true),
            (r#"{"a":1,"b":[true,"x"]"#, true),
        ];
        for many in [1, BATCH * 3] {
            for (text, corrupt) in stored {
                let mut checker = HistoryChecker::new();
                for seq in 1..=many as u64 {
                    let mut e = entry.clone();
                    e.seq = seq;
                    checker.visit_row(StoredRow::of(&e, Some(text), &e.record.body));
                }
                let found = checker.finish(None);
                assert_eq!(
                    found.len(),
                    if corrupt { many } else { 0 },
                    "{text} in batches of {many}"
                );
                assert!(
                    found.iter().all(|c| c.kind() == crate::ConflictKind::Corrupt),
                    "{found:?}"
                );
            }
        }
        // A purged row (its id has a tombstone, seen after it) has no content to check: not
        // corrupt, whatever its metadata text.
        let mut checker = HistoryChecker::new();
        let stored = entry.record.stored_body();
        let mut row = StoredRow::of(&entry, Some("not json"), &stored);
        row.body = StoredBody::Purged;
        checker.visit_row(row);
        let tombstone = Record::tombstone("id", "b", "s");
        let mut tombstone = Entry {
            shard: s,
            seq: 2,
            epoch: 1,
            hlc: Hlc(2),
            content_hash: tombstone.content_hash(),
            record: tombstone,
            purged: false,
        };
        tombstone.purge();
        checker.visit(tombstone);
        assert_eq!(checker.finish(None), Vec::new());
    }

    /// Entries of `id`: puts in shard `a` (seqs from 1), one tombstone in shard `b`, each
    /// `(id, tombstoned)` pair's put without a body (as a purge leaves it, or as damage does).
    fn bodiless_history(ids: &[(&str, bool)]) -> Vec<Entry> {
        let (a, b) = (
            WriterId::new("a").unwrap().shard_id(),
            WriterId::new("b").unwrap().shard_id(),
        );
        let mut out = Vec::new();
        let mut tombstones = 0;
        for (n, &(id, tombstoned)) in ids.iter().enumerate() {
            let record = Record::text(id, "bot", "s", "user", format!("the body of {id}"));
            let mut put = Entry {
                shard: a,
                seq: n as u64 + 1,
                epoch: 1,
                hlc: Hlc(n as u64 + 1),
                content_hash: record.content_hash(),
                record,
                purged: false,
            };
            put.purge();
            out.push(put);
            if tombstoned {
                tombstones += 1;
                let record = Record::tombstone(id, "bot", "s");
                let mut t = Entry {
                    shard: b,
                    seq: tombstones,
                    epoch: 1,
                    hlc: Hlc(1_000 + tombstones),
                    content_hash: record.content_hash(),
                    record,
                    purged: false,
                };
                t.purge();
                out.push(t);
            }
        }
        out
    }

    /// A row without a body is what a purge leaves only where its id has a tombstone (here
    /// in another shard, seen before or after it, in one batch or on the hashing threads);
    /// anywhere else it is `Corrupt`, with the hash of what a reader serves (empty text).
    #[test]
    fn a_missing_body_is_corrupt_unless_its_id_has_a_tombstone() {
        for many in [1, BATCH * 3] {
            let ids: Vec<(String, bool)> = (0..many).map(|n| (format!("gone{n}"), true)).collect();
            let mut ids: Vec<(&str, bool)> = ids.iter().map(|(i, t)| (i.as_str(), *t)).collect();
            ids.push(("live", false));
            let entries = bodiless_history(&ids);
            let live = entries.iter().find(|e| e.record.id == "live").unwrap();
            let expected = vec![Conflict::Corrupt {
                shard: live.shard,
                seq: live.seq,
                epoch: live.epoch,
                id: "live".into(),
                stored_hash: live.content_hash,
                actual_hash: live.record.content_hash(),
            }];
            assert_ne!(live.content_hash, live.record.content_hash());
            assert_eq!(model::conflicts(&entries), expected, "the model, {many} rows");
            for order in [entries.clone(), entries.iter().rev().cloned().collect()] {
                let mut checker = HistoryChecker::new();
                for e in order {
                    checker.visit(e);
                }
                assert_eq!(checker.finish(None), expected, "{many} rows");
            }
        }
    }

    /// A missing body is corrupt even where what a reader serves, empty text, is what the
    /// stored hash covers: the body stored was not missing.
    #[test]
    fn a_missing_empty_body_is_corrupt_too() {
        let record = Record::text("empty", "bot", "s", "user", "");
        let mut e = Entry {
            shard: WriterId::new("a").unwrap().shard_id(),
            seq: 1,
            epoch: 1,
            hlc: Hlc(1),
            content_hash: record.content_hash(),
            record,
            purged: false,
        };
        e.purge();
        let mut checker = HistoryChecker::new();
        checker.visit(e.clone());
        let found = checker.finish(None);
        assert!(matches!(&found[..], [Conflict::Corrupt { .. }]), "{found:?}");
        assert_eq!(found, model::conflicts(&[e]));
    }

    /// A check after a checkpoint answers "has this id a tombstone" for a row without a body
    /// past it from its index: the tombstone may lie below the checkpoint, in another shard.
    /// A row of a live id without a body past the checkpoint is `Corrupt`; the answer is the
    /// full check's, restricted.
    #[tokio::test]
    async fn a_check_after_a_checkpoint_finds_tombstones_below_it() {
        use crate::traits::Store;
        let options = crate::options::StoreOptions {
            create_if_missing: true,
            ..Default::default()
        };
        let store = crate::testing::MemoryStore::open(&format!("bodiless-{}", uuid::Uuid::new_v4()), options).unwrap();
        // Tombstones first (shard b), then the puts (shard a), both without bodies.
        let entries = bodiless_history(&[("gone", true), ("live", false), ("also-gone", true)]);
        let (tombstones, puts): (Vec<Entry>, Vec<Entry>) =
            entries.into_iter().partition(|e| e.record.kind == Kind::Tombstone);
        for e in &tombstones {
            store.inject_raw_entry(e.clone());
        }
        let mut reader = store.projector();
        reader.refresh().await.unwrap();
        let cp = reader.checkpoint();
        for e in &puts {
            store.inject_raw_entry(e.clone());
        }
        let all: Vec<Entry> = tombstones.iter().chain(&puts).cloned().collect();
        let full = model::conflicts(&all);
        assert_eq!(
            full.iter().map(Conflict::kind).collect::<Vec<_>>(),
            [crate::ConflictKind::Corrupt]
        );
        assert_eq!(store.conflict_discovery().conflicts(None).await.unwrap(), full);
        let want: Vec<Conflict> = full.iter().filter(|c| c.involves_entries_after(&cp)).cloned().collect();
        assert_eq!(want, full);
        let mut discovery = store.conflict_discovery();
        assert_eq!(discovery.conflicts(Some(&cp)).await.unwrap(), want, "after {cp:?}");
        // Past every entry: nothing.
        reader.refresh().await.unwrap();
        assert_eq!(
            discovery.conflicts(Some(&reader.checkpoint())).await.unwrap(),
            Vec::new()
        );
    }

    /// The plausible horizon is the last plausible millisecond: at it, no conflict; one past
    /// it, `ImplausibleHlc` (the model's boundary too).
    #[test]
    fn the_clock_horizon_is_inclusive() {
        let s = WriterId::new("w").unwrap().shard_id();
        let at = |seq: u64, millis: u64| {
            let record = Record::text(format!("id{seq}"), "b", "s", "r", "text");
            Entry {
                shard: s,
                seq,
                epoch: 1,
                hlc: Hlc::from_parts(millis, 0),
                content_hash: record.content_hash(),
                record,
                purged: false,
            }
        };
        let entries = [at(1, Hlc::PLAUSIBLE_MILLIS), at(2, Hlc::PLAUSIBLE_MILLIS + 1)];
        let mut checker = HistoryChecker::new();
        for e in &entries {
            checker.visit(e.clone());
        }
        let found = checker.finish(None);
        assert!(
            matches!(&found[..], [Conflict::ImplausibleHlc { seq: 2, .. }]),
            "{found:?}"
        );
        assert_eq!(found, model::conflicts(&entries));
    }

    #[test]
    fn checkpoint_filter_keeps_conflicts_involving_new_entries() {
        let s = WriterId::new("w").unwrap().shard_id();
        let mk = |seq: u64, hlc: u64, text: &str| {
            let record = Record::text("x", "b", "s", "r", text);
            Entry {
                shard: s,
                seq,
                epoch: 1,
                hlc: Hlc(hlc),
                content_hash: record.content_hash(),
                record,
                purged: false,
            }
        };
        let mut c = HistoryChecker::new();
        c.visit(mk(1, 1, "a"));
        c.visit(mk(2, 2, "b"));
        let mut cp = Checkpoint::default();
        cp.advance(s, 1);
        let mut c2 = HistoryChecker::new();
        c2.visit(mk(1, 1, "a"));
        c2.visit(mk(2, 2, "b"));
        assert_eq!(c.finish(Some(&cp)).len(), 1);
        cp.advance(s, 2);
        assert!(c2.finish(Some(&cp)).is_empty());
    }
}
