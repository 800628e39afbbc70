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
        case!(a_purged_secret_is_in_no_byte_of_any_file, needs Erasure),
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
    GcOptions::default().with_grace(Duration::ZERO)
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
    let first = store.purge(&PurgeOptions::default().with_max_ids(1)).await?;
    ensure!(
        (first.ids_purged, first.ids_remaining) == (1, 1),
        "expected 1 id purged and 1 remaining, got {first:?}"
    );
    let second = store.purge(&PurgeOptions::default().with_max_ids(1)).await?;
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
    let store = ctx.store_with(ctx.options().with_clock(clock.clone())).await?;
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

    let options = RetainOptions::older_than(Duration::from_millis(2 * HOUR - 1)).with_bot_id(Some("bot".into()));
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
    expect_maintenance_entries(store.as_ref(), 3).await?;

    // Exactly `older_than` old is not older: bot/mixed and bot/new (newest at t0 + 2h) stay.
    let at_cutoff = RetainOptions::older_than(Duration::from_millis(HOUR)).with_bot_id(Some("bot".into()));
    let r = ctxlog_core::retain(store.as_ref(), &at_cutoff).await?;
    ensure!(
        r.sessions_ended.is_empty(),
        "expected nothing ended at exactly the cutoff, got {r:?}"
    );
    // A bounded pass ends the longest-idle first and says how many it left.
    let bounded = RetainOptions::older_than(Duration::from_millis(HOUR - 1))
        .with_bot_id(Some("bot".into()))
        .with_max_sessions(1);
    let r = ctxlog_core::retain(store.as_ref(), &bounded).await?;
    ensure!(
        r.sessions_ended == vec![("bot".to_string(), "mixed".to_string())] && r.sessions_remaining == 1,
        "expected bot/mixed ended and one session left, got {r:?}"
    );
    Ok(())
}

/// Every file under `dir` (recursively) that contains `needle`, found by another process:
/// this one holds connections to the store, and a descriptor of a SQLite store's file opened
/// and closed here would drop this process's locks on it.
fn files_containing(dir: &std::path::Path, needle: &str) -> anyhow::Result<Vec<std::path::PathBuf>> {
    ctxlog_core::testing::outside::files_containing(dir, needle).with_context(|| format!("scan {}", dir.display()))
}

/// The auditor's test of rule 16: a record whose text and metadata carry a unique secret
/// (once short, with an embedding whose vector's bytes are the secret; once in a body larger
/// than a page; once as the last append of a writer that then closes) is tombstoned; after compaction, purge and gc (no grace period) the secret is
/// nowhere the store keeps it:
///
/// - on a local disk ([`Backend::files_in_root`]), no byte sequence of any file under the
///   store's directory is the secret;
/// - where the backend can decode what it stores ([`Backend::decoded_values_containing`]:
///   compressed files a byte scan cannot see into, object stores), no decoded value of any
///   stored version, generation or log entry holds it.
///
/// A search index saved while the secret lives holds it, and the purge deletes every saved
/// index: the scans above cover their files and objects too.
///
/// Each check runs where it applies, both where both do (local Lance), and each must find the
/// secret before the purge (so that it can fail).
///
/// [`Backend::files_in_root`]: crate::Backend::files_in_root
/// [`Backend::decoded_values_containing`]: crate::Backend::decoded_values_containing
pub async fn a_purged_secret_is_in_no_byte_of_any_file(ctx: Ctx) -> anyhow::Result<()> {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let secret = format!("s3cr3t-{nonce:016x}");
    let scan_files = ctx.backend.files_in_root;
    let decoded_search = ctx.backend.decoded_values_containing;
    ensure!(
        scan_files || decoded_search.is_some(),
        "the backend has neither local files nor a decoded search: the case cannot audit it"
    );
    // Where the decoded search finds the secret, as a readable list.
    let decoded = |when: &'static str| {
        let (uri, secret) = (ctx.uri.clone(), secret.clone());
        async move {
            match decoded_search {
                Some(search) => search(uri, secret)
                    .await
                    .with_context(|| format!("the decoded search {when}")),
                None => Ok(Vec::new()),
            }
        }
    };
    fn listed(places: &[String]) -> String {
        let shown: Vec<&str> = places.iter().take(12).map(String::as_str).collect();
        let more = places.len().saturating_sub(shown.len());
        let more = if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        };
        format!("{} places: {}{more}", places.len(), shown.join("; "))
    }
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w")).await?;
    shard.append(recs("before", "s", 20)).await?;
    let mut short = rec("secret-1", "s", format!("my secret is {secret}"));
    short.metadata = Some(serde_json::json!({"note": secret}));
    let long = rec("secret-2", "s", format!("{secret} ").repeat(2000));
    // An embedding of the record (rule 27) whose vector's bytes are the secret: an id's
    // vectors are erased with it. (Four ASCII bytes are always a finite little-endian f32.)
    let bytes = format!("{secret} ").into_bytes();
    let vector: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("four bytes")))
        .collect();
    let embedded = Record::embedding("secret-1", "bot", "s", "m", ctxlog_core::Metric::Dot, &vector);
    shard.append(vec![short, embedded, long]).await?;
    shard.append(recs("after", "s", 20)).await?;
    // A writer whose last append before it closes is a secret: on a backend with a
    // write-ahead log, the entry its closing flush covers last.
    let mut last = store.open_shard(&w("last-words")).await?;
    last.append(recs("last", "s", 3)).await?;
    last.append(vec![rec("secret-3", "s", format!("last words: {secret}"))])
        .await?;
    last.close().await?;
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    // A search index saved while the secret lives (rule 26's derived data) holds it — its
    // metadata, its vector's bytes — until the purge deletes every saved index.
    let indexes = store
        .saved_indexes()
        .context("every backend keeps saved search indexes")?;
    let mut searcher = ctxlog_core::search::Searcher::new();
    let ctxlog_core::search::saved::Saved::Put { name, .. } =
        ctxlog_core::search::saved::save(&mut searcher, store.as_ref()).await?
    else {
        bail!("the search index was not saved");
    };
    drop(searcher);
    let held = indexes.read(&name).await?.context("the saved index reads back")?;
    ensure!(
        held.windows(secret.len()).any(|w| w == secret.as_bytes()),
        "the saved search index holds no byte of the live secret: its check would prove nothing"
    );
    if scan_files {
        ensure!(
            !files_containing(&ctx.root, &secret)?.is_empty(),
            "expected the secret in some file before the purge: the scan would prove nothing"
        );
    }
    if decoded_search.is_some() {
        ensure!(
            !decoded("before the purge").await?.is_empty(),
            "expected the decoded search to find the secret before the purge: it would prove nothing"
        );
    }
    shard
        .append(vec![
            Record::tombstone("secret-1", "bot", "s"),
            Record::tombstone("secret-2", "bot", "s"),
            Record::tombstone("secret-3", "bot", "s"),
        ])
        .await?;
    shard.close().await?;
    let before = views(store.as_ref()).await?;
    // What erasing takes on any backend: fold, purge, fold what the purge wrote, reclaim.
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    let report = store.purge(&PurgeOptions::default()).await?;
    ensure!(report.ids_purged == 3, "expected 3 ids purged, got {report:?}");
    ensure!(
        indexes.names().await?.is_empty(),
        "a saved search index outlived the purge"
    );
    for _ in 0..3 {
        store.compact(&CompactOptions::default()).await?;
    }
    store.gc(&now()).await?;
    if scan_files {
        let left = files_containing(&ctx.root, &secret)?;
        ensure!(
            left.is_empty(),
            "expected the secret in no file after purge and gc, found it in {left:?}"
        );
    }
    let left = decoded("after purge and gc").await?;
    ensure!(
        left.is_empty(),
        "expected the secret in no stored value after purge and gc, the decoded search found it in {}",
        listed(&left)
    );
    let after = views(ctx.store().await?.as_ref()).await?;
    ensure!(after == before, "purge and gc changed what readers see");
    Ok(())
}

/// The retention cases appended after [`cases`]; `rules::all` lists them next to it.
pub fn retain_race_cases() -> Vec<Case> {
    vec![case!(retain_leaves_alone_a_session_written_to_after_it_was_found_idle)]
}

/// Retention decides which sessions are idle from one read; a record written to one of them
/// after that decision and before its tombstones (here by a hook between the two) keeps the
/// whole session live: the pass re-checks each session just before ending it, skips the one
/// that became active, and says so, and still ends the others.
pub async fn retain_leaves_alone_a_session_written_to_after_it_was_found_idle(ctx: Ctx) -> anyhow::Result<()> {
    const HOUR: u64 = 3_600_000;
    let t0 = 1_800_000_000_000;
    let clock = ManualClock::new(t0);
    let store = ctx.store_with(ctx.options().with_clock(clock.clone())).await?;
    let mut shard = store.open_shard(&w("app")).await?;
    shard.append(recs("a", "idle-a", 2)).await?;
    shard.append(recs("busy", "busy", 3)).await?;
    shard.append(recs("b", "idle-b", 1)).await?;
    clock.set(t0 + 2 * HOUR);
    shard.append(recs("fresh", "fresh", 1)).await?;
    shard.close().await?;
    clock.set(t0 + 3 * HOUR);

    // Idle: bot/idle-a, bot/busy, bot/idle-b (newest at t0, the cutoff is t0 + 2h); the hook
    // runs for each after that decision, and writes one record to bot/busy.
    let calls = std::sync::Mutex::new(Vec::<String>::new());
    let wrote = std::sync::Mutex::new(None::<Result<(), Error>>);
    let (store_ref, calls_ref, wrote_ref) = (store.as_ref(), &calls, &wrote);
    let hook = move |bot: String, session: String| async move {
        calls_ref
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("{bot}/{session}"));
        if session != "busy" {
            return;
        }
        let result = async {
            let mut late = store_ref.open_shard(&w("late")).await?;
            let record = rec("busy-late", "busy", "written after retention found bot/busy idle");
            late.append(vec![record]).await?;
            late.close().await?;
            Ok::<(), Error>(())
        }
        .await;
        *wrote_ref.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(result);
    };
    let options = RetainOptions::older_than(Duration::from_millis(HOUR));
    let report = options.retain_with_hook(store.as_ref(), hook).await?;

    let calls = calls.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    ensure!(
        calls == ["bot/idle-a", "bot/busy", "bot/idle-b"],
        "expected the hook to run for bot/idle-a, bot/busy, bot/idle-b (oldest first), got {calls:?}"
    );
    match wrote.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        Some(Ok(())) => {}
        Some(Err(e)) => return Err(anyhow::Error::new(e).context("the hook's append to bot/busy")),
        None => bail!("the hook never wrote to bot/busy"),
    }
    let idle = |s: &str| ("bot".to_string(), s.to_string());
    ensure!(
        report.sessions_ended == vec![idle("idle-a"), idle("idle-b")]
            && report.tombstones == 3
            && report.sessions_skipped_active == 1
            && report.sessions_remaining == 0,
        "expected bot/idle-a and bot/idle-b ended with 3 tombstones and bot/busy skipped as active, got {report:?}"
    );

    let mut p = store.projector();
    let busy = ids(&p.session("bot", "busy").await?);
    ensure!(
        busy == ["busy-0", "busy-1", "busy-2", "busy-late"],
        "expected every record of bot/busy live (it was written to before it was ended), got {busy:?}"
    );
    for (session, n) in [("idle-a", 0), ("idle-b", 0), ("fresh", 1)] {
        let live = p.session("bot", session).await?.len();
        ensure!(live == n, "expected {n} live records in bot/{session}, got {live}");
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(conflicts.is_empty(), "expected no conflicts, got {conflicts:?}");
    expect_maintenance_entries(store.as_ref(), 3).await?;

    // bot/busy is active now (its newest record is at t0 + 3h): a plain pass leaves it too.
    let again = ctxlog_core::retain(store.as_ref(), &options).await?;
    ensure!(
        again.sessions_ended.is_empty() && again.tombstones == 0 && again.sessions_skipped_active == 0,
        "expected a second pass to end and skip nothing, got {again:?}"
    );
    Ok(())
}

/// The purge cases appended after [`cases`]; `rules::all` lists them next to it.
pub fn purge_conflict_cases() -> Vec<Case> {
    vec![case!(purge_keeps_a_non_empty_conflict_list_byte_identical)]
}

/// Rules 16 and 10: purge leaves a conflict list that is not empty byte-identical — a
/// divergent put and a write after delete of tombstoned ids (tombstones in another shard
/// than those puts), a divergent put of a live id, and damage to live ids, which purge does
/// not touch: a seq gap, content that does not match its hash, an entry without a body
/// (corrupt: its id has no tombstone). The canonical list is the same before and after, in
/// a full check and after checkpoints (one with the tombstones below it), and the model's.
pub async fn purge_keeps_a_non_empty_conflict_list_byte_identical(ctx: Ctx) -> anyhow::Result<()> {
    let store = history_with_a_forgotten_id(&ctx).await?;
    let mut p = store.projector();
    p.refresh().await?;
    // Past every entry so far, the tombstones (shard `a`) among them.
    let tombstoned = p.checkpoint();
    let mut b = store.open_shard(&w("b")).await?;
    b.observe(p.max_hlc())?;
    let late = b
        .append(vec![
            // A late retry of a forgotten put: a write after delete, purged too.
            rec("forget-me", "s", "a secret body"),
            // A live id's divergent put.
            rec("keep-1", "s", "not what was kept"),
        ])
        .await?;
    b.close().await?;
    let shard = w("b").shard_id();
    let damaged = |seq: u64, record: Record| {
        let content_hash = record.content_hash();
        Entry {
            shard,
            seq,
            epoch: late.epoch,
            hlc: Hlc(late.last_hlc.0 + seq),
            record,
            content_hash,
            purged: false,
        }
    };
    // Past a hole (a seq gap): a live record whose body is gone, and one changed.
    let mut lost = damaged(late.last_seq + 2, rec("lost", "s", "a body that is lost"));
    lost.purge();
    let mut tampered = damaged(late.last_seq + 3, rec("tampered", "s", "original"));
    tampered.record.body = Body::Text("tampered".into());
    for e in [lost, tampered] {
        (ctx.backend.inject_raw_entry)(ctx.uri.clone(), e).await?;
    }

    let mut everything_old = tombstoned.clone();
    everything_old.advance(shard, late.last_seq);
    let checkpoints = [Checkpoint::default(), tombstoned, everything_old];
    // The canonical conflict lists: in full, after each checkpoint (a fresh discovery each).
    async fn lists(store: &dyn Store, checkpoints: &[Checkpoint]) -> anyhow::Result<Vec<String>> {
        let mut out = vec![ctxlog_core::conflicts_json(
            &store.conflict_discovery().conflicts(None).await?,
        )];
        for cp in checkpoints {
            out.push(ctxlog_core::conflicts_json(
                &store.conflict_discovery().conflicts(Some(cp)).await?,
            ));
        }
        Ok(out)
    }

    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let model = model::conflicts(&all_entries(store.as_ref()).await?);
    ensure!(
        conflicts == model,
        "before purge, the checker differs from the model: got {conflicts:?}, the model says {model:?}"
    );
    let mut corrupt: Vec<&str> = conflicts
        .iter()
        .filter_map(|c| match c {
            Conflict::Corrupt { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    corrupt.sort_unstable();
    ensure!(
        corrupt == ["lost", "tampered"],
        "expected the live ids' damaged entries corrupt, got {conflicts:?}"
    );
    ensure!(
        kinds(&conflicts)
            == vec![
                ConflictKind::DivergentPut,
                ConflictKind::DivergentPut,
                ConflictKind::WriteAfterDelete,
                ConflictKind::SeqGap,
                ConflictKind::Corrupt,
                ConflictKind::Corrupt,
            ],
        "expected two divergent puts, a write after delete, a seq gap and two corrupt entries, got {conflicts:?}"
    );
    let before = views(store.as_ref()).await?;
    let before_lists = lists(store.as_ref(), &checkpoints).await?;

    let report = store.purge(&PurgeOptions::default()).await?;
    ensure!(report.ids_purged == 2, "expected 2 ids purged, got {report:?}");
    let store = ctx.store().await?;
    let after = views(store.as_ref()).await?;
    ensure!(after.0 == before.0, "purge changed the projection");
    ensure!(
        after.1 == before.1,
        "purge changed the conflict list: {} -> {}",
        before.1,
        after.1
    );
    let after_lists = lists(store.as_ref(), &checkpoints).await?;
    let after_what = [None].into_iter().chain(checkpoints.iter().map(Some));
    for ((cp, old), new) in after_what.zip(&before_lists).zip(&after_lists) {
        ensure!(
            old == new,
            "purge changed the conflict list after {cp:?}: {old} -> {new}"
        );
    }
    let model = model::conflicts(&all_entries(store.as_ref()).await?);
    ensure!(
        ctxlog_core::conflicts_json(&model) == after.1,
        "after purge, the checker differs from the model: {} vs {}",
        after.1,
        ctxlog_core::conflicts_json(&model)
    );
    Ok(())
}

/// The maintenance writer's shard holds exactly `n` entries (retention's tombstones).
async fn expect_maintenance_entries(store: &dyn Store, n: u64) -> anyhow::Result<()> {
    let maintenance = store
        .shards()
        .await?
        .into_iter()
        .find(|s| s.writer.as_str() == ctxlog_core::MAINTENANCE_WRITER)
        .ok_or_else(|| anyhow!("expected a shard of the maintenance writer"))?;
    ensure!(
        maintenance.entries == n,
        "expected {n} tombstones in the maintenance shard, got {}",
        maintenance.entries
    );
    Ok(())
}
