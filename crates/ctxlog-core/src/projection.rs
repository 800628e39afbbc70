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
    /// See [`Conflict::ImplausibleCoverage`].
    ImplausibleCoverage,
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
            ConflictKind::ImplausibleCoverage => "implausible_coverage",
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
        /// The bot whose id it is: the namespace of the id (empty in a store of format 1 or
        /// 2, where ids are one namespace across bots, rule 22).
        #[serde(skip_serializing_if = "String::is_empty")]
        bot_id: String,
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
        /// The bot whose id it is: the namespace of the id (empty in a store of format 1 or
        /// 2, where ids are one namespace across bots, rule 22).
        #[serde(skip_serializing_if = "String::is_empty")]
        bot_id: String,
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
        /// The bot whose id it is: the namespace of the id (empty in a store of format 1 or
        /// 2, where ids are one namespace across bots, rule 22).
        #[serde(skip_serializing_if = "String::is_empty")]
        bot_id: String,
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
    /// A live summary that covers what its writer cannot have read (rule 21): its own entry
    /// or a later one of its shard (`entry` none), or a live record of its session whose
    /// clock is not below its own (`entry`). It never governs a context view.
    ImplausibleCoverage {
        /// The bot whose id it is: the namespace of the id (empty in a store of format 1 or
        /// 2, where ids are one namespace across bots, rule 22).
        #[serde(skip_serializing_if = "String::is_empty")]
        bot_id: String,
        /// The summary's record id.
        id: String,
        /// The summary.
        summary: OrderKey,
        /// The covered record that its writer cannot have read, if it is another record.
        entry: Option<OrderKey>,
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
            Conflict::ImplausibleCoverage { .. } => ConflictKind::ImplausibleCoverage,
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
            Conflict::ImplausibleCoverage { summary, entry, .. } => {
                checkpoint.is_after(summary.shard, summary.seq)
                    || entry.is_some_and(|e| checkpoint.is_after(e.shard, e.seq))
            }
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

/// An id with a tombstone, in its namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TombstonedId {
    /// The id's namespace: its bot (empty in a store of format 1 or 2, rule 22).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub bot_id: String,
    /// The record id.
    pub id: String,
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
    pub tombstoned: Vec<TombstonedId>,
    /// Counts of the same set of entries.
    pub stats: ProjectionStats,
}

impl Projection {
    /// Canonical JSON: byte-identical for the same set of entries on every backend.
    pub fn canonical_json(&self) -> String {
        to_canonical_json(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(shard: u8, seq: Seq) -> OrderKey {
        OrderKey {
            hlc: Hlc::from_parts(u64::from(shard) * 100 + seq, 0),
            shard: ShardId::from_bytes([shard; 16]),
            seq,
            epoch: 1,
        }
    }

    /// A check after a checkpoint keeps a conflict when any entry it involves is new: the
    /// older side may lie at or before the checkpoint.
    #[test]
    fn a_conflict_is_past_a_checkpoint_when_any_of_its_entries_is() {
        let mut cp = Checkpoint::default();
        cp.advance(ShardId::from_bytes([1; 16]), 5);
        cp.advance(ShardId::from_bytes([2; 16]), 5);
        let hash = ContentHash::from_slice(&[0; 32]).unwrap();
        let divergent = |winner, entry| Conflict::DivergentPut {
            bot_id: "b".into(),
            id: "r".into(),
            winner,
            winner_hash: hash,
            entry,
            entry_hash: hash,
        };
        let after_delete = |tombstone, entry| Conflict::WriteAfterDelete {
            bot_id: "b".into(),
            id: "r".into(),
            tombstone,
            entry,
        };
        for (old, new) in [(at(1, 5), at(2, 6)), (at(2, 6), at(1, 5))] {
            assert!(divergent(old, new).involves_entries_after(&cp));
            assert!(after_delete(old, new).involves_entries_after(&cp));
        }
        assert!(!divergent(at(1, 4), at(2, 5)).involves_entries_after(&cp));
        assert!(!after_delete(at(1, 4), at(2, 5)).involves_entries_after(&cp));
        let gap = |missing_to| Conflict::SeqGap {
            shard: ShardId::from_bytes([1; 16]),
            missing_from: 2,
            missing_to,
        };
        assert!(gap(5).involves_entries_after(&cp), "the entry after the gap is new");
        assert!(!gap(4).involves_entries_after(&cp));
    }

    /// The canonical JSON of a conflict list is sorted and without repeats, whatever order
    /// the conflicts were found in: what two backends' answers are compared by.
    #[test]
    fn a_conflict_list_is_compared_in_canonical_order() {
        let shard = ShardId::from_bytes([3; 16]);
        let gap = Conflict::SeqGap {
            shard,
            missing_from: 2,
            missing_to: 2,
        };
        let stale = Conflict::StaleEpoch {
            shard,
            seq: 1,
            epoch: 1,
            superseded_by: 2,
        };
        let json = conflicts_json(&[gap.clone(), stale.clone(), gap.clone()]);
        assert_eq!(json, conflicts_json(&[stale, gap]));
        assert_eq!(
            json,
            format!(
                r#"[{{"epoch":1,"kind":"stale_epoch","seq":1,"shard":"{shard}","superseded_by":2}},{{"kind":"seq_gap","missing_from":2,"missing_to":2,"shard":"{shard}"}}]"#
            )
        );
    }

    #[test]
    fn a_projection_is_compared_as_canonical_json() {
        let p = Projection {
            tombstoned: vec![TombstonedId {
                bot_id: "b".into(),
                id: "gone".into(),
            }],
            ..Projection::default()
        };
        let json = p.canonical_json();
        assert_eq!(json, to_canonical_json(&p));
        assert!(
            json.starts_with(r#"{"records":[],"#) && json.ends_with(r#""tombstoned":[{"bot_id":"b","id":"gone"}]}"#),
            "{json}"
        );
    }

    /// The names `ctxlog conflicts` prints and canonical output carries.
    #[test]
    fn conflict_kinds_have_their_names() {
        let names: Vec<&str> = [
            ConflictKind::DivergentPut,
            ConflictKind::WriteAfterDelete,
            ConflictKind::StaleEpoch,
            ConflictKind::SeqGap,
            ConflictKind::Corrupt,
            ConflictKind::ImplausibleHlc,
        ]
        .into_iter()
        .map(ConflictKind::as_str)
        .collect();
        assert_eq!(
            names,
            [
                "divergent_put",
                "write_after_delete",
                "stale_epoch",
                "seq_gap",
                "corrupt",
                "implausible_hlc"
            ]
        );
    }
}
