//! Retention by age: end the sessions nobody wrote to for a while, through the normal append
//! path, so that every replica and backend agrees and the history checker sees ordinary
//! tombstones. Written once over the traits; every backend gets it.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::hlc::Hlc;
use crate::ids::WriterId;
use crate::options::{RetainOptions, RetainReport};
use crate::record::Record;
use crate::traits::Store;

/// The writer id that retention appends under: its own shard, never an application's.
pub const MAINTENANCE_WRITER: &str = "ctxlog-maintenance";

/// Tombstones per append: well inside the default batch limits.
const TOMBSTONES_PER_APPEND: usize = 500;

/// End every session (of `options.bot_id`, or of every bot) whose newest live record is
/// older than `options.older_than`: each live record gets a tombstone, appended under
/// [`MAINTENANCE_WRITER`]. At most `options.max_sessions` sessions per pass, oldest first.
///
/// Idempotent: a session already ended has no live record left, and a pass interrupted
/// half-way is finished by the next one. Two passes at once fence each other's maintenance
/// shard (rule 3): one of them fails with `Fenced`, and running it again is safe.
pub async fn retain(store: &dyn Store, options: &RetainOptions) -> Result<RetainReport> {
    let now = store.options().clock.now_millis();
    let cutoff = now.saturating_sub(u64::try_from(options.older_than.as_millis()).unwrap_or(u64::MAX));
    let mut reader = store.projector();
    reader.refresh().await?;
    // (bot, session) -> (newest live HLC, live ids in contract order).
    let mut sessions: BTreeMap<(String, String), (Hlc, Vec<String>)> = BTreeMap::new();
    for r in reader.projection().records {
        if options.bot_id.as_ref().is_some_and(|b| *b != r.bot_id) {
            continue;
        }
        let s = sessions
            .entry((r.bot_id, r.session_id))
            .or_insert((Hlc::ZERO, Vec::new()));
        s.0 = s.0.max(r.key.hlc);
        s.1.push(r.id);
    }
    let mut idle: Vec<_> = sessions
        .into_iter()
        .filter(|(_, (newest, _))| newest.millis() < cutoff)
        .collect();
    // Oldest first, so that a bounded pass ends the longest-idle sessions.
    idle.sort_by(|a, b| (a.1.0, &a.0).cmp(&(b.1.0, &b.0)));
    let remaining = idle.len().saturating_sub(options.max_sessions) as u64;
    idle.truncate(options.max_sessions);
    let mut report = RetainReport {
        sessions_remaining: remaining,
        ..RetainReport::default()
    };
    if idle.is_empty() {
        return Ok(report);
    }
    let mut shard = store.open_shard(&WriterId::new(MAINTENANCE_WRITER)?).await?;
    // Order the tombstones after everything read. A far-future clock in the log is refused
    // here (and reported by the history checker); a tombstone hides its id whatever its
    // place in the order (rule 7), so retention goes on without it.
    let _ = shard.observe(reader.max_hlc());
    for ((bot, session), (_, ids)) in idle {
        for chunk in ids.chunks(TOMBSTONES_PER_APPEND) {
            let batch = chunk
                .iter()
                .map(|id| Record::tombstone(id.clone(), &bot, &session))
                .collect();
            shard.append(batch).await?;
            report.tombstones += chunk.len() as u64;
        }
        report.sessions_ended.push((bot, session));
    }
    shard.close().await?;
    report.sessions_ended.sort();
    Ok(report)
}
