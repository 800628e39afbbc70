//! Rule 25: a fork is a position, never a copy. A session continues another as of a
//! position with one record; its view is the other's view as of there, then its own, on
//! every backend and replica; forgetting reaches forks; a hide leaves the parent alone.

use ctxlog_core::{GcOptions, PurgeOptions};

use ctxlog_core::Shard;

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 25: forks";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(a_fork_shows_its_parent_as_of_its_position_while_writers_append),
        case!(forgetting_in_the_parent_reaches_the_fork_and_a_hide_leaves_the_parent_alone),
        case!(a_fork_of_a_fork_sees_through_both_and_purge_reaches_every_one),
        case!(a_fork_uses_the_parents_summaries_as_of_its_position_and_never_for_its_own_records),
        case!(a_fork_naming_a_position_that_did_not_exist_is_reported),
    ]
}

/// Write a fork of `from` as session `session` at `at` through `shard`, having observed
/// `reader`'s clock (as a summary is written, rule 25).
async fn fork(
    shard: &mut dyn Shard,
    reader: &dyn ctxlog_core::Projector,
    id: &str,
    session: &str,
    from: &str,
    at: Checkpoint,
) -> anyhow::Result<()> {
    shard.observe(reader.max_hlc())?;
    shard.append(vec![Record::fork(id, "bot", session, from, at)]).await?;
    Ok(())
}

/// The ids of a session's view, and the session list as `session:records`.
async fn view(p: &mut dyn ctxlog_core::Projector, session: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let records = ids(&p.session("bot", session).await?);
    let sessions = p
        .sessions("bot")
        .await?
        .into_iter()
        .map(|s| format!("{}:{}", s.session_id, s.records))
        .collect();
    Ok((records, sessions))
}

/// A reader takes a position in session `s` while two writers append; a fork `f` at that
/// position shows exactly `s`'s records then, followed by its own; `s` shows everything and
/// nothing of `f`; the fork's pages fit together; as of a position before the fork record,
/// `f` is empty; and a fresh reader, one after compaction and gc, and one from a snapshot
/// answer the same.
pub async fn a_fork_shows_its_parent_as_of_its_position_while_writers_append(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    a.append(recs("a", "s", 3)).await?;
    b.append(recs("b", "s", 2)).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let at = p.checkpoint();
    let parent_then = ids(&p.session("bot", "s").await?);
    a.append(recs("later-a", "s", 2)).await?;
    fork(b.as_mut(), p.as_ref(), "fork-1", "f", "s", at.clone()).await?;
    b.append(recs("own", "f", 2)).await?;
    a.append(recs("later-a2", "s", 1)).await?;
    p.refresh().await?;
    let before_fork = p.checkpoint();
    let mut want_f = parent_then.clone();
    want_f.extend(["own-0".to_string(), "own-1".into()]);
    // A session list counts a session's own records: the fork's two.
    let want = (want_f.clone(), vec!["f:2".to_string(), "s:8".into()]);
    ensure!(
        view(p.as_mut(), "f").await? == want,
        "the fork: {:?}",
        view(p.as_mut(), "f").await?
    );
    let parent = ids(&p.session("bot", "s").await?);
    ensure!(
        parent.len() == 8 && !parent.iter().any(|id| id.starts_with("own") || id == "fork-1"),
        "the parent changed: {parent:?}"
    );
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let (page, more) = p.session_page("bot", "f", after.as_ref(), 2).await?;
        after = page.last().map(Entry::key);
        paged.extend(ids(&page));
        if !more {
            break;
        }
    }
    ensure!(paged == want_f, "the fork's pages hold {paged:?}");
    ensure!(
        ids(&p.session_page_at("bot", "f", &at, None, usize::MAX).await?.0).is_empty(),
        "as of the fork's own position the fork record is not there yet, and neither is the fork"
    );
    ensure!(
        ids(&p.session_page_at("bot", "f", &before_fork, None, usize::MAX).await?.0) == want_f,
        "as of a later position the fork is what it is now"
    );
    // As of a position that holds the fork but none of writer a's entries, the fork shows
    // none of them either: what it inherits is met with the reader's position.
    let mut without_a = before_fork.clone();
    without_a.0.remove(&a.shard_id());
    let partial = ids(&p.session_page_at("bot", "f", &without_a, None, usize::MAX).await?.0);
    ensure!(
        partial == ["b-0", "b-1", "own-0", "own-1"],
        "as of a position without writer a, the fork shows {partial:?}"
    );
    store.compact(&CompactOptions::default()).await?;
    store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    store.projector().save_snapshot().await?;
    for reader in ["a fresh reader after maintenance", "a reader from a snapshot"] {
        let mut r = if reader.contains("snapshot") {
            store.projector()
        } else {
            ctx.store().await?.projector()
        };
        r.refresh().await?;
        ensure!(view(r.as_mut(), "f").await? == want, "{reader} answers otherwise");
    }
    Ok(())
}

/// A record tombstoned in the parent after the fork point is gone from the fork (a fork is
/// the parent as of its position, and forgetting wins); a hide in the fork leaves an
/// inherited record out of the fork only, and tombstoning the hide shows it again.
pub async fn forgetting_in_the_parent_reaches_the_fork_and_a_hide_leaves_the_parent_alone(
    ctx: Ctx,
) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(recs("m", "s", 4)).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let at = p.checkpoint();
    fork(a.as_mut(), p.as_ref(), "fork-1", "f", "s", at).await?;
    a.append(vec![Record::tombstone("m-0", "bot", "s")]).await?;
    a.append(vec![Record::hide("hide-1", "bot", "f", "m-2")]).await?;
    p.refresh().await?;
    ensure!(
        ids(&p.session("bot", "f").await?) == ["m-1", "m-3"],
        "the fork after a tombstone in the parent and a hide in the fork: {:?}",
        ids(&p.session("bot", "f").await?)
    );
    ensure!(
        ids(&p.session("bot", "s").await?) == ["m-1", "m-2", "m-3"],
        "the hide touched the parent: {:?}",
        ids(&p.session("bot", "s").await?)
    );
    ensure!(
        p.get("bot", "m-2").await?.is_some(),
        "the hidden record is gone from the store"
    );
    a.append(vec![Record::tombstone("hide-1", "bot", "f")]).await?;
    p.refresh().await?;
    ensure!(
        ids(&p.session("bot", "f").await?) == ["m-1", "m-2", "m-3"],
        "tombstoning the hide shows the record again: {:?}",
        ids(&p.session("bot", "f").await?)
    );
    a.append(vec![Record::tombstone("fork-1", "bot", "f")]).await?;
    p.refresh().await?;
    ensure!(
        p.session("bot", "f").await?.is_empty() && !view(p.as_mut(), "f").await?.1.iter().any(|s| s.starts_with("f:")),
        "tombstoning the fork makes the session its own records again (none)"
    );
    Ok(())
}

/// `g` forks `f`, which forks `s`: `g` sees `s` as of `f`'s position, `f`'s own records as
/// of `g`'s, and its own; `f`'s hide applies to `g`; records written later in `s` and `f`
/// do not show. Purging a record tombstoned in `s` erases it from every view of every fork,
/// and no entry of any view holds its text.
pub async fn a_fork_of_a_fork_sees_through_both_and_purge_reaches_every_one(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    a.append(vec![
        rec("s-0", "s", "zero"),
        rec("secret", "s", "a secret"),
        rec("s-2", "s", "two"),
    ])
    .await?;
    let mut p = store.projector();
    p.refresh().await?;
    fork(b.as_mut(), p.as_ref(), "fork-f", "f", "s", p.checkpoint()).await?;
    b.append(vec![
        rec("f-0", "f", "f zero"),
        Record::hide("hide-s0", "bot", "f", "s-0"),
    ])
    .await?;
    a.append(recs("s-late", "s", 1)).await?;
    p.refresh().await?;
    let at_f = p.checkpoint();
    fork(a.as_mut(), p.as_ref(), "fork-g", "g", "f", at_f).await?;
    b.append(recs("f-late", "f", 1)).await?;
    a.append(recs("g", "g", 1)).await?;
    p.refresh().await?;
    ensure!(
        ids(&p.session("bot", "g").await?) == ["secret", "s-2", "f-0", "g-0"],
        "the fork of a fork: {:?}",
        ids(&p.session("bot", "g").await?)
    );
    ensure!(
        ids(&p.session("bot", "f").await?) == ["secret", "s-2", "f-0", "f-late-0"],
        "the fork: {:?}",
        ids(&p.session("bot", "f").await?)
    );
    a.append(vec![Record::tombstone("secret", "bot", "s")]).await?;
    store.purge(&PurgeOptions::default()).await?;
    let mut fresh = ctx.store().await?.projector();
    fresh.refresh().await?;
    for session in ["s", "f", "g"] {
        let entries = fresh.session("bot", session).await?;
        ensure!(
            !entries
                .iter()
                .any(|e| e.record.id == "secret" || e.record.body == Body::Text("a secret".into())),
            "session {session} still shows the purged record"
        );
    }
    ensure!(
        ids(&fresh.session("bot", "g").await?) == ["s-2", "f-0", "g-0"],
        "the fork of a fork after purge: {:?}",
        ids(&fresh.session("bot", "g").await?)
    );
    Ok(())
}

/// A summary of the parent at or before the fork's position governs the fork's context view;
/// one written after it does not show in the fork; a summary in the fork can stand for
/// inherited records. An inherited summary never stands for the fork's own records, even
/// one at a position it names (written into the fork's session before the fork record).
pub async fn a_fork_uses_the_parents_summaries_as_of_its_position_and_never_for_its_own_records(
    ctx: Ctx,
) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut summariser = store.open_shard(&w("summariser")).await?;
    a.append(recs("s", "s", 3)).await?;
    // The fork's session holds a record of its own before the fork record.
    a.append(vec![rec("early-own", "f", "written before the fork")]).await?;
    let mut p = store.projector();
    p.refresh().await?;
    summariser.observe(p.max_hlc())?;
    summariser
        .append(vec![Record::summary("sum-1", "bot", "s", "three", p.checkpoint())])
        .await?;
    a.append(recs("s-after-sum", "s", 1)).await?;
    p.refresh().await?;
    fork(a.as_mut(), p.as_ref(), "fork-1", "f", "s", p.checkpoint()).await?;
    p.refresh().await?;
    summariser.observe(p.max_hlc())?;
    summariser
        .append(vec![Record::summary("sum-2", "bot", "s", "four", p.checkpoint())])
        .await?;
    p.refresh().await?;
    let context = |v: ctxlog_core::ContextView| {
        let summary = v
            .summary
            .and_then(|k| v.entries.iter().find(|e| e.key() == k))
            .map(|e| e.record.id.clone());
        (ids(&v.entries), summary, v.covered)
    };
    let parent = context(p.context("bot", "s").await?);
    ensure!(
        parent == (vec!["sum-2".to_string()], Some("sum-2".into()), 4),
        "the parent: {parent:?}"
    );
    let forked = context(p.context("bot", "f").await?);
    ensure!(
        forked
            == (
                vec!["sum-1".to_string(), "early-own".into(), "s-after-sum-0".into()],
                Some("sum-1".into()),
                3
            ),
        "the fork: the parent's summary as of the fork governs, its own record stays raw: {forked:?}"
    );
    // A summary written in the fork stands for inherited records and its own.
    a.append(recs("f-own", "f", 1)).await?;
    p.refresh().await?;
    summariser.observe(p.max_hlc())?;
    summariser
        .append(vec![Record::summary("sum-f", "bot", "f", "all", p.checkpoint())])
        .await?;
    p.refresh().await?;
    let forked = context(p.context("bot", "f").await?);
    ensure!(
        forked == (vec!["sum-f".to_string()], Some("sum-f".into()), 6),
        "the fork's own summary: {forked:?}"
    );
    Ok(())
}

/// A fork that names a position past what existed when it was written (records of the
/// parent written after it) is reported as implausible, as a summary is.
pub async fn a_fork_naming_a_position_that_did_not_exist_is_reported(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut forker = store.open_shard(&w("forker")).await?;
    let ack = a.append(recs("before", "s", 2)).await?;
    let claimed = Checkpoint([(ack.shard, 5)].into_iter().collect());
    let mut p = store.projector();
    p.refresh().await?;
    fork(forker.as_mut(), p.as_ref(), "forged", "f", "s", claimed).await?;
    p.refresh().await?;
    a.observe(p.max_hlc())?;
    a.append(recs("later", "s", 3)).await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts
            .iter()
            .any(|c| matches!(c, Conflict::ImplausibleCoverage { id, entry: Some(_), .. } if id == "forged")),
        "not reported: {conflicts:?}"
    );
    Ok(())
}
