//! The outputs every backend must agree on, byte for byte: the canonical projection and the
//! conflict list (rule 9).

use serde::Serialize;

use crate::canonical::to_canonical_json;
use crate::entry::{Checkpoint, OrderKey};
use crate::hash::ContentHash;
use crate::hlc::Hlc;
use crate::ids::{Epoch, Seq, ShardId};

/// The kinds of [`Conflict`], as printed by `ctxlog conflicts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictKind {
    /// See [`Conflict::DivergentPut`].
    DivergentPut,
    /// See [`Conflict::WriteAfterDelete`].
    WriteAfterDelete,
    /// See [`Conflict::StaleEpoch`].
    StaleEpoch,
    /// See [`Conflict::SeqGap`].
    SeqGap,
    /// See [`Conflict::Corrupt`].
    Corrupt,
    /// See [`Conflict::ImplausibleHlc`].
    ImplausibleHlc,
}

impl ConflictKind {
    /// The name `ctxlog conflicts` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictKind::DivergentPut => "divergent_put",
            ConflictKind::WriteAfterDelete => "write_after_delete",
            ConflictKind::StaleEpoch => "stale_epoch",
            ConflictKind::SeqGap => "seq_gap",
            ConflictKind::Corrupt => "corrupt",
            ConflictKind::ImplausibleHlc => "implausible_hlc",
        }
    }
}

/// A fact found in the log that the projection had to resolve (rules 6, 7), or that shows a
/// broken guarantee (rule 10). The derived order is the canonical order of a conflict list.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Conflict {
    /// A later `Put` of `id` whose content differs from the winner's. The winner stands.
    DivergentPut {
        /// The record id.
        id: String,
        /// The winning put.
        winner: OrderKey,
        /// The winner's content hash.
        winner_hash: ContentHash,
        /// The later put.
        entry: OrderKey,
        /// Its (different) content hash.
        entry_hash: ContentHash,
    },
    /// A `Put` of `id` ordered after its tombstone. It resurrects nothing.
    WriteAfterDelete {
        /// The record id.
        id: String,
        /// The first tombstone of the id.
        tombstone: OrderKey,
        /// The put after it.
        entry: OrderKey,
    },
    /// An entry whose epoch is lower than one already seen at the same or an earlier seq of
    /// its shard: a fenced writer's write that landed.
    StaleEpoch {
        /// The shard.
        shard: ShardId,
        /// The entry's seq.
        seq: Seq,
        /// Its (stale) epoch.
        epoch: Epoch,
        /// The higher epoch already seen at this or an earlier seq.
        superseded_by: Epoch,
    },
    /// Seq numbers `missing_from..=missing_to` are absent from the shard.
    SeqGap {
        /// The shard.
        shard: ShardId,
        /// The first missing seq.
        missing_from: Seq,
        /// The last missing seq.
        missing_to: Seq,
    },
    /// The stored content hash does not match the stored content.
    Corrupt {
        /// The shard.
        shard: ShardId,
        /// The entry's seq.
        seq: Seq,
        /// Its epoch.
        epoch: Epoch,
        /// The record id it names.
        id: String,
        /// The hash stored with it.
        stored_hash: ContentHash,
        /// The hash of what is stored.
        actual_hash: ContentHash,
    },
    /// An entry whose HLC lies past [`Hlc::PLAUSIBLE_MILLIS`]: stamped by a broken clock, or
    /// damaged. Writers refuse to observe such values; its order is kept as stored.
    ImplausibleHlc {
        /// The shard.
        shard: ShardId,
        /// The entry's seq.
        seq: Seq,
        /// Its epoch.
        epoch: Epoch,
        /// The implausible value.
        hlc: Hlc,
    },
}

impl Conflict {
    /// The kind of this conflict.
    pub fn kind(&self) -> ConflictKind {
        match self {
            Conflict::DivergentPut { .. } => ConflictKind::DivergentPut,
            Conflict::WriteAfterDelete { .. } => ConflictKind::WriteAfterDelete,
            Conflict::StaleEpoch { .. } => ConflictKind::StaleEpoch,
            Conflict::SeqGap { .. } => ConflictKind::SeqGap,
            Conflict::Corrupt { .. } => ConflictKind::Corrupt,
            Conflict::ImplausibleHlc { .. } => ConflictKind::ImplausibleHlc,
        }
    }

    /// Whether any entry this conflict involves lies past `checkpoint`.
    pub fn involves_entries_after(&self, checkpoint: &Checkpoint) -> bool {
        match self {
            Conflict::DivergentPut { winner, entry, .. } => {
                checkpoint.is_after(winner.shard, winner.seq) || checkpoint.is_after(entry.shard, entry.seq)
            }
            Conflict::WriteAfterDelete { tombstone, entry, .. } => {
                checkpoint.is_after(tombstone.shard, tombstone.seq) || checkpoint.is_after(entry.shard, entry.seq)
            }
            Conflict::StaleEpoch { shard, seq, .. }
            | Conflict::Corrupt { shard, seq, .. }
            | Conflict::ImplausibleHlc { shard, seq, .. } => checkpoint.is_after(*shard, *seq),
            // The gap shows when the entry after it arrives.
            Conflict::SeqGap { shard, missing_to, .. } => checkpoint.is_after(*shard, missing_to + 1),
        }
    }
}

/// Sort into canonical order and drop repeats.
pub fn canonical_conflicts(mut conflicts: Vec<Conflict>) -> Vec<Conflict> {
    conflicts.sort();
    conflicts.dedup();
    conflicts
}

/// Canonical JSON of a conflict list (sorted first).
pub fn conflicts_json(conflicts: &[Conflict]) -> String {
    to_canonical_json(&canonical_conflicts(conflicts.to_vec()))
}

/// One live record of the projection: the winning entry of its id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LiveRecord {
    /// The bot.
    pub bot_id: String,
    /// The session.
    pub session_id: String,
    /// The winning entry's place in the order.
    pub key: OrderKey,
    /// The record id.
    pub id: String,
    /// The winning entry's content hash.
    pub content_hash: ContentHash,
}

/// Counts that are pure functions of the set of entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProjectionStats {
    /// Distinct entries, of every epoch.
    pub entries: u64,
    /// Shards with at least one entry.
    pub shards: u64,
    /// Distinct record ids.
    pub ids: u64,
    /// Ids with a live winner.
    pub live: u64,
    /// Ids hidden by a tombstone.
    pub tombstoned: u64,
    /// Sessions with at least one live record.
    pub sessions: u64,
    /// Later puts identical to their winner (retries): ignored.
    pub duplicates: u64,
    /// Later puts with other content than their winner.
    pub divergent_puts: u64,
    /// Puts ordered after a tombstone of their id.
    pub writes_after_delete: u64,
}

/// The deterministic view derived from every entry of every shard.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Projection {
    /// Live records sorted by `(bot_id, session_id, key)`: each session in contract order.
    pub records: Vec<LiveRecord>,
    /// Tombstoned ids, sorted.
    pub tombstoned: Vec<String>,
    /// Counts of the same set of entries.
    pub stats: ProjectionStats,
}

impl Projection {
    /// Canonical JSON: byte-identical for the same set of entries on every backend.
    pub fn canonical_json(&self) -> String {
        to_canonical_json(self)
    }
}
