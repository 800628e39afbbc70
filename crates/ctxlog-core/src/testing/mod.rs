//! Test doubles (feature `testing`): the reference model the conformance suite checks
//! backends against, clocks a test can steer, and an in-memory [`MemoryStore`] that keeps
//! the whole contract — for the suite to check itself, and for applications' own tests.

mod clocks;
pub mod memory;
pub mod model;

pub use clocks::{ManualClock, SkewedClock};
pub use memory::MemoryStore;
