//! Records as stored, and positions in the log: entries, their order, checkpoints, what a
//! shard holds and what an append acknowledges.

use serde::Serialize;

use crate::hash::ContentHash;
use crate::hlc::Hlc;
pub use crate::ids::Checkpoint;
use crate::ids::{Epoch, Seq, ShardId, WriterId};
use crate::record::Record;

/// The position of an entry in the total order of contract rule 6: `(hlc, shard, seq, epoch)`.
/// Field order matters: the derived `Ord` is the contract's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct OrderKey {
    /// The hybrid logical clock value.
    pub hlc: Hlc,
    /// The shard that wrote the entry.
    pub shard: ShardId,
    /// Its position in the shard.
    pub seq: Seq,
    /// The epoch it was written under.
    pub epoch: Epoch,
}

/// A record as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The shard that wrote the entry.
    pub shard: ShardId,
    /// Its position in the shard (dense from 1).
    pub seq: Seq,
    /// The epoch of the claim it was written under.
    pub epoch: Epoch,
    /// Its hybrid logical clock value.
    pub hlc: Hlc,
    /// The record as appended.
    pub record: Record,
    /// The hash stored with the entry (computed at append time). `ConflictDiscovery`
    /// recomputes it to find corrupt entries.
    pub content_hash: ContentHash,
    /// True once `Store::purge` erased the entry's body and metadata (rule 16): the header
    /// stays (so seqs stay dense and the order and conflicts are unchanged), the body reads
    /// as empty text and the metadata as none, and the content can no longer be checked
    /// against its hash.
    pub purged: bool,
}

impl Entry {
    /// What is left of an entry once purged: its header, an empty text body, no metadata.
    /// One definition, so that every backend reads a purged entry back identically.
    pub fn purge(&mut self) {
        self.record.body = crate::record::Body::Text(String::new());
        self.record.metadata = None;
        if self.record.covers.is_some() {
            self.record.covers = Some(Checkpoint::default());
        }
        self.purged = true;
    }

    /// The entry's place in the contract's order.
    pub fn key(&self) -> OrderKey {
        OrderKey {
            hlc: self.hlc,
            shard: self.shard,
            seq: self.seq,
            epoch: self.epoch,
        }
    }
}

/// What a store knows about one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardInfo {
    /// The shard.
    pub shard: ShardId,
    /// The writer id that owns it.
    pub writer: WriterId,
    /// The latest claimed epoch.
    pub epoch: Epoch,
    /// The highest seq stored (0 when empty).
    pub last_seq: Seq,
    /// Number of stored entries (of every epoch).
    pub entries: u64,
}

/// What a durable append acknowledges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// The shard written.
    pub shard: ShardId,
    /// The epoch it was written under.
    pub epoch: Epoch,
    /// The first seq of the batch.
    pub first_seq: Seq,
    /// The last seq of the batch.
    pub last_seq: Seq,
    /// The first entry's HLC.
    pub first_hlc: Hlc,
    /// The last entry's HLC.
    pub last_hlc: Hlc,
    /// The record ids, in order.
    pub ids: Vec<String>,
}

/// A summary of one session in the projection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The bot.
    pub bot_id: String,
    /// The session.
    pub session_id: String,
    /// Live records.
    pub records: u64,
    /// The HLC of its first live record.
    pub first_hlc: Option<Hlc>,
    /// The HLC of its last live record.
    pub last_hlc: Option<Hlc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_position_moves_up_and_never_down() {
        let (a, b) = (ShardId::from_bytes([1; 16]), ShardId::from_bytes([2; 16]));
        let mut cp = Checkpoint::default();
        cp.advance(a, 3);
        assert_eq!(cp.get(a), 3, "advance from nothing");
        cp.advance(a, 5);
        assert_eq!(cp.get(a), 5, "advance up");
        cp.advance(a, 4);
        assert_eq!(cp.get(a), 5, "an older seq does not move it down");
        assert_eq!(cp.get(b), 0, "a shard never advanced is at 0");
        assert!(cp.is_after(a, 6) && !cp.is_after(a, 5) && cp.is_after(b, 1));
    }
}
