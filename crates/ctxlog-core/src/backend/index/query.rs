//! What the index answers: positions, sessions and their live records (with their
//! summaries, rule 21), statistics, conflicts of rules 6 and 7, and the canonical projection.

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::{IdState, Ids, PART_BITS, PART_MASK, ProjectionIndex, RowRef, SessionRef, SummarisedSession};
use crate::backend::id_state;
use crate::entry::{Checkpoint, OrderKey, SessionSummary};
use crate::hlc::Hlc;
use crate::projection::{Conflict, LiveRecord, Projection, ProjectionStats, TombstonedId};

impl ProjectionIndex {
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

    /// The live winner of `id` of bot `bot_id`: its order key and where its backend can find
    /// it. Another bot's record of the same id is never it (in a store of format 3), and in
    /// a store of format 1 or 2 only a winner of `bot_id` itself is.
    pub fn live(&self, bot_id: &str, id: &str) -> Option<(OrderKey, RowRef)> {
        let state = self.state(bot_id, id)?;
        let p = state.live()?;
        let ((bot, _), _) = self.sessions.get_index(p.session as usize).expect("interned");
        (&**bot == bot_id).then_some((p.key, p.at))
    }

    /// Whether `id` of bot `bot_id` has a tombstone.
    pub(crate) fn has_tombstone(&self, bot_id: &str, id: &str) -> bool {
        self.state(bot_id, id).is_some_and(|s| !s.tombstones().is_empty())
    }

    /// The live records of one session, in contract order: keys and locations.
    pub fn session_keys(&mut self, bot_id: &str, session_id: &str) -> Vec<(OrderKey, RowRef)> {
        self.session_keys_at(bot_id, session_id, None)
    }

    /// [`ProjectionIndex::session_keys`] as a reader as of `at` saw them (rule 24), or now.
    pub fn session_keys_at(
        &mut self,
        bot_id: &str,
        session_id: &str,
        at: Option<&Checkpoint>,
    ) -> Vec<(OrderKey, RowRef)> {
        self.file();
        match self.sessions.get_index_of(&SessionRef(bot_id, session_id)) {
            Some(no) => self.session_keys_of(no, at),
            None => Vec::new(),
        }
    }

    /// Sessions of one bot with at least one live record, sorted by session id.
    pub fn sessions(&mut self, bot_id: &str) -> Vec<SessionSummary> {
        self.sessions_at(bot_id, None)
    }

    /// [`ProjectionIndex::sessions`] as a reader as of `at` saw them (rule 24), or now.
    pub fn sessions_at(&mut self, bot_id: &str, at: Option<&Checkpoint>) -> Vec<SessionSummary> {
        self.file();
        let mut out = Vec::new();
        for (no, ((b, s), _)) in self.sessions.iter().enumerate() {
            if &**b != bot_id {
                continue;
            }
            let keys = self.session_keys_of(no, at);
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

    fn session_keys_of(&self, no: usize, at: Option<&Checkpoint>) -> Vec<(OrderKey, RowRef)> {
        let mut keys: Vec<(OrderKey, RowRef)> = self.sessions[no]
            .ids
            .iter()
            .filter_map(|&i| {
                self.parts[(i & PART_MASK) as usize][(i >> PART_BITS) as usize]
                    .live_as_of(at)
                    .copied()
            })
            .chain(
                self.frozen
                    .session_ids(no)
                    .filter(|b| !self.thawed.contains(b))
                    .filter_map(|b| self.frozen.state(b as usize).live_as_of(at).copied()),
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
        self.session_with_summaries_at(bot_id, session_id, None)
    }

    /// [`ProjectionIndex::session_with_summaries`] as a reader as of `at` saw it (rule 24),
    /// or now.
    pub fn session_with_summaries_at(
        &mut self,
        bot_id: &str,
        session_id: &str,
        at: Option<&Checkpoint>,
    ) -> SummarisedSession {
        self.file();
        match self.sessions.get_index_of(&SessionRef(bot_id, session_id)) {
            Some(no) => self.summarised(no, at),
            None => SummarisedSession::default(),
        }
    }

    fn summarised(&self, no: usize, at: Option<&Checkpoint>) -> SummarisedSession {
        SummarisedSession {
            keys: self.session_keys_of(no, at),
            summaries: of_session(&self.summaries, no as u32).collect(),
            links: of_session(&self.links, no as u32).collect(),
        }
    }

    /// Whether session `session_id` of bot `bot_id` has a link entry (live or not, rule 25):
    /// when not, its view is its own live records.
    pub fn has_links(&self, bot_id: &str, session_id: &str) -> bool {
        self.sessions
            .get_index_of(&SessionRef(bot_id, session_id))
            .is_some_and(|no| of_session(&self.links, no as u32).next().is_some())
    }

    /// Every entry that gives `id` of bot `bot_id` a value (the winner and the other puts),
    /// wherever it lies: what a hide leaves out (rule 25).
    pub fn put_keys(&self, bot_id: &str, id: &str) -> Vec<OrderKey> {
        self.state(bot_id, id)
            .map(|s| s.winner.iter().chain(s.others()).map(|p| p.key).collect())
            .unwrap_or_default()
    }

    /// Every session with a link entry, live or not (the history checker's input), as
    /// `(bot, session)`.
    pub fn sessions_with_links(&self) -> Vec<(String, String)> {
        let mut nos: Vec<u32> = self.links.iter().map(|(s, _)| *s).collect();
        nos.dedup();
        nos.into_iter()
            .map(|no| {
                let ((b, s), _) = self.sessions.get_index(no as usize).expect("interned");
                (b.to_string(), s.to_string())
            })
            .collect()
    }
}

/// The entries of session `no` in `set`, in order.
fn of_session(set: &super::Summaries, no: u32) -> impl Iterator<Item = OrderKey> + '_ {
    let from = OrderKey {
        hlc: Hlc::ZERO,
        shard: crate::ids::ShardId::from_bytes([0; 16]),
        seq: 0,
        epoch: 0,
    };
    set.range((no, from)..)
        .take_while(move |(s, _)| *s == no)
        .map(|(_, k)| *k)
}

impl ProjectionIndex {
    /// Every session with a summary entry (the history checker's input).
    pub fn sessions_with_summaries(&mut self) -> Vec<SummarisedSession> {
        self.file();
        let mut nos: Vec<u32> = self.summaries.iter().map(|(s, _)| *s).collect();
        nos.dedup();
        nos.into_iter().map(|no| self.summarised(no as usize, None)).collect()
    }

    /// The highest HLC of any entry applied.
    pub fn max_hlc(&self) -> Hlc {
        self.all_states()
            .filter_map(|(_, s)| {
                s.winner
                    .iter()
                    .chain(s.others().iter())
                    .map(|p| p.key.hlc)
                    .chain(s.tombstones().iter().chain(s.embeddings()).map(|k| k.hlc))
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

    /// [`ProjectionIndex::id_conflicts`] of the ids `ids` (`(bot_id, id)`) only.
    pub(crate) fn id_conflicts_of<'a>(&self, ids: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<Conflict> {
        let mut out = Vec::new();
        for (bot_id, id) in ids {
            let namespace = self.scope.namespace(bot_id);
            if let Some(state) = self.state_in(namespace, id) {
                state.conflicts(&id_state::key(namespace, id), &mut out);
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
            for k in keys.chain(state.tombstones()).chain(state.embeddings()) {
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
        for (key, state) in self.all_states() {
            let (namespace, id) = id_state::split(key);
            if !state.tombstones().is_empty() {
                tombstoned.push(TombstonedId {
                    bot_id: namespace.to_string(),
                    id: id.to_string(),
                });
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
