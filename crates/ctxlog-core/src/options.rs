//! How a store is opened and maintained, and what maintenance and refreshes report.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::hlc::{PhysicalClock, SystemClock};
use crate::validate::Limits;

/// How a store is opened. Every field has a sensible default.
#[derive(Clone)]
#[non_exhaustive]
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
    /// Let a projector's first scan start from the newest stored projection snapshot
    /// (rule 17). On by default; off forces a full scan (to compare against one).
    pub read_snapshots: bool,
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
            .field("read_snapshots", &self.read_snapshots)
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
            read_snapshots: true,
        }
    }
}

/// Bounds of one compaction pass.
#[derive(Clone, Debug)]
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
pub struct RefreshReport {
    /// Entries the backend read from storage for this refresh.
    pub entries_read: u64,
    /// Entries new to the projection (the rest were already applied).
    pub new_entries: u64,
    /// True for the first scan.
    pub first_scan: bool,
    /// When the first scan started from a stored snapshot (rule 17): when that was taken,
    /// in milliseconds since the Unix epoch. `None` for a full scan.
    pub from_snapshot: Option<u64>,
}

/// What saving a projection snapshot stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotReport {
    /// Entries the snapshot's index holds.
    pub entries: u64,
    /// Its size.
    pub bytes: u64,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub taken_millis: u64,
}

/// Bounds of one reclaim pass (`Store::gc`, rule 15).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GcOptions {
    /// Nothing younger than this is deleted, so that a reader still on an older version of
    /// the store finishes what it reads. Ten minutes by default.
    pub grace: Duration,
    /// Most objects (files, WAL entries, pages) deleted in one pass; run again for the rest.
    pub max_objects: u64,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            grace: Duration::from_secs(600),
            max_objects: 10_000,
        }
    }
}

/// What a reclaim pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcReport {
    /// Objects deleted by this pass (files, WAL entries, generations, SQLite pages).
    pub objects_deleted: u64,
    /// Bytes those objects held.
    pub bytes_reclaimed: u64,
    /// Reclaimable objects left for a later pass: younger than the grace period, or past
    /// this pass's bound.
    pub objects_pending: u64,
    /// What the backend did, in words.
    pub note: String,
}

/// Bounds of one purge pass (`Store::purge`, rule 16).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PurgeOptions {
    /// Most tombstoned ids purged in one pass; run again for the rest.
    pub max_ids: u64,
}

impl Default for PurgeOptions {
    fn default() -> Self {
        PurgeOptions { max_ids: 10_000 }
    }
}

/// What a purge pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Tombstoned ids whose entries this pass erased.
    pub ids_purged: u64,
    /// Entries whose body and metadata this pass erased.
    pub entries_purged: u64,
    /// Tombstoned ids with entries still to erase (run again).
    pub ids_remaining: u64,
    /// True when no copy of the erased bytes is left in the store's files; false when older
    /// copies wait for `gc` (after its grace period) to delete them.
    pub erased: bool,
    /// What the backend did, in words.
    pub note: String,
}

/// Which sessions a retention pass ends (`ctxlog_core::retain`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RetainOptions {
    /// Sessions whose newest live record is older than this (by its HLC's wall-clock part,
    /// against the store's clock) are ended.
    pub older_than: Duration,
    /// Only this bot's sessions; every bot's when `None`.
    pub bot_id: Option<String>,
    /// Most sessions ended in one pass; run again for the rest.
    pub max_sessions: usize,
}

impl RetainOptions {
    /// End every session (of every bot) idle for longer than `older_than`.
    pub fn older_than(older_than: Duration) -> Self {
        RetainOptions {
            older_than,
            bot_id: None,
            max_sessions: 1_000,
        }
    }
}

/// What a retention pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetainReport {
    /// The sessions ended by this pass, `(bot_id, session_id)`, sorted.
    pub sessions_ended: Vec<(String, String)>,
    /// Tombstones written (one per live record of an ended session).
    pub tombstones: u64,
    /// Sessions past the cutoff left for a later pass.
    pub sessions_remaining: u64,
    /// Sessions found idle but written to before they were ended: the re-read just before
    /// their tombstones saw a record at or after the cutoff, so they were left alone.
    pub sessions_skipped_active: u64,
}

/// Builders: each sets one field (the struct is `#[non_exhaustive]`, so that a new option
/// is no breaking change).
impl StoreOptions {
    /// With `create_if_missing` set to `value`.
    pub fn with_create_if_missing(mut self, value: bool) -> Self {
        self.create_if_missing = value;
        self
    }

    /// With `timeout` set to `value`.
    pub fn with_timeout(mut self, value: Duration) -> Self {
        self.timeout = value;
        self
    }

    /// With `limits` set to `value`.
    pub fn with_limits(mut self, value: Limits) -> Self {
        self.limits = value;
        self
    }

    /// With `clock` set to `value`.
    pub fn with_clock(mut self, value: Arc<dyn PhysicalClock>) -> Self {
        self.clock = value;
        self
    }

    /// With `storage_options` set to `value`.
    pub fn with_storage_options(mut self, value: Vec<(String, String)>) -> Self {
        self.storage_options = value;
        self
    }

    /// With `read_snapshots` set to `value`.
    pub fn with_read_snapshots(mut self, value: bool) -> Self {
        self.read_snapshots = value;
        self
    }
}

/// Builders: each sets one field (the struct is `#[non_exhaustive]`, so that a new option
/// is no breaking change).
impl CompactOptions {
    /// With `max_generations` set to `value`.
    pub fn with_max_generations(mut self, value: usize) -> Self {
        self.max_generations = value;
        self
    }

    /// With `max_bytes` set to `value`.
    pub fn with_max_bytes(mut self, value: u64) -> Self {
        self.max_bytes = value;
        self
    }
}

/// Builders: each sets one field (the struct is `#[non_exhaustive]`, so that a new option
/// is no breaking change).
impl GcOptions {
    /// With `grace` set to `value`.
    pub fn with_grace(mut self, value: Duration) -> Self {
        self.grace = value;
        self
    }

    /// With `max_objects` set to `value`.
    pub fn with_max_objects(mut self, value: u64) -> Self {
        self.max_objects = value;
        self
    }
}

/// Builders: each sets one field (the struct is `#[non_exhaustive]`, so that a new option
/// is no breaking change).
impl PurgeOptions {
    /// With `max_ids` set to `value`.
    pub fn with_max_ids(mut self, value: u64) -> Self {
        self.max_ids = value;
        self
    }
}

/// Builders: each sets one field (the struct is `#[non_exhaustive]`, so that a new option
/// is no breaking change).
impl RetainOptions {
    /// With `older_than` set to `value`.
    pub fn with_older_than(mut self, value: Duration) -> Self {
        self.older_than = value;
        self
    }

    /// With `bot_id` set to `value`.
    pub fn with_bot_id(mut self, value: Option<String>) -> Self {
        self.bot_id = value;
        self
    }

    /// With `max_sessions` set to `value`.
    pub fn with_max_sessions(mut self, value: usize) -> Self {
        self.max_sessions = value;
        self
    }
}

/// Builders for the backends that make this report (it is `#[non_exhaustive]`).
impl CompactReport {
    /// With `generations_merged` set to `value`.
    pub fn with_generations_merged(mut self, value: u64) -> Self {
        self.generations_merged = value;
        self
    }

    /// With `entries_merged` set to `value`.
    pub fn with_entries_merged(mut self, value: u64) -> Self {
        self.entries_merged = value;
        self
    }

    /// With `generations_remaining` set to `value`.
    pub fn with_generations_remaining(mut self, value: u64) -> Self {
        self.generations_remaining = value;
        self
    }

    /// With `note` set to `value`.
    pub fn with_note(mut self, value: impl Into<String>) -> Self {
        self.note = value.into();
        self
    }
}

/// Builders for the backends that make this report (it is `#[non_exhaustive]`).
impl GcReport {
    /// With `objects_deleted` set to `value`.
    pub fn with_objects_deleted(mut self, value: u64) -> Self {
        self.objects_deleted = value;
        self
    }

    /// With `bytes_reclaimed` set to `value`.
    pub fn with_bytes_reclaimed(mut self, value: u64) -> Self {
        self.bytes_reclaimed = value;
        self
    }

    /// With `objects_pending` set to `value`.
    pub fn with_objects_pending(mut self, value: u64) -> Self {
        self.objects_pending = value;
        self
    }

    /// With `note` set to `value`.
    pub fn with_note(mut self, value: impl Into<String>) -> Self {
        self.note = value.into();
        self
    }
}

/// Builders for the backends that make this report (it is `#[non_exhaustive]`).
impl PurgeReport {
    /// With `ids_purged` set to `value`.
    pub fn with_ids_purged(mut self, value: u64) -> Self {
        self.ids_purged = value;
        self
    }

    /// With `entries_purged` set to `value`.
    pub fn with_entries_purged(mut self, value: u64) -> Self {
        self.entries_purged = value;
        self
    }

    /// With `ids_remaining` set to `value`.
    pub fn with_ids_remaining(mut self, value: u64) -> Self {
        self.ids_remaining = value;
        self
    }

    /// With `erased` set to `value`.
    pub fn with_erased(mut self, value: bool) -> Self {
        self.erased = value;
        self
    }

    /// With `note` set to `value`.
    pub fn with_note(mut self, value: impl Into<String>) -> Self {
        self.note = value.into();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_between_a_millisecond_and_a_day() {
        let with = |timeout| StoreOptions {
            timeout,
            ..StoreOptions::default()
        };
        let day = Duration::from_secs(86_400);
        assert!(with(day).validate().is_ok());
        assert!(with(Duration::from_millis(1)).validate().is_ok());
        for bad in [
            day + Duration::from_millis(1),
            Duration::ZERO,
            Duration::from_micros(999),
        ] {
            let err = with(bad).validate().unwrap_err();
            assert!(
                matches!(err, crate::Error::InvalidInput { field: "timeout", .. }),
                "{bad:?}: {err}"
            );
        }
    }

    /// Storage option values are credentials: a debug print names the keys only.
    #[test]
    fn a_debug_print_shows_storage_option_keys_not_values() {
        let o = StoreOptions {
            storage_options: vec![("aws_secret_access_key".into(), "hunter2".into())],
            ..StoreOptions::default()
        };
        let shown = format!("{o:?}");
        assert!(
            shown.contains("aws_secret_access_key") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
