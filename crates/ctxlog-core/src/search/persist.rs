//! A search index saved as bytes (issue 34, rule 26's derived data): a [`Searcher`] — its
//! [`TextIndex`] and how far it read each shard — so that a cold replica loads it and reads
//! only the entries past it instead of indexing the whole log again.
//!
//! Naming:
//! - a *saved index* is one byte string: [`MAGIC`], [`FORMAT`], a BLAKE3 checksum of the
//!   rest, the length of the *header* (postcard: the store's identity, the [`Cells`], the
//!   position, the *tails*, every bot's ids, docs, postings, embeddings and cells), the
//!   header, then every lane's vectors as little-endian `f32`, cell by cell in slot order,
//!   then its centroids';
//! - a shard's *tail* is what the searcher read at its position in that shard (epoch, clock
//!   and content hash of each entry at that seq): a loader checks the store still holds it,
//!   so an index of a store that was rolled back (restored from an older copy) is not used.
//!
//! What a saved index holds is the index's state, not its entries: a doc's text is there only
//! as its terms' postings, and a tombstoned record's doc, terms and vectors left the index
//! when the tombstone was fed (what [`decode`] rebuilds is the same state, derived tables
//! included). Decoding checks every number against what it names: a damaged or crafted
//! saved index is [`Rejected`], never a panic, and the searcher then builds from the log.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    BotText, CellNo, CellVectors, Cells, Centroid, Declaration, Doc, DocMap, Held, IdState, LOOSE, Lane, Positions,
    Postings, Searcher, Slot, TermNo, TextIndex,
};
use crate::entry::{Checkpoint, OrderKey};
use crate::error::Result;
use crate::hlc::Hlc;
use crate::ids::ShardId;
use crate::record::Metric;
use crate::traits::Store;
use crate::validate::MAX_DIMENSIONS;

/// The first bytes of every saved index.
pub const MAGIC: &[u8; 8] = b"CTXLOGSX";

/// The format this build writes and reads. A loader skips a saved index of another format and
/// builds from the log.
pub const FORMAT: u32 = 1;

const PREAMBLE: usize = MAGIC.len() + 4 + 32 + 8;

/// Entries read at a tail: those of its seq are first (a seq holds more than one only when
/// a fenced writer's append landed beside its successor's; past this many, a tail cannot be
/// checked and the saved index is not used).
const TAIL_READ: usize = 16;

/// Why a saved index was not used (the searcher builds from the log instead).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Too short, or another kind of file.
    #[error("not a saved search index ({0})")]
    NotAnIndex(String),
    /// Written by a build with another format.
    #[error("saved search index of format {found}, this build reads format {FORMAT}")]
    UnknownFormat {
        /// The format it says it has.
        found: u32,
    },
    /// The checksum does not match, or the bytes do not decode into a valid index.
    #[error("corrupt saved search index: {0}")]
    Corrupt(String),
    /// Saved of another store.
    #[error("saved search index of another store (`{found}`, this store is `{expected}`)")]
    Foreign {
        /// This store's identity.
        expected: String,
        /// The saved index's.
        found: String,
    },
    /// Of other cells than the loader's, or of entries the store no longer holds as read.
    #[error("stale saved search index: {0}")]
    Stale(String),
}

/// A fingerprint of the rules a saved index was built by: tokens of a fixed text (scripts,
/// case, CJK), which keys are sampled, BM25 and the coarse similarity of fixed inputs. A
/// build whose rules differ (a new tokenizer, say) refuses an index saved by another and
/// builds from the log, so that its answers are the log's under its own rules.
pub fn rules() -> u64 {
    let mut h = blake3::Hasher::new();
    for t in super::tokens("Où est mon REMBOURSEMENT? 東京 refund-7781 don't ½ İstanbul") {
        h.update(t.as_bytes());
        h.update(b"\0");
    }
    for seq in 1..64u64 {
        let key = OrderKey {
            hlc: Hlc(seq),
            shard: ShardId(uuid::Uuid::from_u128(u128::from(seq) * 7919)),
            seq,
            epoch: 1,
        };
        h.update(&[u8::from(super::sampled(&key, super::CELLS.sample.min(8)))]);
    }
    h.update(&super::bm25(2.0, 3.0, 10.0, 7.0, 5.5).to_bits().to_le_bytes());
    let (q, v) = (
        [0.5f32, -1.0, 2.0, 0.25, 1.0, -0.5, 3.0, 0.125, 1.5],
        [1.0f32, 0.5, -2.0, 4.0, 0.0, 1.0, -1.0, 2.0, 0.75],
    );
    for m in Metric::ALL {
        h.update(&super::coarse(m, &q, &v, super::norm8(&v)).to_bits().to_le_bytes());
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("eight bytes"))
}

/// What a searcher read at its position in one shard: the entries at that seq (a fenced
/// writer's that landed and its successor's may share it), as `(epoch, hlc, content hash)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tail {
    shard: [u8; 16],
    seq: u64,
    entries: Vec<(u64, u64, [u8; 32])>,
}

/// The entries `store` holds at `seq` of `shard`, as a tail names them, and whether there
/// may be more than [`TAIL_READ`] of them (then not all are here).
async fn entries_at(store: &dyn Store, shard: ShardId, seq: u64) -> Result<(Vec<(u64, u64, [u8; 32])>, bool)> {
    let page = store.read_shard(shard, seq.saturating_sub(1), TAIL_READ).await?;
    let at: Vec<_> = page
        .iter()
        .filter(|e| e.seq == seq)
        .map(|e| (e.epoch, e.hlc.0, e.content_hash.0))
        .collect();
    Ok((at, page.len() == TAIL_READ && page.iter().all(|e| e.seq == seq)))
}

/// An order key as saved: clock, shard, seq, epoch.
type Key = (u64, [u8; 16], u64, u64);

fn key_of(k: &OrderKey) -> Key {
    (k.hlc.0, *k.shard.0.as_bytes(), k.seq, k.epoch)
}

fn order_key((hlc, shard, seq, epoch): Key) -> OrderKey {
    OrderKey {
        hlc: Hlc(hlc),
        shard: ShardId(uuid::Uuid::from_bytes(shard)),
        seq,
        epoch,
    }
}

fn metric_no(m: Metric) -> u8 {
    match m {
        Metric::Cosine => 0,
        Metric::Dot => 1,
        Metric::L2 => 2,
    }
}

/// An id: dead (`None`), or its winner's key and doc.
type SavedId<'a> = (&'a str, Option<(Key, Option<u64>)>);
/// A term number's term (none: a free number), its live docs in order, how many positions
/// each holds it at, and those positions, doc after doc.
type SavedPostings<'a> = (Option<&'a str>, Vec<u64>, Vec<u32>, Vec<u32>);
/// An id's newest embedding per model, key, dimension, metric.
type SavedHeld<'a> = (&'a str, Vec<(&'a str, Key, u32, u8)>);
/// A cell's centroid's key and its slots: id, norm, coarse similarity to the centroid.
type SavedCell<'a> = (Option<Key>, Vec<(&'a str, f32, f32)>);

#[derive(Serialize, Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    store_id: &'a str,
    taken_millis: u64,
    /// [`rules`] of the build that saved it.
    rules: u64,
    cells: (u64, u64, u64, u64),
    at: Vec<([u8; 16], u64)>,
    tails: Vec<Tail>,
    #[serde(borrow)]
    bots: Vec<SavedBot<'a>>,
}

#[derive(Serialize, Deserialize)]
struct SavedBot<'a> {
    #[serde(borrow)]
    bot: &'a str,
    /// Per id, dead (`None`) or its winner's key and doc.
    #[serde(borrow)]
    ids: Vec<SavedId<'a>>,
    #[serde(borrow)]
    /// The live docs in the order of their numbers, numbered from 0 (a doc's number orders
    /// postings; nothing else depends on it).
    docs: Vec<SavedDoc<'a>>,
    /// Per term number, its term (none: a free number) and its live docs with positions.
    #[serde(borrow)]
    postings: Vec<SavedPostings<'a>>,
    free: Vec<TermNo>,
    /// Per id, its newest embedding per model, key, dimension, metric.
    #[serde(borrow)]
    vectors: Vec<SavedHeld<'a>>,
    #[serde(borrow)]
    lanes: Vec<SavedLane<'a>>,
}

#[derive(Serialize, Deserialize)]
struct SavedDoc<'a> {
    key: Key,
    #[serde(borrow)]
    id: &'a str,
    #[serde(borrow)]
    session: &'a str,
    #[serde(borrow)]
    role: &'a str,
    /// As JSON.
    #[serde(borrow)]
    metadata: Option<Cow<'a, str>>,
    len: u32,
    text: bool,
}

#[derive(Serialize, Deserialize)]
struct SavedLane<'a> {
    #[serde(borrow)]
    model: &'a str,
    dim: u32,
    metric: u8,
    /// Per cell, its centroid's key and its slots: id, norm, coarse similarity to the
    /// centroid (the vectors follow the header).
    #[serde(borrow)]
    cells: Vec<SavedCell<'a>>,
    free: Vec<CellNo>,
    /// Id, key, norm and cell of each centroid, in routing order (their vectors follow the
    /// cells').
    #[serde(borrow)]
    centroids: Vec<(&'a str, Key, f32, CellNo)>,
}

impl Searcher {
    /// What this searcher read at its position in each shard of `store` ([`Tail`]).
    pub async fn tails(&self, store: &dyn Store) -> Result<Vec<Tail>> {
        let mut tails = Vec::new();
        for (&shard, &seq) in &self.at.0 {
            if seq > 0 {
                let (entries, _) = entries_at(store, shard, seq).await?;
                tails.push(Tail {
                    shard: *shard.0.as_bytes(),
                    seq,
                    entries,
                });
            }
        }
        Ok(tails)
    }

    /// Whether `store` still holds every entry of `tails` (an index of a store restored from
    /// an older copy names entries it does not hold, or holds otherwise).
    pub async fn holds_tails(store: &dyn Store, tails: &[Tail]) -> Result<std::result::Result<(), Rejected>> {
        for t in tails {
            let shard = ShardId(uuid::Uuid::from_bytes(t.shard));
            let (held, full) = entries_at(store, shard, t.seq).await?;
            if full {
                return Ok(Err(Rejected::Stale(format!(
                    "shard {shard} holds more than {TAIL_READ} entries at seq {}: its tail cannot be checked",
                    t.seq
                ))));
            }
            if let Some(missing) = t.entries.iter().find(|e| !held.contains(e)) {
                return Ok(Err(Rejected::Stale(format!(
                    "shard {shard} does not hold the entry of epoch {} at seq {} that the index read",
                    missing.0, t.seq
                ))));
            }
        }
        Ok(Ok(()))
    }

    /// This searcher as a saved index of store `store_id`, taken at `taken_millis`, with the
    /// `tails` of its position ([`Searcher::tails`]). Settles the index first: what is saved
    /// is whole.
    pub fn encode(&self, store_id: &str, taken_millis: u64, tails: Vec<Tail>) -> Result<Vec<u8>> {
        if !self.settled() {
            return Err(crate::error::Error::invalid(
                "searcher",
                None,
                "its index is not settled (a catch-up did not finish): catch up first",
            ));
        }
        let ix = &self.index;
        let c = ix.cells;
        // The vectors borrowed where they lie, copied once, into the output.
        let mut floats: Vec<&[f32]> = Vec::new();
        let mut bots: Vec<(&String, &BotText)> = ix.bots.iter().collect();
        bots.sort_unstable_by_key(|(name, _)| *name);
        let header = Header {
            store_id,
            rules: rules(),
            taken_millis,
            cells: (c.sample, c.probe as u64, c.candidates as u64, c.exact as u64),
            at: self.at.0.iter().map(|(s, &seq)| (*s.0.as_bytes(), seq)).collect(),
            tails,
            bots: bots
                .into_iter()
                .map(|(name, b)| save_bot(name, b, &mut floats))
                .collect(),
        };
        let vector_bytes: usize = floats.iter().map(|v| 4 * v.len()).sum();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&[0; 32]);
        out.extend_from_slice(&[0; 8]);
        let mut out = postcard::to_extend(&header, out).expect("an index encodes");
        let head = out.len() - PREAMBLE;
        out[PREAMBLE - 8..PREAMBLE].copy_from_slice(&(head as u64).to_le_bytes());
        let mut at = out.len();
        out.resize(at + vector_bytes, 0);
        for v in floats {
            let to = &mut out[at..at + 4 * v.len()];
            for (b, f) in to.chunks_exact_mut(4).zip(v) {
                b.copy_from_slice(&f.to_le_bytes());
            }
            at += 4 * v.len();
        }
        let sum = blake3::hash(&out[MAGIC.len() + 4 + 32..]);
        out[MAGIC.len() + 4..][..32].copy_from_slice(sum.as_bytes());
        Ok(out)
    }
}

fn save_bot<'a>(name: &'a str, b: &'a BotText, floats: &mut Vec<&'a [f32]>) -> SavedBot<'a> {
    // Docs renumbered densely, in the order of their numbers.
    let mut numbers: Vec<u64> = b.docs.keys().copied().collect();
    numbers.sort_unstable();
    let mut dense: DocMap<u64> = DocMap::default();
    dense.reserve(numbers.len());
    for (new, &old) in numbers.iter().enumerate() {
        dense.insert(old, new as u64);
    }
    let mut ids: Vec<_> = b
        .ids
        .iter()
        .map(|(id, s)| {
            let state = match s {
                IdState::Dead => None,
                IdState::Live { key, doc } => Some((key_of(key), doc.map(|d| dense[&d]))),
            };
            (&**id, state)
        })
        .collect();
    ids.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let docs = numbers
        .iter()
        .map(|no| {
            let d = &b.docs[no];
            SavedDoc {
                key: key_of(&d.key),
                id: &d.id,
                session: &d.session,
                role: &d.role,
                metadata: d.metadata.as_ref().map(|m| Cow::Owned(m.to_string())),
                len: d.len,
                text: d.text,
            }
        })
        .collect();
    let postings = b
        .postings
        .iter()
        .map(|p| {
            // Only live docs: a removed doc's postings are dropped lazily in memory.
            let (mut docs, mut counts, mut positions) = (Vec::new(), Vec::new(), Vec::new());
            for (d, ps) in &p.docs {
                if let Some(&new) = dense.get(d) {
                    docs.push(new);
                    counts.push(ps.as_slice().len() as u32);
                    positions.extend_from_slice(ps.as_slice());
                }
            }
            (p.term.as_deref(), docs, counts, positions)
        })
        .collect();
    let mut vectors: Vec<_> = b
        .vectors
        .iter()
        .map(|(id, held)| {
            let held = held
                .iter()
                .map(|(m, h)| (&**m, key_of(&h.key), h.decl.0 as u32, metric_no(h.decl.1)))
                .collect();
            (&**id, held)
        })
        .collect();
    vectors.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut lanes: Vec<(&Arc<str>, &Declaration, &Lane)> = b
        .lanes
        .iter()
        .flat_map(|(m, ls)| ls.iter().map(move |(d, l)| (m, d, l)))
        .collect();
    lanes.sort_unstable_by(|a, b| (a.0, metric_no(a.1.1), a.1.0).cmp(&(b.0, metric_no(b.1.1), b.1.0)));
    let lanes = lanes
        .into_iter()
        .map(|(model, &(dim, metric), lane)| {
            let cells = lane
                .cells
                .iter()
                .map(|cell| {
                    let slots = cell
                        .iter(dim)
                        .map(|(s, v)| {
                            floats.push(v);
                            (&*s.id, s.norm, s.near)
                        })
                        .collect();
                    (cell.centroid.as_ref().map(key_of), slots)
                })
                .collect();
            floats.push(&lane.centroid_vectors);
            SavedLane {
                model,
                dim: dim as u32,
                metric: metric_no(metric),
                cells,
                free: lane.free.clone(),
                centroids: lane
                    .centroids
                    .iter()
                    .map(|c| (&*c.id, key_of(&c.key), c.norm, c.cell))
                    .collect(),
            }
        })
        .collect();
    SavedBot {
        bot: name,
        ids,
        docs,
        postings,
        free: b.free.clone(),
        vectors,
        lanes,
    }
}

/// A saved index that passed every check of [`decode`].
#[derive(Debug)]
pub struct Decoded {
    /// The searcher as it was saved (it reads the store's format again before it reads on).
    pub searcher: Searcher,
    /// What it read at its position ([`Searcher::holds_tails`]).
    pub tails: Vec<Tail>,
    /// When it was saved (milliseconds since the epoch, the saver's clock).
    pub taken_millis: u64,
}

/// The searcher `bytes` hold, if they are a saved index of this format of store `store_id`
/// with these `cells`, whole and consistent.
pub fn decode(bytes: &[u8], store_id: &str, cells: Cells) -> std::result::Result<Decoded, Rejected> {
    decode_by(bytes, store_id, cells, rules())
}

/// [`decode`] by a build whose [`rules`] are `by`.
fn decode_by(bytes: &[u8], store_id: &str, cells: Cells, by: u64) -> std::result::Result<Decoded, Rejected> {
    if bytes.len() < PREAMBLE || &bytes[..MAGIC.len()] != MAGIC {
        return Err(Rejected::NotAnIndex(format!("{} bytes without its magic", bytes.len())));
    }
    let found = u32::from_le_bytes(bytes[MAGIC.len()..][..4].try_into().expect("four bytes"));
    if found != FORMAT {
        return Err(Rejected::UnknownFormat { found });
    }
    let sum = &bytes[MAGIC.len() + 4..][..32];
    let rest = &bytes[MAGIC.len() + 4 + 32..];
    if blake3::hash(rest).as_bytes() != sum {
        return Err(corrupt("the checksum does not match"));
    }
    let len = u64::from_le_bytes(rest[..8].try_into().expect("eight bytes"));
    let body = &rest[8..];
    let head_len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= body.len())
        .ok_or_else(|| corrupt("the header is longer than the bytes"))?;
    let (head, tail) = body.split_at(head_len);
    let header: Header<'_> = postcard::from_bytes(head).map_err(|e| corrupt(format!("header: {e}")))?;
    if header.store_id != store_id {
        return Err(Rejected::Foreign {
            expected: store_id.to_string(),
            found: header.store_id.to_string(),
        });
    }
    let (sample, probe, candidates, exact) = header.cells;
    let saved = Cells {
        sample,
        probe: probe as usize,
        candidates: candidates as usize,
        exact: exact as usize,
    };
    if header.rules != by {
        return Err(Rejected::Stale(
            "saved by a build whose search rules (tokenizer, sampling, scoring) differ".into(),
        ));
    }
    if saved != cells {
        return Err(Rejected::Stale(format!(
            "saved with cells {saved:?}, this searcher's are {cells:?}"
        )));
    }
    // Every shard read is named by its tail, with what was read there: a loader checks it.
    for &(shard, seq) in &header.at {
        let told = header
            .tails
            .iter()
            .any(|t| t.shard == shard && t.seq == seq && !t.entries.is_empty());
        if seq > 0 && !told {
            return Err(corrupt(format!(
                "no tail names seq {seq} of shard {}",
                uuid::Uuid::from_bytes(shard)
            )));
        }
    }
    if !tail.len().is_multiple_of(4) {
        return Err(corrupt("the vectors are not whole"));
    }
    let mut floats = Floats { bytes: tail };
    let mut bots = HashMap::with_capacity(header.bots.len());
    for saved in header.bots {
        let name = saved.bot.to_string();
        let bot = load_bot(saved, &mut floats).map_err(|why| corrupt(format!("bot `{name}`: {why}")))?;
        if bots.insert(name, bot).is_some() {
            return Err(corrupt("a bot twice"));
        }
    }
    if !floats.bytes.is_empty() {
        return Err(corrupt("vectors past the last lane's"));
    }
    let mut at = Checkpoint::default();
    for (shard, seq) in header.at {
        at.0.insert(ShardId(uuid::Uuid::from_bytes(shard)), seq);
    }
    Ok(Decoded {
        searcher: Searcher {
            index: TextIndex {
                bots,
                cells,
                unsettled: false,
            },
            at,
            // Read again before reading on: formats move, a restored store may be older.
            scoped: false,
            looked: true,
        },
        tails: header.tails,
        taken_millis: header.taken_millis,
    })
}

fn corrupt(why: impl Into<String>) -> Rejected {
    Rejected::Corrupt(why.into())
}

/// The vectors past the header, taken in the order they were saved.
struct Floats<'a> {
    bytes: &'a [u8],
}

impl Floats<'_> {
    /// The next `into.len()` values, into `into`.
    fn take(&mut self, into: &mut [f32]) -> std::result::Result<(), String> {
        if self.bytes.len() / 4 < into.len() {
            return Err("fewer vectors than its lanes hold".into());
        }
        let (these, rest) = self.bytes.split_at(4 * into.len());
        self.bytes = rest;
        for (f, b) in into.iter_mut().zip(these.chunks_exact(4)) {
            *f = f32::from_le_bytes(b.try_into().expect("four bytes"));
        }
        Ok(())
    }
}

/// A check of [`load_bot`]: `Err(why)` unless `ok`.
fn check(ok: bool, why: impl FnOnce() -> String) -> std::result::Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
}

fn load_bot(s: SavedBot<'_>, floats: &mut Floats<'_>) -> std::result::Result<BotText, String> {
    let n = s.docs.len();
    let mut b = BotText {
        next_doc: n as u64,
        ..BotText::default()
    };
    b.docs.reserve(n);
    // Each doc's terms, by its (dense) number: counted first, so each is one allocation.
    let mut counts = vec![0u32; n];
    for (_, docs, _, _) in &s.postings {
        for &d in docs {
            let at = usize::try_from(d).ok().filter(|&d| d < n);
            let at = at.ok_or_else(|| format!("a term names doc {d}, which is not held"))?;
            counts[at] += 1;
        }
    }
    let mut terms: Vec<Vec<TermNo>> = counts.iter().map(|&c| Vec::with_capacity(c as usize)).collect();
    drop(counts);
    // Postings, and each doc's terms.
    let free: HashSet<TermNo> = s.free.iter().copied().collect();
    check(free.len() == s.free.len(), || "a free term number twice".into())?;
    b.postings.reserve(s.postings.len());
    for (no, (term, docs, counts, positions)) in s.postings.into_iter().enumerate() {
        let no = no as TermNo;
        let Some(term) = term else {
            check(docs.is_empty() && free.contains(&no), || {
                format!("term number {no} is neither held nor free")
            })?;
            b.postings.push(Postings::default());
            continue;
        };
        check(
            !free.contains(&no) && !docs.is_empty() && counts.len() == docs.len(),
            || format!("term number {no} is held and free, or holds no doc, or its counts are not its docs'"),
        )?;
        let mut list = Vec::with_capacity(docs.len());
        let mut rest = &positions[..];
        for (&doc, &count) in docs.iter().zip(&counts) {
            check(list.last().is_none_or(|(d, _)| *d < doc), || {
                format!("the docs of term {no} are not in order")
            })?;
            // In range: every doc was counted above.
            terms[doc as usize].push(no);
            let count = count as usize;
            check(count > 0 && count <= rest.len(), || {
                format!("term {no} in doc {doc}: {count} positions of {} left", rest.len())
            })?;
            let (these, after) = rest.split_at(count);
            rest = after;
            let len = s.docs[doc as usize].len;
            check(
                these.windows(2).all(|w| w[0] < w[1]) && these.last().is_some_and(|&p| p < len),
                || format!("the positions of term {no} in doc {doc} are not in order or past its length"),
            )?;
            list.push((
                doc,
                match these {
                    [one] => Positions::One(*one),
                    _ => Positions::Many(these.into()),
                },
            ));
        }
        check(rest.is_empty(), || format!("positions of term {no} past its docs'"))?;
        let term: Arc<str> = term.into();
        check(b.dict.insert(term.clone(), no).is_none(), || {
            format!("term {term:?} twice")
        })?;
        b.postings.push(Postings {
            term: Some(term),
            live: list.len() as u32,
            docs: list,
        });
    }
    check(free.iter().all(|&no| (no as usize) < b.postings.len()), || {
        "a free term number past the last".into()
    })?;
    b.free = s.free;
    // Docs, with their terms.
    for (no, (d, terms)) in s.docs.into_iter().zip(terms).enumerate() {
        let metadata = match d.metadata {
            None => None,
            Some(json) => Some(Box::new(
                serde_json::from_str(&json).map_err(|e| format!("metadata of doc {no}: {e}"))?,
            )),
        };
        let doc = Doc {
            key: order_key(d.key),
            id: d.id.into(),
            session: b.name(d.session),
            role: b.name(d.role),
            metadata,
            len: d.len,
            text: d.text,
            terms: terms.into_boxed_slice(),
        };
        b.total_len += u64::from(doc.len);
        b.text_docs += u64::from(doc.text);
        b.docs.insert(no as u64, doc);
    }
    // Ids: each live doc is the doc of exactly one id, which names its key.
    b.ids.reserve(s.ids.len());
    b.vectors.reserve(s.vectors.len());
    let mut docs_named = 0usize;
    for (id, state) in s.ids {
        let state = match state {
            None => IdState::Dead,
            Some((key, doc)) => {
                let key = order_key(key);
                if let Some(no) = doc {
                    let d = b
                        .docs
                        .get(&no)
                        .ok_or_else(|| format!("id `{id}` names doc {no}, which is not held"))?;
                    check(*d.id == *id && d.key == key, || {
                        format!("id `{id}` and doc {no} disagree")
                    })?;
                    docs_named += 1;
                }
                IdState::Live { key, doc }
            }
        };
        check(b.ids.insert(id.into(), state).is_none(), || format!("id `{id}` twice"))?;
    }
    check(docs_named == b.docs.len(), || "a doc that no id names".into())?;
    // Embeddings held, and the models' declarations they make.
    let mut models: HashSet<Arc<str>> = HashSet::new();
    let mut held_count = 0usize;
    for (id, held) in s.vectors {
        check(!matches!(b.ids.get(id), Some(IdState::Dead)), || {
            format!("dead id `{id}` holds vectors")
        })?;
        let mut by_model = BTreeMap::new();
        for (model, key, dim, metric) in held {
            let dim = dim as usize;
            check((1..=MAX_DIMENSIONS).contains(&dim), || {
                format!("a vector of {dim} dimensions")
            })?;
            let metric = *Metric::ALL
                .get(usize::from(metric))
                .ok_or_else(|| format!("metric number {metric}"))?;
            let model: Arc<str> = match models.get(model) {
                Some(m) => m.clone(),
                None => {
                    let m: Arc<str> = model.into();
                    models.insert(m.clone());
                    m
                }
            };
            let key = order_key(key);
            let decls = b.models.entry(model.clone()).or_default();
            check(decls.insert(key, ((dim, metric), id.into())).is_none(), || {
                format!("two embeddings of one key under model `{model}`")
            })?;
            check(
                by_model
                    .insert(
                        model,
                        Held {
                            key,
                            decl: (dim, metric),
                        },
                    )
                    .is_none(),
                || format!("id `{id}` holds two vectors of one model"),
            )?;
            held_count += 1;
        }
        check(b.vectors.insert(id.into(), by_model).is_none(), || {
            format!("id `{id}` twice among vectors")
        })?;
    }
    // Lanes: every vector held is in exactly one slot of its model's lane of its declaration.
    let mut slots_count = 0usize;
    for l in s.lanes {
        let model = models
            .get(l.model)
            .ok_or_else(|| format!("a lane of model `{}`, of which no vector is held", l.model))?;
        let model = model.clone();
        let dim = l.dim as usize;
        check((1..=MAX_DIMENSIONS).contains(&dim), || {
            format!("a lane of {dim} dimensions")
        })?;
        let metric = *Metric::ALL
            .get(usize::from(l.metric))
            .ok_or_else(|| format!("metric number {}", l.metric))?;
        let decl = (dim, metric);
        let mut lane = Lane::new(decl);
        lane.at.reserve(l.cells.iter().map(|c| c.1.len()).sum());
        lane.cells.clear();
        let born = l.centroids.len() as u64;
        let mut v = vec![0.0f32; dim];
        for (cell, (centroid, slots)) in l.cells.into_iter().enumerate() {
            let mut c = CellVectors {
                centroid: centroid.map(order_key),
                ..CellVectors::default()
            };
            for (id, norm, near) in slots {
                floats.take(&mut v)?;
                let agrees = b
                    .vectors
                    .get(id)
                    .and_then(|h| h.get(&*model))
                    .is_some_and(|h| h.decl == decl);
                check(agrees, || {
                    format!("id `{id}` in a lane of model `{model}` it holds no such vector of")
                })?;
                let doc = match b.ids.get(id) {
                    Some(IdState::Live { doc: Some(d), .. }) => Some((*d, b.docs[d].key)),
                    _ => None,
                };
                let id: Arc<str> = id.into();
                check(
                    lane.at
                        .insert(id.clone(), (cell as CellNo, c.slots.len() as u32))
                        .is_none(),
                    || format!("id `{id}` twice in a lane of model `{model}`"),
                )?;
                let slot = Slot {
                    id,
                    norm,
                    near,
                    routed_at: born,
                    doc,
                };
                c.push(dim, slot, &v);
            }
            lane.cells.push(c);
        }
        check(!lane.at.is_empty(), || format!("an empty lane of model `{model}`"))?;
        slots_count += lane.at.len();
        let cells_len = lane.cells.len();
        check(cells_len > LOOSE as usize, || "a lane without its loose cell".into())?;
        let free: HashSet<CellNo> = l.free.iter().copied().collect();
        check(free.len() == l.free.len(), || "a free cell twice".into())?;
        for &f in &l.free {
            let cell = lane.cells.get(f as usize);
            check(
                f != LOOSE && cell.is_some_and(|c| c.centroid.is_none() && c.slots.is_empty()),
                || format!("free cell {f} is not an empty cell"),
            )?;
        }
        lane.free = l.free;
        let mut centroid_cells = HashSet::new();
        for (n, (id, key, norm, cell)) in l.centroids.into_iter().enumerate() {
            let key = order_key(key);
            let owns = lane.cells.get(cell as usize).is_some_and(|c| c.centroid == Some(key));
            check(cell != LOOSE && owns && centroid_cells.insert(cell), || {
                format!("centroid `{id}` names cell {cell}, which is not its own")
            })?;
            let held = b.vectors.get(id).and_then(|h| h.get(&*model)).map(|h| h.key);
            check(
                held == Some(key) && !lane.centroids.iter().any(|c| &*c.id == id),
                || format!("centroid `{id}` is not its id's vector, or is twice"),
            )?;
            check(lane.at.contains_key(id), || {
                format!("centroid `{id}` holds no vector in its lane")
            })?;
            floats.take(&mut v)?;
            lane.centroid_vectors.extend_from_slice(&v);
            lane.centroids.push(Centroid {
                id: id.into(),
                key,
                norm,
                born: n as u64 + 1,
                cell,
            });
        }
        let owned = lane.cells.iter().filter(|c| c.centroid.is_some()).count();
        check(owned == lane.centroids.len(), || {
            "a cell of a centroid that is not held".into()
        })?;
        lane.born = born;
        lane.settled = born;
        let lanes = b.lanes.entry(model.clone()).or_default();
        check(lanes.insert(decl, lane).is_none(), || {
            format!("two lanes of one declaration of model `{model}`")
        })?;
    }
    check(slots_count == held_count, || "a vector held in no lane".into())?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build whose search rules differ from the saver's refuses its index (the rules are
    /// a pure function: every build of these sources computes the same).
    #[test]
    fn an_index_saved_under_other_search_rules_is_refused() {
        let bytes = Searcher::new().encode("store", 0, Vec::new()).unwrap();
        assert_eq!(rules(), rules());
        assert!(decode_by(&bytes, "store", super::super::CELLS, rules()).is_ok());
        let other = decode_by(&bytes, "store", super::super::CELLS, rules() ^ 1);
        assert!(matches!(other, Err(Rejected::Stale(_))), "{other:?}");
    }
}
