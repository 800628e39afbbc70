//! ctxlog-core: the traits, types, errors, clock, content hash and reference model shared
//! by every ctxlog backend. See `ARCHITECTURE.md` at the repository root.

pub mod canonical;
pub mod engine;
pub mod error;
pub mod hash;
pub mod hlc;
pub mod index;
pub mod model;
pub mod projection;
pub mod redact;
pub mod traits;
pub mod types;
pub mod validate;

pub use error::{Error, Result, Unavailability, Written, with_deadline};
pub use hash::ContentHash;
pub use hlc::{Hlc, HlcClock, ManualClock, PhysicalClock, SkewedClock, SystemClock};
pub use projection::{Conflict, ConflictKind, LiveRecord, Projection, ProjectionStats};
pub use traits::{
    CompactOptions, CompactReport, ConflictDiscovery, Projector, RefreshReport, Shard, Store, StoreOptions,
};
pub use types::{
    AppendAck, Body, Checkpoint, Entry, Epoch, Kind, OrderKey, Record, Seq, SessionSummary, ShardId, ShardInfo,
    WriterId,
};
pub use validate::Limits;
