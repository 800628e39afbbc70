//! The vocabulary of ctxlog: records, entries, identities, positions.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::hash::ContentHash;
use crate::hlc::Hlc;

/// The stable identity of a writing process (instance id, host name, StatefulSet ordinal).
/// Required to write; never derived from data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WriterId(String);

impl WriterId {
    /// A writer id must be non-empty and at most 512 bytes.
    pub fn new(id: impl Into<String>) -> crate::Result<Self> {
        let id = id.into();
        if id.is_empty() {
            return Err(crate::Error::invalid("writer", None, "must not be empty"));
        }
        if id.len() > 512 {
            return Err(crate::Error::invalid(
                "writer",
                None,
                format!("is {} bytes, the limit is 512", id.len()),
            ));
        }
        Ok(WriterId(id))
    }

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub Uuid);

impl ShardId {
    pub fn for_writer(writer: &WriterId) -> Self {
        ShardId(Uuid::new_v5(&SHARD_NAMESPACE, writer.as_str().as_bytes()))
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        ShardId(Uuid::from_bytes(bytes))
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

/// What a record asks for: a value (`Put`) or its permanent removal (`Tombstone`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Put,
    Tombstone,
}

impl Kind {
    pub fn as_u8(self) -> u8 {
        match self {
            Kind::Put => 0,
            Kind::Tombstone => 1,
        }
    }

    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Kind::Put),
            1 => Some(Kind::Tombstone),
            _ => None,
        }
    }
}

/// The payload of a record: text or opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    Text(String),
    Bytes(Vec<u8>),
}

impl Body {
    pub fn len(&self) -> usize {
        match self {
            Body::Text(s) => s.len(),
            Body::Bytes(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Body {
    fn default() -> Self {
        Body::Text(String::new())
    }
}

/// What a caller appends. `id` is the idempotency key.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub id: String,
    pub bot_id: String,
    pub session_id: String,
    pub role: String,
    pub content_type: String,
    pub body: Body,
    /// A JSON object, or nothing.
    pub metadata: Option<serde_json::Value>,
    /// Caller's timestamp; stored but not covered by the content hash.
    pub created_at: Option<DateTime<Utc>>,
    pub kind: Kind,
}

impl Record {
    /// A text `Put` with content type `text/plain` and no metadata.
    pub fn text(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        role: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: role.into(),
            content_type: "text/plain".into(),
            body: Body::Text(text.into()),
            metadata: None,
            created_at: None,
            kind: Kind::Put,
        }
    }

    /// A tombstone for `id`.
    pub fn tombstone(id: impl Into<String>, bot_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: String::new(),
            content_type: String::new(),
            body: Body::Text(String::new()),
            metadata: None,
            created_at: None,
            kind: Kind::Tombstone,
        }
    }

    pub fn content_hash(&self) -> ContentHash {
        ContentHash::of(self)
    }
}

/// The position of an entry in the total order of contract rule 6: `(hlc, shard, seq, epoch)`.
/// Field order matters: the derived `Ord` is the contract's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OrderKey {
    pub hlc: Hlc,
    pub shard: ShardId,
    pub seq: Seq,
    pub epoch: Epoch,
}

/// A record as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub shard: ShardId,
    pub seq: Seq,
    pub epoch: Epoch,
    pub hlc: Hlc,
    pub record: Record,
    /// The hash stored with the entry (computed at append time). `ConflictDiscovery`
    /// recomputes it to find corrupt entries.
    pub content_hash: ContentHash,
}

impl Entry {
    pub fn key(&self) -> OrderKey {
        OrderKey {
            hlc: self.hlc,
            shard: self.shard,
            seq: self.seq,
            epoch: self.epoch,
        }
    }
}

/// A vector of per-shard positions: shard -> last seq applied. Never a single global
/// sequence, because per-writer logs commit out of order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint(pub BTreeMap<ShardId, Seq>);

impl Checkpoint {
    /// The last seq applied for `shard` (0 when nothing was).
    pub fn get(&self, shard: ShardId) -> Seq {
        self.0.get(&shard).copied().unwrap_or(0)
    }

    pub fn advance(&mut self, shard: ShardId, seq: Seq) {
        let pos = self.0.entry(shard).or_insert(0);
        if seq > *pos {
            *pos = seq;
        }
    }

    /// True when the entry at `(shard, seq)` is past this checkpoint.
    pub fn is_after(&self, shard: ShardId, seq: Seq) -> bool {
        seq > self.get(shard)
    }
}

/// What a store knows about one shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub shard: ShardId,
    pub writer: WriterId,
    /// The latest claimed epoch.
    pub epoch: Epoch,
    /// The highest seq stored (0 when empty).
    pub last_seq: Seq,
    /// Number of stored entries (of every epoch).
    pub entries: u64,
}

/// What a durable append acknowledges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendAck {
    pub shard: ShardId,
    pub epoch: Epoch,
    pub first_seq: Seq,
    pub last_seq: Seq,
    pub first_hlc: Hlc,
    pub last_hlc: Hlc,
    pub ids: Vec<String>,
}

/// A summary of one session in the projection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    pub bot_id: String,
    pub session_id: String,
    /// Live records.
    pub records: u64,
    pub first_hlc: Option<Hlc>,
    pub last_hlc: Option<Hlc>,
}
