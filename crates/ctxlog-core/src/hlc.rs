//! Hybrid logical clock: physical milliseconds in the high 48 bits, a logical counter in
//! the low 16. A clock never goes backwards and always moves past what it has observed.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde::{Deserialize, Serialize};

const LOGICAL_BITS: u32 = 16;

/// A hybrid logical clock value. Ordered as a plain integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Hlc(pub u64);

impl Hlc {
    pub const ZERO: Hlc = Hlc(0);

    pub fn from_parts(millis: u64, logical: u16) -> Self {
        Hlc((millis << LOGICAL_BITS) | u64::from(logical))
    }

    pub fn millis(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    pub fn logical(self) -> u16 {
        (self.0 & 0xffff) as u16
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.millis(), self.logical())
    }
}

/// The physical time source of a clock. Tests inject skewed clocks through it.
pub trait PhysicalClock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;
}

/// Wall-clock time.
#[derive(Debug, Default)]
pub struct SystemClock;

impl PhysicalClock for SystemClock {
    fn now_millis(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// Wall-clock time shifted by a fixed offset; used to prove that ordering survives skew.
#[derive(Debug, Default)]
pub struct SkewedClock {
    offset_millis: AtomicI64,
}

impl SkewedClock {
    pub fn new(offset_millis: i64) -> Arc<Self> {
        Arc::new(SkewedClock {
            offset_millis: AtomicI64::new(offset_millis),
        })
    }

    pub fn set_offset(&self, offset_millis: i64) {
        self.offset_millis.store(offset_millis, Ordering::Relaxed);
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
    millis: std::sync::atomic::AtomicU64,
}

impl ManualClock {
    pub fn new(millis: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            millis: std::sync::atomic::AtomicU64::new(millis),
        })
    }

    pub fn set(&self, millis: u64) {
        self.millis.store(millis, Ordering::Relaxed);
    }
}

impl PhysicalClock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.millis.load(Ordering::Relaxed)
    }
}

/// The clock of one writer.
#[derive(Debug, Clone)]
pub struct HlcClock {
    last: Hlc,
    physical: Arc<dyn PhysicalClock>,
}

impl HlcClock {
    /// A clock that starts past `last` (the highest HLC recovered from the writer's shard).
    pub fn new(physical: Arc<dyn PhysicalClock>, last: Hlc) -> Self {
        HlcClock { last, physical }
    }

    /// The next timestamp: greater than every earlier tick and every observed value.
    pub fn tick(&mut self) -> Hlc {
        let physical = Hlc::from_parts(self.physical.now_millis(), 0);
        let next = if physical > self.last {
            physical
        } else {
            Hlc(self.last.0 + 1)
        };
        self.last = next;
        next
    }

    /// Move past a value read from the log, so that the next tick orders after it.
    pub fn observe(&mut self, seen: Hlc) {
        if seen > self.last {
            self.last = seen;
        }
    }

    pub fn last(&self) -> Hlc {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fixed(u64);
    impl PhysicalClock for Fixed {
        fn now_millis(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn ticks_strictly_increase_when_physical_time_stands_still() {
        let mut c = HlcClock::new(Arc::new(Fixed(1000)), Hlc::ZERO);
        let a = c.tick();
        let b = c.tick();
        assert_eq!(a, Hlc::from_parts(1000, 0));
        assert_eq!(b, Hlc::from_parts(1000, 1));
    }

    #[test]
    fn never_goes_backwards_when_physical_time_does() {
        let mut c = HlcClock::new(Arc::new(Fixed(10)), Hlc::from_parts(5000, 7));
        assert_eq!(c.tick(), Hlc::from_parts(5000, 8));
    }

    #[test]
    fn observe_moves_past_what_was_read() {
        let mut c = HlcClock::new(Arc::new(Fixed(10)), Hlc::ZERO);
        c.observe(Hlc::from_parts(99_999, 3));
        assert!(c.tick() > Hlc::from_parts(99_999, 3));
        // observing something older changes nothing
        let before = c.last();
        c.observe(Hlc::from_parts(1, 0));
        assert_eq!(c.last(), before);
    }

    #[test]
    fn physical_time_wins_when_ahead() {
        let mut c = HlcClock::new(Arc::new(Fixed(2000)), Hlc::from_parts(1000, 9));
        assert_eq!(c.tick(), Hlc::from_parts(2000, 0));
    }
}
