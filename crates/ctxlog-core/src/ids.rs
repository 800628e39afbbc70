//! Identities and positions: who writes (a writer id), where (its shard), under which claim
//! (epoch), at which place (seq). Nothing here depends on the rest of the crate.

use std::collections::BTreeMap;
use std::fmt;

use uuid::Uuid;

/// The stable identity of a writing process (instance id, host name, StatefulSet ordinal).
/// Required to write; never derived from data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriterId(String);

impl WriterId {
    /// A writer id as given, unchecked: [`WriterId::new`] (in `validate.rs`) checks it.
    pub(crate) fn new_unchecked(id: String) -> Self {
        WriterId(id)
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this writer owns: a pure function of the writer id.
    pub fn shard_id(&self) -> ShardId {
        ShardId::for_writer(self)
    }
}

impl fmt::Display for WriterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Namespace of the UUIDv5 that maps a writer id to its shard id. Never change it: every
/// stored shard id depends on it.
pub const SHARD_NAMESPACE: Uuid = Uuid::from_u128(0x6c0d_9a3e_54c1_4b7e_9f0a_c7a1_0d3b_5e21);

/// The id of the shard owned by one writer: UUIDv5(SHARD_NAMESPACE, writer id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ShardId(pub Uuid);

impl ShardId {
    /// The shard owned by `writer`.
    pub fn for_writer(writer: &WriterId) -> Self {
        ShardId(Uuid::new_v5(&SHARD_NAMESPACE, writer.as_str().as_bytes()))
    }

    /// The 16 bytes of the UUID.
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// From the 16 bytes of a stored UUID.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        ShardId(Uuid::from_bytes(bytes))
    }

    /// From the UUID text it displays as; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        Uuid::parse_str(text).ok().map(ShardId)
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// The claim generation of a shard. Every `open_shard` of a writer returns a larger one.
pub type Epoch = u64;
/// Position of an entry within its shard: dense, strictly increasing, starting at 1.
pub type Seq = u64;

/// A vector of per-shard positions: shard -> last seq applied. Never a single global
/// sequence, because per-writer logs commit out of order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Checkpoint(pub BTreeMap<ShardId, Seq>);

impl Checkpoint {
    /// The last seq applied for `shard` (0 when nothing was).
    pub fn get(&self, shard: ShardId) -> Seq {
        self.0.get(&shard).copied().unwrap_or(0)
    }

    /// Move `shard`'s position up to `seq` (never down).
    pub fn advance(&mut self, shard: ShardId, seq: Seq) {
        let pos = self.0.entry(shard).or_insert(0);
        if seq > *pos {
            *pos = seq;
        }
    }

    /// The first position this checkpoint names past what `held` holds, if any: a
    /// summary's coverage that a reader has not read (rule 21).
    pub fn first_beyond(&self, held: &Checkpoint) -> Option<(ShardId, Seq)> {
        self.0
            .iter()
            .find(|(s, seq)| **seq > held.get(**s))
            .map(|(s, seq)| (*s, *seq))
    }

    /// True when the entry at `(shard, seq)` is past this checkpoint.
    pub fn is_after(&self, shard: ShardId, seq: Seq) -> bool {
        seq > self.get(shard)
    }
}

/// Which record ids are one record (rule 6): the namespace of an id. A store's format says
/// which (rule 22): formats 1 and 2 group ids across the whole store, as the releases that
/// wrote them did, so that every replica of a mixed deployment shows the same views; format 3
/// scopes them by bot, so that nothing one bot writes can change, hide, pre-empt or reveal
/// another bot's records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IdScope {
    /// One namespace for the whole store (formats 1 and 2).
    Store,
    /// A namespace per bot: a record is `(bot_id, id)` (format 3).
    #[default]
    Bot,
}

impl IdScope {
    /// The scope of a store of format `format`.
    pub fn of_format(format: u32) -> Self {
        if format >= 3 { IdScope::Bot } else { IdScope::Store }
    }

    /// The namespace an id of `bot_id` is in: the bot, or `""` for the whole store.
    pub fn namespace(self, bot_id: &str) -> &str {
        match self {
            IdScope::Store => "",
            IdScope::Bot => bot_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages and the CLI print a writer as given and a shard as its hyphenated UUID; the
    /// shard is a pure function of the writer id (its stored value never changes).
    #[test]
    fn writers_and_shards_print_as_stored() {
        let w = WriterId::new_unchecked("replica-0".into());
        assert_eq!(w.to_string(), "replica-0");
        let s = w.shard_id();
        assert_eq!(s, ShardId(Uuid::new_v5(&SHARD_NAMESPACE, b"replica-0")));
        assert_eq!(s.to_string(), s.0.hyphenated().to_string());
        assert_eq!(ShardId::from_bytes(*s.as_bytes()), s);
    }
}
