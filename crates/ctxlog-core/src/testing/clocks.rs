//! Physical clocks that tests steer: skewed wall time, and time that stands still.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::hlc::{PhysicalClock, SystemClock};

/// Wall-clock time shifted by a fixed offset; used to prove that ordering survives skew.
#[derive(Debug, Default)]
pub struct SkewedClock {
    offset_millis: AtomicI64,
}

impl SkewedClock {
    /// Wall-clock time shifted by `offset_millis`.
    pub fn new(offset_millis: i64) -> Arc<Self> {
        Arc::new(SkewedClock {
            offset_millis: AtomicI64::new(offset_millis),
        })
    }
}

impl PhysicalClock for SkewedClock {
    fn now_millis(&self) -> u64 {
        let now = SystemClock.now_millis() as i64;
        (now + self.offset_millis.load(Ordering::Relaxed)).max(0) as u64
    }
}

/// A physical clock that stands still until moved: deterministic HLCs for tests that
/// compare two stores byte for byte.
#[derive(Debug, Default)]
pub struct ManualClock {
    millis: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `millis`.
    pub fn new(millis: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            millis: AtomicU64::new(millis),
        })
    }

    /// Move the clock to `millis`.
    pub fn set(&self, millis: u64) {
        self.millis.store(millis, Ordering::Relaxed);
    }
}

impl PhysicalClock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.millis.load(Ordering::Relaxed)
    }
}
