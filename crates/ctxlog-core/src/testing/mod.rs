//! Test doubles (feature `testing`): the reference model the conformance suite checks
//! backends against, clocks a test can steer, and a [`ReferenceStore`] (in the process's memory) that keeps
//! the whole contract — for the suite to check itself, and for applications' own tests.

mod clocks;
pub mod model;
pub mod outside;
pub mod reference;

pub use clocks::{ManualClock, SkewedClock};
pub use reference::ReferenceStore;

/// Bytes as long as a snapshot that is read in parts (more than one reader wherever there is
/// more than one core), not a multiple of any part's length, and different at every offset
/// within a part: for backends' tests of their snapshot reads.
pub fn large_snapshot_bytes() -> Vec<u8> {
    let len: usize = (9 << 20) + 7;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(crate::backend::snapshot::read_parts(len) > 1 || cores == 1);
    (0..len as u64).map(|i| (i * 31 + i / 4099) as u8).collect()
}
