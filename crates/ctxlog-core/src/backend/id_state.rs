//! The state the projection keeps per record id, and the rules of rules 6 and 7 on it:
//! which put wins, which entries are retries, divergent puts or writes after delete. Below
//! the index and its frozen (snapshot) form, which both hold it.
//!
//! A record is an id in a *namespace* ([`crate::IdScope`]): its bot in a store of format 3,
//! `""` (the whole store) in one of format 1 or 2. The index keys an id state by its *key*,
//! the namespace and the id in one string (`{len}:{namespace}{id}`, [`key`]), so that the
//! parts, the frozen form and the snapshot hold one string per id as before; a lookup hashes
//! the two parts ([`hash_of`]) and compares them ([`is_key`]) without building the string.

use crate::entry::{Checkpoint, OrderKey};
use crate::hash::ContentHash;
use crate::projection::Conflict;

/// A fast keyed hasher, randomly seeded per map (ids are caller-chosen, so not a fixed seed).
pub(super) type Hasher = foldhash::fast::RandomState;

/// The key of `id` in `namespace`.
pub(super) fn key(namespace: &str, id: &str) -> Box<str> {
    format!("{}:{namespace}{id}", namespace.len()).into_boxed_str()
}

/// The namespace and the id of a key made by [`key`].
pub(super) fn split(key: &str) -> (&str, &str) {
    let (len, rest) = key.split_once(':').expect("a key starts with its namespace's length");
    let len: usize = len.parse().expect("a key starts with its namespace's length");
    rest.split_at(len)
}

/// Whether `stored` is the key of `id` in `namespace`.
pub(super) fn is_key(stored: &str, namespace: &str, id: &str) -> bool {
    split(stored) == (namespace, id)
}

/// The hash an id state is found by: of the namespace and the id, as two strings.
pub(super) fn hash_of(hasher: &Hasher, namespace: &str, id: &str) -> u64 {
    use std::hash::BuildHasher;
    hasher.hash_one((namespace, id))
}

/// Where a backend can find an entry again. Opaque to the index, which keeps it with each
/// put and hands it back with the keys a view needs; backends that fetch by key leave it 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RowRef(pub u64, pub u64);

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
    /// Every `Embedding` (rule 27): neither a put nor a tombstone, held so that the history
    /// checks see every entry.
    pub(super) embeddings: Vec<OrderKey>,
}

impl IdState {
    pub(super) fn others(&self) -> &[Put] {
        self.extra.as_ref().map_or(&[], |e| &e.others)
    }

    pub(super) fn tombstones(&self) -> &[OrderKey] {
        self.extra.as_ref().map_or(&[], |e| &e.tombstones)
    }

    pub(super) fn embeddings(&self) -> &[OrderKey] {
        self.extra.as_ref().map_or(&[], |e| &e.embeddings)
    }

    pub(super) fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    pub(super) fn first_tombstone(&self) -> Option<OrderKey> {
        self.tombstones().iter().min().copied()
    }

    pub(super) fn live(&self) -> Option<&Put> {
        if self.tombstones().is_empty() {
            self.winner.as_ref()
        } else {
            None
        }
    }

    /// The live winner as a reader as of `at` saw it (rule 24): none once the id has a
    /// tombstone, whenever it was written (forgetting wins over history); else the earliest
    /// put at or below `at`, which may be another than the winner of the whole log (a put
    /// of another shard, above `at`, that sorts first) or none (every put is above `at`).
    pub(super) fn live_at(&self, at: &Checkpoint) -> Option<&Put> {
        if !self.tombstones().is_empty() {
            return None;
        }
        let held = |p: &&Put| !at.is_after(p.key.shard, p.key.seq);
        // The winner sorts before every other put: when it was held, it won then too.
        self.winner
            .iter()
            .find(held)
            .or_else(|| self.others().iter().filter(held).min_by_key(|p| p.key))
    }

    /// [`IdState::live`] as of `at`, or now.
    pub(super) fn live_as_of(&self, at: Option<&Checkpoint>) -> Option<&Put> {
        match at {
            None => self.live(),
            Some(at) => self.live_at(at),
        }
    }

    pub(super) fn has(&self, key: &OrderKey) -> bool {
        self.winner.as_ref().is_some_and(|w| w.key == *key)
            || self.others().iter().any(|p| p.key == *key)
            || self.tombstones().contains(key)
            || self.embeddings().contains(key)
    }

    pub(super) fn sessions(&self) -> impl Iterator<Item = u32> + '_ {
        self.winner.iter().chain(self.others().iter()).map(|p| p.session)
    }

    /// This id's conflicts of rules 6 and 7 (`key` as made by [`key`]).
    pub(super) fn conflicts(&self, key: &str, out: &mut Vec<Conflict>) {
        if self.extra.is_none() {
            return;
        }
        let (bot_id, id) = split(key);
        let tomb = self.first_tombstone();
        let Some(w) = self.winner else { return };
        for p in std::iter::once(&w).chain(self.others().iter()) {
            match tomb {
                Some(t) if p.key > t => out.push(Conflict::WriteAfterDelete {
                    bot_id: bot_id.to_string(),
                    id: id.to_string(),
                    tombstone: t,
                    entry: p.key,
                }),
                _ if p.key != w.key && p.hash != w.hash => out.push(Conflict::DivergentPut {
                    bot_id: bot_id.to_string(),
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
