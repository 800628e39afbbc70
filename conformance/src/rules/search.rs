//! Rule 26: search is a function of the log. A searcher fed from a backend's entries ranks
//! a bot's live records as the order written here by hand says, as the model's brute-force
//! reference says (scores to the bit), the same after compaction, gc and a snapshot; never
//! returns a tombstoned or purged record and keeps none of its words; never crosses its bot.
//! Rule 27: vectors rank by their model's metric and hybrids by reciprocal rank as written by
//! hand, an embedding again replaces, a forgotten record's vectors are gone; embeddings are
//! in no view.

use ctxlog_core::search::{Ask, Deadline, Filter, Nearest, Query, Searcher};
use ctxlog_core::{GcOptions, Metric, PurgeOptions};

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 26, 27: search";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(search_ranks_as_written_by_hand_and_as_the_reference_on_every_reader),
        case!(a_forgotten_record_is_never_found_and_leaves_no_word_in_the_index),
        case!(search_never_crosses_its_bot),
        case!(vectors_and_hybrids_rank_as_written_by_hand_on_every_reader),
        case!(a_forgotten_records_vectors_leave_the_index),
    ]
}

/// A searcher fed with everything a fresh reader of `store` holds.
async fn searcher(store: &dyn Store) -> anyhow::Result<Searcher> {
    let mut p = store.projector();
    p.refresh().await?;
    let mut s = Searcher::new();
    s.catch_up(store, &p.checkpoint()).await?;
    Ok(s)
}

/// `store` compacted, collected and snapshotted, then opened afresh: what a reader that
/// comes later starts from.
async fn maintained(ctx: &Ctx, store: &dyn Store) -> anyhow::Result<std::sync::Arc<dyn Store>> {
    store.compact(&CompactOptions::default()).await?;
    store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    store.projector().save_snapshot().await?;
    ctx.store().await
}

/// The ids and scores of `query`'s hits in bot `bot`, best first.
fn hits(s: &Searcher, bot: &str, query: &str, filter: &Filter) -> anyhow::Result<Vec<(String, f64)>> {
    let (hits, _) = s.index().search(bot, &Query::parse(query)?, filter, None, 100);
    Ok(hits.into_iter().map(|h| (h.id, h.score)).collect())
}

fn names(hits: &[(String, f64)]) -> Vec<&str> {
    hits.iter().map(|h| h.0.as_str()).collect()
}

/// Two writers' records; the order of each query below is reasoned by hand from BM25 (a
/// rarer term outweighs a common one; the shorter of two docs with the same counts ranks
/// first; a phrase needs its words in sequence); it equals the reference's, scores to the
/// bit; a fresh reader after compaction and gc, and one from a snapshot, answer the same.
pub async fn search_ranks_as_written_by_hand_and_as_the_reference_on_every_reader(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    a.append(vec![
        rec("long", "s", "Please refund my order, it arrived broken today"),
        rec("order", "s", "order order order"),
    ])
    .await?;
    b.append(vec![
        rec("short", "t", "Refund the order"),
        rec("weather", "t", "the weather is fine"),
    ])
    .await?;
    let mut tool = rec("tool", "t", "refund issued for order 42");
    tool.role = "tool".into();
    a.append(vec![tool]).await?;
    let all = Filter::default();
    let queries: [(&str, Filter, &[&str]); 5] = [
        ("refund", all.clone(), &["short", "tool", "long"]),
        ("refund order", all.clone(), &["short", "tool", "long", "order"]),
        ("\"refund the order\"", all.clone(), &["short"]),
        (
            "refund",
            Filter {
                session: Some("s".into()),
                ..all.clone()
            },
            &["long"],
        ),
        (
            "ref*",
            Filter {
                roles: vec!["tool".into()],
                ..all.clone()
            },
            &["tool"],
        ),
    ];
    let check = |s: &Searcher, entries: &[Entry], reader: &str| -> anyhow::Result<()> {
        for (q, filter, want) in &queries {
            let got = hits(s, "bot", q, filter)?;
            ensure!(names(&got) == *want, "{reader}: `{q}` ranks {:?}", names(&got));
            let reference = model::search(entries, "bot", &Query::parse(q)?, filter);
            ensure!(
                got == reference,
                "{reader}: `{q}` is {got:?}, the reference {reference:?}"
            );
        }
        Ok(())
    };
    let entries = all_entries(store.as_ref()).await?;
    check(&searcher(store.as_ref()).await?, &entries, "a searcher")?;
    let reopened = maintained(&ctx, store.as_ref()).await?;
    check(
        &searcher(reopened.as_ref()).await?,
        &entries,
        "after maintenance and a snapshot",
    )?;
    Ok(())
}

/// A tombstone takes its record out of results and out of every statistic (the other
/// records score as if it had never been); after purge and gc a searcher built from the
/// store holds none of its words, and one that read it before holds none after the
/// tombstone either.
pub async fn a_forgotten_record_is_never_found_and_leaves_no_word_in_the_index(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(vec![
        rec("keep", "s", "refund my order"),
        rec("secret", "s", "refund zanzibarcode 7781"),
    ])
    .await?;
    let mut early = searcher(store.as_ref()).await?;
    ensure!(names(&hits(&early, "bot", "zanzibarcode", &Filter::default())?) == ["secret"]);
    a.append(vec![Record::tombstone("secret", "bot", "s")]).await?;
    let mut p = store.projector();
    p.refresh().await?;
    early.catch_up(store.as_ref(), &p.checkpoint()).await?;
    let only_keep = {
        let other = ctx.open(&ctx.other_uri("only-keep"), ctx.options()).await?;
        let mut w2 = other.open_shard(&w("solo")).await?;
        w2.append(vec![rec("keep", "s", "refund my order")]).await?;
        drop(w2);
        let mut s = Searcher::new();
        let mut p = other.projector();
        p.refresh().await?;
        s.catch_up(other.as_ref(), &p.checkpoint()).await?;
        hits(&s, "bot", "refund", &Filter::default())?
    };
    ensure!(
        hits(&early, "bot", "refund", &Filter::default())? == only_keep,
        "the tombstoned record still counts: {:?} vs {only_keep:?}",
        hits(&early, "bot", "refund", &Filter::default())?
    );
    for term in ["zanzibarcode", "7781"] {
        ensure!(!early.index().has_term("bot", term), "the index still holds `{term}`");
    }
    store.purge(&PurgeOptions::default()).await?;
    store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    let after = searcher(store.as_ref()).await?;
    ensure!(hits(&after, "bot", "zanzibarcode", &Filter::default())?.is_empty());
    ensure!(
        !after.index().has_term("bot", "zanzibarcode"),
        "a fresh index holds the purged word"
    );
    ensure!(names(&hits(&after, "bot", "refund", &Filter::default())?) == ["keep"]);
    Ok(())
}

/// Another bot's records with the same words are never returned and move no score.
pub async fn search_never_crosses_its_bot(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(vec![rec("mine", "s", "refund my order"), rec("also", "s", "order")])
        .await?;
    let alone = hits(
        &searcher(store.as_ref()).await?,
        "bot",
        "refund order",
        &Filter::default(),
    )?;
    a.append(vec![
        Record::text("theirs", "other", "s", "user", "refund refund refund"),
        Record::text("mine", "other", "s", "user", "refund order refund"),
    ])
    .await?;
    let s = searcher(store.as_ref()).await?;
    let crowded = hits(&s, "bot", "refund order", &Filter::default())?;
    ensure!(
        crowded == alone,
        "another bot moved the scores: {crowded:?} vs {alone:?}"
    );
    ensure!(names(&hits(&s, "other", "refund", &Filter::default())?) == ["theirs", "mine"]);
    Ok(())
}

/// The ids and scores of a vector (and, with `query`, hybrid) search in bot `bot`.
fn near(
    s: &Searcher,
    bot: &str,
    query: Option<&str>,
    model: &str,
    v: &[f32],
    filter: &Filter,
) -> anyhow::Result<Vec<(String, f64)>> {
    let n = Nearest {
        model: model.into(),
        vector: v.to_vec(),
    };
    let q = query.map(Query::parse).transpose()?;
    let ask = match &q {
        Some(q) => Ask::Hybrid(q, &n),
        None => Ask::Vector(&n),
    };
    let (hits, _) = s.index().find_by(bot, ask, filter, None, 100, &Deadline::never())?;
    Ok(hits.into_iter().map(|h| (h.id, h.score)).collect())
}

/// Records with embeddings under one model (cosine), some in the batch of their record, one
/// from another writer later, one embedded again; the orders below are worked out by hand
/// (cosines of 2-d vectors; reciprocal rank fusion of the BM25 and cosine rankings); they
/// equal the reference's, scores to the bit; embeddings are in no session view and move the
/// store to format 5; a fresh reader after compaction, gc and a snapshot answers the same.
pub async fn vectors_and_hybrids_rank_as_written_by_hand_on_every_reader(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    let mut b = store.open_shard(&w("b")).await?;
    let emb = |id: &str, session: &str, v: &[f32]| Record::embedding(id, "bot", session, "mini", Metric::Cosine, v);
    a.append(vec![rec("a", "s", "refund my order"), emb("a", "s", &[1.0, 0.0])])
        .await?;
    a.append(vec![rec("b", "s", "refund refund order"), emb("b", "s", &[0.6, 0.8])])
        .await?;
    b.append(vec![rec("c", "t", "the weather is fine")]).await?;
    // An indexer embeds `c` later, through another writer, then again (the newer replaces).
    b.append(vec![emb("c", "t", &[0.0, 1.0])]).await?;
    // A put of bytes (an image) is found by its vectors, never by words, and counts in no
    // text statistic: under a model of its own, nearer (0, 1) than `a`.
    let mut image = Record::text("img", "bot", "u", "user", "");
    image.body = ctxlog_core::Body::Bytes(b"\x89PNG refund".to_vec());
    image.content_type = "image/png".into();
    let clip = |id: &str, session: &str, v: &[f32]| Record::embedding(id, "bot", session, "clip", Metric::Cosine, v);
    a.append(vec![image, clip("img", "u", &[0.0, 1.0]), clip("a", "s", &[1.0, 0.0])])
        .await?;
    let all = Filter::default();
    let s = searcher(store.as_ref()).await?;
    // Against (1, 0): cos a = 1, b = 0.6, c = 0.
    ensure!(names(&near(&s, "bot", None, "mini", &[1.0, 0.0], &all)?) == ["a", "b", "c"]);
    b.append(vec![emb("c", "t", &[1.0, 0.5])]).await?;
    // The reference store has no formats (always 3).
    let format = store.format().await?;
    ensure!(
        format == 5 || ctx.backend.name == "reference",
        "an embedding moves the store to format 5, not {format}"
    );
    let only_t = Filter {
        session: Some("t".into()),
        ..all.clone()
    };
    // Now cos c = 1/√1.25 ≈ 0.894: a, c, b. Hybrid with `refund`: text ranks b, a; vectors
    // a, c, b; fused a = 1/62 + 1/61, b = 1/61 + 1/63, c = 1/62: a, b, c.
    let asks: [(Option<&str>, &Filter, &[&str]); 3] = [
        (None, &all, &["a", "c", "b"]),
        (Some("refund"), &all, &["a", "b", "c"]),
        (None, &only_t, &["c"]),
    ];
    let check = |s: &Searcher, entries: &[Entry], reader: &str| -> anyhow::Result<()> {
        let pictures = near(s, "bot", None, "clip", &[0.0, 1.0], &all)?;
        ensure!(
            names(&pictures) == ["img", "a"],
            "{reader}: clip ranks {:?}",
            names(&pictures)
        );
        let both = near(s, "bot", Some("refund"), "clip", &[0.0, 1.0], &all)?;
        // Text ranks b, a (not `img`: bytes hold no words); vectors img, a: fused a = 1/62 +
        // 1/62, b = 1/61, img = 1/61, b before img in the contract's order.
        ensure!(
            names(&both) == ["a", "b", "img"],
            "{reader}: clip hybrid ranks {:?}",
            names(&both)
        );
        let clip = Nearest {
            model: "clip".into(),
            vector: vec![0.0, 1.0],
        };
        let refund = Query::parse("refund")?;
        for (got, q) in [(&pictures, None), (&both, Some(&refund))] {
            let reference = model::find(entries, "bot", q, Some(&clip), &all, &ctxlog_core::search::CELLS);
            ensure!(
                Some(got) == reference.as_ref(),
                "{reader}: clip {q:?} is {got:?}, the reference {reference:?}"
            );
        }
        for (q, filter, want) in &asks {
            let got = near(s, "bot", *q, "mini", &[1.0, 0.0], filter)?;
            ensure!(names(&got) == *want, "{reader}: {q:?} ranks {:?}", names(&got));
            let n = Nearest {
                model: "mini".into(),
                vector: vec![1.0, 0.0],
            };
            let parsed = q.map(Query::parse).transpose()?;
            let reference = model::find(
                entries,
                "bot",
                parsed.as_ref(),
                Some(&n),
                filter,
                &ctxlog_core::search::CELLS,
            );
            ensure!(
                Some(&got) == reference.as_ref(),
                "{reader}: {q:?} is {got:?}, the reference {reference:?}"
            );
        }
        Ok(())
    };
    let entries = all_entries(store.as_ref()).await?;
    check(&searcher(store.as_ref()).await?, &entries, "a searcher")?;
    let mut p = store.projector();
    p.refresh().await?;
    let listed: Vec<String> = p.session("bot", "s").await?.into_iter().map(|e| e.record.id).collect();
    ensure!(listed == ["a", "b"], "embeddings are in no view: {listed:?}");
    let reopened = maintained(&ctx, store.as_ref()).await?;
    check(
        &searcher(reopened.as_ref()).await?,
        &entries,
        "after maintenance and a snapshot",
    )?;
    Ok(())
}

/// A tombstone ends its id's vectors (an embedding naming another session too): a searcher
/// that held them holds none after, and the record is not found by a vector; after purge and
/// gc the embedding reads back purged.
pub async fn a_forgotten_records_vectors_leave_the_index(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut a = store.open_shard(&w("a")).await?;
    a.append(vec![
        rec("keep", "s", "refund my order"),
        Record::embedding("keep", "bot", "s", "mini", Metric::Dot, &[1.0, 1.0]),
        rec("gone", "s", "refund zanzibarcode"),
        // Under the record's identity, whatever session it names.
        Record::embedding("gone", "bot", "elsewhere", "mini", Metric::Dot, &[2.0, 2.0]),
    ])
    .await?;
    let mut early = searcher(store.as_ref()).await?;
    let all = Filter::default();
    ensure!(names(&near(&early, "bot", None, "mini", &[1.0, 0.0], &all)?) == ["gone", "keep"]);
    a.append(vec![Record::tombstone("gone", "bot", "s")]).await?;
    let mut p = store.projector();
    p.refresh().await?;
    early.catch_up(store.as_ref(), &p.checkpoint()).await?;
    ensure!(
        !early.index().has_vector("bot", "gone", "mini"),
        "a forgotten record's vector is held"
    );
    ensure!(names(&near(&early, "bot", None, "mini", &[1.0, 0.0], &all)?) == ["keep"]);
    store.purge(&PurgeOptions::default()).await?;
    store.gc(&GcOptions::default().with_grace(Duration::ZERO)).await?;
    let entries = all_entries(store.as_ref()).await?;
    let embedded: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.record.id == "gone" && e.record.kind == ctxlog_core::Kind::Embedding)
        .collect();
    ensure!(
        embedded.len() == 1 && embedded[0].purged && embedded[0].record.body.is_empty(),
        "the forgotten record's embedding is not erased by purge: {embedded:?}"
    );
    let after = searcher(store.as_ref()).await?;
    ensure!(!after.index().has_vector("bot", "gone", "mini"));
    ensure!(names(&near(&after, "bot", None, "mini", &[1.0, 0.0], &all)?) == ["keep"]);
    Ok(())
}
