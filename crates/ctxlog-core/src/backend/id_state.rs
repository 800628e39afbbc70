//! The state the projection keeps per record id, and the rules of rules 6 and 7 on it:
//! which put wins, which entries are retries, divergent puts or writes after delete. Below
//! the index and its frozen (snapshot) form, which both hold it.

use crate::entry::OrderKey;
use crate::hash::ContentHash;
use crate::projection::Conflict;

/// A fast keyed hasher, randomly seeded per map (ids are caller-chosen, so not a fixed seed).
pub(super) type Hasher = foldhash::fast::RandomState;

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
}

impl IdState {
    pub(super) fn others(&self) -> &[Put] {
        self.extra.as_ref().map_or(&[], |e| &e.others)
    }

    pub(super) fn tombstones(&self) -> &[OrderKey] {
        self.extra.as_ref().map_or(&[], |e| &e.tombstones)
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

    pub(super) fn has(&self, key: &OrderKey) -> bool {
        self.winner.as_ref().is_some_and(|w| w.key == *key)
            || self.others().iter().any(|p| p.key == *key)
            || self.tombstones().contains(key)
    }

    pub(super) fn sessions(&self) -> impl Iterator<Item = u32> + '_ {
        self.winner.iter().chain(self.others().iter()).map(|p| p.session)
    }

    /// This id's conflicts of rules 6 and 7.
    pub(super) fn conflicts(&self, id: &str, out: &mut Vec<Conflict>) {
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
