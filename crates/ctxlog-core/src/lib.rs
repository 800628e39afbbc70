//! ctxlog-core: the vocabulary, the rules and the four traits of ctxlog, shared by every
//! backend.
//!
//! Applications use the `ctxlog` facade, which re-exports what they need from here. Backend
//! authors build on [`backend`]; tests use [`testing`] (feature `testing`). The contract is
//! `docs/contract.md` in the repository, and the `# Contract` sections of [`Store`],
//! [`Shard`], [`Projector`] and [`ConflictDiscovery`].
//!
//! Modules depend on each other in one direction only: `ids` → `error` → `hlc` → `record`
//! → `canonical` → `hash` → `entry` → `validate` → `projection` → `context` → `options` → `traits` →
//! `retain` → `upgrade` → `search` → `backend` → `testing`.

#![warn(missing_docs)]

pub mod backend;
mod canonical;
pub mod context;
pub mod entry;
pub mod error;
pub mod hash;
pub mod hlc;
pub mod ids;
pub mod options;
pub mod projection;
pub mod record;
pub mod redact;
mod retain;
pub mod search;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod traits;
mod upgrade;
pub mod validate;

pub use context::{ContextView, check_covers_held};
pub use entry::{AppendAck, Checkpoint, Entry, OrderKey, SessionSummary, ShardInfo};
pub use error::{Error, Result, Unavailability, Written};
pub use hash::ContentHash;
pub use hlc::{Hlc, PhysicalClock, SystemClock};
pub use ids::{Epoch, IdScope, SHARD_NAMESPACE, Seq, ShardId, WriterId};
pub use options::{
    CompactOptions, CompactReport, GcOptions, GcReport, PurgeOptions, PurgeReport, RefreshReport, RetainOptions,
    RetainReport, SnapshotReport, StoreOptions,
};
pub use projection::{Conflict, ConflictKind, LiveRecord, Projection, ProjectionStats, TombstonedId, conflicts_json};
pub use record::{Body, Kind, Metric, Record};
pub use redact::redact_uri;
pub use retain::{MAINTENANCE_WRITER, retain};
pub use traits::{ConflictDiscovery, Projector, Shard, Store};
pub use upgrade::{IDS_BY_BOT, SharedId, UpgradeReport, needs_ids_by_bot, upgrade_ids_by_bot};
pub use validate::Limits;
