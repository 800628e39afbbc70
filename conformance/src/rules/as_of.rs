//! Rule 24: reads as of a position. A reader given a position earlier (a page's, a context
//! view's) reads a session, its context view and the bot's session list as they were there,
//! on every backend and replica, less what was forgotten since.

use ctxlog_core::{GcOptions, PurgeOptions};

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 24: reads as of a position";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(a_view_as_of_a_position_is_what_its_reader_saw_while_writers_append),
        case!(a_summary_written_after_the_position_does_not_govern_as_of_it),
        case!(a_record_forgotten_after_the_position_is_gone_as_of_it_too),
        case!(the_winner_as_of_a_position_is_the_first_put_held_there),
        case!(a_position_the_reader_does_not_hold_is_refused),
    ]
}

/// A context view's ids, its governing summary's id and how many records it covers.
type ContextIds = (Vec<String>, Option<String>, u64);

/// What a reader answers of bot `bot`: the session list (`session:records`), session `s`'s
/// view and its context view.
type Seen = (Vec<String>, Vec<String>, ContextIds);

/// [`Seen`] now, or as of `at`.
async fn seen(p: &mut dyn ctxlog_core::Projector, at: Option<&Checkpoint>) -> anyhow::Result<Seen> {
    let (sessions, records, view) = match at {
        None => (
            p.sessions("bot").await?,
            p.session("bot", "s").await?,
            p.context("bot", "s").await?,
        ),
        Some(at) => (
            p.sessions_at("bot", at).await?,
            p.session_page_at("bot", "s", at, None, usize::MAX).await?.0,
            p.context_at("bot", "s", at).await?,
        ),
    };
    let summary = view
        .summary
        .and_then(|k| view.entries.iter().find(|e| e.key() == k))
        .map(|e| e.record.id.clone());
    Ok((
        sessions
            .into_iter()
            .map(|s| format!("{}:{}", s.session_id, s.records))
            .collect(),
        ids(&records),
        (ids(&view.entries), summary, view.covered),
    ))
}

/// A reader reads; two writers go on appending (to the session, to a new session, a
/// summary); then, from a fresh reader, after compaction and gc, and from a snapshot, the
/// views as of the first reader's position are exactly what it saw — and the pages of one
/// as-of read fit together.
pub async fn a_view_as_of_a_position_is_what_its_reader_saw_while_writers_append(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    a.append(recs("a", "s", 4)).await?;
    b.append(recs("b", "s", 3)).await?;
    b.append(recs("other", "t", 1)).await?;
    let mut first = store.projector();
    first.refresh().await?;
    let at = first.checkpoint();
    let then = seen(first.as_mut(), None).await?;

    a.observe(first.max_hlc())?;
    a.append(recs("later-a", "s", 3)).await?;
    b.append(recs("new-session", "u", 2)).await?;
    b.observe(first.max_hlc())?;
    b.append(vec![Record::summary("sum", "bot", "s", "all of it", at.clone())])
        .await?;
    let mut now = store.projector();
    now.refresh().await?;
    ensure!(
        seen(now.as_mut(), None).await? != then,
        "the writes after the position changed nothing"
    );
    ensure!(
        seen(now.as_mut(), Some(&at)).await? == then,
        "as of the position, a fresh reader answers otherwise than the reader that held it"
    );
    // Pages as of the position: the same records, page by page.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let (page, more) = now.session_page_at("bot", "s", &at, after.as_ref(), 2).await?;
        after = page.last().map(Entry::key);
        paged.extend(ids(&page));
        if !more {
            break;
        }
    }
    ensure!(
        paged == then.1,
        "the pages as of the position hold {paged:?}, not {:?}",
        then.1
    );
    // Maintenance and snapshots change nothing of it (rules 14, 15, 17).
    store.compact(&CompactOptions::default()).await?;
    store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    store.projector().save_snapshot().await?;
    for reader in ["a fresh reader after maintenance", "a reader from a snapshot"] {
        let mut p = if reader.contains("snapshot") {
            store.projector()
        } else {
            ctx.store().await?.projector()
        };
        p.refresh().await?;
        ensure!(
            seen(p.as_mut(), Some(&at)).await? == then,
            "as of the position, {reader} answers otherwise than the reader that held it"
        );
    }
    Ok(())
}

/// A summary governs an as-of context view only when it is at or below the position and
/// names nothing past it: a summary written later governs now, the earlier one as of the
/// position, and a position before any summary shows the records raw.
pub async fn a_summary_written_after_the_position_does_not_govern_as_of_it(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut summariser = store.open_shard(&w("summariser")).await?;
    a.append(recs("one", "s", 3)).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let raw = p.checkpoint();
    summariser.observe(p.max_hlc())?;
    summariser
        .append(vec![Record::summary("sum-1", "bot", "s", "one", raw.clone())])
        .await?;
    a.observe(p.max_hlc())?;
    a.append(recs("two", "s", 2)).await?;
    p.refresh().await?;
    let first_summary = p.checkpoint();
    summariser.observe(p.max_hlc())?;
    summariser
        .append(vec![Record::summary(
            "sum-2",
            "bot",
            "s",
            "one and two",
            first_summary.clone(),
        )])
        .await?;
    let mut fresh = store.projector();
    fresh.refresh().await?;
    let context = |v: Seen| v.2;
    let now = context(seen(fresh.as_mut(), None).await?);
    ensure!(
        now == (vec!["sum-2".to_string()], Some("sum-2".into()), 5),
        "now: {now:?}"
    );
    let then = context(seen(fresh.as_mut(), Some(&first_summary)).await?);
    ensure!(
        then == (
            vec!["sum-1".to_string(), "two-0".into(), "two-1".into()],
            Some("sum-1".into()),
            3
        ),
        "as of the position after the first summary: {then:?}"
    );
    let before = context(seen(fresh.as_mut(), Some(&raw)).await?);
    ensure!(
        before == (vec!["one-0".to_string(), "one-1".into(), "one-2".into()], None, 0),
        "as of the position before any summary: {before:?}"
    );
    // As of a position that holds the first summary but none of the records it covers (a
    // reader that had read the summariser's shard only), it is not trusted: it is left out,
    // as every summary that does not govern is.
    let mut summariser_only = first_summary.clone();
    summariser_only.0.remove(&a.shard_id());
    let partial = context(seen(fresh.as_mut(), Some(&summariser_only)).await?);
    ensure!(
        partial == (Vec::new(), None, 0),
        "as of a position without what the summary covers: {partial:?}"
    );
    Ok(())
}

/// Forgetting wins over history: a record tombstoned after the position is gone from every
/// view as of it too (a tombstone hides its id for good, rule 7), so purge then changes no
/// as-of view either (rule 16), and the session list as of it counts one record less.
pub async fn a_record_forgotten_after_the_position_is_gone_as_of_it_too(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(vec![
        rec("keep", "s", "kept"),
        rec("forget-me", "s", "a secret"),
        rec("alone", "t", "the only record of t"),
    ])
    .await?;
    let mut p = store.projector();
    p.refresh().await?;
    let at = p.checkpoint();
    a.append(vec![
        Record::tombstone("forget-me", "bot", "s"),
        Record::tombstone("alone", "bot", "t"),
    ])
    .await?;
    p.refresh().await?;
    let want = (
        vec!["s:1".to_string()],
        vec!["keep".to_string()],
        (vec!["keep".to_string()], None, 0),
    );
    ensure!(
        seen(p.as_mut(), Some(&at)).await? == want,
        "as of a position before the tombstones, the forgotten records show"
    );
    store.purge(&PurgeOptions::default()).await?;
    let mut after = ctx.store().await?.projector();
    after.refresh().await?;
    ensure!(
        seen(after.as_mut(), Some(&at)).await? == want,
        "purge changed a view as of a position"
    );
    Ok(())
}

/// First writer wins by the order (rule 6), and a later put can sort first: a writer whose
/// clock runs an hour ahead writes `x` in session `s`; a reader takes its position; a writer
/// on time then writes `x` in session `t`, which sorts first and wins now. As of the
/// position, `x` is the put held then, in `s`, with its body — from a first scan, a snapshot,
/// and a reader that caught up from before.
pub async fn the_winner_as_of_a_position_is_the_first_put_held_there(ctx: Ctx) -> anyhow::Result<()> {
    let ahead = ctx
        .store_with(ctx.options().with_clock(SkewedClock::new(3_600_000)))
        .await?;
    let mut early = ahead.open_shard(&w("ahead")).await?;
    early
        .append(vec![rec("x", "s", "held then"), rec("y", "s", "y")])
        .await?;
    let store = ctx.store().await?;
    let mut before = store.projector();
    before.refresh().await?;
    let at = before.checkpoint();
    let mut on_time = store.open_shard(&w("on-time")).await?;
    on_time.append(vec![rec("x", "t", "sorts first")]).await?;
    before.refresh().await?;
    store.projector().save_snapshot().await?;
    let mut fresh = ctx.store().await?.projector();
    fresh.refresh().await?;
    let mut from_snapshot = store.projector();
    from_snapshot.refresh().await?;
    for (reader, p) in [
        ("a reader that caught up", &mut before),
        ("a first scan", &mut fresh),
        ("a first scan from a snapshot", &mut from_snapshot),
    ] {
        let now_s = ids(&p.session("bot", "s").await?);
        let now_t = p.session("bot", "t").await?;
        ensure!(
            now_s == ["y"] && ids(&now_t) == ["x"] && now_t[0].record.body == Body::Text("sorts first".into()),
            "{reader}: now, x should be t's (it sorts first): s {now_s:?}, t {:?}",
            ids(&now_t)
        );
        let (then_s, _) = p.session_page_at("bot", "s", &at, None, 10).await?;
        let (then_t, _) = p.session_page_at("bot", "t", &at, None, 10).await?;
        ensure!(
            ids(&then_s) == ["x", "y"] && then_s[0].record.body == Body::Text("held then".into()) && then_t.is_empty(),
            "{reader}: as of the position, x should be s's as written then: s {:?}, t {:?}",
            ids(&then_s),
            ids(&then_t)
        );
        let listed: Vec<String> = p
            .sessions_at("bot", &at)
            .await?
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        ensure!(listed == ["s"], "{reader}: sessions as of the position: {listed:?}");
    }
    Ok(())
}

/// A reader asked for a view as of a position past what it holds (one another reader was
/// given, or a forged one) refuses it, naming the field, and answers once it holds it.
pub async fn a_position_the_reader_does_not_hold_is_refused(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(recs("one", "s", 2)).await?;
    let mut stale = store.projector();
    stale.refresh().await?;
    a.append(recs("two", "s", 2)).await?;
    let mut fresh = store.projector();
    fresh.refresh().await?;
    let newer = fresh.checkpoint();
    let mut forged = newer.clone();
    forged.advance(a.shard_id(), 1_000);
    for (what, at) in [("a newer position", &newer), ("a forged position", &forged)] {
        let refused = |r: Result<(), Error>| matches!(r, Err(Error::InvalidInput { field: "at", .. }));
        ensure!(
            refused(stale.sessions_at("bot", at).await.map(drop)),
            "{what}: the session list was not refused"
        );
        ensure!(
            refused(stale.session_page_at("bot", "s", at, None, 10).await.map(drop)),
            "{what}: the page was not refused"
        );
        ensure!(
            refused(stale.context_at("bot", "s", at).await.map(drop)),
            "{what}: the context view was not refused"
        );
    }
    stale.refresh().await?;
    let (page, _) = stale.session_page_at("bot", "s", &newer, None, 10).await?;
    ensure!(
        ids(&page).len() == 4,
        "once held, the position answers: {:?}",
        ids(&page)
    );
    ensure!(
        matches!(
            stale.context_at("bot", "s", &forged).await,
            Err(Error::InvalidInput { field: "at", .. })
        ),
        "a forged position was answered"
    );
    Ok(())
}
