//! Retention by age: end the sessions nobody wrote to for a while, through the normal append
//! path, so that every replica and backend agrees and the history checker sees ordinary
//! tombstones. Written once over the traits; every backend gets it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use crate::error::Result;
use crate::hlc::Hlc;
use crate::ids::WriterId;
use crate::options::{RetainOptions, RetainReport};
use crate::record::Record;
use crate::traits::{Projector, Store};

/// The writer id that retention appends under: its own shard, never an application's.
pub const MAINTENANCE_WRITER: &str = "ctxlog-maintenance";

/// Tombstones per append: well inside the default batch limits.
const TOMBSTONES_PER_APPEND: usize = 500;

/// A test hook, run with `(bot_id, session_id)` after a session was found idle and before
/// it is re-checked and ended.
type Hook<'h> = dyn Fn(String, String) -> Pin<Box<dyn Future<Output = ()> + Send + 'h>> + Send + Sync + 'h;

/// End every session (of `options.bot_id`, or of every bot) whose newest live record is
/// older than `options.older_than`: each live record gets a tombstone, appended under
/// [`MAINTENANCE_WRITER`]. At most `options.max_sessions` sessions per pass, oldest first.
///
/// A session found idle is read again (a refresh, then its session view) immediately before
/// its tombstones are appended: if a record at or after the cutoff arrived meanwhile, the
/// session is left alone (`sessions_skipped_active`); otherwise exactly the live ids that
/// read saw are tombstoned. Sessions are re-checked and ended a group at a time, about one
/// append of tombstones each, after one refresh per group. What is left of the race is in
/// `docs/contract.md` (Retention). Cost: one incremental refresh per group and one session
/// read per session ended.
///
/// Idempotent: a session already ended has no live record left, and a pass interrupted
/// half-way is finished by the next one. Two passes at once fence each other's maintenance
/// shard (rule 3): one of them fails with `Fenced`, and running it again is safe.
pub async fn retain(store: &dyn Store, options: &RetainOptions) -> Result<RetainReport> {
    run(store, options, None).await
}

#[cfg(any(test, feature = "testing"))]
impl RetainOptions {
    /// [`retain`](fn@crate::retain) with a test hook: `hook(bot_id, session_id)` runs (and
    /// is awaited) for every session the pass found idle, after that decision and before the
    /// session is re-checked and its tombstones appended. Only with feature `testing`.
    #[doc(hidden)]
    pub async fn retain_with_hook<'h, F, Fut>(&self, store: &dyn Store, hook: F) -> Result<RetainReport>
    where
        F: Fn(String, String) -> Fut + Send + Sync + 'h,
        Fut: Future<Output = ()> + Send + 'h,
    {
        let boxed = move |bot: String, session: String| -> Pin<Box<dyn Future<Output = ()> + Send + 'h>> {
            Box::pin(hook(bot, session))
        };
        let boxed: &Hook<'h> = &boxed;
        run(store, self, Some(boxed)).await
    }
}

async fn run(store: &dyn Store, options: &RetainOptions, hook: Option<&Hook<'_>>) -> Result<RetainReport> {
    let now = store.options().clock.now_millis();
    let cutoff = now.saturating_sub(u64::try_from(options.older_than.as_millis()).unwrap_or(u64::MAX));
    let mut reader = store.projector();
    reader.refresh().await?;
    // (bot, session) -> newest live HLC, and how many live records it had.
    let mut sessions: BTreeMap<(String, String), Hlc> = BTreeMap::new();
    let mut first_seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in reader.projection().records {
        if options.bot_id.as_ref().is_some_and(|b| *b != r.bot_id) {
            continue;
        }
        let key = (r.bot_id, r.session_id);
        *first_seen.entry(key.clone()).or_default() += 1;
        let newest = sessions.entry(key).or_insert(Hlc::ZERO);
        *newest = (*newest).max(r.key.hlc);
    }
    let mut idle: Vec<_> = sessions
        .into_iter()
        .filter(|(_, newest)| newest.millis() < cutoff)
        .collect();
    // Oldest first, so that a bounded pass ends the longest-idle sessions.
    idle.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
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
    // Sessions are ended a group at a time (about one append of tombstones each): the group
    // is decided again from one refresh taken just before its tombstones are appended.
    let mut rest = idle.into_iter().peekable();
    while rest.peek().is_some() {
        let mut group = Vec::new();
        let mut size = 0;
        while let Some(((key, _), n)) = rest.peek().map(|s| (s, first_seen[&s.0])) {
            if !group.is_empty() && size + n > TOMBSTONES_PER_APPEND {
                break;
            }
            size += n;
            group.push(key.clone());
            rest.next();
        }
        if let Some(hook) = hook {
            for (bot, session) in &group {
                hook(bot.clone(), session.clone()).await;
            }
        }
        // The decision above is as old as the first refresh: a writer may have added to a
        // session since. Decide again from a fresh read, and end only what that read saw.
        reader.refresh().await?;
        let mut tombstones = Vec::new();
        let mut ended = Vec::new();
        for (bot, session) in group {
            let Some(ids) = still_idle(&mut *reader, &bot, &session, cutoff).await? else {
                report.sessions_skipped_active += 1;
                continue;
            };
            if ids.is_empty() {
                // Ended meanwhile (by another pass): nothing left to end.
                continue;
            }
            tombstones.extend(ids.into_iter().map(|id| Record::tombstone(id, &bot, &session)));
            ended.push((bot, session));
        }
        // Order the tombstones after everything read. A far-future clock in the log is
        // refused here (and reported by the history checker); a tombstone hides its id
        // whatever its place in the order (rule 7), so retention goes on without it.
        let _ = shard.observe(reader.max_hlc());
        while !tombstones.is_empty() {
            let batch: Vec<Record> = tombstones
                .drain(..tombstones.len().min(TOMBSTONES_PER_APPEND))
                .collect();
            let n = batch.len() as u64;
            shard.append(batch).await?;
            report.tombstones += n;
        }
        report.sessions_ended.extend(ended);
    }
    shard.close().await?;
    report.sessions_ended.sort();
    Ok(report)
}

/// Read the session (the caller refreshed just before): its own live ids in contract order
/// if its newest own live entry is still older than `cutoff` (none if it has no live entry
/// left), `None` if it is not. Its own entries, links among them (rule 25): what a fork
/// inherits is not the fork's to end, and a fork or hide ends with its session.
async fn still_idle(reader: &mut dyn Projector, bot: &str, session: &str, cutoff: u64) -> Result<Option<Vec<String>>> {
    let live = reader.own_entries(bot, session).await?;
    if live.iter().any(|e| e.hlc.millis() >= cutoff) {
        return Ok(None);
    }
    Ok(Some(live.into_iter().map(|e| e.record.id).collect()))
}
