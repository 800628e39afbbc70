//! `ctxlog-bench search`: full-text search (rule 26) on a generated corpus, against SQLite
//! FTS5 queried directly on the same texts (the floor, measured in the same process).
//!
//! The corpus: `records` records of 10 to 40 words drawn from a Zipf vocabulary (50,000
//! words, exponent 1.07, as natural text roughly is) in 1,000 sessions of one bot, appended
//! to a fresh store. What is measured:
//! - the index: a [`Searcher`] catching up with the store from nothing (a replica's first
//!   search: the store read and every entry fed), its time and the resident memory it adds,
//!   against the raw text's bytes (an upper bound: what the read of the store leaves
//!   allocated counts too);
//! - queries of 1 to 3 words (drawn from the same vocabulary past its 50 most common words,
//!   which a searcher rarely types — and which cost most here), with and without a session
//!   filter, k = 10, each parsed and answered: p50 and p99;
//! - freshness: a record appended through one store handle (replica A's writer) and then
//!   found by a search through a second handle of the same store (replica B: its projector
//!   refreshed, the searcher caught up to its position, the query answered), from before
//!   the append to the hit, up to [`FRESH_APPENDS`] times: p50 and p99 (what `serve` adds — HTTP,
//!   the view's fresh read on the request path — is not in it);
//! - vectors (rule 27, with `dims` > 0): each record embedded in its own batch (a
//!   `dims`-dimension cosine vector near one of 256 topic centres), k = 10 nearest of a
//!   query near a topic centre (at most 100 queries): p50 and p99; a hybrid query (words and a vector); the floor,
//!   exact brute force over the same vectors in one flat `f32` array (norms precomputed,
//!   top 10 by partial selection), and the recall@10 of the index's answer against it; the
//!   index's resident memory against the raw vector bytes;
//! - the floor: the same texts in an FTS5 table in memory, built and then asked the same
//!   queries (`MATCH` of the words joined by `OR`, ranked by its BM25, limit 10), and its
//!   size. Its build inserts texts held in memory, where the index's reads them from the
//!   store: the build ratio favours FTS5.

use std::time::Instant;

use anyhow::{Context, Result};
use ctxlog::search::{Ask, Deadline, Filter, Nearest, Query, Searcher};
use ctxlog::{Checkpoint, Metric, Record, WriterId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal, Zipf};
use serde_json::{Value, json};

const BOT: &str = "search-bench";
const VOCABULARY: usize = 50_000;
const SESSIONS: usize = 1_000;
/// The most common words, never asked for.
const STOP: usize = 50;

/// Word `i` of the vocabulary: letters only, distinct per `i`.
fn word(i: usize) -> String {
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    let mut n = i + 26;
    let mut w = Vec::new();
    while n > 0 {
        w.push(LETTERS[n % 26]);
        n /= 26;
    }
    String::from_utf8(w).expect("ascii")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    json!({"p50_ms": percentile(&ms, 0.5), "p99_ms": percentile(&ms, 0.99)})
}

/// Resident memory now (kB), from `/proc/self/status`.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// [`crate::Cmd::Search`].
pub(crate) async fn search(uri: &str, records: usize, queries: usize, seed: u64, dims: usize) -> Result<Value> {
    anyhow::ensure!(records > 0 && queries > 0, "--records and --queries must be at least 1");
    let mut rng = StdRng::seed_from_u64(seed);
    let zipf = Zipf::new(VOCABULARY as f64, 1.07).context("a Zipf distribution")?;
    let draw = |rng: &mut StdRng| word(zipf.sample(rng) as usize - 1);
    let topics = Topics::new(&mut rng, dims)?;
    // Every record's vector, one flat array (the floor's, and the embeddings' source).
    let mut flat: Vec<f32> = Vec::with_capacity(records * dims);

    // The corpus, appended to a fresh store.
    let store = ctxlog::open(uri, crate::creating()).await?;
    let mut shard = store.open_shard(&WriterId::new("search-bench")?).await?;
    let mut to = Checkpoint::default();
    let mut texts: Vec<(String, String)> = Vec::with_capacity(records);
    let mut raw_bytes = 0usize;
    for chunk in (0..records).collect::<Vec<_>>().chunks(1_000) {
        let mut batch = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let n = rng.random_range(10..=40);
            let text = (0..n).map(|_| draw(&mut rng)).collect::<Vec<_>>().join(" ");
            let session = format!("s{}", i % SESSIONS);
            raw_bytes += text.len();
            batch.push(Record::text(format!("r{i}"), BOT, &session, "user", &text));
            if dims > 0 {
                let topic = rng.random_range(0..TOPICS);
                let v = topics.near(&mut rng, topic);
                batch.push(Record::embedding(
                    format!("r{i}"),
                    BOT,
                    &session,
                    MODEL,
                    Metric::Cosine,
                    &v,
                ));
                flat.extend_from_slice(&v);
            }
            texts.push((session, text));
        }
        let ack = shard.append(batch).await?;
        to.0.insert(ack.shard, ack.last_seq);
    }
    shard.close().await?;

    // The index, as a replica's first search builds it.
    let before = rss_kb();
    let started = Instant::now();
    let mut searcher = Searcher::new();
    let fed = searcher.catch_up(store.as_ref(), &to).await?;
    let build_s = started.elapsed().as_secs_f64();
    let index_kb = rss_kb().saturating_sub(before);
    let entries = records * (1 + usize::from(dims > 0));
    anyhow::ensure!(fed == entries, "the searcher fed {fed} of {entries} entries");

    // The queries, drawn once, asked of both.
    let asks: Vec<(Vec<String>, String)> = (0..queries)
        .map(|_| {
            let n = rng.random_range(1..=3);
            let words = (0..n)
                .map(|_| {
                    loop {
                        let rank = zipf.sample(&mut rng) as usize - 1;
                        if rank >= STOP {
                            break word(rank);
                        }
                    }
                })
                .collect();
            (words, format!("s{}", rng.random_range(0..SESSIONS)))
        })
        .collect();
    let index = searcher.index();
    let mut ours = (Vec::new(), Vec::new());
    let (mut hits, mut in_session) = (0usize, 0usize);
    for (words, session) in &asks {
        // The query's parse is timed too, as FTS5's is.
        let started = Instant::now();
        let q = Query::parse(&words.join(" "))?;
        let (found, _) = index.search(BOT, &q, &Filter::default(), None, 10);
        ours.0.push(started.elapsed().as_secs_f64() * 1e3);
        hits += found.len();
        let only = Filter {
            session: Some(session.clone()),
            ..Filter::default()
        };
        let started = Instant::now();
        let q = Query::parse(&words.join(" "))?;
        let (found, _) = index.search(BOT, &q, &only, None, 10);
        ours.1.push(started.elapsed().as_secs_f64() * 1e3);
        in_session += found.len();
    }
    let vectors = if dims > 0 {
        vectors(index, &topics, &flat, &asks, &mut rng)?
    } else {
        Value::Null
    };
    let freshness = freshness(
        store.as_ref(),
        uri,
        &mut searcher,
        (records / 100).clamp(1, FRESH_APPENDS),
    )
    .await?;
    let saved = saved_index(store.as_ref(), &searcher, &asks).await?;
    drop(searcher);

    // The floor: FTS5 on the same texts.
    let db = rusqlite::Connection::open_in_memory()?;
    db.execute_batch("CREATE VIRTUAL TABLE t USING fts5(body, session UNINDEXED);")?;
    let started = Instant::now();
    {
        let tx = db.unchecked_transaction()?;
        {
            let mut insert = tx.prepare("INSERT INTO t (body, session) VALUES (?1, ?2)")?;
            for (session, text) in &texts {
                insert.execute((text, session))?;
            }
        }
        tx.commit()?;
    }
    let fts_build_s = started.elapsed().as_secs_f64();
    let fts_bytes: i64 = db.query_row(
        "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        [],
        |r| r.get(0),
    )?;
    let mut all = db.prepare("SELECT rowid FROM t WHERE t MATCH ?1 ORDER BY rank LIMIT 10")?;
    let mut one = db.prepare("SELECT rowid FROM t WHERE t MATCH ?1 AND session = ?2 ORDER BY rank LIMIT 10")?;
    let mut floor = (Vec::new(), Vec::new());
    let (mut fts_hits, mut fts_in_session) = (0usize, 0usize);
    for (words, session) in &asks {
        let m = words
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(" OR ");
        let started = Instant::now();
        fts_hits += all.query_map([&m], |r| r.get::<_, i64>(0))?.count();
        floor.0.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        fts_in_session += one.query_map((&m, session), |r| r.get::<_, i64>(0))?.count();
        floor.1.push(started.elapsed().as_secs_f64() * 1e3);
    }
    anyhow::ensure!(
        (hits, in_session) == (fts_hits, fts_in_session),
        "ctxlog found {hits} hits in all and {in_session} in sessions, FTS5 {fts_hits} and {fts_in_session}: not the same corpus or queries"
    );
    let p99 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.99)
    };
    Ok(json!({
        "records": records,
        "raw_text_bytes": raw_bytes,
        "queries": queries,
        "raw_vector_bytes": flat.len() * 4,
        "index": {
            "build_s": build_s,
            "rss_kb": index_kb,
            "rss_over_raw_text": index_kb as f64 * 1024.0 / raw_bytes as f64,
            "rss_over_raw_vectors": if flat.is_empty() { Value::Null } else { json!(index_kb as f64 * 1024.0 / (flat.len() * 4) as f64) },
        },
        "vectors": vectors,
        "freshness": freshness,
        "saved_index": saved,
        "query": summary(ours.0.clone()),
        "query_in_session": summary(ours.1.clone()),
        "fts5": {
            "build_s": fts_build_s,
            "bytes": fts_bytes,
            "query": summary(floor.0.clone()),
            "query_in_session": summary(floor.1.clone()),
        },
        "ratios": {
            "query_p99_over_fts5": p99(&ours.0) / p99(&floor.0),
            "query_in_session_p99_over_fts5": p99(&ours.1) / p99(&floor.1),
            "build_over_fts5": build_s / fts_build_s,
            "cold_load_over_build": saved["cold_load_s"].as_f64().unwrap_or(f64::NAN) / build_s,
        },
    }))
}

/// The index saved to a file beside the store and loaded back as a cold replica would: the
/// bytes, the time to save (tails read, encoded, written, synced) and to load (read, checked,
/// decoded, tails checked against the store), and the loaded index answering the text
/// queries as the one it was saved from.
async fn saved_index(store: &dyn ctxlog::Store, searcher: &Searcher, asks: &[(Vec<String>, String)]) -> Result<Value> {
    use ctxlog::search::persist;
    let dir = std::env::temp_dir().join(format!("ctxlog-bench-saved-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("index");
    let started = Instant::now();
    let tails = searcher.tails(store).await?;
    let bytes = searcher.encode("bench", 0, tails)?;
    let encode_s = started.elapsed().as_secs_f64();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    let save_s = started.elapsed().as_secs_f64();
    let len = bytes.len();
    drop(bytes);
    let started = Instant::now();
    let bytes = std::fs::read(&path)?;
    let read_s = started.elapsed().as_secs_f64();
    let loaded = persist::decode(&bytes, "bench", ctxlog::search::CELLS)?;
    drop(bytes);
    let decode_s = started.elapsed().as_secs_f64() - read_s;
    Searcher::holds_tails(store, &loaded.tails).await??;
    let cold_load_s = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&dir)?;
    for (words, _) in asks.iter().take(20) {
        let q = Query::parse(&words.join(" "))?;
        let want = searcher.index().search(BOT, &q, &Filter::default(), None, 10);
        let got = loaded.searcher.index().search(BOT, &q, &Filter::default(), None, 10);
        anyhow::ensure!(got == want, "the loaded index answers {q:?} otherwise");
    }
    Ok(json!({
        "bytes": len,
        "encode_s": encode_s,
        "save_s": save_s,
        "read_s": read_s,
        "decode_s": decode_s,
        "cold_load_s": cold_load_s,
    }))
}

/// The embedding model of the corpus.
const MODEL: &str = "bench-topics";
/// Vector and hybrid queries at most (of the text queries' words, each with a vector).
const VECTOR_QUERIES: usize = 100;
/// Topic centres the vectors lie near.
const TOPICS: usize = 256;

/// Topic centres: unit vectors of `dims` Gaussian components; a vector near one is the
/// centre plus Gaussian noise of a third of its length.
struct Topics {
    centres: Vec<Vec<f32>>,
    noise: Option<Normal<f32>>,
    dims: usize,
}

impl Topics {
    fn new(rng: &mut StdRng, dims: usize) -> Result<Topics> {
        if dims == 0 {
            return Ok(Topics {
                centres: Vec::new(),
                noise: None,
                dims,
            });
        }
        let unit = Normal::new(0.0f32, 1.0).context("a normal distribution")?;
        let centres = (0..TOPICS)
            .map(|_| {
                let v: Vec<f32> = (0..dims).map(|_| unit.sample(rng)).collect();
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.into_iter().map(|x| x / norm).collect()
            })
            .collect();
        let noise = Normal::new(0.0f32, 1.0 / (3.0 * (dims as f32).sqrt())).context("a normal distribution")?;
        Ok(Topics {
            centres,
            noise: Some(noise),
            dims,
        })
    }

    fn near(&self, rng: &mut StdRng, topic: usize) -> Vec<f32> {
        let noise = self.noise.expect("vectors asked of a corpus with dimensions");
        (0..self.dims)
            .map(|d| self.centres[topic][d] + noise.sample(rng))
            .collect()
    }
}

/// The exact top 10 of `q` among `flat`'s vectors by cosine in `f32` (the floor): record
/// numbers, best first.
fn exact_top10(flat: &[f32], norms: &[f32], q: &[f32]) -> Vec<usize> {
    let dims = q.len();
    let qn = q.iter().map(|x| x * x).sum::<f32>().sqrt();
    let mut scored: Vec<(f32, usize)> = flat
        .chunks_exact(dims)
        .enumerate()
        .map(|(i, v)| (v.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() / (norms[i] * qn), i))
        .collect();
    let k = 10.min(scored.len());
    let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if scored.len() > k {
        scored.select_nth_unstable_by(k, order);
        scored.truncate(k);
    }
    scored.sort_by(order);
    scored.into_iter().map(|(_, i)| i).collect()
}

/// Vector and hybrid queries of the index against the exact floor (see the module's doc).
fn vectors(
    index: &ctxlog::search::TextIndex,
    topics: &Topics,
    flat: &[f32],
    asks: &[(Vec<String>, String)],
    rng: &mut StdRng,
) -> Result<Value> {
    let dims = topics.dims;
    let norms: Vec<f32> = flat
        .chunks_exact(dims)
        .map(|v| v.iter().map(|x| x * x).sum::<f32>().sqrt())
        .collect();
    let (mut ours, mut floor, mut hybrid) = (Vec::new(), Vec::new(), Vec::new());
    let mut recall = 0.0;
    // At most VECTOR_QUERIES: an exact search at 1M vectors takes most of a second.
    for (words, _) in asks.iter().take(VECTOR_QUERIES) {
        let near = Nearest {
            model: MODEL.into(),
            vector: {
                let topic = rng.random_range(0..TOPICS);
                topics.near(rng, topic)
            },
        };
        let started = Instant::now();
        let (found, _) = index.find_by(
            BOT,
            Ask::Vector(&near),
            &Filter::default(),
            None,
            10,
            &Deadline::never(),
        )?;
        ours.push(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let exact = exact_top10(flat, &norms, &near.vector);
        floor.push(started.elapsed().as_secs_f64() * 1e3);
        let exact: std::collections::HashSet<String> = exact.into_iter().map(|i| format!("r{i}")).collect();
        recall += found.iter().filter(|h| exact.contains(&h.id)).count() as f64 / exact.len().max(1) as f64;
        let started = Instant::now();
        let q = Query::parse(&words.join(" "))?;
        index.find_by(
            BOT,
            Ask::Hybrid(&q, &near),
            &Filter::default(),
            None,
            10,
            &Deadline::never(),
        )?;
        hybrid.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let p99 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.99)
    };
    Ok(json!({
        "dims": dims,
        "query": summary(ours.clone()),
        "floor": summary(floor.clone()),
        "hybrid": summary(hybrid),
        "query_p99_over_floor": p99(&ours) / p99(&floor),
        "queries": ours.len(),
        "recall_at_10": recall / ours.len() as f64,
    }))
}

/// Appends the freshness figure times at most (one per 100 records below 20,000: the
/// smoke test's small corpus pays little for it).
const FRESH_APPENDS: usize = 200;

/// `appends` times: append one record with a word of its own through a new writer on
/// handle `a` of the store (the one the corpus was written through), then refresh a second
/// handle's projector, catch `searcher` up to its position and search the word; the time
/// from before the append to the hit.
async fn freshness(a: &dyn ctxlog::Store, uri: &str, searcher: &mut Searcher, appends: usize) -> Result<Value> {
    let b = ctxlog::open(uri, crate::creating()).await?;
    let mut shard = a.open_shard(&WriterId::new("search-bench-fresh")?).await?;
    let mut view = b.projector();
    view.refresh().await?;
    let mut ms = Vec::with_capacity(appends);
    for i in 0..appends {
        // Digits: never a word of the vocabulary (letters only), one doc each.
        let word = format!("fresh{i:06}");
        let started = Instant::now();
        shard
            .append(vec![Record::text(
                format!("fresh-{i}"),
                BOT,
                "s0",
                "user",
                format!("news {word}"),
            )])
            .await?;
        view.refresh().await?;
        searcher.catch_up(b.as_ref(), &view.checkpoint()).await?;
        let (found, _) = searcher
            .index()
            .search(BOT, &Query::parse(&word)?, &Filter::default(), None, 10);
        ms.push(started.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(
            found.len() == 1 && found[0].id == format!("fresh-{i}"),
            "replica B's search after append {i} found {found:?}"
        );
    }
    shard.close().await?;
    let mut v = summary(ms);
    v["appends"] = json!(appends);
    Ok(v)
}
