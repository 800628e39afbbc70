//! For backend authors: the machinery every backend builds on, so that each rule of the
//! contract is implemented once.
//!
//! - [`writer::WriterState`]: a shard handle's state and the one sequence of an append
//!   (rules 3, 4, 8, 11).
//! - [`index::ProjectionIndex`]: the incremental, order-independent projection (rules 6–9).
//! - [`projector::IndexedProjector`]: a `Projector` over any [`projector::IndexSource`].
//! - [`snapshot`]: the projection snapshot format (rule 17), checked before it is used.
//! - [`history::HistoryConflicts`]: a `ConflictDiscovery` over any
//!   [`history::HistorySource`] (rules 6, 7, 10).
//! - [`failpoint`]: named points in a backend's own code where a test stops or holds an
//!   operation.
//!
//! Applications never need this module.

pub mod failpoint;
mod frozen;
pub mod history;
mod id_state;
pub mod index;
pub mod projector;
pub mod snapshot;
pub mod writer;

pub use crate::canonical::canonical_json;
pub use crate::error::with_deadline;
pub use crate::hlc::HlcClock;
