//! Rule 21: summaries and the context view.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 21: summaries and the context view";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(a_summary_covers_what_its_writer_read_and_nothing_appended_after),
        case!(a_chain_governs_by_its_newest_link_and_a_tombstone_ends_a_link),
        case!(incomparable_summaries_of_two_replicas_agree_and_lose_nothing),
        case!(an_implausible_summary_is_reported_and_never_governs),
    ]
}

/// A summary of `covers`, written through `shard` after it observed `after` (rule 8).
async fn summarise(
    shard: &mut dyn ctxlog_core::Shard,
    id: &str,
    covers: Checkpoint,
    after: Hlc,
) -> anyhow::Result<ctxlog_core::AppendAck> {
    shard.observe(after)?;
    Ok(shard
        .append(vec![Record::summary(id, "bot", "s", format!("summary {id}"), covers)])
        .await?)
}

/// What a fresh reader's context view of session `s` holds: its ids and the covered count.
async fn context_of(store: &dyn Store) -> anyhow::Result<(Vec<String>, Option<String>, u64)> {
    let view = store.projector().context("bot", "s").await?;
    let summary = view
        .summary
        .and_then(|k| view.entries.iter().find(|e| e.key() == k))
        .map(|e| e.record.id.clone());
    Ok((ids(&view.entries), summary, view.covered))
}

/// A summariser reads the session; another writer appends while it works; its summary then
/// stands for exactly what it read, in the place of the newest of it, and everything
/// appended after its read stays in the context view. The session view keeps every record.
pub async fn a_summary_covers_what_its_writer_read_and_nothing_appended_after(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    let mut summariser = store.open_shard(&w("summariser")).await?;
    a.append(recs("read", "s", 5)).await?;
    let mut view = store.projector();
    view.refresh().await?;
    let read = view.checkpoint();
    // Another writer, which has read the session too, answers while the summariser works.
    b.observe(view.max_hlc())?;
    b.append(recs("meanwhile", "s", 3)).await?;
    summarise(summariser.as_mut(), "sum", read, view.max_hlc()).await?;
    a.append(recs("after", "s", 2)).await?;

    let (got, summary, covered) = context_of(store.as_ref()).await?;
    // The summary in the place of what it covers: before everything appended after its read
    // (which writers without a causal order interleave by their clocks).
    let mut rest = got.get(1..).unwrap_or_default().to_vec();
    rest.sort();
    let want = ["after-0", "after-1", "meanwhile-0", "meanwhile-1", "meanwhile-2"];
    ensure!(
        got.first().map(String::as_str) == Some("sum") && rest == want,
        "the context view holds {got:?}"
    );
    ensure!(
        summary.as_deref() == Some("sum") && covered == 5,
        "{summary:?} covering {covered}"
    );
    let full = store.projector().session("bot", "s").await?;
    ensure!(
        full.len() == 11,
        "the session view keeps all 11 records, has {}",
        full.len()
    );
    Ok(())
}

/// A chain of summaries governs by its newest link; a tombstoned summary stops governing and
/// the one before it governs again; with none left, every record shows raw.
pub async fn a_chain_governs_by_its_newest_link_and_a_tombstone_ends_a_link(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut summariser = store.open_shard(&w("summariser")).await?;
    let mut p = store.projector();
    a.append(recs("one", "s", 3)).await?;
    p.refresh().await?;
    summarise(summariser.as_mut(), "sum-1", p.checkpoint(), p.max_hlc()).await?;
    a.append(recs("two", "s", 2)).await?;
    p.refresh().await?;
    summarise(summariser.as_mut(), "sum-2", p.checkpoint(), p.max_hlc()).await?;
    a.append(recs("three", "s", 1)).await?;

    let (got, _, covered) = context_of(store.as_ref()).await?;
    ensure!(
        got == ["sum-2", "three-0"] && covered == 5,
        "the chain's newest link: {got:?}, {covered}"
    );
    a.append(vec![Record::tombstone("sum-2", "bot", "s")]).await?;
    let (got, _, covered) = context_of(store.as_ref()).await?;
    ensure!(
        got == ["sum-1", "two-0", "two-1", "three-0"] && covered == 3,
        "the link before governs again: {got:?}, {covered}"
    );
    a.append(vec![Record::tombstone("sum-1", "bot", "s")]).await?;
    let (got, summary, _) = context_of(store.as_ref()).await?;
    ensure!(summary.is_none() && got.len() == 6, "everything raw: {got:?}");
    Ok(())
}

/// Two replicas summarise at once from views neither of which holds the other: the later
/// governs, what only the earlier covers shows raw, nothing is lost, and both replicas (and a
/// reader that starts from a projection snapshot) answer the same.
pub async fn incomparable_summaries_of_two_replicas_agree_and_lose_nothing(ctx: Ctx) -> anyhow::Result<()> {
    let one = ctx.store().await?;
    let two = ctx.store().await?;
    let mut x = one.open_shard(&w("x")).await?;
    let mut y = two.open_shard(&w("y")).await?;
    let x_ack = x.append(recs("x", "s", 4)).await?;
    let y_ack = y.append(recs("y", "s", 4)).await?;
    let mut p = one.projector();
    p.refresh().await?;
    // Replica one summarised what it had of x only; replica two what it had of y only.
    let of = |ack: &ctxlog_core::AppendAck| Checkpoint([(ack.shard, ack.last_seq)].into_iter().collect());
    let mut s1 = one.open_shard(&w("replica-one")).await?;
    let mut s2 = two.open_shard(&w("replica-two")).await?;
    let first = summarise(s1.as_mut(), "sum-x", of(&x_ack), p.max_hlc()).await?;
    // Written later (its writer's clock past the first's): it governs.
    summarise(s2.as_mut(), "sum-y", of(&y_ack), first.last_hlc).await?;
    let mut p = one.projector();
    p.refresh().await?;
    p.save_snapshot().await?;

    let (got, summary, covered) = context_of(one.as_ref()).await?;
    ensure!(
        summary.as_deref() == Some("sum-y") && covered == 4,
        "{summary:?} covering {covered}"
    );
    let mut raw: Vec<&String> = got.iter().filter(|id| id.starts_with("x-")).collect();
    raw.sort();
    ensure!(raw.len() == 4, "what only sum-x covers shows raw: {got:?}");
    ensure!(
        !got.iter().any(|id| id == "sum-x"),
        "a summary that does not govern is left out"
    );
    ensure!(
        context_of(two.as_ref()).await? == (got.clone(), summary.clone(), covered),
        "the replicas differ"
    );
    let from_snapshot = ctx.store().await?;
    ensure!(
        context_of(from_snapshot.as_ref()).await? == (got, summary, covered),
        "a reader starting from the snapshot differs"
    );
    Ok(())
}

/// A summary that claims records appended after it (a forged or broken coverage) is
/// reported by the history checker and never governs: every record shows raw.
pub async fn an_implausible_summary_is_reported_and_never_governs(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut summariser = store.open_shard(&w("summariser")).await?;
    let ack = a.append(recs("before", "s", 2)).await?;
    // Claims seqs 1..=5 of a's shard: 3 of them are written after it.
    let claimed = Checkpoint([(ack.shard, 5)].into_iter().collect());
    let mut p = store.projector();
    p.refresh().await?;
    let forged = summarise(summariser.as_mut(), "forged", claimed, p.max_hlc()).await?;
    let (got, summary, _) = context_of(store.as_ref()).await?;
    ensure!(summary.is_none(), "not held yet, so not trusted: {got:?}");
    // The writer has read the summary: what it appends now orders after it.
    a.observe(forged.last_hlc)?;
    a.append(recs("later", "s", 3)).await?;

    let (got, summary, covered) = context_of(store.as_ref()).await?;
    ensure!(
        summary.is_none() && covered == 0,
        "an implausible summary governed: {got:?}"
    );
    ensure!(got.len() == 5, "every record raw: {got:?}");
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts
            .iter()
            .any(|c| matches!(c, Conflict::ImplausibleCoverage { id, entry: Some(_), .. } if id == "forged")),
        "not reported: {conflicts:?}"
    );
    Ok(())
}
