//! Hybrid logical clock: physical milliseconds in the high 48 bits, a logical counter in
//! the low 16. A clock never goes backwards and always moves past what it has observed.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{Error, Result};

const LOGICAL_BITS: u32 = 16;
/// The largest physical part an HLC can carry (48 bits).
const MAX_MILLIS: u64 = (1 << (64 - LOGICAL_BITS)) - 1;

/// A hybrid logical clock value. Ordered as a plain integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Hlc(pub u64);

impl Hlc {
    /// The least value: before every write.
    pub const ZERO: Hlc = Hlc(0);

    /// The last millisecond of physical time an HLC may plausibly carry: 2200-01-01T00:00Z.
    /// An entry past it was stamped by a broken clock or damaged; the history checker
    /// reports it (`implausible_hlc`). A fixed horizon, not "now", so that the check is a
    /// pure function of the entries (rule 9).
    pub const PLAUSIBLE_MILLIS: u64 = 7_258_118_400_000;

    /// How far ahead of this machine's physical clock a value may be for a writer to
    /// [`HlcClock::observe`] it: one day. Clocks of healthy servers differ by milliseconds;
    /// a value further ahead would drag every writer that reads it into its future.
    pub const MAX_OBSERVE_AHEAD_MILLIS: u64 = 24 * 3600 * 1000;

    /// `millis` past 48 bits saturates at the largest representable millisecond.
    pub fn from_parts(millis: u64, logical: u16) -> Self {
        Hlc((millis.min(MAX_MILLIS) << LOGICAL_BITS) | u64::from(logical))
    }

    /// The physical milliseconds.
    pub fn millis(self) -> u64 {
        self.0 >> LOGICAL_BITS
    }

    /// The logical counter within a millisecond.
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

    /// The same instant as a date (the Unix epoch if out of range).
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(i64::try_from(self.now_millis()).unwrap_or(i64::MAX))
            .unwrap_or_default()
    }
}

/// Wall-clock time.
#[derive(Debug, Default)]
pub struct SystemClock;

impl PhysicalClock for SystemClock {
    // The one place the library reads the machine's clock.
    #[allow(clippy::disallowed_methods)]
    fn now_millis(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
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

    /// The next timestamp: greater than every earlier tick and every observed value. Fails
    /// (and stays where it is) only when the clock has no larger value left, which only a
    /// damaged store can bring about.
    pub fn tick(&mut self) -> Result<Hlc> {
        let physical = Hlc::from_parts(self.physical.now_millis().min(MAX_MILLIS), 0);
        let next = if physical > self.last {
            physical
        } else {
            Hlc(self.last.0.checked_add(1).ok_or_else(|| Error::Corrupt {
                shard: None,
                what: format!(
                    "the writer's clock is at {} and has no larger value left: the shard holds a damaged HLC",
                    self.last
                ),
            })?)
        };
        self.last = next;
        Ok(next)
    }

    /// Move past a value read from the log, so that the next tick orders after it (rule 8).
    /// A value more than [`Hlc::MAX_OBSERVE_AHEAD_MILLIS`] ahead of the physical clock is
    /// refused (the clock does not move): one damaged entry must not drag every writer that
    /// reads it into the far future. The history checker reports such entries.
    pub fn observe(&mut self, seen: Hlc) -> Result<()> {
        let limit = self.physical.now_millis().saturating_add(Hlc::MAX_OBSERVE_AHEAD_MILLIS);
        if seen.millis() > limit {
            return Err(Error::invalid(
                "hlc",
                None,
                format!(
                    "{seen} is more than a day ahead of this machine's clock ({} ms): not observed",
                    self.physical.now_millis()
                ),
            ));
        }
        self.resume_after(seen);
        Ok(())
    }

    /// Move past `hlc` unconditionally: for the writer's own shard's highest stored value,
    /// which its next entries must follow whatever it is (rule 8 across reopen).
    pub fn resume_after(&mut self, hlc: Hlc) {
        if hlc > self.last {
            self.last = hlc;
        }
    }

    /// The latest value handed out or observed.
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
    fn an_hlc_is_milliseconds_and_a_logical_counter() {
        let h = Hlc::from_parts(1_700_000_000_123, 0xbeef);
        assert_eq!((h.millis(), h.logical()), (1_700_000_000_123, 0xbeef));
        assert_eq!(h.to_string(), "1700000000123.48879");
        assert!(
            Hlc::from_parts(5, 9) < Hlc::from_parts(6, 0),
            "milliseconds order first"
        );
        // "More than a day ahead" (rule 8's bound on observed values) is one day.
        assert_eq!(Hlc::MAX_OBSERVE_AHEAD_MILLIS, 86_400_000);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // compared with the machine's clock
    fn the_system_clock_reads_wall_time() {
        let wall = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64
        };
        let before = wall();
        let now = SystemClock.now_millis();
        assert!(before <= now && now <= wall(), "{before} <= {now}");
    }

    #[test]
    fn ticks_strictly_increase_when_physical_time_stands_still() {
        let mut c = HlcClock::new(Arc::new(Fixed(1000)), Hlc::ZERO);
        let a = c.tick().unwrap();
        let b = c.tick().unwrap();
        assert_eq!(a, Hlc::from_parts(1000, 0));
        assert_eq!(b, Hlc::from_parts(1000, 1));
    }

    #[test]
    fn never_goes_backwards_when_physical_time_does() {
        let mut c = HlcClock::new(Arc::new(Fixed(10)), Hlc::from_parts(5000, 7));
        assert_eq!(c.tick().unwrap(), Hlc::from_parts(5000, 8));
    }

    #[test]
    fn observe_moves_past_what_was_read() {
        let mut c = HlcClock::new(Arc::new(Fixed(10)), Hlc::ZERO);
        c.observe(Hlc::from_parts(99_999, 3)).unwrap();
        assert!(c.tick().unwrap() > Hlc::from_parts(99_999, 3));
        // observing something older changes nothing
        let before = c.last();
        c.observe(Hlc::from_parts(1, 0)).unwrap();
        assert_eq!(c.last(), before);
    }

    #[test]
    fn physical_time_wins_when_ahead() {
        let mut c = HlcClock::new(Arc::new(Fixed(2000)), Hlc::from_parts(1000, 9));
        assert_eq!(c.tick().unwrap(), Hlc::from_parts(2000, 0));
    }

    #[test]
    fn refuses_to_observe_values_far_ahead_of_physical_time() {
        let now = 1_780_000_000_000;
        let mut c = HlcClock::new(Arc::new(Fixed(now)), Hlc::ZERO);
        let day = Hlc::MAX_OBSERVE_AHEAD_MILLIS;
        c.observe(Hlc::from_parts(now + day, 5)).unwrap();
        assert_eq!(c.last(), Hlc::from_parts(now + day, 5));
        let err = c.observe(Hlc::from_parts(now + day + 1, 0)).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { field: "hlc", .. }), "{err}");
        let err = c.observe(Hlc(u64::MAX)).unwrap_err();
        assert!(matches!(err, Error::InvalidInput { field: "hlc", .. }), "{err}");
        assert_eq!(c.last(), Hlc::from_parts(now + day, 5), "a refused value moves nothing");
    }

    #[test]
    fn a_clock_at_its_maximum_fails_instead_of_wrapping() {
        let mut c = HlcClock::new(Arc::new(Fixed(10)), Hlc(u64::MAX - 1));
        assert_eq!(c.tick().unwrap(), Hlc(u64::MAX));
        let err = c.tick().unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert_eq!(c.last(), Hlc(u64::MAX), "never goes backwards");
        // Physical time beyond 48 bits saturates rather than overflowing the shift.
        let mut far = HlcClock::new(Arc::new(Fixed(u64::MAX)), Hlc::ZERO);
        assert_eq!(far.tick().unwrap().millis(), MAX_MILLIS);
    }
}
