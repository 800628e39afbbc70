//! How a store is opened and maintained, and what maintenance and refreshes report.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::hlc::{PhysicalClock, SystemClock};
use crate::validate::Limits;

/// How a store is opened. Every field has a sensible default.
#[derive(Clone)]
pub struct StoreOptions {
    /// Create the store when it does not exist (safe when many processes race, rule 12).
    pub create_if_missing: bool,
    /// Deadline of every single operation (an append, a claim, a refresh, a close).
    pub timeout: Duration,
    /// Input limits (rule 11).
    pub limits: Limits,
    /// The physical time source of writers' hybrid logical clocks.
    pub clock: Arc<dyn PhysicalClock>,
    /// Backend-specific settings (object-store credentials, endpoints, ...).
    pub storage_options: Vec<(String, String)>,
}

/// Storage option values are credentials more often than not: never print them.
impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.storage_options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("StoreOptions")
            .field("create_if_missing", &self.create_if_missing)
            .field("timeout", &self.timeout)
            .field("limits", &self.limits)
            .field("clock", &self.clock)
            .field("storage_options (values redacted)", &keys)
            .finish()
    }
}

impl StoreOptions {
    /// The longest deadline an operation may have: one day.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
    /// The shortest: one millisecond.
    pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

    /// Check the options before a store is opened with them.
    pub fn validate(&self) -> Result<()> {
        if !(Self::MIN_TIMEOUT..=Self::MAX_TIMEOUT).contains(&self.timeout) {
            return Err(crate::Error::invalid(
                "timeout",
                None,
                format!(
                    "{:?} is outside the allowed range {:?} to {:?}",
                    self.timeout,
                    Self::MIN_TIMEOUT,
                    Self::MAX_TIMEOUT
                ),
            ));
        }
        Ok(())
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            create_if_missing: true,
            timeout: Duration::from_secs(60),
            limits: Limits::default(),
            clock: Arc::new(SystemClock),
            storage_options: Vec::new(),
        }
    }
}

/// Bounds of one compaction pass.
#[derive(Clone, Debug)]
pub struct CompactOptions {
    /// Most flushed generations folded into the base table in one pass.
    pub max_generations: usize,
    /// Most bytes of flushed generations folded in one pass.
    pub max_bytes: u64,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            max_generations: 16,
            max_bytes: 256 * 1024 * 1024,
        }
    }
}

/// What a compaction pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Generations folded into the base table by this pass.
    pub generations_merged: u64,
    /// Entries folded.
    pub entries_merged: u64,
    /// Generations still waiting (run again to fold them).
    pub generations_remaining: u64,
    /// Free text for backends with nothing to fold (e.g. a SQLite WAL checkpoint).
    pub note: String,
}

/// What a refresh read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefreshReport {
    /// Entries the backend read from storage for this refresh.
    pub entries_read: u64,
    /// Entries new to the projection (the rest were already applied).
    pub new_entries: u64,
    /// True for the first scan.
    pub first_scan: bool,
}
