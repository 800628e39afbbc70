//! Full-text search over a bot's live records (rule 26): the tokenizer, the query language,
//! an inverted index fed with entries, and BM25 scoring. Pure state, no I/O: whoever holds
//! the entries (a projector, a server's view) feeds them; the answer is a pure function of
//! the set of entries fed, in whatever order they came (rule 9).
//!
//! Naming:
//! - a *doc* is the live value of one record id of one bot — its winning put (rule 6), a
//!   `put` or a `summary` with a text body — as long as no tombstone of the id was fed;
//! - a *term* is one token of a doc's text ([`tokens`]); a doc's *length* is its number of
//!   tokens; *postings* hold, per bot and term, the docs holding it and at which token
//!   positions;
//! - a *query* is clauses ([`Query::parse`]): terms, `"phrases"` and `prefix*`es; a *hit* is
//!   a doc that matches a clause and passes the [`Filter`], with its score;
//! - a doc's *vector* under a model is the newest embedding (rule 27) of its id under that
//!   model; a model's *declaration* (dimension and metric) is its earliest vector of a doc,
//!   and only vectors that agree with it are searched ([`Nearest`]); a *hybrid* search ranks
//!   both ways and fuses the two rankings ([`RRF_K`]);
//! - a model's vectors of one declaration are a *lane*, split in *cells* ([`Cells`]): a
//!   vector whose entry is *sampled* is a *centroid*, every vector is in the cell of the
//!   centroid it is nearest by the *coarse* similarity ([`coarse`]); a vector search probes
//!   the cells nearest the query and scores exactly only the best of their *candidates*.
//!
//! Statistics (docs, lengths, document frequencies) are per bot and over the bot's whole
//! live corpus, never filtered: a doc's score does not depend on the filter (a filtered
//! text list is the unfiltered one with docs left out; a vector search takes its candidates
//! among the docs that pass), and nothing of another bot's records — not even how common a
//! word is there — moves a score (rule 23).

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unicode_segmentation::UnicodeSegmentation;

use crate::entry::{Checkpoint, Entry, OrderKey};
use crate::error::{Error, Result, Written};
use crate::record::{Body, Kind, Metric};
use crate::traits::Store;
pub use crate::validate::{MAX_DIMENSIONS, check_model};

/// BM25's term-frequency saturation.
pub const K1: f64 = 1.2;
/// BM25's length normalisation.
pub const B: f64 = 0.75;
/// Terms a `prefix*` clause stands for at most: the first this many in code-point order.
pub const MAX_PREFIX_TERMS: usize = 64;
/// Clauses of a query at most.
pub const MAX_CLAUSES: usize = 32;
/// Terms of one phrase at most.
pub const MAX_PHRASE_TERMS: usize = 16;
/// `prefix*` clauses of a query at most.
pub const MAX_PREFIXES: usize = 4;
/// Bytes of a query at most (what a search may cost is bounded by the clauses above, and
/// they by this).
pub const MAX_QUERY_BYTES: usize = 1024;

/// Reciprocal rank fusion's constant: a hybrid search scores a doc `Σ 1/(RRF_K + rank)` over
/// the text and vector rankings it is in (ranks from 1).
pub const RRF_K: f64 = 60.0;

/// Postings, scored docs or phrase positions a search visits between two looks at its
/// [`Deadline`].
pub const CHECK_EVERY: u32 = 1024;

/// When a search gives up. A search's cost grows with the corpus (a common term's postings),
/// so a replica bounds its time, not only its query: the deadline is looked at before each
/// clause and every [`CHECK_EVERY`] postings, docs or phrase start positions visited (a doc
/// may hold a word millions of times), and a search past it answers
/// [`Error::Timeout`] (`op` `search`, nothing written) instead of holding its thread and the
/// searcher's lock for as long as it takes.
pub struct Deadline {
    passed: Box<dyn Fn() -> bool + Send + Sync>,
    after: Duration,
}

impl Deadline {
    /// No deadline (a search in the caller's own process).
    pub fn never() -> Self {
        Deadline {
            passed: Box::new(|| false),
            after: Duration::MAX,
        }
    }

    /// `budget` from now.
    pub fn after(budget: Duration) -> Self {
        let at = Instant::now().checked_add(budget);
        Deadline {
            passed: Box::new(move || at.is_some_and(|at| Instant::now() >= at)),
            after: budget,
        }
    }

    /// Passed from the `n`th look on (the first is 1): a deterministic clock for tests,
    /// which says where a search looks.
    #[cfg(test)]
    pub(crate) fn at_look(n: usize) -> Self {
        let looks = std::sync::atomic::AtomicUsize::new(0);
        Deadline {
            passed: Box::new(move || looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 >= n),
            after: Duration::ZERO,
        }
    }

    fn check(&self) -> Result<()> {
        if (self.passed)() {
            return Err(Error::Timeout {
                op: "search",
                after: self.after,
                shard: None,
                written: Written::Nothing,
            });
        }
        Ok(())
    }
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline")
            .field("after", &self.after)
            .finish_non_exhaustive()
    }
}

/// A [`Deadline`] looked at every [`CHECK_EVERY`] visits.
struct Clock<'a> {
    deadline: &'a Deadline,
    visits: Cell<u32>,
}

impl Clock<'_> {
    /// Look at the deadline now.
    fn look(&self) -> Result<()> {
        self.visits.set(0);
        self.deadline.check()
    }

    /// One more posting or doc visited.
    fn tick(&self) -> Result<()> {
        let n = self.visits.get() + 1;
        if n >= CHECK_EVERY {
            return self.look();
        }
        self.visits.set(n);
        Ok(())
    }
}

/// The terms of `text`, in order: its words by Unicode's word boundaries (UAX #29), each
/// lower-cased (Unicode's full lower-case mapping). Punctuation and spaces are no terms. A
/// run of Han ideographs or of Hiragana is one term per character (UAX #29 puts a boundary
/// between them), Katakana runs and Hangul words stay whole; no stemming, no stop words.
pub fn tokens(text: &str) -> Vec<String> {
    text.unicode_words().map(str::to_lowercase).collect()
}

/// One clause of a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Clause {
    /// A doc holding the term matches.
    Term(String),
    /// A doc holding these terms one after the other matches.
    Phrase(Vec<String>),
    /// A doc holding a term that starts with this matches (as the first
    /// [`MAX_PREFIX_TERMS`] such terms of the bot, each a `Term`).
    Prefix(String),
}

/// A query: a doc matching any clause is a hit, scored by the sum of its clauses' scores.
/// Made only by [`Query::parse`], which bounds what a search costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    clauses: Vec<Clause>,
}

/// Terms of `text` as one clause: none, a term, or a phrase.
fn clause_of(text: &str) -> Option<Clause> {
    let mut terms = tokens(text);
    match terms.len() {
        0 => None,
        1 => terms.pop().map(Clause::Term),
        _ => Some(Clause::Phrase(terms)),
    }
}

impl Query {
    /// Parse a query. `"…"` (a quote at the start of a word) is a phrase: its terms in
    /// sequence. A word ending in `*` is a prefix (a word of several terms before the `*`,
    /// such as `e-ma*`, is its terms and a prefix of its last). Every other word is a term, or
    /// the phrase of its terms when it has several (`e-mail`, `東京`): what was written
    /// together is searched together. Words are [`tokens`]; a `"` inside a word is part of it.
    /// Refused (`InvalidInput` on field `query`) with no term, a quote not closed, or more
    /// than [`MAX_QUERY_BYTES`], [`MAX_CLAUSES`], [`MAX_PHRASE_TERMS`] or [`MAX_PREFIXES`].
    pub fn parse(q: &str) -> Result<Query> {
        if q.len() > MAX_QUERY_BYTES {
            return Err(Error::invalid(
                "query",
                None,
                format!("{} bytes; at most {MAX_QUERY_BYTES}", q.len()),
            ));
        }
        let mut clauses = Vec::new();
        let mut rest = q.trim_start_matches(char::is_whitespace);
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('"') {
                let Some(end) = after.find('"') else {
                    return Err(Error::invalid("query", None, "a quote is not closed"));
                };
                clauses.extend(clause_of(&after[..end]));
                rest = after[end + 1..].trim_start_matches(char::is_whitespace);
                continue;
            }
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            let (word, tail) = rest.split_at(end);
            rest = tail.trim_start_matches(char::is_whitespace);
            match word.strip_suffix('*') {
                Some(stem) => {
                    let mut terms = tokens(stem);
                    if let Some(last) = terms.pop() {
                        clauses.extend(terms.into_iter().map(Clause::Term));
                        clauses.push(Clause::Prefix(last));
                    }
                }
                None => clauses.extend(clause_of(word)),
            }
        }
        let refuse = |why: String| Err(Error::invalid("query", None, why));
        if clauses.is_empty() {
            return refuse("holds no word to search for".into());
        }
        if clauses.len() > MAX_CLAUSES {
            return refuse(format!("{} clauses; at most {MAX_CLAUSES}", clauses.len()));
        }
        let prefixes = clauses.iter().filter(|c| matches!(c, Clause::Prefix(_))).count();
        if prefixes > MAX_PREFIXES {
            return refuse(format!("{prefixes} prefixes; at most {MAX_PREFIXES}"));
        }
        if let Some(Clause::Phrase(long)) = clauses
            .iter()
            .find(|c| matches!(c, Clause::Phrase(t) if t.len() > MAX_PHRASE_TERMS))
        {
            return refuse(format!("a phrase of {} terms; at most {MAX_PHRASE_TERMS}", long.len()));
        }
        Ok(Query { clauses })
    }

    /// The clauses, in the order written.
    pub fn clauses(&self) -> &[Clause] {
        &self.clauses
    }
}

/// Which docs a search may return (all given conditions hold).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// Only this session's records.
    pub session: Option<String>,
    /// Only records of one of these roles (any role when empty).
    pub roles: Vec<String>,
    /// Only records whose HLC's wall time (milliseconds) is at or past this.
    pub since_millis: Option<u64>,
    /// Only records whose HLC's wall time (milliseconds) is before this.
    pub until_millis: Option<u64>,
    /// Only records whose metadata has each of these top-level keys with exactly this value.
    pub metadata: BTreeMap<String, serde_json::Value>,
}

/// One result: a doc, its score and the terms of the query it holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// The order key of the doc's entry (its winning put).
    pub key: OrderKey,
    /// Its record id.
    pub id: String,
    /// Its score, higher first: BM25 (text), the model's similarity (vector), or reciprocal
    /// rank fusion (hybrid).
    pub score: f64,
    /// The query's terms the doc holds (a prefix's, the terms it stood for), sorted.
    pub matched: Vec<String>,
}

/// Where a page of hits ended: the next page starts after this score and key.
#[derive(Clone, Debug, PartialEq)]
pub struct After {
    /// The last hit's score.
    pub score: f64,
    /// The last hit's key.
    pub key: OrderKey,
}

/// Whether hit `a` comes before `b`: higher score first, then the contract's order (rule 8).
fn before(a: (f64, &OrderKey), b: (f64, &OrderKey)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

/// A map keyed by doc number. Doc numbers are the index's own (counted up per bot), never a
/// caller's, so they need no hash that resists chosen keys: a multiplication and a shift
/// instead of SipHash, on the two lookups a search makes per posting (the doc, its score so
/// far). The 2026-12-07 search bench's 1M-record p99 went from 43 to 13.5 ms.
type DocMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<DocHasher>>;

/// The hasher of [`DocMap`]: a `u64` times 2⁶⁴/φ, its high half folded into its low half.
/// hashbrown takes a bucket from the low bits and a tag from the top 7: the product's low
/// bits alone depend only on the number's low bits (numbers a power of two apart would share
/// a bucket), so the high half, which depends on all of them, is folded in.
#[derive(Default)]
struct DocHasher(u64);

impl std::hash::Hasher for DocHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed (`write_u64`); any other key is still hashed whole.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
}

/// What the index holds of one record id of a bot.
#[derive(Clone, Debug)]
enum IdState {
    /// A tombstone was fed: nothing of it is held, for good (rule 7).
    Dead,
    /// Its winning put so far, and that put's doc if it is one (a put or summary not purged:
    /// of text, or of bytes found only by vector).
    Live { key: OrderKey, doc: Option<u64> },
}

/// One doc: what filters and scoring need, and its distinct terms (to take it out again).
/// Kept small (a replica holds one per live record): terms by number, session and role
/// shared with the bot's other docs.
#[derive(Clone, Debug)]
struct Doc {
    key: OrderKey,
    id: Box<str>,
    session: Arc<str>,
    role: Arc<str>,
    metadata: Option<Box<serde_json::Value>>,
    len: u32,
    /// Whether it is text (a doc of rule 26); a put of bytes is a doc of vector search only.
    text: bool,
    terms: Box<[TermNo]>,
}

/// A term's number in its bot's dictionary (reused once no live doc holds the term).
type TermNo = u32;

/// Where a term stands in one doc: most terms stand once, so one position is held inline.
#[derive(Clone, Debug)]
enum Positions {
    One(u32),
    Many(Box<[u32]>),
}

impl Positions {
    fn as_slice(&self) -> &[u32] {
        match self {
            Positions::One(p) => std::slice::from_ref(p),
            Positions::Many(ps) => ps,
        }
    }
}

/// One term's docs, by doc number. A doc taken out stays in `docs` until the list is
/// compacted (when more than half of it is gone): taking one doc out of a term held by
/// most docs would otherwise move the whole list. Readers skip docs no longer live; `live`
/// counts the others (the term's document frequency).
#[derive(Clone, Debug, Default)]
struct Postings {
    /// The term (shared with the dictionary's key); `None` for a free number.
    term: Option<Arc<str>>,
    docs: Vec<(u64, Positions)>,
    live: u32,
}

impl Postings {
    fn get(&self, doc: u64) -> Option<&Positions> {
        self.docs
            .binary_search_by_key(&doc, |(d, _)| *d)
            .ok()
            .map(|i| &self.docs[i].1)
    }
}

/// One embedding held, as its id knows it: its entry's key (the newest of an id and model
/// replaces the others) and its model's declaration (which lane holds its vector).
#[derive(Clone, Copy, Debug)]
struct Held {
    key: OrderKey,
    decl: Declaration,
}

/// How a vector search approximates (rule 27), a function of the vectors held and nothing
/// else, so that every replica answers the same.
///
/// A vector whose entry is sampled ([`sampled`]: one in `sample`) is a centroid; every
/// vector of the lane is in the cell of the centroid it is nearest by [`coarse`] similarity
/// (the earliest centroid of equals). A search takes the cells best first by the coarse
/// similarity of their centroid to the query (the earliest of equals) until it has taken
/// `probe` cells and they hold `candidates` candidates (docs that pass the filter; a hybrid
/// search's vector ranking takes them unfiltered), then scores exactly the `exact`
/// candidates best by coarse similarity (the earliest doc of equals). A lane without a
/// centroid is one cell. The larger `probe`, `candidates` and `exact`, the nearer exact
/// search (docs/benchmarks.md#vectors-rule-27 measures recall).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cells {
    /// One embedding in `sample` is sampled (at least 1: every one).
    pub sample: u64,
    /// Cells taken at least (at least 1).
    pub probe: usize,
    /// Candidates wanted before a search stops taking cells.
    pub candidates: usize,
    /// Candidates scored exactly, at most: a vector search's whole list (all its pages).
    pub exact: usize,
}

/// The cells every replica searches with (rule 27): at 1M vectors of a model, about 490
/// cells of about 2,000 vectors, 8 of them probed.
pub const CELLS: Cells = Cells {
    sample: 2048,
    probe: 8,
    candidates: 2048,
    exact: 512,
};

impl Default for Cells {
    fn default() -> Self {
        CELLS
    }
}

/// Whether the embedding at `key` is a centroid under `sample` (rule 27): the 64-bit FNV-1a
/// hash of its shard's 16 bytes and then its seq's 8 little-endian bytes is a multiple of
/// `sample`. Of the entry, not of the record id: a writer can name ids as it likes, but only
/// one of its appends in `sample` lands at a sampled seq (it can choose which of its vectors
/// those are, not how many).
pub fn sampled(key: &OrderKey, sample: u64) -> bool {
    let seq = key.seq.to_le_bytes();
    let hash = key
        .shard
        .0
        .as_bytes()
        .iter()
        .chain(&seq)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    hash.is_multiple_of(sample.max(1))
}

/// `Σ f(q[i], v[i])` in `f32` over eight partial sums — dimension `i` into sum `i mod 8`, in
/// order — added as `((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7))`: a fixed order every replica
/// follows to the bit, and one the compiler can run eight wide.
fn lanes8(q: &[f32], v: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut s = [0.0f32; 8];
    let (qs, vs) = (q.chunks_exact(8), v.chunks_exact(8));
    let (qr, vr) = (qs.remainder(), vs.remainder());
    for (a, b) in qs.zip(vs) {
        // Arrays of eight, not slices: no bounds checks, eight lanes at once.
        let (a, b): (&[f32; 8], &[f32; 8]) = (a.try_into().expect("eight"), b.try_into().expect("eight"));
        for i in 0..8 {
            s[i] += f(a[i], b[i]);
        }
    }
    for (i, (&a, &b)) in qr.iter().zip(vr).enumerate() {
        s[i] += f(a, b);
    }
    ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

/// A vector's norm as [`coarse`] takes it: `√(Σ v[i]²)` by [`lanes8`].
fn norm8(v: &[f32]) -> f32 {
    lanes8(v, v, |a, b| a * b).sqrt()
}

/// The coarse similarity of `q` to `v` under `metric` (rule 27's cells; higher is nearer),
/// in `f32` by eight partial sums: cosine `q·v / |v|` (0 when `|v|` is; `q`'s own norm ranks
/// nothing), dot `q·v`, L2 `−|q − v|²`. `norm` is `v`'s ([`norm8`]). A NaN (sums of huge
/// values overflow) is −∞ and −0 is 0: the sign of a NaN differs between processors, and the
/// ranking by IEEE total order must not.
pub fn coarse(metric: Metric, q: &[f32], v: &[f32], norm: f32) -> f32 {
    let s = match metric {
        Metric::Cosine if norm == 0.0 => 0.0,
        Metric::Cosine => lanes8(q, v, |a, b| a * b) / norm,
        Metric::Dot => lanes8(q, v, |a, b| a * b),
        Metric::L2 => -lanes8(q, v, |a, b| (a - b) * (a - b)),
    };
    if s.is_nan() { f32::NEG_INFINITY } else { s + 0.0 }
}

/// Whether `a` is nearer than `b`: more similar, or as similar and earlier.
fn nearer(a: (f32, OrderKey), b: (f32, OrderKey)) -> bool {
    a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)).is_gt()
}

/// A cell's number in its lane. Cell [`LOOSE`] holds the vectors routed to no centroid (a
/// lane without one is one cell); a removed centroid's number is reused.
type CellNo = u32;

/// The cell of vectors routed to no centroid.
const LOOSE: CellNo = 0;

/// One vector of a lane, in its cell (its values are in the cell's blocks, at its slot).
#[derive(Clone, Debug)]
struct Slot {
    id: Arc<str>,
    norm: f32,
    /// Its coarse similarity to its cell's centroid.
    near: f32,
    /// The centroids it was compared with: those born (numbered by arrival) up to this.
    routed_at: u64,
    /// Its id's live doc and that doc's key, if it has one ([`BotText::redoc`] keeps it): a
    /// search takes a candidate without looking its id up.
    doc: Option<(u64, OrderKey)>,
}

/// Vectors a cell holds per block.
const BLOCK: usize = 64;

/// The vectors of one cell side by side, so that a search reads a cell front to back: in
/// blocks of [`BLOCK`] vectors rather than one array, so that a large cell grows without
/// copying and without leaving freed arrays of every size behind (vectors are most of a
/// replica's memory); only the first block grows, from one vector, by doubling.
#[derive(Clone, Debug, Default)]
struct CellVectors {
    /// Its centroid's key (none for the loose cell and a free number's).
    centroid: Option<OrderKey>,
    slots: Vec<Slot>,
    /// Slot `i`'s vector is block `i / BLOCK`'s `i % BLOCK`th.
    blocks: Vec<Box<[f32]>>,
}

impl CellVectors {
    /// The slots with their vectors, in order.
    fn iter(&self, dim: usize) -> impl Iterator<Item = (&Slot, &[f32])> {
        self.slots
            .iter()
            .zip(self.blocks.iter().flat_map(move |b| b.chunks_exact(dim)))
    }

    fn vector_mut(&mut self, dim: usize, i: usize) -> &mut [f32] {
        &mut self.blocks[i / BLOCK][(i % BLOCK) * dim..][..dim]
    }

    fn push(&mut self, dim: usize, slot: Slot, vector: &[f32]) {
        let i = self.slots.len();
        let room = self.blocks.last().map_or(0, |b| b.len() / dim);
        if i.is_multiple_of(BLOCK) {
            // The first block of a cell holds one vector, and doubles up to a whole block:
            // a bot's few vectors of a model cost what they are, not a block each.
            let vectors = if i == 0 { 1 } else { BLOCK };
            self.blocks.push(vec![0.0; vectors * dim].into_boxed_slice());
        } else if i == room {
            let mut grown = vec![0.0; (2 * room).min(BLOCK) * dim];
            grown[..room * dim].copy_from_slice(&self.blocks[0]);
            self.blocks[0] = grown.into_boxed_slice();
        }
        self.vector_mut(dim, i).copy_from_slice(vector);
        self.slots.push(slot);
    }

    /// Take slot `i` out with its vector: the last slot takes its place.
    fn swap_remove(&mut self, dim: usize, i: usize) -> (Slot, Vec<f32>) {
        let last = self.slots.len() - 1;
        let vector = self.vector_mut(dim, i).to_vec();
        if i != last {
            let moved = self.vector_mut(dim, last).to_vec();
            self.vector_mut(dim, i).copy_from_slice(&moved);
        }
        if last.is_multiple_of(BLOCK) {
            self.blocks.pop();
        }
        (self.slots.swap_remove(i), vector)
    }
}

/// A centroid as routing walks it (its vector is its lane's `centroid_vectors` at its index).
#[derive(Clone, Debug)]
struct Centroid {
    id: Arc<str>,
    key: OrderKey,
    norm: f32,
    /// Its number of birth.
    born: u64,
    cell: CellNo,
}

/// A model's vectors of one declaration, in cells ([`Cells`]).
#[derive(Clone, Debug)]
struct Lane {
    dim: usize,
    metric: Metric,
    /// Per vector's id, its cell and slot.
    at: HashMap<Arc<str>, (CellNo, u32)>,
    cells: Vec<CellVectors>,
    /// Cell numbers free for reuse.
    free: Vec<CellNo>,
    centroids: Vec<Centroid>,
    /// The centroids' vectors side by side, in `centroids`' order (what routing walks).
    centroid_vectors: Vec<f32>,
    /// Centroids come so far (each one's number of birth).
    born: u64,
    /// The births up to which every vector was compared with every centroid: the cells of
    /// those born later have not yet taken the vectors held before them that are nearer
    /// them than their own centroid ([`Lane::settle`]). One pass over the lane settles them
    /// all, so that a replica catching up on a long log passes over each lane once rather
    /// than once per centroid.
    settled: u64,
}

impl Lane {
    fn new((dim, metric): Declaration) -> Lane {
        Lane {
            dim,
            metric,
            at: HashMap::new(),
            cells: vec![CellVectors::default()],
            free: Vec::new(),
            centroids: Vec::new(),
            centroid_vectors: Vec::new(),
            born: 0,
            settled: 0,
        }
    }

    /// The centroids with their vectors.
    fn centroids(&self) -> impl Iterator<Item = (&Centroid, &[f32])> {
        self.centroids.iter().zip(self.centroid_vectors.chunks_exact(self.dim))
    }

    /// The cell of the centroid `v` is nearest, and how near (the loose cell while there is
    /// no centroid).
    fn route(&self, v: &[f32]) -> (CellNo, f32) {
        let mut best: Option<(CellNo, f32, OrderKey)> = None;
        for (c, w) in self.centroids() {
            let s = coarse(self.metric, v, w, c.norm);
            if best.is_none_or(|(_, near, k)| nearer((s, c.key), (near, k))) {
                best = Some((c.cell, s, c.key));
            }
        }
        best.map_or((LOOSE, 0.0), |(c, s, _)| (c, s))
    }

    /// Put `slot` with `vector` at the end of `cell`.
    fn put(&mut self, cell: CellNo, slot: Slot, vector: &[f32]) {
        let c = &mut self.cells[cell as usize];
        self.at.insert(slot.id.clone(), (cell, c.slots.len() as u32));
        c.push(self.dim, slot, vector);
    }

    /// Take slot `i` out of `cell` with its vector: the cell's last takes its place. Its id
    /// stays in `at`.
    fn take(&mut self, cell: CellNo, i: u32) -> (Slot, Vec<f32>) {
        let c = &mut self.cells[cell as usize];
        let last = c.slots.len() - 1;
        if i as usize != last {
            *self.at.get_mut(&c.slots[last].id).expect("a slot's id") = (cell, i);
        }
        c.swap_remove(self.dim, i as usize)
    }

    /// Hold `vector` as `id`'s (which holds none in this lane), of `doc`, in the cell of the
    /// centroid it is nearest. A new centroid's cell takes the vectors held before it at the
    /// next [`Lane::settle`].
    fn insert(&mut self, id: &str, key: OrderKey, vector: &[f32], doc: Option<(u64, OrderKey)>, sample: u64) {
        let id: Arc<str> = id.into();
        let norm = norm8(vector);
        if sampled(&key, sample) {
            self.born += 1;
            let cell = self.free.pop().unwrap_or_else(|| {
                self.cells.push(CellVectors::default());
                (self.cells.len() - 1) as CellNo
            });
            self.cells[cell as usize].centroid = Some(key);
            self.centroids.push(Centroid {
                id: id.clone(),
                key,
                norm,
                born: self.born,
                cell,
            });
            self.centroid_vectors.extend_from_slice(vector);
        }
        let (cell, near) = self.route(vector);
        let slot = Slot {
            id,
            norm,
            near,
            routed_at: self.born,
            doc,
        };
        self.put(cell, slot, vector);
    }

    /// Move every vector nearer a centroid born after it was routed than to its own centroid
    /// into that centroid's cell (the nearest and earliest such): one pass over the lane, and
    /// then the cells are as [`Cells`] defines them.
    fn settle(&mut self) {
        if self.settled == self.born {
            return;
        }
        let mut moves: Vec<(Arc<str>, CellNo, f32)> = Vec::new();
        for cell in &self.cells {
            for (slot, v) in cell.iter(self.dim) {
                let mut best: Option<(CellNo, f32, OrderKey)> = None;
                for (c, w) in self.centroids() {
                    if c.born <= slot.routed_at {
                        continue;
                    }
                    let s = coarse(self.metric, v, w, c.norm);
                    let beats = match (best, cell.centroid) {
                        (Some((_, near, k)), _) => nearer((s, c.key), (near, k)),
                        (None, None) => true,
                        (None, Some(own)) => nearer((s, c.key), (slot.near, own)),
                    };
                    if beats {
                        best = Some((c.cell, s, c.key));
                    }
                }
                if let Some((c, s, _)) = best {
                    moves.push((slot.id.clone(), c, s));
                }
            }
        }
        for (id, cell, near) in moves {
            let (from, i) = self.at[&id];
            let (slot, vector) = self.take(from, i);
            self.put(cell, Slot { near, ..slot }, &vector);
        }
        let born = self.born;
        for cell in &mut self.cells {
            for slot in &mut cell.slots {
                slot.routed_at = born;
            }
            // A cell that gave most of its vectors to new cells gives back their room.
            let len = cell.slots.len();
            if cell.slots.capacity() > 2 * len + 16 {
                cell.slots.shrink_to(len + len / 8);
            }
        }
        self.settled = born;
    }

    /// Let go of `id`'s vector; if it was a centroid, its cell's vectors go to the cells of
    /// the centroids they are nearest now.
    fn remove(&mut self, id: &str) {
        let Some(&(cell, i)) = self.at.get(id) else {
            return;
        };
        self.take(cell, i);
        self.at.remove(id);
        let Some(n) = self.centroids.iter().position(|c| &*c.id == id) else {
            return;
        };
        let c = self.centroids.remove(n);
        self.centroid_vectors.drain(n * self.dim..(n + 1) * self.dim);
        let gone = std::mem::take(&mut self.cells[c.cell as usize]);
        self.free.push(c.cell);
        for (slot, v) in gone.iter(self.dim) {
            let slot = slot.clone();
            let (cell, near) = self.route(v);
            let routed_at = self.born;
            self.put(
                cell,
                Slot {
                    near,
                    routed_at,
                    ..slot
                },
                v,
            );
        }
    }

    /// Hold `doc` as the doc of `id`'s vector, if it holds one.
    fn set_doc(&mut self, id: &str, doc: Option<(u64, OrderKey)>) {
        if let Some(&(cell, i)) = self.at.get(id) {
            self.cells[cell as usize].slots[i as usize].doc = doc;
        }
    }
}

/// What an embedding declares of its model: its dimension and metric.
type Declaration = (usize, Metric);

/// A model's declarations by the key of the embedding that made each, with its record id.
type Declarations = BTreeMap<OrderKey, (Declaration, Box<str>)>;

/// A vector search: the `k` docs nearest `vector` under `model`, by the metric the model
/// declares.
#[derive(Clone, Debug, PartialEq)]
pub struct Nearest {
    /// The model the vector was made by (an embedding's role).
    pub model: String,
    /// The query's vector: of the model's dimension.
    pub vector: Vec<f32>,
}

impl Nearest {
    /// A vector search, checked as every surface checks it: the model's name
    /// ([`check_model`], field `model`), 1 to [`MAX_DIMENSIONS`] finite values (field
    /// `vector`).
    pub fn new(model: impl Into<String>, vector: Vec<f32>) -> Result<Nearest> {
        let model = model.into();
        check_model(&model).map_err(|why| Error::invalid("model", None, why))?;
        if vector.is_empty() || vector.len() > MAX_DIMENSIONS {
            return Err(Error::invalid(
                "vector",
                None,
                format!("{} dimensions: from 1 to {MAX_DIMENSIONS}", vector.len()),
            ));
        }
        if let Some(at) = vector.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid("vector", None, format!("value {at} is not finite")));
        }
        Ok(Nearest { model, vector })
    }
}

/// What a search asks: words, a vector, or both (a hybrid search).
#[derive(Clone, Copy, Debug)]
pub enum Ask<'a> {
    /// A full-text query.
    Text(&'a Query),
    /// A vector query.
    Vector(&'a Nearest),
    /// Both, fused by reciprocal rank ([`RRF_K`]).
    Hybrid(&'a Query, &'a Nearest),
}

/// The similarity of `q` and `v` under `metric` (higher is nearer), in `f64` summed in index
/// order, so that every replica computes it to the bit: cosine `q·v / (|q| |v|)` (0 when
/// either is all zeros), dot `q·v`, L2 `−|q − v|`.
pub fn similarity(metric: Metric, q: &[f32], v: &[f32]) -> f64 {
    let pairs = q.iter().zip(v).map(|(&a, &b)| (f64::from(a), f64::from(b)));
    match metric {
        Metric::Cosine => {
            let (mut dot, mut qq, mut vv) = (0.0f64, 0.0f64, 0.0f64);
            for (a, b) in pairs {
                dot += a * b;
                qq += a * a;
                vv += b * b;
            }
            if qq == 0.0 || vv == 0.0 {
                0.0
            } else {
                dot / (qq.sqrt() * vv.sqrt())
            }
        }
        Metric::Dot => pairs.fold(0.0, |dot, (a, b)| dot + a * b),
        Metric::L2 => -pairs.fold(0.0, |dd, (a, b)| dd + (a - b) * (a - b)).sqrt(),
    }
}

/// One bot's part of the index.
#[derive(Clone, Debug, Default)]
struct BotText {
    ids: HashMap<Box<str>, IdState>,
    /// Per record id not dead, its newest embedding per model.
    vectors: HashMap<Box<str>, BTreeMap<Arc<str>, Held>>,
    /// Per model and declaration, the vectors held.
    lanes: HashMap<Arc<str>, HashMap<Declaration, Lane>>,
    /// Per model, the declarations of the embeddings held, by key, with their ids: the
    /// earliest of an id with a live doc governs.
    models: HashMap<Arc<str>, Declarations>,
    docs: DocMap<Doc>,
    next_doc: u64,
    /// The terms some live doc holds, in code-point order (for prefixes), to their numbers.
    dict: BTreeMap<Arc<str>, TermNo>,
    /// Per term number, its postings (empty for a free number).
    postings: Vec<Postings>,
    /// Term numbers free for reuse.
    free: Vec<TermNo>,
    /// Sessions and roles of live docs, each held once.
    names: HashSet<Arc<str>>,
    /// How many docs are of text (rule 26's docs: what BM25's statistics count).
    text_docs: u64,
    total_len: u64,
}

/// The full-text index of every bot's live records.
#[derive(Clone, Debug, Default)]
pub struct TextIndex {
    bots: HashMap<String, BotText>,
    cells: Cells,
    /// Fed since the last [`TextIndex::settle`]: some lane may hold centroids whose cells are not settled.
    unsettled: bool,
}

impl TextIndex {
    /// An empty index, searching vectors by [`CELLS`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty index searching vectors by `cells` (tests: small cells on small corpora). An
    /// index of other cells than [`CELLS`] answers vector searches unlike every replica.
    #[doc(hidden)]
    pub fn with_cells(cells: Cells) -> Self {
        TextIndex {
            bots: HashMap::new(),
            cells,
            unsettled: false,
        }
    }

    /// Feed one entry. Order-independent: any order of the same entries leaves the same
    /// answers. A tombstone takes its id out for good; a put earlier in the contract's order
    /// than the held winner of its id replaces it (rule 6); a later one changes nothing.
    pub fn apply(&mut self, e: &Entry) {
        let unsettled = self.unsettled;
        self.feed(e);
        if let Some(bot) = self.bots.get_mut(&e.record.bot_id) {
            bot.settle();
        }
        self.unsettled = unsettled;
    }

    /// Settle every lane ([`Lane::settle`]): after [`TextIndex::feed`]s, before a search.
    pub(crate) fn settle(&mut self) {
        if std::mem::take(&mut self.unsettled) {
            for bot in self.bots.values_mut() {
                bot.settle();
            }
        }
    }

    /// [`TextIndex::apply`] but for the cells of new centroids, which take the vectors held
    /// before them only at the next [`TextIndex::settle`]: no search may come between.
    pub(crate) fn feed(&mut self, e: &Entry) {
        self.unsettled = true;
        let r = &e.record;
        let sample = self.cells.sample;
        let bot = self.bots.entry(r.bot_id.clone()).or_default();
        if r.kind == Kind::Tombstone {
            if let Some(IdState::Live { doc: Some(doc), .. }) = bot.ids.insert(r.id.as_str().into(), IdState::Dead) {
                bot.remove(doc);
            }
            // Its vectors go with it, for good (rule 27).
            for (model, held) in bot.vectors.remove(r.id.as_str()).unwrap_or_default() {
                bot.undeclare(&model, &held.key);
                bot.unlane(&model, held.decl, &r.id);
            }
            return;
        }
        if r.kind == Kind::Embedding {
            if !matches!(bot.ids.get(r.id.as_str()), Some(IdState::Dead))
                && !e.purged
                && let Some((model, metric, vector)) = r.vector()
            {
                bot.embed(e.key(), model, (vector.len(), metric), &vector, &r.id, sample);
            }
            return;
        }
        let key = e.key();
        match bot.ids.get(r.id.as_str()) {
            Some(IdState::Dead) => return,
            Some(IdState::Live { key: held, .. }) if *held <= key => return,
            Some(IdState::Live { doc: Some(doc), .. }) => {
                let doc = *doc;
                bot.remove(doc);
            }
            _ => {}
        }
        let doc = match (&r.body, r.kind) {
            (_, Kind::Put | Kind::Summary) if e.purged => None,
            (Body::Text(t), Kind::Put | Kind::Summary) => Some(bot.add(e, Some(t))),
            // Found by its vectors only (rule 27).
            (Body::Bytes(_), Kind::Put | Kind::Summary) => Some(bot.add(e, None)),
            _ => None,
        };
        bot.ids.insert(r.id.as_str().into(), IdState::Live { key, doc });
        bot.redoc(&r.id, doc.map(|d| (d, key)));
    }

    /// Whether any live doc of `bot` holds `term` (what a test of forgetting asks: a term only
    /// forgotten records held is gone from the index).
    pub fn has_term(&self, bot: &str, term: &str) -> bool {
        self.bots.get(bot).is_some_and(|b| b.dict.contains_key(term))
    }

    /// Live docs of `bot` (of text, and puts of bytes: rule 27's docs).
    pub fn docs(&self, bot: &str) -> usize {
        self.bots.get(bot).map_or(0, |b| b.docs.len())
    }

    /// The hits of `query` in `bot` that pass `filter`, best first (ties in the contract's
    /// order), past `after`, at most `k`; and whether more follow. No deadline: see
    /// [`TextIndex::search_by`].
    pub fn search(
        &self,
        bot: &str,
        query: &Query,
        filter: &Filter,
        after: Option<&After>,
        k: usize,
    ) -> (Vec<Hit>, bool) {
        match self.search_by(bot, query, filter, after, k, &Deadline::never()) {
            Ok(found) => found,
            Err(_) => unreachable!("a search without a deadline does not time out"),
        }
    }

    /// [`TextIndex::search`], given up at `deadline` ([`Error::Timeout`], nothing written).
    pub fn search_by(
        &self,
        bot: &str,
        query: &Query,
        filter: &Filter,
        after: Option<&After>,
        k: usize,
        deadline: &Deadline,
    ) -> Result<(Vec<Hit>, bool)> {
        self.find_by(bot, Ask::Text(query), filter, after, k, deadline)
    }

    /// The hits of `ask` in `bot` that pass `filter`, best first (ties in the contract's
    /// order), past `after`, at most `k`; and whether more follow. A text search scores by
    /// BM25, a vector search by the model's similarity, a hybrid one by reciprocal rank
    /// fusion of both rankings — each ranking over the bot's docs unfiltered, so that a
    /// filter only leaves docs out — but for a vector search's candidates, taken among the
    /// docs that pass ([`Cells`]). Given up at `deadline` ([`Error::Timeout`], nothing
    /// written).
    pub fn find_by(
        &self,
        bot: &str,
        ask: Ask<'_>,
        filter: &Filter,
        after: Option<&After>,
        k: usize,
        deadline: &Deadline,
    ) -> Result<(Vec<Hit>, bool)> {
        let clock = Clock {
            deadline,
            visits: Cell::new(0),
        };
        let Some(b) = self.bots.get(bot) else {
            return Ok((Vec::new(), false));
        };
        // No early answer for a bot without docs: a query vector of the wrong dimension is
        // refused all the same.
        let mut terms: Vec<&str> = Vec::new();
        let mut phrases: Vec<&[String]> = Vec::new();
        let scores = match ask {
            Ask::Text(query) => b.text_scores(query, &mut terms, &mut phrases, &clock)?,
            Ask::Vector(q) => b.nearest(q, filter, &self.cells, &clock)?,
            Ask::Hybrid(query, q) => {
                let text = b.text_scores(query, &mut terms, &mut phrases, &clock)?;
                let near = b.nearest(q, &Filter::default(), &self.cells, &clock)?;
                let mut fused: DocMap<f64> = DocMap::default();
                // Text first, then vectors: each doc's sum is added in the same order on
                // every replica.
                for ranked in [b.ranked(text, &clock)?, b.ranked(near, &clock)?] {
                    for (rank, doc) in ranked.into_iter().enumerate() {
                        *fused.entry(doc).or_default() += 1.0 / (RRF_K + (rank + 1) as f64);
                    }
                }
                fused
            }
        };
        let mut hits: Vec<(f64, OrderKey, u64)> = Vec::new();
        for (doc, score) in scores {
            clock.tick()?;
            let d = &b.docs[&doc];
            if passes(d, filter) && after.is_none_or(|a| before((a.score, &a.key), (score, &d.key)).is_lt()) {
                hits.push((score, d.key, doc));
            }
        }
        let order = |x: &(f64, OrderKey, u64), y: &(f64, OrderKey, u64)| before((x.0, &x.1), (y.0, &y.1));
        let more = hits.len() > k;
        if more {
            // The best k in front (in no order), the rest behind: no sort of every hit.
            hits.select_nth_unstable_by(k, order);
            hits.truncate(k);
        }
        hits.sort_by(order);
        let hits = hits
            .into_iter()
            .map(|(score, key, doc)| {
                Ok(Hit {
                    key,
                    id: b.docs[&doc].id.to_string(),
                    score,
                    matched: b.matched(doc, &terms, &phrases, &clock)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok((hits, more))
    }

    /// Whether `bot` holds a vector of record `id` under `model` (what a test of forgetting
    /// asks: a tombstoned id's vectors are gone from the index).
    pub fn has_vector(&self, bot: &str, id: &str, model: &str) -> bool {
        let Some(b) = self.bots.get(bot) else { return false };
        b.vectors.get(id).is_some_and(|v| v.contains_key(model))
            || b.lanes
                .get(model)
                .is_some_and(|lanes| lanes.values().any(|l| l.at.contains_key(id)))
    }
}

/// BM25 of one clause in one doc: `idf · tf·(K1+1) / (tf + K1·(1 − B + B·len/avg))`, with
/// `idf = ln(1 + (n − df + 0.5)/(df + 0.5))` (never negative).
pub fn bm25(tf: f64, df: f64, n: f64, len: f64, avg: f64) -> f64 {
    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
    idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg))
}

fn passes(d: &Doc, f: &Filter) -> bool {
    let millis = d.key.hlc.millis();
    f.session.as_deref().is_none_or(|s| s == &*d.session)
        && (f.roles.is_empty() || f.roles.iter().any(|r| r == &*d.role))
        && f.since_millis.is_none_or(|t| millis >= t)
        && f.until_millis.is_none_or(|t| millis < t)
        && f.metadata
            .iter()
            .all(|(k, v)| d.metadata.as_ref().and_then(|m| m.get(k)).is_some_and(|held| held == v))
}

impl BotText {
    /// Hold `e` as a new doc: of `text`, or of no text (a put of bytes).
    fn add(&mut self, e: &Entry, text: Option<&str>) -> u64 {
        let doc = self.next_doc;
        self.next_doc += 1;
        let words = text.map(tokens).unwrap_or_default();
        self.text_docs += u64::from(text.is_some());
        // Per distinct term, its positions: a doc's number is the largest yet, so each
        // term's postings take it at their end.
        let mut held: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (pos, t) in words.iter().enumerate() {
            held.entry(t.as_str()).or_default().push(pos as u32);
        }
        let mut terms = Vec::with_capacity(held.len());
        for (t, positions) in held {
            let no = self.term_no(t);
            let positions = match positions[..] {
                [one] => Positions::One(one),
                _ => Positions::Many(positions.into_boxed_slice()),
            };
            let p = &mut self.postings[no as usize];
            p.docs.push((doc, positions));
            p.live += 1;
            terms.push(no);
        }
        let len = words.len() as u32;
        self.total_len += u64::from(len);
        let r = &e.record;
        let session = self.name(&r.session_id);
        let role = self.name(&r.role);
        self.docs.insert(
            doc,
            Doc {
                key: e.key(),
                id: r.id.as_str().into(),
                session,
                role,
                metadata: r.metadata.clone().map(Box::new),
                len,
                text: text.is_some(),
                terms: terms.into_boxed_slice(),
            },
        );
        doc
    }

    /// Hold `vector` as id's embedding under `model` unless a newer one is held (the newest
    /// replaces: rule 27).
    fn embed(&mut self, key: OrderKey, model: &str, decl: Declaration, vector: &[f32], id: &str, sample: u64) {
        let held = self.vectors.get(id).and_then(|v| v.get(model)).copied();
        match held {
            Some(h) if h.key >= key => return,
            Some(h) => {
                self.undeclare(model, &h.key);
                self.unlane(model, h.decl, id);
            }
            None => {}
        }
        // The model's name held once per bot while any vector of it is declared.
        let model: Arc<str> = match self.models.get_key_value(model) {
            Some((m, _)) => m.clone(),
            None => model.into(),
        };
        self.vectors
            .entry(id.into())
            .or_default()
            .insert(model.clone(), Held { key, decl });
        self.models
            .entry(model.clone())
            .or_default()
            .insert(key, (decl, id.into()));
        let doc = match self.ids.get(id) {
            Some(IdState::Live { doc: Some(doc), .. }) => Some((*doc, self.docs[doc].key)),
            _ => None,
        };
        self.lanes
            .entry(model)
            .or_default()
            .entry(decl)
            .or_insert_with(|| Lane::new(decl))
            .insert(id, key, vector, doc, sample);
    }

    /// Hold `doc` (and its key) as the doc of `id`'s vectors: its live doc changed.
    fn redoc(&mut self, id: &str, doc: Option<(u64, OrderKey)>) {
        let Some(held) = self.vectors.get(id) else { return };
        for (model, h) in held {
            if let Some(lane) = self.lanes.get_mut(&**model).and_then(|l| l.get_mut(&h.decl)) {
                lane.set_doc(id, doc);
            }
        }
    }

    /// Settle every lane of the bot.
    fn settle(&mut self) {
        for lane in self.lanes.values_mut().flat_map(|l| l.values_mut()) {
            lane.settle();
        }
    }

    /// Let go of `id`'s vector in the lane of `model` and `decl`.
    fn unlane(&mut self, model: &str, decl: Declaration, id: &str) {
        let Some(lanes) = self.lanes.get_mut(model) else { return };
        if let Some(lane) = lanes.get_mut(&decl) {
            lane.remove(id);
            if lane.at.is_empty() {
                lanes.remove(&decl);
            }
        }
        if lanes.is_empty() {
            self.lanes.remove(model);
        }
    }

    /// Forget the declaration of the embedding `key` of `model` (replaced or dead).
    fn undeclare(&mut self, model: &str, key: &OrderKey) {
        if let Some(decls) = self.models.get_mut(model) {
            decls.remove(key);
            if decls.is_empty() {
                self.models.remove(model);
            }
        }
    }

    /// Per candidate (by `cells`, among live docs that pass `filter`) holding a vector under
    /// `q.model` that agrees with the model's declaration (that of its earliest vector of a
    /// live doc, of text or bytes: a vector of an id without one — not yet put, or purged —
    /// declares nothing), its similarity to `q.vector`. A query vector of another dimension than the
    /// model's is refused (field `vector`); a model no doc holds a vector of finds nothing.
    fn nearest(&self, q: &Nearest, filter: &Filter, cells: &Cells, clock: &Clock) -> Result<DocMap<f64>> {
        let mut scores = DocMap::default();
        let mut declared = None;
        for (decl, id) in self.models.get(q.model.as_str()).into_iter().flat_map(|d| d.values()) {
            clock.tick()?;
            if matches!(self.ids.get(id), Some(IdState::Live { doc: Some(_), .. })) {
                declared = Some(*decl);
                break;
            }
        }
        let Some((dim, metric)) = declared else {
            return Ok(scores);
        };
        if q.vector.len() != dim {
            return Err(Error::invalid(
                "vector",
                None,
                format!(
                    "has {} dimensions; model `{}` has {dim} (declared by its earliest embedding)",
                    q.vector.len(),
                    q.model
                ),
            ));
        }
        let Some(lane) = self.lanes.get(q.model.as_str()).and_then(|l| l.get(&(dim, metric))) else {
            return Ok(scores);
        };
        // The cells nearest first, the earliest centroid of equals (a lane without a
        // centroid is one cell).
        let mut order = Vec::with_capacity(lane.centroids.len());
        for (c, w) in lane.centroids() {
            clock.tick()?;
            order.push((coarse(metric, &q.vector, w, c.norm), c.key, c.cell));
        }
        order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let cells_in_order = if order.is_empty() {
            vec![LOOSE]
        } else {
            order.into_iter().map(|(_, _, cell)| cell).collect()
        };
        // Candidates: coarse similarity, doc key, doc, vector.
        let mut found: Vec<(f32, OrderKey, u64, &[f32])> = Vec::new();
        for (probed, cell) in cells_in_order.into_iter().enumerate() {
            if probed >= cells.probe && found.len() >= cells.candidates {
                break;
            }
            self.candidates(lane, cell, &q.vector, filter, clock, &mut found)?;
        }
        let best = |a: &(f32, OrderKey, u64, &[f32]), b: &(f32, OrderKey, u64, &[f32])| {
            b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1))
        };
        if found.len() > cells.exact {
            found.select_nth_unstable_by(cells.exact, best);
            found.truncate(cells.exact);
        }
        for (_, _, doc, v) in found {
            clock.tick()?;
            scores.insert(doc, similarity(metric, &q.vector, v));
        }
        Ok(scores)
    }

    /// The vectors of `lane`'s `cell` whose ids have a live doc that passes `filter`, as
    /// candidates of a search for `q` (onto `found`): coarse similarity, doc key, doc, vector.
    fn candidates<'a>(
        &self,
        lane: &'a Lane,
        cell: CellNo,
        q: &[f32],
        filter: &Filter,
        clock: &Clock,
        found: &mut Vec<(f32, OrderKey, u64, &'a [f32])>,
    ) -> Result<()> {
        let unfiltered = *filter == Filter::default();
        for (slot, v) in lane.cells[cell as usize].iter(lane.dim) {
            clock.tick()?;
            let Some((doc, key)) = slot.doc else { continue };
            if unfiltered || passes(&self.docs[&doc], filter) {
                found.push((coarse(lane.metric, q, v, slot.norm), key, doc, v));
            }
        }
        Ok(())
    }

    /// Per doc holding a clause of `query`, its BM25 score summed in clause order; the terms
    /// and phrases looked for (for the page's matched terms).
    fn text_scores<'q>(
        &'q self,
        query: &'q Query,
        terms: &mut Vec<&'q str>,
        phrases: &mut Vec<&'q [String]>,
        clock: &Clock,
    ) -> Result<DocMap<f64>> {
        let n = self.text_docs as f64;
        let avg = self.total_len as f64 / n;
        let mut scores: DocMap<f64> = DocMap::default();
        for clause in &query.clauses {
            clock.look()?;
            match clause {
                Clause::Term(t) => {
                    self.score_term(t, n, avg, &mut scores, clock)?;
                    terms.push(t);
                }
                Clause::Prefix(p) => {
                    let expanded = self
                        .dict
                        .range::<str, _>((std::ops::Bound::Included(p.as_str()), std::ops::Bound::Unbounded))
                        .take_while(|(t, _)| t.starts_with(p.as_str()))
                        .take(MAX_PREFIX_TERMS);
                    for (t, _) in expanded {
                        self.score_term(t, n, avg, &mut scores, clock)?;
                        terms.push(t);
                    }
                }
                Clause::Phrase(words) => {
                    let found = self.phrase(words, clock)?;
                    let df = found.len() as f64;
                    for (doc, tf) in found {
                        *scores.entry(doc).or_default() += bm25(tf as f64, df, n, self.docs[&doc].len as f64, avg);
                    }
                    phrases.push(words);
                }
            }
        }
        Ok(scores)
    }

    /// Docs by score, best first, ties in the contract's order (one ranking of a hybrid
    /// search).
    fn ranked(&self, scores: DocMap<f64>, clock: &Clock) -> Result<Vec<u64>> {
        let mut all = Vec::with_capacity(scores.len());
        for (doc, score) in scores {
            clock.tick()?;
            all.push((score, self.docs[&doc].key, doc));
        }
        all.sort_unstable_by(|x, y| before((x.0, &x.1), (y.0, &y.1)));
        Ok(all.into_iter().map(|(_, _, doc)| doc).collect())
    }

    /// The number of term `t`, given one if it has none.
    fn term_no(&mut self, t: &str) -> TermNo {
        if let Some(&no) = self.dict.get(t) {
            return no;
        }
        let no = self.free.pop().unwrap_or_else(|| {
            self.postings.push(Postings::default());
            (self.postings.len() - 1) as TermNo
        });
        let term: Arc<str> = t.into();
        self.postings[no as usize].term = Some(term.clone());
        self.dict.insert(term, no);
        no
    }

    /// `name` as held once for the bot's docs.
    fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(held) = self.names.get(name) {
            return held.clone();
        }
        let held: Arc<str> = name.into();
        self.names.insert(held.clone());
        held
    }

    /// Let go of a name a removed doc held: the last holder takes it out of the set.
    fn release(&mut self, name: Arc<str>) {
        // Held by the set and by `name`: no live doc holds it any more.
        if Arc::strong_count(&name) == 2 {
            self.names.remove(&name);
        }
    }

    fn remove(&mut self, doc: u64) {
        let Some(d) = self.docs.remove(&doc) else { return };
        self.total_len -= u64::from(d.len);
        self.text_docs -= u64::from(d.text);
        for &no in &d.terms {
            let p = &mut self.postings[no as usize];
            p.live -= 1;
            if p.live == 0 {
                // No live doc holds the term: its text leaves the index (rule 26), its
                // number is free.
                if let Some(term) = std::mem::take(p).term {
                    self.dict.remove(&term);
                }
                self.free.push(no);
            } else if p.docs.len() > 2 * p.live as usize + 8 {
                let docs = &self.docs;
                p.docs.retain(|(d, _)| docs.contains_key(d));
                p.docs.shrink_to_fit();
            }
        }
        self.release(d.session);
        self.release(d.role);
    }

    /// The live docs of term `t` and its positions there.
    fn live<'a>(&'a self, t: &str) -> Option<impl Iterator<Item = (u64, &'a Positions)> + 'a> {
        let p = &self.postings[*self.dict.get(t)? as usize];
        let docs = &self.docs;
        Some(
            p.docs
                .iter()
                .filter(move |(d, _)| docs.contains_key(d))
                .map(|(d, ps)| (*d, ps)),
        )
    }

    fn score_term(&self, t: &str, n: f64, avg: f64, scores: &mut DocMap<f64>, clock: &Clock) -> Result<()> {
        let Some(p) = self.dict.get(t).map(|&no| &self.postings[no as usize]) else {
            return Ok(());
        };
        let df = f64::from(p.live);
        // One lookup per posting: a doc no longer live is not in `docs`.
        for (doc, positions) in &p.docs {
            clock.tick()?;
            let Some(d) = self.docs.get(doc) else { continue };
            *scores.entry(*doc).or_default() += bm25(positions.as_slice().len() as f64, df, n, f64::from(d.len), avg);
        }
        Ok(())
    }

    /// Per doc holding the phrase, how many times.
    fn phrase(&self, terms: &[String], clock: &Clock) -> Result<Vec<(u64, usize)>> {
        let Some((first, rest)) = terms.split_first() else {
            return Ok(Vec::new());
        };
        let Some(docs) = self.live(first) else {
            return Ok(Vec::new());
        };
        let Some(rest) = self.lists(rest) else {
            return Ok(Vec::new());
        };
        let mut found = Vec::new();
        for (doc, starts) in docs {
            clock.tick()?;
            let count = phrase_count(doc, starts.as_slice(), &rest, clock)?;
            if count > 0 {
                found.push((doc, count));
            }
        }
        Ok(found)
    }

    /// The postings of each of `terms`, if every one is held.
    fn lists(&self, terms: &[String]) -> Option<Vec<&Postings>> {
        terms
            .iter()
            .map(|t| self.dict.get(t.as_str()).map(|&no| &self.postings[no as usize]))
            .collect()
    }

    /// The terms live doc `doc` matched, in code-point order: each of `terms` it holds, and
    /// the terms of each of `phrases` it holds as a phrase.
    fn matched(&self, doc: u64, terms: &[&str], phrases: &[&[String]], clock: &Clock) -> Result<Vec<String>> {
        let holds = |t: &str| self.dict.get(t).and_then(|&no| self.postings[no as usize].get(doc));
        let mut m: BTreeSet<String> = terms
            .iter()
            .filter(|t| holds(t).is_some())
            .map(|t| t.to_string())
            .collect();
        for words in phrases {
            let Some((first, rest)) = words.split_first() else {
                continue;
            };
            let (Some(starts), Some(rest)) = (holds(first), self.lists(rest)) else {
                continue;
            };
            if phrase_count(doc, starts.as_slice(), &rest, clock)? > 0 {
                m.extend(words.iter().cloned());
            }
        }
        Ok(m.into_iter().collect())
    }
}

/// How many times the phrase whose first term stands at `starts` in `doc` and whose other
/// terms' postings are `rest` stands there.
fn phrase_count(doc: u64, starts: &[u32], rest: &[&Postings], clock: &Clock) -> Result<usize> {
    let follow: Option<Vec<&[u32]>> = rest.iter().map(|l| l.get(doc).map(Positions::as_slice)).collect();
    let Some(follow) = follow else { return Ok(0) };
    // One tick per start: a doc may hold a word millions of times.
    let mut count = 0;
    for &s in starts {
        clock.tick()?;
        if follow
            .iter()
            .enumerate()
            .all(|(i, ps)| ps.binary_search(&(s + i as u32 + 1)).is_ok())
        {
            count += 1;
        }
    }
    Ok(count)
}

/// Words of a snippet at most.
pub const SNIPPET_WORDS: usize = 24;

/// A short part of `text` to show with a hit: from a few words before the first word that is
/// one of `matched` (a hit's terms) up to [`SNIPPET_WORDS`] words, as written (case, spaces
/// and punctuation kept, the text's own start and end whole), with `…` where text was cut.
/// The start of `text` when none of its words is matched.
pub fn snippet(text: &str, matched: &[String]) -> String {
    // Words are read only up to the first match and the snippet's end, however long the text.
    let first = text
        .unicode_words()
        .position(|w| matched.iter().any(|m| *m == w.to_lowercase()))
        .unwrap_or(0);
    let start = first.saturating_sub(4);
    let words: Vec<(usize, &str)> = text
        .unicode_word_indices()
        .skip(start)
        .take(SNIPPET_WORDS + 1)
        .collect();
    let cut = words.len() > SNIPPET_WORDS;
    let shown = &words[..words.len().min(SNIPPET_WORDS)];
    let (Some(&(from, _)), Some(&(last_at, last))) = (shown.first(), shown.last()) else {
        return String::new();
    };
    // Whole at either end where nothing is cut (the text's own punctuation kept).
    let from = if start == 0 { 0 } else { from };
    let to = if cut { last_at + last.len() } else { text.len() };
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(text[from..to].trim());
    if cut {
        out.push('…');
    }
    out
}

/// Entries asked of a store in one read (with their bodies).
const READ: usize = 256;

/// A [`TextIndex`] that follows a store: it reads each shard's entries past what it holds,
/// with their bodies, up to a position (a projector's checkpoint) — what backends give is
/// entries, every rule of search is here.
#[derive(Clone, Debug, Default)]
pub struct Searcher {
    index: TextIndex,
    at: Checkpoint,
    /// The store was seen at format 3 or later (formats only move up).
    scoped: bool,
    /// A first catch-up looked for a saved index ([`saved::load`]).
    looked: bool,
}

impl Searcher {
    /// A searcher that holds nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether its index is whole: false after a [`Searcher::catch_up`] that did not finish
    /// (its future dropped half-way), whose entries are held but whose new centroids' cells
    /// have not taken their vectors yet — until the next `catch_up`, which settles first.
    pub fn settled(&self) -> bool {
        !self.index.unsettled
    }

    /// A searcher that holds nothing yet and searches vectors by `cells` (tests; see
    /// [`TextIndex::with_cells`]).
    #[doc(hidden)]
    pub fn with_cells(cells: Cells) -> Self {
        Searcher {
            index: TextIndex::with_cells(cells),
            ..Self::default()
        }
    }

    /// The index as far as it has read.
    pub fn index(&self) -> &TextIndex {
        &self.index
    }

    /// How far it has read, per shard.
    pub fn position(&self) -> &Checkpoint {
        &self.at
    }

    /// Read every entry past [`Searcher::position`] and at or below `to` (per shard), and
    /// feed it; the entries fed. A failed read leaves what was fed before it (feeding is
    /// idempotent; the next call goes on from there). A position past what the store holds
    /// is refused (`InvalidInput` on field `at`), and so is a store of format 1 or 2, whose
    /// record ids are grouped across bots (`InvalidInput` on field `format`: run `ctxlog
    /// upgrade`): the index keeps rule 6 and 7 per bot.
    pub async fn catch_up(&mut self, store: &dyn Store, to: &Checkpoint) -> Result<usize> {
        // A searcher that holds nothing starts from the store's newest saved index that
        // passes every check and holds nothing past `to`, if the store keeps any (and the
        // store's options let snapshots be read): it then reads only what is past it.
        if !std::mem::replace(&mut self.looked, true)
            && self.at.0.is_empty()
            && self.index.bots.is_empty()
            && store.options().read_snapshots
        {
            let (found, report) = saved::load(store, self.index.cells, to).await;
            for (name, why) in &report.refused {
                tracing::warn!(saved_index = %name, "a saved search index was not used: {why}");
            }
            if let Some(found) = found {
                *self = Searcher { looked: true, ..found };
            }
        }
        let format = if self.scoped {
            crate::IDS_BY_BOT
        } else {
            store.format().await?
        };
        self.scoped = format >= crate::IDS_BY_BOT;
        if !self.scoped {
            return Err(Error::invalid(
                "format",
                None,
                format!(
                    "search needs a store whose ids are scoped by bot (format 3 or later); this one is at format {format}: run `ctxlog upgrade`"
                ),
            ));
        }
        // Fed without settling, settled once at the end, whatever the end (and at the
        // start: a catch-up whose future was dropped half-way did not).
        self.index.settle();
        let read = self.read_to(store, to).await;
        self.index.settle();
        read
    }

    /// Feed the index from `store` up to `to` ([`TextIndex::feed`]): how many entries.
    async fn read_to(&mut self, store: &dyn Store, to: &Checkpoint) -> Result<usize> {
        let mut fed = 0;
        for (&shard, &end) in &to.0 {
            let mut after = self.at.get(shard);
            while after < end {
                let mut page = store.read_shard(shard, after, READ).await?;
                // A page never ends inside the entries of one seq (a fenced writer's that
                // landed and its successor's): the next read starts past the page's last.
                if page.len() == READ
                    && let (Some(first), Some(last)) = (page.first().map(|e| e.seq), page.last().map(|e| e.seq))
                    && first < last
                {
                    page.retain(|e| e.seq < last);
                }
                if page.is_empty() {
                    return Err(Error::invalid(
                        "at",
                        None,
                        format!("names seq {end} of shard {shard}, past what the store holds (it ends at {after})"),
                    ));
                }
                for e in page.iter().filter(|e| e.seq <= end) {
                    self.index.feed(e);
                    fed += 1;
                    after = e.seq;
                }
                if page.last().is_some_and(|e| e.seq > end) {
                    after = end;
                }
                self.at.0.insert(shard, after);
            }
        }
        Ok(fed)
    }
}

pub mod persist;
pub mod saved;

#[cfg(test)]
mod tests;
