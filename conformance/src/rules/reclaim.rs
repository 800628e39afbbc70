//! Rules 15 and 16, and retention: reclaim (`gc`) is invisible to writers and readers; a
//! purge erases bodies and metadata of tombstoned ids and changes no view; retention ends
//! idle sessions with ordinary tombstones.

use ctxlog_core::testing::ManualClock;
use ctxlog_core::{GcOptions, PurgeOptions, RetainOptions};

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 15-16: reclaim, purge and retention";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(gc_beside_live_writers_and_readers_loses_nothing),
        case!(a_writer_reopened_after_gc_keeps_its_seqs_and_clock),
        case!(purge_erases_tombstoned_bodies_and_changes_no_view),
        case!(purge_is_bounded_and_converges),
        case!(a_purged_secret_is_in_no_byte_of_any_file, needs Files),
        case!(retain_ends_idle_sessions_with_ordinary_tombstones),
    ]
}

/// Everything a reader can see, canonically: the projection and the conflict list.
async fn views(store: &dyn Store) -> anyhow::Result<(String, String)> {
    let mut p = store.projector();
    p.refresh().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    Ok((p.projection().canonical_json(), ctxlog_core::conflicts_json(&conflicts)))
}

/// A gc with no grace period: everything reclaimable is reclaimed now.
fn now() -> GcOptions {
    GcOptions {
        grace: Duration::ZERO,
        ..GcOptions::default()
    }
}

/// Passes of compaction and gc (no grace period) run while a writer appends and a reader
/// refreshes: every append succeeds under its epoch, the reader that scanned before the
/// first pass catches up to exactly what a new reader sees, and every record is there once.
pub async fn gc_beside_live_writers_and_readers_loses_nothing(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("live")).await?;
    let mut appended = Vec::new();
    for b in 0..3 {
        let batch = recs(&format!("before{b}"), "s", 5);
        shard.append(batch.clone()).await?;
        appended.extend(ids_of(&batch));
    }
    let mut early = store.projector();
    early.refresh().await?;
    let maintainer = {
        let store = ctx.store().await?;
        tokio::spawn(async move {
            for _ in 0..4 {
                store.compact(&CompactOptions::default()).await?;
                store.gc(&now()).await?;
            }
            anyhow::Ok(())
        })
    };
    let mut n = 0;
    while n < 12 || !maintainer.is_finished() {
        appended.extend(append_beside(&ctx, shard.as_mut(), "gc", n).await?);
        if n % 4 == 0 {
            early.refresh().await.context("a refresh beside gc failed")?;
        }
        n += 1;
        ensure!(n < 10_000, "compaction and gc never finished");
    }
    bounded("compaction and gc", ctx.backend.op_timeout * 8, maintainer).await???;
    store.compact(&CompactOptions::default()).await?;
    store.gc(&now()).await?;
    shard.close().await?;

    let fresh = ctx.store().await?;
    let view = ids(&fresh.projector().session("bot", "s").await?);
    ensure!(
        view == appended,
        "expected every appended record once, in order ({}), got {} ({} distinct)",
        appended.len(),
        view.len(),
        view.iter().collect::<BTreeSet<_>>().len()
    );
    early.refresh().await?;
    let (projection, _) = views(fresh.as_ref()).await?;
    ensure!(
        early.projection().canonical_json() == projection,
        "a reader that scanned before gc does not catch up to what a new reader sees"
    );
    // Its records, too, wherever they were when it indexed them.
    let bodies = early
        .session("bot", "s")
        .await
        .context("the early reader's session after gc")?;
    ensure!(
        ids(&bodies) == appended,
        "expected the early reader to read every record after gc, got {} of {}",
        bodies.len(),
        appended.len()
    );
    let conflicts = fresh.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts.is_empty(),
        "expected no conflicts after gc, got {conflicts:?}"
    );
    Ok(())
}

/// A writer reopened after compaction and gc reclaimed what it wrote continues its shard:
/// its first seq follows the last stored one and its clock follows every stored HLC.
pub async fn a_writer_reopened_after_gc_keeps_its_seqs_and_clock(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w")).await?;
    let mut last = None;
    for b in 0..4 {
        last = Some(shard.append(recs(&format!("b{b}"), "s", 5)).await?);
    }
    let last = last.expect("appended");
    shard.close().await?;
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    store.gc(&now()).await?;
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w")).await?;
    let ack = shard.append(recs("after", "s", 1)).await?;
    ensure!(
        ack.first_seq == last.last_seq + 1,
        "expected seq {} after gc, got {}",
        last.last_seq + 1,
        ack.first_seq
    );
    ensure!(
        ack.first_hlc > last.last_hlc,
        "expected an HLC after {:?}, got {:?}",
        last.last_hlc,
        ack.first_hlc
    );
    shard.close().await?;
    let entries = all_entries(store.as_ref()).await?;
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    let dense: Vec<u64> = (1..=ack.last_seq).collect();
    ensure!(
        seqs == dense,
        "expected seqs 1..={} after gc, got {seqs:?}",
        ack.last_seq
    );
    Ok(())
}

/// A history with a tombstoned id (put on two shards, the second divergent, with metadata)
/// and ids that stay live. Returns the store and the tombstoned id.
async fn history_with_a_forgotten_id(ctx: &Ctx) -> anyhow::Result<Arc<dyn Store>> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    let mut secret = rec("forget-me", "s", "a secret body");
    secret.metadata = Some(serde_json::json!({"secret": "a secret value"}));
    a.append(vec![rec("keep-1", "s", "kept"), secret.clone()]).await?;
    b.observe(a.append(vec![rec("keep-2", "s", "kept too")]).await?.last_hlc)?;
    let mut divergent = secret.clone();
    divergent.body = Body::Bytes(b"another secret".to_vec());
    b.append(vec![divergent, rec("other-forgotten", "t", "x")]).await?;
    a.observe(b.append(vec![rec("keep-3", "s", "kept three")]).await?.last_hlc)?;
    a.append(vec![
        Record::tombstone("forget-me", "bot", "s"),
        Record::tombstone("other-forgotten", "bot", "t"),
    ])
    .await?;
    a.close().await?;
    b.close().await?;
    Ok(store)
}

/// Purge erases the body and metadata of every entry of each tombstoned id and nothing
/// else; the header stays (dense seqs, no corrupt or missing entry reported), and the
/// projection and the conflict list are byte-identical before and after. A second pass
/// finds nothing left.
pub async fn purge_erases_tombstoned_bodies_and_changes_no_view(ctx: Ctx) -> anyhow::Result<()> {
    let store = history_with_a_forgotten_id(&ctx).await?;
    let before_entries = all_entries(store.as_ref()).await?;
    let before = views(store.as_ref()).await?;
    let report = store.purge(&PurgeOptions::default()).await?;
    ensure!(
        (report.ids_purged, report.entries_purged, report.ids_remaining) == (2, 5, 0),
        "expected 2 ids and 5 entries purged (2 puts and a tombstone of one, a put and a \
         tombstone of the other), none remaining; got {report:?}"
    );
    let after = views(ctx.store().await?.as_ref()).await?;
    ensure!(after.0 == before.0, "purge changed the projection");
    ensure!(
        after.1 == before.1,
        "purge changed the conflict list: {} -> {}",
        before.1,
        after.1
    );
    let after_entries = all_entries(store.as_ref()).await?;
    ensure!(
        after_entries.len() == before_entries.len(),
        "expected {} entries after purge, got {}",
        before_entries.len(),
        after_entries.len()
    );
    for (old, new) in before_entries.iter().zip(&after_entries) {
        ensure!(old.key() == new.key(), "purge changed the order or the headers");
        let forgotten = ["forget-me", "other-forgotten"].contains(&old.record.id.as_str());
        if forgotten {
            let mut expected = old.clone();
            expected.purge();
            ensure!(
                *new == expected,
                "expected entry seq {} of `{}` purged (empty text, no metadata, header kept), got {new:?}",
                old.seq,
                old.record.id
            );
        } else {
            ensure!(new == old, "purge changed `{}`, which has no tombstone", old.record.id);
        }
    }
    let again = store.purge(&PurgeOptions::default()).await?;
    ensure!(
        (again.ids_purged, again.entries_purged) == (0, 0),
        "expected nothing left to purge, got {again:?}"
    );
    Ok(())
}

/// A purge bounded to one id per pass reports what is left, and passes converge.
pub async fn purge_is_bounded_and_converges(ctx: Ctx) -> anyhow::Result<()> {
    let store = history_with_a_forgotten_id(&ctx).await?;
    let first = store.purge(&PurgeOptions { max_ids: 1 }).await?;
    ensure!(
        (first.ids_purged, first.ids_remaining) == (1, 1),
        "expected 1 id purged and 1 remaining, got {first:?}"
    );
    let second = store.purge(&PurgeOptions { max_ids: 1 }).await?;
    ensure!(
        (second.ids_purged, second.ids_remaining) == (1, 0),
        "expected the last id purged, got {second:?}"
    );
    let purged = all_entries(store.as_ref()).await?.iter().filter(|e| e.purged).count();
    ensure!(purged == 5, "expected 5 purged entries after two passes, got {purged}");
    Ok(())
}

/// Retention ends exactly the sessions whose newest live record is older than the cutoff,
/// with one ordinary tombstone per live record under the maintenance writer; a second pass
/// ends nothing; a bot filter confines it.
pub async fn retain_ends_idle_sessions_with_ordinary_tombstones(ctx: Ctx) -> anyhow::Result<()> {
    const HOUR: u64 = 3_600_000;
    let t0 = 1_800_000_000_000;
    let clock = ManualClock::new(t0);
    let store = ctx
        .store_with(StoreOptions {
            clock: clock.clone(),
            ..ctx.options()
        })
        .await?;
    let mut shard = store.open_shard(&w("app")).await?;
    let mut other_bot = rec("x-1", "old", "another bot's old session");
    other_bot.bot_id = "other".into();
    shard.append([recs("old", "old", 3), vec![other_bot]].concat()).await?;
    shard.append(recs("mixed-old", "mixed", 2)).await?;
    clock.set(t0 + 2 * HOUR);
    shard.append(recs("mixed-new", "mixed", 1)).await?;
    shard.append(recs("new", "new", 2)).await?;
    shard.close().await?;
    clock.set(t0 + 3 * HOUR);

    let options = RetainOptions {
        bot_id: Some("bot".into()),
        ..RetainOptions::older_than(Duration::from_millis(2 * HOUR - 1))
    };
    let report = ctxlog_core::retain(store.as_ref(), &options).await?;
    ensure!(
        report.sessions_ended == vec![("bot".to_string(), "old".to_string())] && report.tombstones == 3,
        "expected bot/old ended with 3 tombstones, got {report:?}"
    );
    let again = ctxlog_core::retain(store.as_ref(), &options).await?;
    ensure!(
        again.sessions_ended.is_empty() && again.tombstones == 0,
        "expected a second pass to end nothing, got {again:?}"
    );
    let mut p = store.projector();
    ensure!(p.session("bot", "old").await?.is_empty(), "expected bot/old ended");
    for (bot, session, n) in [("bot", "mixed", 3), ("bot", "new", 2), ("other", "old", 1)] {
        let live = p.session(bot, session).await?.len();
        ensure!(live == n, "expected {n} live records in {bot}/{session}, got {live}");
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "expected no conflicts, got {conflicts:?}");
    let maintenance = store
        .shards()
        .await?
        .into_iter()
        .find(|s| s.writer.as_str() == ctxlog_core::MAINTENANCE_WRITER)
        .ok_or_else(|| anyhow!("expected a shard of the maintenance writer"))?;
    ensure!(
        maintenance.entries == 3,
        "expected 3 tombstones in the maintenance shard, got {}",
        maintenance.entries
    );

    // Exactly `older_than` old is not older: bot/mixed and bot/new (newest at t0 + 2h) stay.
    let at_cutoff = RetainOptions {
        bot_id: Some("bot".into()),
        ..RetainOptions::older_than(Duration::from_millis(HOUR))
    };
    let r = ctxlog_core::retain(store.as_ref(), &at_cutoff).await?;
    ensure!(
        r.sessions_ended.is_empty(),
        "expected nothing ended at exactly the cutoff, got {r:?}"
    );
    // A bounded pass ends the longest-idle first and says how many it left.
    let bounded = RetainOptions {
        bot_id: Some("bot".into()),
        max_sessions: 1,
        ..RetainOptions::older_than(Duration::from_millis(HOUR - 1))
    };
    let r = ctxlog_core::retain(store.as_ref(), &bounded).await?;
    ensure!(
        r.sessions_ended == vec![("bot".to_string(), "mixed".to_string())] && r.sessions_remaining == 1,
        "expected bot/mixed ended and one session left, got {r:?}"
    );
    Ok(())
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &std::path::Path, needle: &[u8]) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for item in std::fs::read_dir(&d).with_context(|| format!("list {}", d.display()))? {
            let path = item?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                todo.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path);
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The auditor's test of rule 16 on a local disk: a record whose text and metadata carry a
/// unique secret (once short, once in a body larger than a page) is tombstoned; after
/// compaction, purge and gc (no grace period), no byte sequence of any file under the
/// store's directory is the secret. Before the purge the secret is found (the scan can fail).
pub async fn a_purged_secret_is_in_no_byte_of_any_file(ctx: Ctx) -> anyhow::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let secret = format!("s3cr3t-{nonce:016x}");
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w")).await?;
    shard.append(recs("before", "s", 20)).await?;
    let mut short = rec("secret-1", "s", format!("my secret is {secret}"));
    short.metadata = Some(serde_json::json!({"note": secret}));
    let long = rec("secret-2", "s", format!("{secret} ").repeat(2000));
    shard.append(vec![short, long]).await?;
    shard.append(recs("after", "s", 20)).await?;
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    ensure!(
        !files_containing(&ctx.root, secret.as_bytes())?.is_empty(),
        "expected the secret in some file before the purge: the scan would prove nothing"
    );
    shard
        .append(vec![
            Record::tombstone("secret-1", "bot", "s"),
            Record::tombstone("secret-2", "bot", "s"),
        ])
        .await?;
    shard.close().await?;
    let before = views(store.as_ref()).await?;
    // What erasing takes on any backend: fold, purge, fold what the purge wrote, reclaim.
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    let report = store.purge(&PurgeOptions::default()).await?;
    ensure!(report.ids_purged == 2, "expected 2 ids purged, got {report:?}");
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    store.gc(&now()).await?;
    let left = files_containing(&ctx.root, secret.as_bytes())?;
    ensure!(
        left.is_empty(),
        "expected the secret in no file after purge and gc, found it in {left:?}"
    );
    let after = views(ctx.store().await?.as_ref()).await?;
    ensure!(after == before, "purge and gc changed what readers see");
    Ok(())
}
