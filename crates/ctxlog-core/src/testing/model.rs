//! The reference model: the projection and conflict rules (6–10) written for clarity, over
//! a plain list of entries. Backends are checked against it; it is never used to serve.
//!
//! Every function here is a pure function of the *set* of entries: input order and repeats
//! of the same entry (same shard, seq, epoch) do not change the output.

use std::collections::{BTreeMap, BTreeSet};

use crate::entry::{Checkpoint, Entry};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::ShardId;
use crate::projection::{Conflict, LiveRecord, Projection, ProjectionStats, canonical_conflicts};
use crate::record::{Body, Kind};

/// The set of entries: one per (shard, seq, epoch), sorted in contract order.
fn entry_set(entries: &[Entry]) -> Vec<&Entry> {
    let mut by_position: BTreeMap<(ShardId, u64, u64), &Entry> = BTreeMap::new();
    for e in entries {
        by_position.entry((e.shard, e.seq, e.epoch)).or_insert(e);
    }
    let mut set: Vec<&Entry> = by_position.into_values().collect();
    set.sort_by_key(|e| e.key());
    set
}

/// What rule 6 and 7 make of one id: its entries in contract order.
struct IdHistory<'a> {
    /// The earliest `Put`.
    winner: Option<&'a Entry>,
    /// The earliest `Tombstone`.
    tombstone: Option<&'a Entry>,
    /// Every other `Put`, in contract order.
    later_puts: Vec<&'a Entry>,
}

impl<'a> IdHistory<'a> {
    fn of(entries_in_order: &[&'a Entry]) -> Self {
        let puts: Vec<&Entry> = entries_in_order
            .iter()
            .copied()
            .filter(|e| e.record.kind.is_value())
            .collect();
        IdHistory {
            winner: puts.first().copied(),
            tombstone: entries_in_order
                .iter()
                .copied()
                .find(|e| e.record.kind == Kind::Tombstone),
            later_puts: puts.iter().skip(1).copied().collect(),
        }
    }

    fn is_live(&self) -> bool {
        self.winner.is_some() && self.tombstone.is_none()
    }

    /// Puts after the tombstone are writes after delete; puts before it are compared to
    /// the winner.
    fn after_tombstone(&self, e: &Entry) -> bool {
        self.tombstone.is_some_and(|t| e.key() > t.key())
    }
}

/// A record's identity (rule 6): its bot and its id. The model is of a store of format 3,
/// where ids are scoped by bot.
type RecordKey<'a> = (&'a str, &'a str);

fn key_of(e: &Entry) -> RecordKey<'_> {
    (e.record.bot_id.as_str(), e.record.id.as_str())
}

fn by_id<'a>(set: &[&'a Entry]) -> BTreeMap<RecordKey<'a>, Vec<&'a Entry>> {
    let mut ids: BTreeMap<RecordKey<'a>, Vec<&Entry>> = BTreeMap::new();
    for e in set {
        ids.entry(key_of(e)).or_default().push(e);
    }
    ids
}

/// The projection of a set of entries.
pub fn project(entries: &[Entry]) -> Projection {
    let set = entry_set(entries);
    let mut records = Vec::new();
    let mut tombstoned = Vec::new();
    let mut stats = ProjectionStats {
        entries: set.len() as u64,
        shards: set.iter().map(|e| e.shard).collect::<BTreeSet<_>>().len() as u64,
        ..Default::default()
    };
    for ((bot_id, id), history) in by_id(&set) {
        stats.ids += 1;
        let h = IdHistory::of(&history);
        if h.tombstone.is_some() {
            stats.tombstoned += 1;
            tombstoned.push(crate::projection::TombstonedId {
                bot_id: bot_id.to_string(),
                id: id.to_string(),
            });
        }
        let mut all_puts: Vec<&Entry> = h.winner.into_iter().collect();
        all_puts.extend(h.later_puts.iter().copied());
        for p in &all_puts {
            if h.after_tombstone(p) {
                stats.writes_after_delete += 1;
            } else if Some(*p) != h.winner {
                let winner = h.winner.expect("a later put implies a winner");
                if p.content_hash == winner.content_hash {
                    stats.duplicates += 1;
                } else {
                    stats.divergent_puts += 1;
                }
            }
        }
        if h.is_live() {
            let w = h.winner.expect("live implies a winner");
            records.push(LiveRecord {
                bot_id: w.record.bot_id.clone(),
                session_id: w.record.session_id.clone(),
                key: w.key(),
                id: id.to_string(),
                content_hash: w.content_hash,
            });
        }
    }
    stats.live = records.len() as u64;
    records.sort();
    stats.sessions = records
        .iter()
        .map(|r| (&r.bot_id, &r.session_id))
        .collect::<BTreeSet<_>>()
        .len() as u64;
    Projection {
        records,
        tombstoned,
        stats,
    }
}

/// The view of one session (rule 25): its live records in contract order, with their full
/// content — those it inherits through a fork included, links left out.
pub fn session_view(entries: &[Entry], bot_id: &str, session_id: &str) -> Vec<Entry> {
    composed_view(entries, bot_id, session_id)
        .into_iter()
        .map(|(_, e)| e)
        .collect()
}

/// Rule 25 written out: the session's own live records that are not links (step 0); then,
/// if one of its live links is a fork (the first in contract order), the records of the
/// session it names as a reader as of the fork's position saw them — that position met with
/// the reader's (`entries` are as of it already) and short of the fork record in its own
/// shard — composed the same way (step 1, and so on), less every record whose id a live
/// hide of a step before names. Each record with the step it came from, in contract order;
/// a record met twice (a chain that comes back to a session) once, at its first step.
pub fn composed_view(entries: &[Entry], bot_id: &str, session_id: &str) -> Vec<(u32, Entry)> {
    let mut out: Vec<(u32, Entry)> = Vec::new();
    let mut hidden: BTreeSet<String> = BTreeSet::new();
    let mut session = session_id.to_string();
    let mut visible: Vec<Entry> = entries.to_vec();
    for step in 0u32.. {
        let own = own_view(&visible, bot_id, &session);
        for e in own.iter().filter(|e| !e.record.kind.is_link()) {
            if !hidden.contains(&e.record.id) && !out.iter().any(|(_, o)| o.key() == e.key()) {
                out.push((step, e.clone()));
            }
        }
        for e in own.iter().filter(|e| e.record.kind == Kind::Hide) {
            hidden.extend(e.record.link_target().map(str::to_string));
        }
        let Some(fork) = own
            .iter()
            .find(|e| e.record.kind == Kind::Fork && e.record.link_target().is_some())
        else {
            break;
        };
        let Some(position) = &fork.record.covers else { break };
        // At most 64 steps in all (the projector's `MAX_FORK_DEPTH`).
        if step + 1 >= 64 {
            break;
        }
        let mut at = position.clone();
        let before_fork = fork.seq - 1;
        at.0.entry(fork.shard).and_modify(|seq| *seq = (*seq).min(before_fork));
        at.0.retain(|_, seq| *seq > 0);
        session = fork.record.link_target().expect("checked").to_string();
        visible = as_of(&visible, &at);
    }
    out.sort_by_key(|(_, e)| e.key());
    out
}

/// The live records of one session that are its own (rule 8), links too, in contract order.
fn own_view(entries: &[Entry], bot_id: &str, session_id: &str) -> Vec<Entry> {
    let set = entry_set(entries);
    let mut view: Vec<Entry> = by_id(&set)
        .values()
        .map(|history| IdHistory::of(history))
        .filter(|h| h.is_live())
        .filter_map(|h| h.winner)
        .filter(|w| w.record.bot_id == bot_id && w.record.session_id == session_id)
        .cloned()
        .collect();
    view.sort_by_key(|e| e.key());
    view
}

/// The context view of one session (rule 21), written out: of the session's live summaries,
/// the latest in contract order that (a) names no position past the highest seq the set
/// holds of its shard, (b) does not cover itself or a later entry of its own shard, and (c)
/// covers no live record of the session whose clock is not below its own, governs. The view
/// is every live record that is no summary and that it does not cover, in order, with the
/// summary in the place of the newest record it covers (its own place if it covers none).
pub fn context_view(entries: &[Entry], bot_id: &str, session_id: &str) -> crate::context::ContextView {
    context_view_holding(entries, bot_id, session_id, |shard| held(entries, shard))
}

/// The entries a reader as of the position `at` answers from (rule 24): every entry at or
/// below `at` in its shard, and every tombstone, wherever it is (forgetting wins over
/// history).
pub fn as_of(entries: &[Entry], at: &Checkpoint) -> Vec<Entry> {
    entries
        .iter()
        .filter(|e| e.record.kind == Kind::Tombstone || e.seq <= at.get(e.shard))
        .cloned()
        .collect()
}

/// A session view as of `at` (rule 24).
pub fn session_view_at(entries: &[Entry], bot_id: &str, session_id: &str, at: &Checkpoint) -> Vec<Entry> {
    session_view(&as_of(entries, at), bot_id, session_id)
}

/// The context view as of `at` (rule 24): that of [`as_of`]'s entries, for a reader that
/// holds exactly `at`.
pub fn context_view_at(
    entries: &[Entry],
    bot_id: &str,
    session_id: &str,
    at: &Checkpoint,
) -> crate::context::ContextView {
    context_view_holding(&as_of(entries, at), bot_id, session_id, |shard| at.get(shard))
}

/// A bot's sessions as of `at` (rule 24).
pub fn sessions_at(entries: &[Entry], bot_id: &str, at: &Checkpoint) -> Vec<crate::entry::SessionSummary> {
    sessions(&as_of(entries, at), bot_id)
}

/// [`context_view`] for a reader that holds `held` of each shard.
fn context_view_holding(
    entries: &[Entry],
    bot_id: &str,
    session_id: &str,
    held: impl Fn(ShardId) -> u64,
) -> crate::context::ContextView {
    let composed = composed_view(entries, bot_id, session_id);
    let step = |e: &Entry| composed.iter().find(|(_, o)| o.key() == e.key()).map_or(0, |(s, _)| *s);
    let live: Vec<Entry> = composed.iter().map(|(_, e)| e.clone()).collect();
    // A summary covers what its coverage names of its own step's records and of those its
    // step inherited, never a fork's own records (rule 25).
    let covered_by = |s: &Entry, e: &Entry| {
        step(e) >= step(s)
            && s.record
                .covers
                .as_ref()
                .is_some_and(|c| c.0.get(&e.shard).is_some_and(|seq| e.seq <= *seq))
    };
    let governing = live.iter().rev().filter(|s| s.record.kind == Kind::Summary).find(|s| {
        let Some(c) = &s.record.covers else { return false };
        let held_all = c.0.iter().all(|(shard, seq)| *seq <= held(*shard));
        let not_itself = c.0.get(&s.shard).is_none_or(|seq| *seq < s.seq);
        let clocks = live
            .iter()
            .filter(|e| e.key() != s.key() && covered_by(s, e))
            .all(|e| e.hlc < s.hlc);
        held_all && not_itself && clocks
    });
    let mut view = crate::context::ContextView {
        entries: Vec::new(),
        summary: governing.map(Entry::key),
        covered: 0,
    };
    // Every live record that is no summary and that the governing summary does not cover,
    // in order; the summary in the place of the newest record it covers (or its own).
    let mut place = None;
    for e in &live {
        if Some(e.key()) == view.summary {
            place = place.or(Some(view.entries.len()));
        } else if e.record.kind == Kind::Summary {
        } else if governing.is_some_and(|s| covered_by(s, e)) {
            view.covered += 1;
            place = Some(view.entries.len());
        } else {
            view.entries.push(e.clone());
        }
    }
    if let (Some(s), Some(at)) = (governing, place) {
        view.entries.insert(at, s.clone());
    }
    view
}

/// The highest seq of `shard` among `entries`: how far a reader of all of them holds it.
pub fn held(entries: &[Entry], shard: ShardId) -> u64 {
    entries
        .iter()
        .filter(|e| e.shard == shard)
        .map(|e| e.seq)
        .max()
        .unwrap_or(0)
}

/// The sessions of one bot with a live entry of their own (a record or a link), sorted by
/// session id, each with its own live records (links and what a fork inherits not counted,
/// rule 25).
pub fn sessions(entries: &[Entry], bot_id: &str) -> Vec<crate::entry::SessionSummary> {
    let names: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.record.bot_id == bot_id)
        .map(|e| e.record.session_id.as_str())
        .collect();
    names
        .into_iter()
        .filter_map(|session| {
            let own = own_view(entries, bot_id, session);
            let listed = !own.is_empty();
            let view: Vec<&Entry> = own.iter().filter(|e| !e.record.kind.is_link()).collect();
            listed.then(|| crate::entry::SessionSummary {
                bot_id: bot_id.to_string(),
                session_id: session.to_string(),
                records: view.len() as u64,
                first_hlc: view.iter().map(|e| e.hlc).min(),
                last_hlc: view.iter().map(|e| e.hlc).max(),
            })
        })
        .collect()
}

/// The record of `e` as a reader serves it: a purged (bodiless) entry's body is empty text.
fn as_read(e: &Entry) -> std::borrow::Cow<'_, crate::record::Record> {
    if e.purged {
        let mut r = e.record.clone();
        r.body = Body::Text(String::new());
        std::borrow::Cow::Owned(r)
    } else {
        std::borrow::Cow::Borrowed(&e.record)
    }
}

/// Every conflict in a set of entries, in canonical order.
pub fn conflicts(entries: &[Entry]) -> Vec<Conflict> {
    let set = entry_set(entries);
    let mut out = Vec::new();

    // Rules 6 and 7, per id of a bot.
    for ((bot_id, id), history) in by_id(&set) {
        let h = IdHistory::of(&history);
        let puts = h.winner.into_iter().chain(h.later_puts.iter().copied());
        for p in puts {
            if let Some(t) = h.tombstone.filter(|_| h.after_tombstone(p)) {
                out.push(Conflict::WriteAfterDelete {
                    bot_id: bot_id.to_string(),
                    id: id.to_string(),
                    tombstone: t.key(),
                    entry: p.key(),
                });
            } else if let Some(w) = h.winner.filter(|w| *w != p && w.content_hash != p.content_hash) {
                out.push(Conflict::DivergentPut {
                    bot_id: bot_id.to_string(),
                    id: id.to_string(),
                    winner: w.key(),
                    winner_hash: w.content_hash,
                    entry: p.key(),
                    entry_hash: p.content_hash,
                });
            }
        }
    }

    // Rule 21: a live summary that covers itself, a later entry of its shard, or a live
    // record of its session whose clock is not below its own; rule 25: a live fork that
    // names itself, a later entry of its shard, or a live record of the session it
    // continues whose clock is not below its own.
    for s in set.iter().filter(|e| e.record.kind.has_position()) {
        let history = by_id(&set).remove(&key_of(s)).unwrap_or_default();
        let h = IdHistory::of(&history);
        if !h.is_live() || h.winner.map(|w| w.key()) != Some(s.key()) {
            continue;
        }
        let Some(c) = &s.record.covers else { continue };
        let covers = |e: &Entry| c.0.get(&e.shard).is_some_and(|seq| e.seq <= *seq);
        let entry = if c.0.get(&s.shard).is_some_and(|seq| *seq >= s.seq) {
            Some(None)
        } else {
            let session = match s.record.kind {
                Kind::Fork => match s.record.link_target() {
                    Some(from) => from,
                    None => continue,
                },
                _ => &s.record.session_id,
            };
            own_view(entries, &s.record.bot_id, session)
                .iter()
                .find(|e| e.key() != s.key() && covers(e) && e.hlc >= s.hlc)
                .map(|e| Some(e.key()))
        };
        if let Some(entry) = entry {
            out.push(Conflict::ImplausibleCoverage {
                bot_id: s.record.bot_id.clone(),
                id: s.record.id.clone(),
                summary: s.key(),
                entry,
            });
        }
    }

    // Ids with a tombstone anywhere in the log: the only ones a purge erases (rule 16).
    let tombstoned: BTreeSet<RecordKey<'_>> = set
        .iter()
        .filter(|e| e.record.kind == Kind::Tombstone)
        .map(|e| key_of(e))
        .collect();

    // Rule 10, per shard.
    let mut shards: BTreeMap<ShardId, Vec<&Entry>> = BTreeMap::new();
    for e in &set {
        shards.entry(e.shard).or_default().push(e);
    }
    for (shard, entries) in shards {
        // Stale epoch: some entry at the same or a lower seq carries a higher epoch.
        for e in &entries {
            let newest_at_or_before = entries
                .iter()
                .filter(|o| o.seq <= e.seq)
                .map(|o| o.epoch)
                .max()
                .unwrap_or(e.epoch);
            if newest_at_or_before > e.epoch {
                out.push(Conflict::StaleEpoch {
                    shard,
                    seq: e.seq,
                    epoch: e.epoch,
                    superseded_by: newest_at_or_before,
                });
            }
        }
        // Seq gaps: seqs run 1..=max with none missing.
        let seqs: BTreeSet<u64> = entries.iter().map(|e| e.seq).collect();
        let mut expected = 1;
        for &s in &seqs {
            if s > expected {
                out.push(Conflict::SeqGap {
                    shard,
                    missing_from: expected,
                    missing_to: s - 1,
                });
            }
            expected = s + 1;
        }
        // Implausible clock: an HLC past the fixed horizon.
        for e in &entries {
            if e.hlc.millis() > Hlc::PLAUSIBLE_MILLIS {
                out.push(Conflict::ImplausibleHlc {
                    shard,
                    seq: e.seq,
                    epoch: e.epoch,
                    hlc: e.hlc,
                });
            }
        }
        // Corrupt: the stored hash is not the hash of the stored content; or the body is
        // missing (purged) where its id has no tombstone — purge erases only tombstoned ids
        // (rule 16), so that is damage, whatever the hash says. A purged entry of a
        // tombstoned id has no content left to check.
        for e in &entries {
            if e.purged && tombstoned.contains(&key_of(e)) {
                continue;
            }
            let actual = ContentHash::of(&as_read(e));
            if e.purged || actual != e.content_hash {
                out.push(Conflict::Corrupt {
                    shard,
                    seq: e.seq,
                    epoch: e.epoch,
                    bot_id: e.record.bot_id.clone(),
                    id: e.record.id.clone(),
                    stored_hash: e.content_hash,
                    actual_hash: actual,
                });
            }
        }
    }
    canonical_conflicts(out)
}

/// Rule 26's full-text search, by brute force: every live text record of `bot_id` (its
/// winning put, a put or a summary, not purged) tokenised afresh, every clause of `query`
/// counted by scanning the tokens, BM25 summed in the query's order, the hits that pass
/// `filter` sorted best first and then in contract order. Ids and scores.
pub fn search(
    entries: &[Entry],
    bot_id: &str,
    query: &crate::search::Query,
    filter: &crate::search::Filter,
) -> Vec<(String, f64)> {
    search_matched(entries, bot_id, query, filter)
        .into_iter()
        .map(|(id, score, _)| (id, score))
        .collect()
}

/// [`search`] with each hit's matched terms: the terms of every scored sequence (a term, a
/// phrase, a prefix's term) the doc holds, in code-point order.
pub fn search_matched(
    entries: &[Entry],
    bot_id: &str,
    query: &crate::search::Query,
    filter: &crate::search::Filter,
) -> Vec<(String, f64, Vec<String>)> {
    use crate::search::{B, Clause, K1, MAX_PREFIX_TERMS, tokens};
    let set = entry_set(entries);
    let docs: Vec<(&Entry, Vec<String>)> = by_id(&set)
        .into_iter()
        .filter(|((bot, _), _)| *bot == bot_id)
        .filter_map(|(_, history)| {
            let h = IdHistory::of(&history);
            let w = h.winner.filter(|_| h.is_live())?;
            match (&w.record.body, w.record.kind) {
                (Body::Text(t), Kind::Put | Kind::Summary) if !w.purged => Some((w, tokens(t))),
                _ => None,
            }
        })
        .collect();
    if docs.is_empty() {
        return Vec::new();
    }
    let n = docs.len() as f64;
    let avg = docs.iter().map(|(_, t)| t.len() as u64).sum::<u64>() as f64 / n;
    // How often `terms` occurs one after the other in `doc`.
    let count = |doc: &[String], terms: &[String]| doc.windows(terms.len()).filter(|w| *w == terms).count();
    let vocabulary: BTreeSet<&String> = docs.iter().flat_map(|(_, t)| t.iter()).collect();
    // Each clause as the terms sequences it scores (a prefix: its first terms, each alone).
    let mut scored: Vec<Vec<String>> = Vec::new();
    for clause in query.clauses() {
        match clause {
            Clause::Term(t) => scored.push(vec![t.clone()]),
            Clause::Phrase(ts) => scored.push(ts.clone()),
            Clause::Prefix(p) => scored.extend(
                vocabulary
                    .iter()
                    .filter(|t| t.starts_with(p.as_str()))
                    .take(MAX_PREFIX_TERMS)
                    .map(|t| vec![(*t).clone()]),
            ),
        }
    }
    let mut hits: Vec<(&Entry, f64, BTreeSet<String>)> = Vec::new();
    for (e, doc) in &docs {
        let mut score = 0.0;
        let mut matched = BTreeSet::new();
        for terms in &scored {
            let tf = count(doc, terms) as f64;
            if tf == 0.0 {
                continue;
            }
            matched.extend(terms.iter().cloned());
            let df = docs.iter().filter(|(_, d)| count(d, terms) > 0).count() as f64;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            score += idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * doc.len() as f64 / avg));
        }
        if !matched.is_empty() && passes(e, filter) {
            hits.push((e, score, matched));
        }
    }
    hits.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.key().cmp(&b.0.key())));
    hits.into_iter()
        .map(|(e, s, m)| (e.record.id.clone(), s, m.into_iter().collect()))
        .collect()
}

/// Rule 27's similarity written out again, not the index's: each sum over the dimensions
/// in order, in `f64`.
fn similarity_by_hand(metric: crate::record::Metric, q: &[f32], v: &[f32]) -> f64 {
    let sum = |f: &dyn Fn(f64, f64) -> f64| {
        let mut total = 0.0f64;
        for i in 0..q.len().min(v.len()) {
            total += f(f64::from(q[i]), f64::from(v[i]));
        }
        total
    };
    let dot = sum(&|a, b| a * b);
    match metric {
        crate::record::Metric::Dot => dot,
        crate::record::Metric::L2 => -sum(&|a, b| (a - b) * (a - b)).sqrt(),
        crate::record::Metric::Cosine => {
            let (qq, vv) = (sum(&|a, _| a * a), sum(&|_, b| b * b));
            if qq == 0.0 || vv == 0.0 {
                0.0
            } else {
                dot / (qq.sqrt() * vv.sqrt())
            }
        }
    }
}

/// Whether doc `e` passes `filter` (rule 26): its session, role, clock and metadata.
fn passes(e: &Entry, filter: &crate::search::Filter) -> bool {
    let r = &e.record;
    let millis = e.hlc.millis();
    filter.session.as_ref().is_none_or(|s| *s == r.session_id)
        && (filter.roles.is_empty() || filter.roles.contains(&r.role))
        && filter.since_millis.is_none_or(|t| millis >= t)
        && filter.until_millis.is_none_or(|t| millis < t)
        && filter
            .metadata
            .iter()
            .all(|(k, v)| r.metadata.as_ref().and_then(|m| m.get(k)) == Some(v))
}

/// Rule 27's coarse similarity written out again: each sum in `f32` over eight partial sums
/// (dimension `i` into sum `i mod 8`, in order), added pairwise; a NaN is −∞, −0 is 0.
pub fn coarse_by_hand(metric: crate::record::Metric, q: &[f32], v: &[f32]) -> f32 {
    let sum = |f: &dyn Fn(f32, f32) -> f32| {
        let mut s = [0.0f32; 8];
        for i in 0..q.len().min(v.len()) {
            s[i % 8] += f(q[i], v[i]);
        }
        ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
    };
    let s = match metric {
        crate::record::Metric::Dot => sum(&|a, b| a * b),
        crate::record::Metric::L2 => -sum(&|a, b| (a - b) * (a - b)),
        crate::record::Metric::Cosine => {
            let norm = sum(&|_, b| b * b).sqrt();
            if norm == 0.0 { 0.0 } else { sum(&|a, b| a * b) / norm }
        }
    };
    if s.is_nan() {
        f32::NEG_INFINITY
    } else if s == 0.0 {
        0.0
    } else {
        s
    }
}

/// Rule 27's sampling written out again: the 64-bit FNV-1a hash of the entry's shard bytes
/// and then its seq's little-endian bytes.
fn sampled_by_hand(e: &Entry, sample: u64) -> bool {
    let mut hash: u64 = 14_695_981_039_346_656_037;
    for b in e.shard.0.as_bytes().iter().copied().chain(e.seq.to_le_bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(1_099_511_628_211);
    }
    hash.is_multiple_of(sample.max(1))
}

/// Rule 27's vector and hybrid search, by brute force, over the docs of [`search`] and the
/// live puts and summaries of bytes (found by vector only): a
/// doc's vector under a model is the newest (contract order) embedding of its id under it
/// that reads back whole; a model's declaration is the earliest of the docs' vectors;
/// vectors that disagree with it are not searched; a query of another dimension is refused
/// (`None`). The vectors agreeing with it (of any id not tombstoned) are split in `cells`:
/// each in the cell of the sampled vector it is nearest by coarse similarity; the cells
/// nearest the query are taken until enough are and they hold enough candidates, and the
/// candidates best by coarse similarity are ranked exactly. A hybrid search ranks the
/// unfiltered text hits and the unfiltered vector hits, and scores each doc `Σ 1/(60 +
/// rank)`, text first; the filter then leaves docs out. Ids and scores, best first.
pub fn find(
    entries: &[Entry],
    bot_id: &str,
    query: Option<&crate::search::Query>,
    near: Option<&crate::search::Nearest>,
    filter: &crate::search::Filter,
    cells: &crate::search::Cells,
) -> Option<Vec<(String, f64)>> {
    use crate::search::RRF_K;
    let set = entry_set(entries);
    let all = crate::search::Filter::default();
    let ids = by_id(&set);
    // Per live doc of the bot, its winner: a put or summary not purged, of text (rule 26's
    // docs, which `search` ranks by words) or of bytes (found by vector only).
    let docs: BTreeMap<&str, &Entry> = ids
        .iter()
        .filter(|((bot, _), _)| *bot == bot_id)
        .filter_map(|((_, id), history)| {
            let h = IdHistory::of(history);
            let w = h.winner.filter(|_| h.is_live())?;
            (matches!(w.record.kind, Kind::Put | Kind::Summary) && !w.purged).then_some((*id, w))
        })
        .collect();
    let key_of_doc = |id: &str| docs[id].key();
    let rank = |mut scored: Vec<(String, f64)>| {
        scored.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| key_of_doc(&a.0).cmp(&key_of_doc(&b.0)))
        });
        scored
    };
    // A hybrid search's vector ranking is unfiltered.
    let vector_filter = if query.is_some() { &all } else { filter };
    let vector_hits = match near {
        None => None,
        Some(q) => {
            // The newest whole vector of `q.model`, per id of the bot without a tombstone.
            type Held<'a> = (&'a str, &'a Entry, (usize, crate::record::Metric, Vec<f32>));
            let newest: Vec<Held<'_>> = ids
                .iter()
                .filter(|((bot, _), history)| {
                    *bot == bot_id && !history.iter().any(|e| e.record.kind == Kind::Tombstone)
                })
                .filter_map(|((_, id), history)| {
                    history
                        .iter()
                        .rev()
                        .filter(|e| !e.purged)
                        .filter_map(|e| e.record.vector().map(|(m, metric, v)| (m, e, metric, v)))
                        .find(|(m, ..)| *m == q.model)
                        .map(|(_, e, metric, v)| (*id, *e, (v.len(), metric, v)))
                })
                .collect();
            match newest
                .iter()
                .filter(|(id, ..)| docs.contains_key(id))
                .min_by_key(|(_, e, _)| e.key())
            {
                // A model nothing was embedded by: an empty ranking.
                None => Some(Vec::new()),
                Some((_, _, (dim, _, _))) if q.vector.len() != *dim => return None,
                Some((_, _, (dim, metric, _))) => {
                    let metric = *metric;
                    let lane: Vec<&Held<'_>> = newest
                        .iter()
                        .filter(|(_, _, (d, m, _))| (d, m) == (dim, &metric))
                        .collect();
                    let centroids: Vec<&Held<'_>> = lane
                        .iter()
                        .copied()
                        .filter(|(_, e, _)| sampled_by_hand(e, cells.sample))
                        .collect();
                    // Centroids by coarse similarity to `x`, nearest first, the earliest of equals.
                    let by_nearness = |x: &[f32]| {
                        let mut cs = centroids.clone();
                        cs.sort_by(|a, b| {
                            coarse_by_hand(metric, x, &b.2.2)
                                .total_cmp(&coarse_by_hand(metric, x, &a.2.2))
                                .then_with(|| a.1.key().cmp(&b.1.key()))
                        });
                        cs
                    };
                    let candidate = |h: &&Held<'_>| docs.get(h.0).is_some_and(|d| passes(d, vector_filter));
                    let mut candidates: Vec<&Held<'_>> = Vec::new();
                    if centroids.is_empty() {
                        candidates.extend(lane.iter().copied().filter(candidate));
                    } else {
                        for (taken, c) in by_nearness(&q.vector).into_iter().enumerate() {
                            if taken >= cells.probe && candidates.len() >= cells.candidates {
                                break;
                            }
                            candidates.extend(
                                lane.iter()
                                    .copied()
                                    .filter(candidate)
                                    .filter(|h| by_nearness(&h.2.2)[0].0 == c.0),
                            );
                        }
                    }
                    candidates.sort_by(|a, b| {
                        coarse_by_hand(metric, &q.vector, &b.2.2)
                            .total_cmp(&coarse_by_hand(metric, &q.vector, &a.2.2))
                            .then_with(|| key_of_doc(a.0).cmp(&key_of_doc(b.0)))
                    });
                    candidates.truncate(cells.exact);
                    Some(rank(
                        candidates
                            .iter()
                            .map(|(id, _, (_, _, v))| (id.to_string(), similarity_by_hand(metric, &q.vector, v)))
                            .collect(),
                    ))
                }
            }
        }
    };
    let keep = |id: &str| passes(docs[id], filter);
    Some(match (query, vector_hits) {
        (Some(q), None) => search(entries, bot_id, q, filter),
        (None, Some(v)) => v.into_iter().filter(|(id, _)| keep(id)).collect(),
        (Some(q), Some(v)) => {
            let mut fused: BTreeMap<String, f64> = BTreeMap::new();
            for ranking in [search(entries, bot_id, q, &all), v] {
                for (rank, (id, _)) in ranking.into_iter().enumerate() {
                    *fused.entry(id).or_default() += 1.0 / (RRF_K + (rank + 1) as f64);
                }
            }
            rank(fused.into_iter().filter(|(id, _)| keep(id)).collect())
        }
        (None, None) => Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WriterId;
    use crate::projection::ConflictKind;
    use crate::record::Record;

    fn shard(n: u8) -> ShardId {
        WriterId::new(format!("w{n}")).unwrap().shard_id()
    }

    fn entry(shard_no: u8, seq: u64, epoch: u64, hlc: u64, record: Record) -> Entry {
        let content_hash = record.content_hash();
        Entry {
            shard: shard(shard_no),
            seq,
            epoch,
            hlc: Hlc(hlc),
            record,
            content_hash,
            purged: false,
        }
    }

    fn put(id: &str, text: &str) -> Record {
        Record::text(id, "bot", "s", "user", text)
    }

    fn kinds(c: &[Conflict]) -> Vec<ConflictKind> {
        c.iter().map(Conflict::kind).collect()
    }

    #[test]
    fn rule6_duplicate_put_changes_nothing() {
        let a = entry(1, 1, 1, 10, put("x", "hello"));
        let b = entry(2, 1, 1, 20, put("x", "hello"));
        let p = project(&[a.clone(), b]);
        assert_eq!(p.records.len(), 1);
        assert_eq!(p.records[0].key, a.key());
        assert_eq!(p.stats.duplicates, 1);
        assert!(conflicts(&[a]).is_empty());
    }

    #[test]
    fn rule6_created_at_does_not_make_a_retry_divergent() {
        let mut r = put("x", "hello");
        r.created_at = chrono::DateTime::from_timestamp(1_780_000_000, 0);
        let a = entry(1, 1, 1, 10, put("x", "hello"));
        let b = entry(1, 2, 1, 11, r);
        assert!(conflicts(&[a, b]).is_empty());
    }

    #[test]
    fn rule6_divergent_put_keeps_the_earliest_winner() {
        let early = entry(2, 1, 1, 10, put("x", "first"));
        let late = entry(1, 1, 1, 20, put("x", "second"));
        let p = project(&[late.clone(), early.clone()]);
        assert_eq!(p.records[0].key, early.key());
        let c = conflicts(&[late.clone(), early.clone()]);
        assert_eq!(kinds(&c), vec![ConflictKind::DivergentPut]);
        match &c[0] {
            Conflict::DivergentPut { winner, entry, .. } => {
                assert_eq!(*winner, early.key());
                assert_eq!(*entry, late.key());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rule6_ties_on_hlc_break_by_shard_then_seq_then_epoch() {
        let a = entry(1, 5, 1, 10, put("x", "a"));
        let b = entry(2, 1, 1, 10, put("x", "b"));
        let winner = if a.shard < b.shard { &a } else { &b };
        let p = project(&[a.clone(), b.clone()]);
        assert_eq!(p.records[0].key, winner.key());
    }

    #[test]
    fn rule7_tombstone_is_final() {
        let p1 = entry(1, 1, 1, 10, put("x", "v"));
        let t = entry(1, 2, 1, 20, Record::tombstone("x", "bot", "s"));
        let p2 = entry(2, 1, 1, 30, put("x", "v"));
        let p = project(&[p1.clone(), t.clone(), p2.clone()]);
        assert!(p.records.is_empty());
        assert_eq!(
            p.tombstoned,
            vec![crate::projection::TombstonedId {
                bot_id: "bot".into(),
                id: "x".into()
            }]
        );
        let c = conflicts(&[p1, t.clone(), p2.clone()]);
        assert_eq!(
            c,
            vec![Conflict::WriteAfterDelete {
                bot_id: "bot".into(),
                id: "x".into(),
                tombstone: t.key(),
                entry: p2.key()
            }]
        );
    }

    #[test]
    fn rule7_tombstone_before_any_put() {
        let t = entry(1, 1, 1, 10, Record::tombstone("x", "bot", "s"));
        let p1 = entry(1, 2, 1, 20, put("x", "v"));
        assert!(project(&[t.clone(), p1.clone()]).records.is_empty());
        assert_eq!(kinds(&conflicts(&[t, p1])), vec![ConflictKind::WriteAfterDelete]);
    }

    #[test]
    fn rule8_session_view_is_in_contract_order() {
        let a = entry(2, 1, 1, 30, put("a", "1"));
        let b = entry(1, 1, 1, 10, put("b", "2"));
        let c = entry(1, 2, 1, 20, put("c", "3"));
        let mut other = put("d", "4");
        other.session_id = "other".into();
        let d = entry(1, 3, 1, 5, other);
        let view = session_view(&[a, b, c, d], "bot", "s");
        let ids: Vec<&str> = view.iter().map(|e| e.record.id.as_str()).collect();
        assert_eq!(ids, vec!["b", "c", "a"]);
    }

    #[test]
    fn rule9_input_order_and_repeats_do_not_matter() {
        let es = vec![
            entry(1, 1, 1, 10, put("x", "a")),
            entry(2, 1, 1, 5, put("x", "b")),
            entry(2, 2, 1, 6, Record::tombstone("y", "bot", "s")),
            entry(1, 2, 1, 11, put("y", "c")),
        ];
        let mut shuffled = es.clone();
        shuffled.reverse();
        shuffled.push(es[0].clone());
        assert_eq!(project(&es).canonical_json(), project(&shuffled).canonical_json());
        assert_eq!(conflicts(&es), conflicts(&shuffled));
    }

    #[test]
    fn rule10_stale_epoch_seq_gap_and_corrupt() {
        let e1 = entry(1, 1, 1, 10, put("a", "1"));
        let e2 = entry(1, 2, 2, 11, put("b", "2"));
        // a fenced writer (epoch 1) wrote seq 2 and 5 after the successor claimed epoch 2
        let stale = entry(1, 2, 1, 12, put("c", "3"));
        let after_gap = entry(1, 5, 2, 13, put("d", "4"));
        let mut corrupt = entry(2, 1, 1, 14, put("e", "5"));
        corrupt.record.body = crate::record::Body::Text("tampered".into());
        let c = conflicts(&[e1, e2, stale, after_gap, corrupt]);
        assert_eq!(
            kinds(&c),
            vec![ConflictKind::StaleEpoch, ConflictKind::SeqGap, ConflictKind::Corrupt]
        );
        assert!(matches!(
            c[0],
            Conflict::StaleEpoch {
                seq: 2,
                epoch: 1,
                superseded_by: 2,
                ..
            }
        ));
        assert!(matches!(
            c[1],
            Conflict::SeqGap {
                missing_from: 3,
                missing_to: 4,
                ..
            }
        ));
    }

    /// Rule 16 with rule 10: a purged entry (no body) is what a purge leaves only of an id
    /// with a tombstone — here in another shard, and the tombstone purged too; a live id's
    /// entry without a body is `Corrupt`, hashed as a reader serves it (empty text).
    #[test]
    fn rule16_a_missing_body_is_corrupt_unless_its_id_has_a_tombstone() {
        let mut gone = entry(1, 1, 1, 10, put("gone", "a secret"));
        let mut tombstone = entry(2, 1, 1, 20, Record::tombstone("gone", "bot", "s"));
        let mut live = entry(1, 2, 1, 30, put("live", "kept"));
        let intact = [gone.clone(), tombstone.clone(), live.clone()];
        assert!(conflicts(&intact).is_empty());
        gone.purge();
        tombstone.purge();
        assert!(conflicts(&[gone.clone(), tombstone.clone(), live.clone()]).is_empty());
        live.purge();
        let c = conflicts(&[gone, tombstone, live.clone()]);
        assert_eq!(
            c,
            vec![Conflict::Corrupt {
                shard: live.shard,
                seq: 2,
                epoch: 1,
                bot_id: "bot".into(),
                id: "live".into(),
                stored_hash: live.content_hash,
                actual_hash: put("live", "").content_hash(),
            }]
        );
        // Even where the stored hash is of empty text: the body stored was not missing.
        let mut empty = entry(1, 1, 1, 10, put("empty", ""));
        empty.purge();
        assert_eq!(kinds(&conflicts(&[empty])), vec![ConflictKind::Corrupt]);
    }

    #[test]
    fn rule10_gap_at_the_start_of_a_shard() {
        let e = entry(1, 3, 1, 10, put("a", "1"));
        assert!(matches!(
            conflicts(&[e])[..],
            [Conflict::SeqGap {
                missing_from: 1,
                missing_to: 2,
                ..
            }]
        ));
    }
}
