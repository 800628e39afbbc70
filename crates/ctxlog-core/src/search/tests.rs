//! The search index's tests: a ranking fixed by hand, the query language, the tokenizer,
//! forgetting, and a property test against the brute-force reference of the model.

use proptest::prelude::*;

use super::*;
use crate::hlc::Hlc;
use crate::ids::WriterId;
use crate::record::Record;
use crate::search::saved::SavedIndexes as _;
use crate::testing::model;

fn entry(writer: &str, seq: u64, hlc: u64, record: Record) -> Entry {
    Entry {
        shard: WriterId::new(writer).unwrap().shard_id(),
        seq,
        epoch: 1,
        hlc: Hlc::from_parts(hlc, 0),
        content_hash: record.content_hash(),
        record,
        purged: false,
    }
}

fn put(seq: u64, id: &str, session: &str, text: &str) -> Entry {
    entry("w", seq, 1_000 + seq, Record::text(id, "bot", session, "user", text))
}

fn index(entries: &[Entry]) -> TextIndex {
    let mut ix = TextIndex::new();
    for e in entries {
        ix.apply(e);
    }
    ix
}

fn ids(ix: &TextIndex, q: &str, filter: &Filter) -> Vec<String> {
    let (hits, _) = ix.search("bot", &Query::parse(q).unwrap(), filter, None, 100);
    hits.into_iter().map(|h| h.id).collect()
}

fn all() -> Filter {
    Filter::default()
}

#[test]
fn the_tokenizer_splits_words_by_unicode_and_folds_case() {
    assert_eq!(
        tokens("Hello, WORLD! It's Straße-42 (v1.2)"),
        ["hello", "world", "it's", "straße", "42", "v1.2"]
    );
    // Han ideographs one term each; a Katakana run stays whole; Hangul words whole.
    assert_eq!(tokens("東京タワー 한국어"), ["東", "京", "タワー", "한국어"]);
    assert!(tokens(" ,.;— ").is_empty());
}

/// The ranking below is reasoned by hand from BM25, not computed: the rare term `refund`
/// outweighs the common `order`; of two docs holding `refund` once, the shorter ranks
/// first; holding it twice beats once at the same length; a doc with neither is no hit.
#[test]
fn a_small_corpus_ranks_as_bm25_says() {
    let ix = index(&[
        put(1, "a", "s", "order shipped order late order"),
        put(2, "b", "s", "refund my order please now thanks"),
        put(3, "c", "s", "refund order"),
        put(4, "d", "s", "refund refund order please now thanks"),
        put(5, "e", "s", "weather is fine today"),
        put(6, "f", "t", "order order"),
    ]);
    assert_eq!(ids(&ix, "refund order", &all()), ["c", "d", "b", "f", "a"]);
    assert_eq!(ids(&ix, "refund", &all()), ["c", "d", "b"]);
    // Case and punctuation of the query do not matter.
    assert_eq!(ids(&ix, "REFUND!", &all()), ["c", "d", "b"]);
}

#[test]
fn phrases_prefixes_and_filters() {
    let mut e = vec![
        put(1, "a", "s", "please refund my order"),
        put(2, "b", "s", "my order refund please"),
        put(3, "c", "t", "refunded orders arrive"),
    ];
    let mut tool = put(4, "d", "s", "refund my order");
    tool.record.role = "tool".into();
    tool.record.metadata = Some(serde_json::json!({"lang": "en", "n": 1}));
    e.push(tool);
    let ix = index(&e);
    assert_eq!(ids(&ix, "\"refund my order\"", &all()), ["d", "a"]);
    assert_eq!(ids(&ix, "\"order refund\"", &all()), ["b"]);
    assert_eq!(ids(&ix, "ord*", &all()).len(), 4);
    assert_eq!(ids(&ix, "orders", &all()), ["c"]);
    let session = Filter {
        session: Some("t".into()),
        ..all()
    };
    assert_eq!(ids(&ix, "refund*", &session), ["c"]);
    let roles = Filter {
        roles: vec!["tool".into()],
        ..all()
    };
    assert_eq!(ids(&ix, "refund", &roles), ["d"]);
    let meta = Filter {
        metadata: [("lang".to_string(), serde_json::json!("en"))].into(),
        ..all()
    };
    assert_eq!(ids(&ix, "order", &meta), ["d"]);
    let time = Filter {
        since_millis: Some(1_002),
        until_millis: Some(1_004),
        ..all()
    };
    assert_eq!(ids(&ix, "refund*", &time), ["c", "b"]);
    // A filter leaves docs out; it moves no score.
    let (every, _) = ix.search("bot", &Query::parse("refund").unwrap(), &all(), None, 10);
    let (some, _) = ix.search("bot", &Query::parse("refund").unwrap(), &roles, None, 10);
    assert_eq!(some[0].score, every.iter().find(|h| h.id == "d").unwrap().score);
}

#[test]
fn the_query_language_refuses_what_it_cannot_search() {
    for bad in ["", "  ", "\"unclosed", "!!! ---", "\"\""] {
        let err = Query::parse(bad).unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput { field: "query", .. }),
            "{bad:?}: {err:?}"
        );
    }
    let many = (0..=MAX_CLAUSES).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    assert!(Query::parse(&many).is_err());
    assert_eq!(
        Query::parse("a \"b c\" d* \"e\"").unwrap().clauses(),
        [
            Clause::Term("a".into()),
            Clause::Phrase(vec!["b".into(), "c".into()]),
            Clause::Prefix("d".into()),
            Clause::Term("e".into()),
        ]
    );
    // What was written together is searched together; a quote inside a word is part of it.
    let phrase = |t: &[&str]| Clause::Phrase(t.iter().map(|t| t.to_string()).collect());
    assert_eq!(Query::parse("e-mail").unwrap().clauses(), [phrase(&["e", "mail"])]);
    assert_eq!(Query::parse("東京").unwrap().clauses(), [phrase(&["東", "京"])]);
    assert_eq!(Query::parse("צה\"ל").unwrap().clauses(), [Clause::Term("צה\"ל".into())]);
    // What a search may cost is bounded before it runs.
    let long_phrase = format!("\"{}\"", ["a"; MAX_PHRASE_TERMS + 1].join(" "));
    let prefixes = ["p*"; MAX_PREFIXES + 1].join(" ");
    let long = "a ".repeat(MAX_QUERY_BYTES);
    for bad in [long_phrase, prefixes, long] {
        assert!(
            matches!(Query::parse(&bad), Err(Error::InvalidInput { field: "query", .. })),
            "{bad:.40}"
        );
    }
}

/// Rule 26's forgetting and rule 6's winner: a tombstone takes its record out of results
/// and of every statistic, in either order of arrival; an earlier put replaces a later one.
#[test]
fn a_tombstone_takes_a_record_out_and_an_earlier_put_wins() {
    let keep = put(1, "a", "s", "refund order");
    let gone = put(2, "b", "s", "refund refund");
    let tomb = entry("w", 3, 1_003, Record::tombstone("b", "bot", "s"));
    let only = index(std::slice::from_ref(&keep));
    for order in [vec![&keep, &gone, &tomb], vec![&tomb, &gone, &keep]] {
        let mut ix = TextIndex::new();
        for e in order {
            ix.apply(e);
        }
        assert_eq!(ids(&ix, "refund", &all()), ["a"]);
        assert_eq!(ix.docs("bot"), 1);
        let q = Query::parse("refund").unwrap();
        assert_eq!(
            ix.search("bot", &q, &all(), None, 1).0,
            only.search("bot", &q, &all(), None, 1).0,
            "the tombstoned record counts in no statistic"
        );
        let b = &ix.bots["bot"];
        assert_eq!(b.postings[b.dict["refund"] as usize].live, 1);
    }
    // A put of `a` from another writer, ordered before the held one, replaces it.
    let earlier = entry("v", 1, 999, Record::text("a", "bot", "s", "user", "weather"));
    let mut ix = index(&[keep.clone(), earlier.clone()]);
    assert!(ids(&ix, "refund", &all()).is_empty());
    assert_eq!(ids(&ix, "weather", &all()), ["a"]);
    ix.apply(&keep);
    assert_eq!(ids(&ix, "weather", &all()), ["a"], "a later put changes nothing");
}

/// Most docs of a common term taken out: its postings are compacted, the terms only they
/// held leave the dictionary and their numbers are reused, and every answer is the one an
/// index fed only the survivors gives, to the bit.
#[test]
fn taking_most_docs_out_leaves_the_answers_of_the_survivors() {
    let puts: Vec<Entry> = (0..100)
        .map(|i| {
            put(
                i + 1,
                &format!("d{i}"),
                &format!("s{}", i % 3),
                &format!("common word{i} common tail{}", i % 7),
            )
        })
        .collect();
    let gone = |i: u64| !i.is_multiple_of(10);
    let tombstones: Vec<Entry> = (0..100)
        .filter(|&i| gone(i))
        .map(|i| {
            entry(
                "w",
                200 + i,
                2_000 + i,
                Record::tombstone(format!("d{i}"), "bot", format!("s{}", i % 3)),
            )
        })
        .collect();
    let mut ix = index(&puts);
    for t in &tombstones {
        ix.apply(t);
    }
    let survivors: Vec<Entry> = puts
        .iter()
        .enumerate()
        .filter(|(i, _)| !gone(*i as u64))
        .map(|(_, e)| e.clone())
        .collect();
    let only = index(&survivors);
    let b = &ix.bots["bot"];
    let common = &b.postings[b.dict["common"] as usize];
    assert_eq!(common.live, 10);
    assert!(
        common.docs.len() <= 2 * 10 + 8,
        "{} postings held for 10 live docs",
        common.docs.len()
    );
    assert!(!ix.has_term("bot", "word1") && ix.has_term("bot", "word10"));
    assert_eq!(b.dict.len(), only.bots["bot"].dict.len());
    assert_eq!(b.names.len(), 4, "three sessions and one role");
    for q in ["common", "common tail3", "\"common word20\"", "word*", "tail*", "word1"] {
        for f in [
            all(),
            Filter {
                session: Some("s1".into()),
                ..all()
            },
        ] {
            let q = Query::parse(q).unwrap();
            let got = ix.search("bot", &q, &f, None, 100);
            let want = only.search("bot", &q, &f, None, 100);
            assert_eq!(got.0.len(), want.0.len(), "{q:?}");
            for (g, w) in got.0.iter().zip(&want.0) {
                assert_eq!(
                    (&g.id, g.score.to_bits(), &g.matched),
                    (&w.id, w.score.to_bits(), &w.matched)
                );
            }
        }
    }
    // Freed term numbers are taken again, not added to.
    let held = ix.bots["bot"].postings.len();
    ix.apply(&put(500, "new", "s0", "fresh words here"));
    assert_eq!(ix.bots["bot"].postings.len(), held);
    assert_eq!(ids(&ix, "fresh", &all()), ["new"]);
}

#[test]
fn pages_go_on_after_the_last_hit() {
    let e: Vec<Entry> = (1..=7).map(|i| put(i, &format!("r{i}"), "s", "same words")).collect();
    let ix = index(&e);
    let q = Query::parse("words").unwrap();
    let (first, more) = ix.search("bot", &q, &all(), None, 3);
    assert!(more);
    let last = first.last().unwrap();
    let after = After {
        score: last.score,
        key: last.key,
    };
    let (second, _) = ix.search("bot", &q, &all(), Some(&after), 10);
    let got: Vec<String> = first.iter().chain(&second).map(|h| h.id.clone()).collect();
    // Equal scores: the contract's order.
    assert_eq!(got, (1..=7).map(|i| format!("r{i}")).collect::<Vec<_>>());
}

#[test]
fn another_bots_records_move_no_score() {
    let mine = put(1, "a", "s", "refund order");
    let other = |i: u64| {
        entry(
            "w",
            10 + i,
            2_000 + i,
            Record::text(format!("o{i}"), "other", "s", "user", "refund"),
        )
    };
    let alone = index(std::slice::from_ref(&mine));
    let mut crowded: Vec<Entry> = (0..5).map(other).collect();
    crowded.push(mine);
    let crowded = index(&crowded);
    let q = Query::parse("refund").unwrap();
    assert_eq!(
        alone.search("bot", &q, &all(), None, 5).0,
        crowded.search("bot", &q, &all(), None, 5).0
    );
    assert_eq!(ids(&crowded, "refund", &all()), ["a"]);
}

const WORDS: &[&str] = &[
    "refund", "order", "late", "please", "weather", "ship", "shipped", "東", "京",
];

fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
    let one = (
        0..3usize,
        0..6usize,
        0..3usize,
        0..2usize,
        prop::collection::vec(0..WORDS.len(), 0..6),
        0..14u8,
        prop::collection::vec(-3i8..4, 3),
    );
    prop::collection::vec(one, 1..40).prop_map(|specs| {
        let records = specs
            .into_iter()
            .enumerate()
            .map(|(i, (w, id, session, bot, words, what, v))| {
                let text: Vec<&str> = words.iter().map(|&k| WORDS[k]).collect();
                let (bot, session, id) = (["bot", "other"][bot], format!("s{session}"), format!("r{id}"));
                let record = match what {
                    0 => Record::tombstone(id, bot, session),
                    1 => {
                        let mut r = Record::text(id, bot, session, "user", "");
                        r.body = Body::Bytes(text.join(" ").into_bytes());
                        r
                    }
                    2 => Record::summary(id, bot, session, text.join(" "), Default::default()),
                    // Embeddings under two models, one of them sometimes of another
                    // dimension than its declaration (not searched), few distinct values
                    // (equal similarities tie).
                    10 | 11 => {
                        let v: Vec<f32> = v.iter().map(|&x| f32::from(x)).collect();
                        Record::embedding(
                            id,
                            bot,
                            session,
                            "m",
                            Metric::Cosine,
                            &v[..2 + usize::from(what == 11 && i % 3 == 0)],
                        )
                    }
                    12 => {
                        let v: Vec<f32> = v.iter().map(|&x| f32::from(x) / 2.0).collect();
                        Record::embedding(id, bot, session, "n", Metric::L2, &v)
                    }
                    13 => {
                        let v: Vec<f32> = v.iter().map(|&x| f32::from(x)).collect();
                        Record::embedding(id, bot, session, "n", Metric::Dot, &v)
                    }
                    _ => Record::text(id, bot, session, ["user", "tool"][i % 2], text.join(" ")),
                };
                (w, record)
            });
        by_writers(records, 5)
    })
}

/// `records` as entries of writers `w0`, `w1` and `w2` (each record's writer by number), in
/// order, over `clocks` clock values: equal scores tie on the clock too, and the contract's
/// order goes on to shard and seq.
fn by_writers(records: impl IntoIterator<Item = (usize, Record)>, clocks: u64) -> Vec<Entry> {
    let mut seqs = [0u64; 3];
    records
        .into_iter()
        .enumerate()
        .map(|(i, (w, record))| {
            seqs[w] += 1;
            entry(
                ["w0", "w1", "w2"][w],
                seqs[w],
                1_000 + (i as u64 * 7919) % clocks,
                record,
            )
        })
        .collect()
}

/// `entries` in an order drawn from `seed`.
fn shuffle(entries: &[Entry], seed: u64) -> Vec<Entry> {
    let mut shuffled = entries.to_vec();
    let mut state = seed;
    for i in (1..shuffled.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        shuffled.swap(i, (state >> 33) as usize % (i + 1));
    }
    shuffled
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The index answers what the brute-force reference answers — ids, scores to the bit
    /// and matched terms — whatever order the entries arrive in.
    #[test]
    fn the_index_is_the_reference_in_any_order(
        entries in arb_entries(),
        seed in any::<u64>(),
        q in prop::sample::select(vec!["refund", "refund order", "\"refund order\"", "sh*", "東 京", "\"東 京\" late", "please*"]),
        session in prop::option::of(0..3usize),
    ) {
        let query = Query::parse(q).unwrap();
        let filter = Filter { session: session.map(|s| format!("s{s}")), ..Filter::default() };
        let want = model::search_matched(&entries, "bot", &query, &filter);
        let shuffled = shuffle(&entries, seed);
        // Every entry twice, the second time after the rest: feeding is idempotent.
        let twice: Vec<Entry> = shuffled.iter().chain(&entries).cloned().collect();
        for order in [&entries, &shuffled, &twice] {
            let (hits, more) = index(order).search("bot", &query, &filter, None, 1000);
            prop_assert!(!more);
            let got: Vec<(String, f64, Vec<String>)> = hits.into_iter().map(|h| (h.id, h.score, h.matched)).collect();
            prop_assert_eq!(&got, &want);
        }
        // Pages of any size, each going on after the last hit of the one before, are the
        // whole list.
        let ix = index(&shuffled);
        let k = 1 + (seed % 3) as usize;
        let (mut paged, mut after) = (Vec::new(), None);
        loop {
            let (page, more) = ix.search("bot", &query, &filter, after.as_ref(), k);
            after = page.last().map(|h| After { score: h.score, key: h.key });
            paged.extend(page.into_iter().map(|h| (h.id, h.score, h.matched)));
            if !more {
                break;
            }
        }
        prop_assert_eq!(&paged, &want);
    }

    /// Vector and hybrid searches answer what the reference answers — ids and scores to the
    /// bit, a query of a model's wrong dimension refused alike — in any order of the entries,
    /// and pages of them are the whole list.
    #[test]
    fn vectors_and_hybrids_are_the_reference_in_any_order(
        entries in arb_entries(),
        seed in any::<u64>(),
        model in prop::sample::select(vec!["m", "n", "none"]),
        dim in 2..4usize,
        q in prop::option::of(prop::sample::select(vec!["refund", "refund order", "sh*"])),
        session in prop::option::of(0..3usize),
        cells in prop::sample::select(vec![
            CELLS,
            // Small cells: a few vectors split, probes that leave cells out, candidates that
            // outnumber what is scored exactly.
            Cells { sample: 2, probe: 1, candidates: 2, exact: 3 },
            Cells { sample: 3, probe: 2, candidates: 1, exact: 2 },
            Cells { sample: 1, probe: 1, candidates: 4, exact: 100 },
        ]),
    ) {
        let near = Nearest { model: model.into(), vector: [1.0, -2.0, 0.5][..dim].to_vec() };
        let index = |entries: &[Entry]| {
            let mut ix = TextIndex::with_cells(cells);
            for e in entries {
                ix.apply(e);
            }
            ix
        };
        let query = q.map(|q| Query::parse(q).unwrap());
        let ask = match &query {
            Some(t) => Ask::Hybrid(t, &near),
            None => Ask::Vector(&near),
        };
        let filter = Filter { session: session.map(|s| format!("s{s}")), ..Filter::default() };
        let want = model::find(&entries, "bot", query.as_ref(), Some(&near), &filter, &cells);
        let shuffled = shuffle(&entries, seed);
        let twice: Vec<Entry> = shuffled.iter().chain(&entries).cloned().collect();
        for order in [&entries, &shuffled, &twice] {
            let got = index(order).find_by("bot", ask, &filter, None, 1000, &Deadline::never());
            match (&want, got) {
                (None, Err(e)) => prop_assert!(matches!(e, Error::InvalidInput { field: "vector", .. }), "{e}"),
                (Some(want), Ok((hits, more))) => {
                    prop_assert!(!more);
                    let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
                    prop_assert_eq!(&got, want);
                }
                (want, got) => prop_assert!(false, "reference {want:?}, index {got:?}"),
            }
        }
        if let Some(want) = want {
            let ix = index(&shuffled);
            let k = 1 + (seed % 3) as usize;
            let (mut paged, mut after) = (Vec::new(), None);
            loop {
                let (page, more) = ix.find_by("bot", ask, &filter, after.as_ref(), k, &Deadline::never()).unwrap();
                after = page.last().map(|h| After { score: h.score, key: h.key });
                paged.extend(page.into_iter().map(|h| (h.id, h.score)));
                if !more {
                    break;
                }
            }
            prop_assert_eq!(&paged, &want);
        }
    }
}

/// Cells worked out by hand (rule 27). With one embedding in two sampled, three centroids on
/// the axes (`r1`, `r3`, `r5`: their embeddings land at sampled seqs) and one vector beside
/// each; the query leans towards `r1`'s cell.
#[test]
fn a_search_probes_the_nearest_cells_and_scores_the_best_candidates() {
    let placed = [
        ("r1", [1.0, 0.0], true),
        ("r3", [0.0, 1.0], true),
        ("r5", [-1.0, 0.0], true),
        ("r0", [1.0, 0.2], false),
        ("r2", [0.2, 1.0], false),
        ("r4", [-1.0, 0.1], false),
    ];
    let mut entries = Vec::new();
    let mut seq = 0;
    for (n, (id, v, centroid)) in placed.iter().enumerate() {
        entries.push(entry(
            "p",
            n as u64 + 1,
            1_000 + n as u64,
            Record::text(*id, "bot", "s", "user", "text"),
        ));
        // The next seq whose embedding is sampled, or not, as wanted.
        let e = loop {
            seq += 1;
            let e = emb(seq, id, "m", Metric::Cosine, v);
            if sampled(&e.key(), 2) == *centroid {
                break e;
            }
        };
        entries.push(e);
    }
    let near = Nearest {
        model: "m".into(),
        vector: vec![1.0, 0.1],
    };
    let found = |ix: &TextIndex| {
        let (hits, _) = ix
            .find_by("bot", Ask::Vector(&near), &all(), None, 100, &Deadline::never())
            .unwrap();
        hits.into_iter().map(|h| h.id).collect::<Vec<_>>()
    };
    let with = |cells: Cells, entries: &[Entry]| {
        let mut ix = TextIndex::with_cells(cells);
        for e in entries {
            ix.apply(e);
        }
        found(&ix)
    };
    let cells = |probe, candidates, exact| Cells {
        sample: 2,
        probe,
        candidates,
        exact,
    };
    // r1's cell alone (r1 and r0) holds enough: cos(q, r0) = 1.02/(|q|·|r0|) ≈ 0.9952 beats
    // cos(q, r1) = 1/|q| ≈ 0.9950.
    assert_eq!(with(cells(1, 1, 10), &entries), ["r0", "r1"]);
    // The same when each centroid comes after the vector beside it.
    let reversed: Vec<Entry> = entries.iter().rev().cloned().collect();
    assert_eq!(with(cells(1, 1, 10), &reversed), ["r0", "r1"]);
    // Three candidates wanted: r3's cell is the next nearest (q·r3/|r3| = 0.1, against −1
    // for r5).
    assert_eq!(with(cells(1, 3, 10), &entries), ["r0", "r1", "r2", "r3"]);
    // Two cells at least, whatever the candidates.
    assert_eq!(with(cells(2, 1, 10), &entries), ["r0", "r1", "r2", "r3"]);
    // One scored exactly: the best by coarse similarity, q·r0/|r0| ≈ 1.0002 against 1.
    assert_eq!(with(cells(1, 3, 1), &entries), ["r0"]);
    // A tombstone takes centroid r1 away: r0 moves to the cell of r3 (coarse 0.2, against −1
    // for r5), the cell the query is nearest now.
    entries.push(entry("p", 100, 2_000, Record::tombstone("r1", "bot", "s")));
    assert_eq!(with(cells(1, 1, 10), &entries), ["r0", "r2", "r3"]);
    // A lane without a centroid is one cell.
    assert_eq!(
        with(
            Cells {
                sample: u64::MAX,
                ..cells(1, 1, 10)
            },
            &entries
        ),
        ["r0", "r2", "r3", "r4", "r5"]
    );
}

/// The coarse similarity adds dimension `i` into partial sum `i mod 8` and the eight sums
/// pairwise: dimension 8 is added to 1e8 in sum 0 and lost (`1e8 + 1` is `1e8` in `f32`),
/// and sums 2 and 3 (4 each) are added to each other before 1e8 (`1e8 + 4` alone would be
/// lost too). In dimension order, or sum after sum, the answer would be 1e8.
#[test]
fn coarse_similarity_adds_eight_partial_sums_pairwise() {
    let v = [1e8f32, 0.0, 4.0, 4.0, 0.0, 0.0, 0.0, 0.0, 1.0];
    assert_eq!(coarse(Metric::Dot, &[1.0; 9], &v, 0.0), 100_000_008.0);
    assert_eq!(v.iter().fold(0.0f32, |s, x| s + x), 1e8);
    assert_eq!(
        coarse(
            Metric::L2,
            &[0.0; 9],
            &[3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0],
            0.0
        ),
        -25.0
    );
    assert_eq!(coarse(Metric::Cosine, &[1.0, 1.0], &[3.0, 4.0], 5.0), 7.0 / 5.0);
    assert_eq!(coarse(Metric::Cosine, &[1.0, 1.0], &[0.0, 0.0], 0.0), 0.0);
}

/// Histories of many vectors of one model and metric: puts, embeddings (again, of ids never
/// put, after tombstones), tombstones, from three writers.
fn arb_vectors() -> impl Strategy<Value = Vec<Entry>> {
    let one = (
        0..3usize,
        0..24usize,
        0..3usize,
        0..10u8,
        prop::collection::vec(-4i8..5, 2),
    );
    let metric = prop::sample::select(vec![Metric::Cosine, Metric::Dot, Metric::L2]);
    (metric, prop::collection::vec(one, 1..120)).prop_map(|(metric, specs)| {
        let records = specs.into_iter().map(|(w, id, session, what, v)| {
            let (session, id) = (format!("s{session}"), format!("v{id}"));
            let record = match what {
                0 => Record::tombstone(id, "bot", session),
                1..=3 => Record::text(id, "bot", session, "user", "refund"),
                _ => {
                    let v: Vec<f32> = v.iter().map(|&x| f32::from(x) / 2.0).collect();
                    Record::embedding(id, "bot", session, "m", metric, &v)
                }
            };
            (w, record)
        });
        by_writers(records, 7)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// The coarse similarity is the reference's to the bit — which dimension goes into which
    /// partial sum, the order they are added in, overflow to NaN as −∞ — at any dimension,
    /// with values from tiny to huge.
    #[test]
    fn coarse_similarity_is_the_reference_to_the_bit(
        pairs in prop::collection::vec(((-100i32..100, -70i32..70), (-100i32..100, -70i32..70)), 1..40),
        metric in prop::sample::select(vec![Metric::Cosine, Metric::Dot, Metric::L2]),
    ) {
        let value = |(m, e): (i32, i32)| m as f32 * 2f32.powi(e);
        let q: Vec<f32> = pairs.iter().map(|&(a, _)| value(a)).collect();
        let v: Vec<f32> = pairs.iter().map(|&(_, b)| value(b)).collect();
        prop_assert_eq!(
            coarse(metric, &q, &v, norm8(&v)).to_bits(),
            model::coarse_by_hand(metric, &q, &v).to_bits()
        );
    }

    /// Cells (rule 27) split, probed and screened as the reference does it by brute force —
    /// whichever centroids come and go with embeddings, re-embeddings and tombstones, in any
    /// order.
    #[test]
    fn cells_are_the_reference_in_any_order(
        entries in arb_vectors(),
        seed in any::<u64>(),
        q in prop::collection::vec(-4i8..5, 2),
        session in prop::option::of(0..3usize),
        hybrid in any::<bool>(),
        (sample, probe, candidates, exact) in (1..5u64, 1..4usize, 1..8usize, 1..10usize),
    ) {
        let cells = Cells { sample, probe, candidates, exact };
        let near = Nearest { model: "m".into(), vector: q.iter().map(|&x| f32::from(x)).collect() };
        let refund = Query::parse("refund").unwrap();
        let query = hybrid.then_some(&refund);
        let ask = match query {
            Some(t) => Ask::Hybrid(t, &near),
            None => Ask::Vector(&near),
        };
        let filter = Filter { session: session.map(|s| format!("s{s}")), ..Filter::default() };
        let want = model::find(&entries, "bot", query, Some(&near), &filter, &cells).unwrap();
        let shuffled = shuffle(&entries, seed);
        let twice: Vec<Entry> = shuffled.iter().chain(&entries).cloned().collect();
        // Settled after every entry, or fed in runs (split by `seed`) each settled once.
        for (order, runs) in [(&entries, false), (&shuffled, false), (&twice, false), (&shuffled, true), (&twice, true)] {
            let mut ix = TextIndex::with_cells(cells);
            for (n, e) in order.iter().enumerate() {
                if runs {
                    ix.feed(e);
                    if (seed >> (n % 64)) & 1 == 1 {
                        ix.settle();
                    }
                } else {
                    ix.apply(e);
                }
            }
            ix.settle();
            let (hits, more) = ix.find_by("bot", ask, &filter, None, 1000, &Deadline::never()).unwrap();
            prop_assert!(!more);
            let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
            prop_assert_eq!(&got, &want);
        }
    }
}

fn emb(seq: u64, id: &str, model: &str, metric: Metric, v: &[f32]) -> Entry {
    entry(
        "w",
        seq,
        1_000 + seq,
        Record::embedding(id, "bot", "s", model, metric, v),
    )
}

fn nearest(ix: &TextIndex, model: &str, v: &[f32]) -> Vec<(String, f64)> {
    let near = Nearest {
        model: model.into(),
        vector: v.to_vec(),
    };
    let (hits, _) = ix
        .find_by("bot", Ask::Vector(&near), &all(), None, 100, &Deadline::never())
        .unwrap();
    hits.into_iter().map(|h| (h.id, h.score)).collect()
}

/// Vectors rank by their model's metric, as worked out by hand: cosine by angle, dot by
/// projection, L2 by distance; a record embedded again ranks by its newest vector, the same
/// vector the same on every metric's terms; a record without a vector of the model is not
/// found.
#[test]
fn vectors_rank_by_the_metric_their_model_declares() {
    let mut entries = vec![
        put(1, "a", "s", "alpha"),
        put(2, "b", "s", "beta"),
        put(3, "c", "s", "gamma"),
        emb(4, "a", "cos", Metric::Cosine, &[1.0, 0.0]),
        emb(5, "b", "cos", Metric::Cosine, &[3.0, 4.0]),
        emb(6, "c", "cos", Metric::Cosine, &[0.0, -2.0]),
        emb(7, "a", "dot", Metric::Dot, &[1.0, 0.0]),
        emb(8, "b", "dot", Metric::Dot, &[3.0, 4.0]),
        emb(9, "c", "dot", Metric::Dot, &[0.0, -2.0]),
        emb(10, "a", "l2", Metric::L2, &[1.0, 0.0]),
        emb(11, "b", "l2", Metric::L2, &[3.0, 4.0]),
        emb(12, "c", "l2", Metric::L2, &[0.0, -2.0]),
    ];
    let ix = index(&entries);
    // q = (1, 1): cos(a) = 1/√2 ≈ 0.707, cos(b) = 7/(5√2) ≈ 0.990, cos(c) = −1/√2.
    let cos = nearest(&ix, "cos", &[1.0, 1.0]);
    assert_eq!(cos.iter().map(|h| h.0.as_str()).collect::<Vec<_>>(), ["b", "a", "c"]);
    assert!((cos[0].1 - 7.0 / (5.0 * 2f64.sqrt())).abs() < 1e-12);
    // Dot: a 1, b 7, c −2. Against (0, −1): a 0, b −4, c 2.
    let dot = nearest(&ix, "dot", &[0.0, -1.0]);
    assert_eq!(dot, [("c".into(), 2.0), ("a".into(), 0.0), ("b".into(), -4.0)]);
    // L2 from (0, 0): a 1, c 2, b 5 (nearest first, negated).
    assert_eq!(
        nearest(&ix, "l2", &[0.0, 0.0]),
        [("a".into(), -1.0), ("c".into(), -2.0), ("b".into(), -5.0)]
    );
    // `a` embedded again, nearer (2, 0) → distance 0 from the query; an older vector fed
    // later changes nothing.
    entries.push(emb(13, "a", "l2", Metric::L2, &[6.0, 8.0]));
    entries.push(emb(14, "b", "l2", Metric::L2, &[0.5, 0.0]));
    let mut ix = index(&entries);
    ix.apply(&emb(3, "b", "l2", Metric::L2, &[100.0, 100.0]));
    assert_eq!(
        nearest(&ix, "l2", &[0.0, 0.0]),
        [("b".into(), -0.5), ("c".into(), -2.0), ("a".into(), -10.0)]
    );
    // Sums go over the dimensions in order, in f64 (rule 27): 1 + 1e20 is 1e20 there, then
    // − 1e20 is 0; summed from the end (or the last two first) it would be 1.
    let big = index(&[
        put(20, "x", "s", "x"),
        emb(21, "x", "order", Metric::Dot, &[1.0, 1e20, -1e20]),
    ]);
    assert_eq!(nearest(&big, "order", &[1.0, 1.0, 1.0]), [("x".into(), 0.0)]);
    // Unknown model: nothing; wrong dimension: refused, naming the field.
    assert!(nearest(&ix, "e5", &[1.0]).is_empty());
    let near = Nearest {
        model: "cos".into(),
        vector: vec![1.0, 0.0, 0.0],
    };
    let err = ix
        .find_by("bot", Ask::Vector(&near), &all(), None, 10, &Deadline::never())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput { field: "vector", .. }), "{err}");
}

/// A model is what its earliest vector of a doc declares: a later one of another dimension
/// or metric is not searched until the earlier ones are gone, and a vector of an id without
/// a doc declares nothing; a tombstone takes an id's vectors out for good (and a vector fed
/// after it is not held).
#[test]
fn a_models_earliest_embedding_declares_it_and_a_tombstone_ends_its_vectors() {
    let entries = vec![
        emb(0, "orphan", "m", Metric::L2, &[5.0]),
        put(1, "a", "s", "alpha"),
        put(2, "b", "s", "beta"),
        emb(3, "a", "m", Metric::Cosine, &[1.0, 0.0]),
        emb(4, "b", "m", Metric::Cosine, &[1.0, 0.0, 0.0]),
    ];
    let mut ix = index(&entries);
    assert_eq!(nearest(&ix, "m", &[1.0, 0.0]), [("a".into(), 1.0)]);
    ix.apply(&entry("w", 5, 1_005, Record::tombstone("a", "bot", "s")));
    assert!(!ix.has_vector("bot", "a", "m"));
    // `a`'s gone: `b`'s declaration governs now.
    assert_eq!(nearest(&ix, "m", &[0.0, 0.0, 2.0]), [("b".into(), 0.0)]);
    ix.apply(&emb(6, "a", "m", Metric::Cosine, &[0.0, 0.0, 1.0]));
    assert!(
        !ix.has_vector("bot", "a", "m"),
        "a vector of a tombstoned id is not held"
    );
}

/// A hybrid search fuses the two rankings by reciprocal rank, worked out by hand: text
/// ranks x 1st, y 2nd; vectors rank y 1st, z 2nd, x 3rd. RRF: y = 1/62 + 1/61, x = 1/61 +
/// 1/63, z = 1/62. A filter leaves docs out and moves no score.
#[test]
fn a_hybrid_search_fuses_both_rankings_by_reciprocal_rank() {
    let entries = vec![
        put(1, "x", "s", "refund refund please"),
        put(2, "y", "s", "refund of the order that was late and long and slow"),
        entry("w", 3, 1_003, Record::text("z", "bot", "t", "user", "weather")),
        emb(4, "x", "m", Metric::Dot, &[1.0]),
        emb(5, "y", "m", Metric::Dot, &[3.0]),
        emb(6, "z", "m", Metric::Dot, &[2.0]),
    ];
    let ix = index(&entries);
    let q = Query::parse("refund").unwrap();
    let near = Nearest {
        model: "m".into(),
        vector: vec![1.0],
    };
    let find = |f: &Filter| {
        let (hits, _) = ix
            .find_by("bot", Ask::Hybrid(&q, &near), f, None, 10, &Deadline::never())
            .unwrap();
        hits.into_iter().map(|h| (h.id, h.score, h.matched)).collect::<Vec<_>>()
    };
    let r = |ranks: &[usize]| ranks.iter().map(|&n| 1.0 / (60.0 + n as f64)).sum::<f64>();
    assert_eq!(
        find(&all()),
        [
            ("y".into(), r(&[2, 1]), vec!["refund".to_string()]),
            ("x".into(), r(&[1, 3]), vec!["refund".to_string()]),
            ("z".into(), r(&[2]), vec![]),
        ]
    );
    let only_t = Filter {
        session: Some("t".into()),
        ..all()
    };
    assert_eq!(find(&only_t), [("z".into(), r(&[2]), vec![])]);
}

/// A searcher reads what a store holds, shard by shard, up to a position, and answers as
/// the reference does over the same entries; a tombstone read later takes its record out.
#[tokio::test]
async fn a_searcher_follows_a_store_up_to_a_position() {
    use crate::options::StoreOptions;
    use crate::testing::ReferenceStore;
    let store = ReferenceStore::open("search-follows", StoreOptions::default()).unwrap();
    let mut a = store.open_shard(&WriterId::new("a").unwrap()).await.unwrap();
    let mut b = store.open_shard(&WriterId::new("b").unwrap()).await.unwrap();
    let text = |id: &str, t: &str| Record::text(id, "bot", "s", "user", t);
    a.append(vec![text("r1", "refund my order"), text("r2", "late order")])
        .await
        .unwrap();
    b.append(vec![text("r3", "refund please")]).await.unwrap();
    let mut p = store.projector();
    p.refresh().await.unwrap();
    let then = p.checkpoint();
    a.append(vec![text("r4", "refund refund")]).await.unwrap();
    b.append(vec![Record::tombstone("r1", "bot", "s")]).await.unwrap();
    let mut searcher = Searcher::new();
    assert_eq!(searcher.catch_up(&store, &then).await.unwrap(), 3);
    assert_eq!(searcher.position(), &then);
    assert_eq!(ids_in(searcher.index(), "refund"), ["r3", "r1"]);
    p.refresh().await.unwrap();
    let now = p.checkpoint();
    assert_eq!(
        searcher.catch_up(&store, &now).await.unwrap(),
        2,
        "only what is past it"
    );
    let q = Query::parse("refund").unwrap();
    let (hits, _) = searcher.index().search("bot", &q, &all(), None, 10);
    let mut entries = Vec::new();
    for shard in store.shards().await.unwrap() {
        entries.extend(store.read_shard(shard.shard, 0, 100).await.unwrap());
    }
    let want = model::search(&entries, "bot", &q, &all());
    assert_eq!(hits.into_iter().map(|h| (h.id, h.score)).collect::<Vec<_>>(), want);
    assert_eq!(want.iter().map(|w| w.0.as_str()).collect::<Vec<_>>(), ["r4", "r3"]);
    let mut beyond = now.clone();
    beyond.0.insert(WriterId::new("a").unwrap().shard_id(), 99);
    let err = searcher.catch_up(&store, &beyond).await.unwrap_err();
    assert!(matches!(err, Error::InvalidInput { field: "at", .. }), "{err:?}");
}

fn ids_in(ix: &TextIndex, q: &str) -> Vec<String> {
    ids(ix, q, &all())
}

#[test]
fn a_snippet_starts_a_few_words_before_the_first_match() {
    let text = "one two three four five six seven Refund eight nine";
    assert_eq!(
        snippet(text, &["refund".into()]),
        "…four five six seven Refund eight nine"
    );
    let long: String = (0..40).map(|i| format!("w{i} ")).collect();
    let s = snippet(&long, &["w10".into()]);
    assert!(s.starts_with("…w6 ") && s.ends_with("w29…"), "{s}");
    assert_eq!(snippet("no match here", &["x".into()]), "no match here");
    assert_eq!(
        snippet(" Where is my refund? ", &["refund".into()]),
        "Where is my refund?"
    );
    assert_eq!(snippet(" ,. ", &["x".into()]), "");
}

/// Where a search's looks at its deadline are, counted by hand. A deadline passed at the
/// last look gives up with a typed timeout, nothing written; one passed only at the look
/// after changes nothing. A loop without its look leaves the search short of looks, and it
/// answers where it must not.
fn looks_exactly(ix: &TextIndex, q: &str, looks: usize) {
    let q = Query::parse(q).unwrap();
    match ix.search_by("bot", &q, &all(), None, 10, &Deadline::at_look(looks)) {
        Err(Error::Timeout {
            op: "search",
            shard: None,
            written: Written::Nothing,
            ..
        }) => {}
        other => panic!("{q:?} at look {looks}: {other:?}"),
    }
    let whole = ix.search("bot", &q, &all(), None, 10);
    let late = ix
        .search_by("bot", &q, &all(), None, 10, &Deadline::at_look(looks + 1))
        .unwrap();
    assert_eq!(whole, late, "{q:?}");
    assert!(!late.0.is_empty(), "{q:?}");
}

/// The looks of a search: one before each clause, then one every CHECK_EVERY ticks — a tick
/// per posting of a term (or of a prefix's terms), per doc and per start position of a
/// phrase, per scored doc, and per start position of a phrase again for the page's matched
/// terms. With 3 × CHECK_EVERY docs holding `common word` once: a term or prefix 1 + 3
/// (postings) + 3 (scored docs) = 7; the phrase 1 + 6 (a doc and a start each) + 3 = 10.
#[test]
fn a_search_past_its_deadline_gives_up_in_every_long_loop() {
    let n = 3 * CHECK_EVERY as u64;
    let entries: Vec<Entry> = (1..=n)
        .map(|i| put(i, &format!("r{i}"), "s", "a common word"))
        .collect();
    let ix = index(&entries);
    looks_exactly(&ix, "common", 7);
    looks_exactly(&ix, "comm*", 7);
    looks_exactly(&ix, "\"common word\"", 10);
    let q = Query::parse("word").unwrap();
    assert!(
        ix.search_by("bot", &q, &all(), None, 10, &Deadline::after(Duration::from_secs(3600)))
            .is_ok()
    );
    assert!(matches!(
        ix.search_by("bot", &q, &all(), None, 10, &Deadline::after(Duration::ZERO)),
        Err(Error::Timeout { .. })
    ));
}

/// One doc holding a word 5,000 times: a phrase of it costs per start position, not per
/// doc, both to score and to tell the page's matched terms. 1 look before the clause; the
/// doc and its 5,000 starts (5,001 ticks: 4 looks, 905 over); the scored doc (906); the
/// 5,000 starts again for matched (5,906: 5 looks) — 10.
#[test]
fn a_phrase_looks_at_its_deadline_per_position_of_a_long_doc() {
    let text = vec!["a"; 5_000].join(" ");
    let ix = index(&[put(1, "long", "s", &text)]);
    looks_exactly(&ix, "\"a a\"", 10);
}

/// A reference store whose reads after the first never answer (`hangs`: a catch-up
/// cancelled half-way), and whose saved indexes are `saved`'s.
struct Wrapped {
    inner: crate::testing::ReferenceStore,
    reads: std::sync::atomic::AtomicUsize,
    hangs: bool,
    saved: Option<std::sync::Arc<dyn saved::SavedIndexes>>,
}

#[async_trait::async_trait]
impl Store for Wrapped {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn options(&self) -> &crate::options::StoreOptions {
        self.inner.options()
    }
    async fn open_shard(&self, writer: &WriterId) -> Result<Box<dyn crate::Shard>> {
        self.inner.open_shard(writer).await
    }
    async fn reopen_shard(&self, writer: &WriterId, held: crate::ids::Epoch) -> Result<Box<dyn crate::Shard>> {
        self.inner.reopen_shard(writer, held).await
    }
    async fn shards(&self) -> Result<Vec<crate::ShardInfo>> {
        self.inner.shards().await
    }
    async fn read_shard(&self, shard: crate::ids::ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
        if self.hangs && self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            std::future::pending::<()>().await;
        }
        self.inner.read_shard(shard, after_seq, limit).await
    }
    async fn format(&self) -> Result<u32> {
        self.inner.format().await
    }
    async fn set_format(&self, from: u32, to: u32) -> Result<()> {
        self.inner.set_format(from, to).await
    }
    fn projector(&self) -> Box<dyn crate::Projector> {
        self.inner.projector()
    }
    fn conflict_discovery(&self) -> Box<dyn crate::ConflictDiscovery> {
        self.inner.conflict_discovery()
    }
    async fn compact(&self, options: &crate::options::CompactOptions) -> Result<crate::options::CompactReport> {
        self.inner.compact(options).await
    }
    async fn gc(&self, options: &crate::options::GcOptions) -> Result<crate::options::GcReport> {
        self.inner.gc(options).await
    }
    async fn purge(&self, options: &crate::options::PurgeOptions) -> Result<crate::options::PurgeReport> {
        self.inner.purge(options).await
    }
    fn saved_indexes(&self) -> Option<std::sync::Arc<dyn saved::SavedIndexes>> {
        self.saved.clone()
    }
}

/// Saved indexes in memory over which a purge runs (its mark changed, every index deleted)
/// just before each put: a purge that overlaps a save.
struct PurgedAfterPut(saved::MemoryIndexes);

#[async_trait::async_trait]
impl saved::SavedIndexes for PurgedAfterPut {
    async fn identity(&self, create: bool) -> Result<Option<String>> {
        self.0.identity(create).await
    }
    async fn names(&self) -> Result<Vec<String>> {
        self.0.names().await
    }
    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.0.read(name).await
    }
    async fn put(&self, bytes: Vec<u8>, tag: &str) -> Result<String> {
        // A purge ran while the index was encoded: it forgot every saved index before this
        // one was put.
        saved::forget(&self.0).await?;
        self.0.put(bytes, tag).await
    }
    async fn delete(&self, name: &str) -> Result<()> {
        self.0.delete(name).await
    }
    async fn mark(&self) -> Result<Option<String>> {
        self.0.mark().await
    }
    async fn remark(&self) -> Result<()> {
        self.0.remark().await
    }
}

/// A save that a purge overlaps (the mark changed between its first look and its put's end)
/// deletes what it put: it may hold what the purge erased. Without the overlap, it is kept.
#[tokio::test]
async fn a_save_that_a_purge_overlaps_is_withdrawn() {
    use crate::options::StoreOptions;
    use crate::testing::ReferenceStore;
    let store = ReferenceStore::open("search-save-purged", StoreOptions::default()).unwrap();
    let mut w = store.open_shard(&WriterId::new("a").unwrap()).await.unwrap();
    w.append(vec![Record::text("r1", "bot", "s", "user", "refund my order")])
        .await
        .unwrap();
    let overlapped = std::sync::Arc::new(PurgedAfterPut(saved::MemoryIndexes::new("x")));
    let wrapped = Wrapped {
        inner: store.clone(),
        reads: Default::default(),
        hangs: false,
        saved: Some(overlapped.clone()),
    };
    let got = saved::save(&mut Searcher::new(), &wrapped).await.unwrap();
    assert_eq!(got, saved::Saved::Withdrawn);
    assert!(
        overlapped.names().await.unwrap().is_empty(),
        "the withdrawn index is kept"
    );
    let calm = std::sync::Arc::new(saved::MemoryIndexes::new("x"));
    let wrapped = Wrapped {
        saved: Some(calm.clone()),
        ..wrapped
    };
    let got = saved::save(&mut Searcher::new(), &wrapped).await.unwrap();
    assert!(matches!(got, saved::Saved::Put { .. }), "{got:?}");
    assert_eq!(calm.names().await.unwrap().len(), 1);
    let everything = Checkpoint(std::iter::once((WriterId::new("a").unwrap().shard_id(), 1)).collect());
    let (loaded, _) = saved::load(&wrapped, CELLS, &everything).await;
    assert!(loaded.is_some(), "the saved index is loaded");
    // A save that died between its put and its look at the mark, a purge meanwhile: what it
    // put is begun under the old mark, never loaded, and swept by `gc`.
    calm.remark().await.unwrap();
    let (loaded, report) = saved::load(&wrapped, CELLS, &everything).await;
    assert!(loaded.is_none() && report.refused.len() == 1, "{report:?}");
    assert_eq!(saved::sweep(&*calm).await.unwrap(), 1);
    assert!(calm.names().await.unwrap().is_empty());
}

/// A catch-up dropped after its first read holds what it read unsettled — the searcher says
/// so — and the next one settles it: its vector searches are the reference's.
#[tokio::test]
async fn a_catch_up_dropped_half_way_is_settled_by_the_next() {
    use crate::options::StoreOptions;
    use crate::testing::ReferenceStore;
    let store = ReferenceStore::open("search-dropped", StoreOptions::default()).unwrap();
    // Every embedding a centroid: each one's cell must take the vectors held before it.
    let cells = Cells {
        sample: 1,
        probe: 1,
        candidates: 1,
        exact: 100,
    };
    for (writer, ids) in [("a", ["a1", "a2", "a3"]), ("b", ["b1", "b2", "b3"])] {
        let mut shard = store.open_shard(&WriterId::new(writer).unwrap()).await.unwrap();
        for (n, id) in ids.iter().enumerate() {
            let v = [1.0, n as f32 - 1.0];
            shard
                .append(vec![
                    Record::text(*id, "bot", "s", "user", "text"),
                    Record::embedding(*id, "bot", "s", "m", Metric::Cosine, &v),
                ])
                .await
                .unwrap();
        }
    }
    let mut p = store.projector();
    p.refresh().await.unwrap();
    let to = p.checkpoint();
    let hangs = Wrapped {
        inner: store,
        reads: Default::default(),
        hangs: true,
        saved: None,
    };
    let mut searcher = Searcher::with_cells(cells);
    {
        let mut once = std::pin::pin!(searcher.catch_up(&hangs, &to));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(once.as_mut().poll(&mut cx).is_pending(), "the second read hangs");
    }
    assert!(!searcher.settled(), "one shard fed, its centroids pending");
    let store = hangs.inner;
    searcher.catch_up(&store, &to).await.unwrap();
    assert!(searcher.settled());
    let mut entries = Vec::new();
    for shard in store.shards().await.unwrap() {
        entries.extend(store.read_shard(shard.shard, 0, 100).await.unwrap());
    }
    for q in [[1.0, -1.0], [1.0, 1.0], [0.0, 1.0]] {
        let near = Nearest {
            model: "m".into(),
            vector: q.to_vec(),
        };
        let (hits, _) = searcher
            .index()
            .find_by("bot", Ask::Vector(&near), &all(), None, 100, &Deadline::never())
            .unwrap();
        let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
        assert_eq!(
            Some(got),
            model::find(&entries, "bot", None, Some(&near), &all(), &cells)
        );
    }
}

/// A record of bytes is found by its vectors, never by its bytes as words, and counts in no
/// text statistic; a cell of several blocks (64 vectors each) answers as the reference while
/// its vectors go in any order.
#[test]
fn a_record_of_bytes_is_found_by_vector_and_a_cell_spans_blocks() {
    let mut image = Record::text("img", "bot", "s", "user", "");
    image.body = Body::Bytes(b"refund".to_vec());
    let ix = index(&[
        put(1, "t", "s", "refund order"),
        entry("w", 2, 1_002, image),
        emb(3, "img", "m", Metric::Dot, &[1.0, 0.0]),
        emb(4, "t", "m", Metric::Dot, &[0.5, 0.0]),
    ]);
    let (hits, _) = ix.search("bot", &Query::parse("refund").unwrap(), &all(), None, 10);
    assert_eq!(hits.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["t"]);
    // N = 1 and the average length 2: the bytes are no doc of text.
    assert_eq!(hits[0].score, bm25(1.0, 1.0, 1.0, 2.0, 2.0));
    assert_eq!(nearest(&ix, "m", &[1.0, 0.0]), [("img".into(), 1.0), ("t".into(), 0.5)]);
    assert_eq!(ix.docs("bot"), 2);

    // No centroid (one in 2^40): one cell of 200 vectors, then of fewer and fewer.
    let cells = Cells {
        sample: 1 << 40,
        probe: 1,
        candidates: 1_000,
        exact: 1_000,
    };
    let mut entries = Vec::new();
    for i in 0..200u64 {
        let id = format!("r{i}");
        entries.push(put(1 + 2 * i, &id, "s", "x"));
        entries.push(emb(2 + 2 * i, &id, "m", Metric::Dot, &[i as f32, 1.0]));
    }
    let mut ix = TextIndex::with_cells(cells);
    for e in &entries {
        ix.apply(e);
    }
    let near = Nearest {
        model: "m".into(),
        vector: vec![-1.0, 0.5],
    };
    let mut seq = 1_000;
    for round in 0..8 {
        let (hits, _) = ix
            .find_by("bot", Ask::Vector(&near), &all(), None, 100, &Deadline::never())
            .unwrap();
        let got: Vec<(String, f64)> = hits.into_iter().map(|h| (h.id, h.score)).collect();
        let mut want = model::find(&entries, "bot", None, Some(&near), &all(), &cells).unwrap();
        want.truncate(100);
        assert_eq!(got, want, "round {round}");
        // Twenty-five more gone, scattered over the cell's blocks.
        for n in 0..25u64 {
            let i = (round * 25 + n) * 37 % 200;
            seq += 1;
            let gone = entry("w", seq, 1_000 + seq, Record::tombstone(format!("r{i}"), "bot", "s"));
            ix.apply(&gone);
            entries.push(gone);
        }
    }
    assert!(nearest(&ix, "m", &[1.0, 0.0]).is_empty());
}

/// A searcher of `entries` fed one by one (its position is not kept: what these tests save is
/// the index).
fn searcher_of(entries: &[Entry], cells: Cells) -> Searcher {
    let mut s = Searcher::with_cells(cells);
    for e in entries {
        s.index.feed(e);
    }
    s.index.settle();
    s
}

/// Every answer a test of a saved index compares: text, vector and hybrid searches with and
/// without a session filter (ids, score bits, matched terms, or the refusal), and which
/// terms and vectors are held.
fn answers(ix: &TextIndex) -> Vec<String> {
    let near = |m: &str, v: &[f32]| Nearest::new(m, v.to_vec()).unwrap();
    let texts: Vec<Query> = ["refund", "\"refund order\"", "sh*", "東 京"]
        .iter()
        .map(|q| Query::parse(q).unwrap())
        .collect();
    let nears = [
        near("m", &[1.0, -2.0]),
        near("n", &[0.5, 1.0, -1.0]),
        near("m", &[1.0, -2.0, 0.5]),
    ];
    let mut asks: Vec<Ask<'_>> = texts.iter().map(Ask::Text).collect();
    asks.extend(nears.iter().map(Ask::Vector));
    asks.push(Ask::Hybrid(&texts[0], &nears[0]));
    asks.push(Ask::Hybrid(&texts[2], &nears[1]));
    let mut out = Vec::new();
    for bot in ["bot", "other"] {
        for ask in &asks {
            for session in [None, Some("s1".to_string())] {
                let filter = Filter {
                    session,
                    ..Filter::default()
                };
                let got = ix.find_by(bot, *ask, &filter, None, 1000, &Deadline::never());
                out.push(match got {
                    Ok((hits, more)) => format!(
                        "{more} {:?}",
                        hits.into_iter()
                            .map(|h| (h.id, h.score.to_bits(), h.matched))
                            .collect::<Vec<_>>()
                    ),
                    Err(e) => format!("refused: {e}"),
                });
            }
        }
        out.push(format!("{} docs", ix.docs(bot)));
        for w in WORDS {
            out.push(format!("{w}: {}", ix.has_term(bot, w)));
        }
        for id in 0..6 {
            for m in ["m", "n"] {
                out.push(format!("r{id} {m}: {}", ix.has_vector(bot, &format!("r{id}"), m)));
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// An index saved after any part of a history and loaded, then fed the rest, answers
    /// every search to the bit as one fed the whole history at once; and a loaded index saves
    /// the same bytes it was loaded from.
    #[test]
    fn a_saved_index_loads_to_the_index_it_was(
        entries in arb_entries(),
        seed in any::<u64>(),
        split in 0.0..=1.0f64,
        cells in prop::sample::select(vec![
            CELLS,
            Cells { sample: 2, probe: 1, candidates: 2, exact: 3 },
            Cells { sample: 1, probe: 1, candidates: 4, exact: 100 },
        ]),
    ) {
        let entries = shuffle(&entries, seed);
        let at = (entries.len() as f64 * split) as usize;
        let whole = searcher_of(&entries, cells);
        let first = searcher_of(&entries[..at], cells);
        let bytes = first.encode("store", 7, Vec::new()).unwrap();
        let loaded = persist::decode(&bytes, "store", cells).unwrap();
        prop_assert_eq!(loaded.taken_millis, 7);
        let mut s = loaded.searcher;
        prop_assert!(s.settled());
        prop_assert_eq!(&answers(s.index()), &answers(first.index()));
        prop_assert!(s.encode("store", 7, Vec::new()).unwrap() == bytes, "a loaded index saves other bytes");
        for e in &entries[at..] {
            s.index.feed(e);
        }
        s.index.settle();
        let mut whole = whole;
        whole.index.settle();
        prop_assert_eq!(answers(s.index()), answers(whole.index()));
    }

    /// A saved index changed anywhere — a byte flipped (the checksum made to match or not),
    /// or cut short — is refused or, if the change still decodes into a consistent index,
    /// searched without a panic.
    #[test]
    fn a_damaged_saved_index_is_refused_and_never_panics(
        entries in arb_entries(),
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
        resum in any::<bool>(),
    ) {
        let bytes = searcher_of(&entries, Cells { sample: 2, probe: 1, candidates: 2, exact: 3 }).encode("store", 0, Vec::new()).unwrap();
        let cells = Cells { sample: 2, probe: 1, candidates: 2, exact: 3 };
        let i = at.index(bytes.len());
        let mut bad = bytes.clone();
        bad[i] ^= value.max(1);
        if resum && i >= 44 {
            let sum = blake3::hash(&bad[44..]);
            bad[12..44].copy_from_slice(sum.as_bytes());
        }
        // A crafted header may name another store or other cells: refused all the same.
        if let Ok(d) = persist::decode(&bad, "store", cells) {
            prop_assert!(resum, "a flipped byte passed the checksum");
            answers(d.searcher.index());
            // Fed on (every entry again, then a tombstone of every id): removals, moves
            // between cells and reused numbers on what was decoded.
            let mut s = d.searcher;
            for (n, e) in entries.iter().enumerate() {
                s.index.feed(e);
                let r = &e.record;
                s.index.feed(&entry("w9", n as u64 + 1, 5_000, Record::tombstone(r.id.as_str(), &r.bot_id, &r.session_id)));
            }
            s.index.settle();
            answers(s.index());
        }
        let cut = persist::decode(&bytes[..i], "store", cells);
        prop_assert!(cut.is_err(), "cut at {i} of {}", bytes.len());
    }
}

/// A saved index says why it is not used: not one, another format, another store, other cells.
#[test]
fn a_saved_index_of_another_kind_format_store_or_cells_is_refused() {
    use persist::Rejected;
    let entries = [put(1, "r1", "s1", "refund order")];
    let bytes = searcher_of(&entries, CELLS).encode("store", 0, Vec::new()).unwrap();
    assert!(persist::decode(&bytes, "store", CELLS).is_ok());
    let refused = |b: &[u8], store: &str, cells: Cells| persist::decode(b, store, cells).unwrap_err();
    assert!(matches!(
        refused(
            b"CTXLOGPS and more bytes than a preamble holds..........",
            "store",
            CELLS
        ),
        Rejected::NotAnIndex(_)
    ));
    let mut next = bytes.clone();
    next[8..12].copy_from_slice(&(persist::FORMAT + 1).to_le_bytes());
    assert_eq!(
        refused(&next, "store", CELLS),
        Rejected::UnknownFormat {
            found: persist::FORMAT + 1
        }
    );
    assert_eq!(
        refused(&bytes, "other", CELLS),
        Rejected::Foreign {
            expected: "other".into(),
            found: "store".into()
        }
    );
    let small = Cells { sample: 2, ..CELLS };
    assert!(matches!(refused(&bytes, "store", small), Rejected::Stale(_)));
}

/// An index saved after a record's tombstone holds no byte of what the record held: its
/// text's words, its metadata, its vector, its id's text; only that the id is dead.
#[test]
fn a_saved_index_holds_nothing_of_a_forgotten_record() {
    let secret: [f32; 3] = [1234.5, -8765.25, 0.125];
    let mut r = Record::text("gone", "bot", "s1", "user", "zebracorn refund");
    r.metadata = Some(serde_json::json!({"topic": "okapiwhale"}));
    let entries = [
        put(1, "kept", "s1", "refund order"),
        entry("w", 2, 1_002, r),
        emb(3, "gone", "m", Metric::L2, &secret),
        entry("w", 4, 1_004, Record::tombstone("gone", "bot", "s1")),
    ];
    let before = searcher_of(&entries[..3], CELLS)
        .encode("store", 0, Vec::new())
        .unwrap();
    let after = searcher_of(&entries, CELLS).encode("store", 0, Vec::new()).unwrap();
    let vector: Vec<u8> = secret.iter().flat_map(|f| f.to_le_bytes()).collect();
    let holds = |b: &[u8], needle: &[u8]| b.windows(needle.len()).any(|w| w == needle);
    // What was saved while the record lived is loaded whole: its metadata filters.
    let loaded = persist::decode(&before, "store", CELLS).unwrap().searcher;
    let topic = Filter {
        metadata: [("topic".to_string(), serde_json::json!("okapiwhale"))].into(),
        ..Filter::default()
    };
    assert_eq!(ids(loaded.index(), "refund", &topic), ["gone"]);
    for needle in [&b"zebracorn"[..], b"okapiwhale", &vector[..4], &vector[4..8]] {
        assert!(holds(&before, needle), "the live record's {needle:?} is saved");
        assert!(!holds(&after, needle), "the forgotten record's {needle:?} is saved");
    }
}

/// A loader checks that the store still holds what the saved index read at its position:
/// the same store does; one rolled back to before it (another store at the same position
/// with other entries) does not.
#[tokio::test]
async fn a_saved_index_names_the_entries_at_its_position() {
    use crate::options::StoreOptions;
    use crate::testing::ReferenceStore;
    let text = |id: &str, t: &str| Record::text(id, "bot", "s", "user", t);
    let a = WriterId::new("a").unwrap();
    let store = ReferenceStore::open("search-tails", StoreOptions::default()).unwrap();
    let mut w = store.open_shard(&a).await.unwrap();
    w.append(vec![text("r1", "refund my order"), text("r2", "late order")])
        .await
        .unwrap();
    let mut p = store.projector();
    p.refresh().await.unwrap();
    let mut s = Searcher::new();
    s.catch_up(&store, &p.checkpoint()).await.unwrap();
    let tails = s.tails(&store).await.unwrap();
    assert_eq!(tails.len(), 1);
    let bytes = s.encode("store", 0, tails).unwrap();
    let loaded = persist::decode(&bytes, "store", CELLS).unwrap();
    assert_eq!(loaded.searcher.position(), s.position());
    assert_eq!(Searcher::holds_tails(&store, &loaded.tails).await.unwrap(), Ok(()));
    // The same position, other entries there.
    let other = ReferenceStore::open("search-tails-other", StoreOptions::default()).unwrap();
    let mut w = other.open_shard(&a).await.unwrap();
    w.append(vec![text("r1", "refund my order"), text("r2", "late orders")])
        .await
        .unwrap();
    let held = Searcher::holds_tails(&other, &loaded.tails).await.unwrap();
    assert!(matches!(held, Err(persist::Rejected::Stale(_))), "{held:?}");
    // A store that ends before the position.
    let short = ReferenceStore::open("search-tails-short", StoreOptions::default()).unwrap();
    let held = Searcher::holds_tails(&short, &loaded.tails).await.unwrap();
    assert!(matches!(held, Err(persist::Rejected::Stale(_))), "{held:?}");
}

/// Saved indexes in a directory: put whole under names that sort by time, the newest two
/// kept, read back; a purge's `forget` deletes every one, and every half-written file (a
/// crashed save's), and changes the mark.
#[tokio::test]
async fn saved_indexes_in_a_directory_are_kept_two_and_forgotten_whole() {
    use crate::options::StoreOptions;
    use crate::testing::{ManualClock, ReferenceStore};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("s.db.ctxlog-search");
    let identity = std::sync::Arc::new(ReferenceStore::open("search-dir", StoreOptions::default()).unwrap());
    let clock = ManualClock::new(1_000);
    let saved = saved::DirIndexes::new(&dir, "test", identity, clock.clone());
    assert!(saved.names().await.unwrap().is_empty(), "no directory yet");
    let mut names = Vec::new();
    for i in 0..3u8 {
        clock.set(1_000 + u64::from(i));
        names.push(saved.put(vec![i; 10], &saved::tag(None)).await.unwrap());
    }
    assert_eq!(saved.names().await.unwrap(), [names[2].clone(), names[1].clone()]);
    assert_eq!(saved.read(&names[2]).await.unwrap(), Some(vec![2; 10]));
    assert_eq!(saved.read(&names[0]).await.unwrap(), None);
    let crashed = dir.join(".tmp-crashed");
    std::fs::write(&crashed, b"a secret").unwrap();
    let before = saved.mark().await.unwrap();
    assert_eq!(saved::forget(&saved).await.unwrap(), 2);
    assert!(saved.names().await.unwrap().is_empty());
    assert!(!crashed.exists(), "a half-written saved index outlived a purge");
    assert_ne!(saved.mark().await.unwrap(), before);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["purged"]);
}
