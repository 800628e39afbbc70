//! `cargo xtask bench search`: full-text search (rule 26) on a generated Zipf corpus — the
//! index a replica's first search builds (time, resident memory against the raw text) and
//! query p50/p99 with and without a session filter — against SQLite FTS5 on the same texts
//! in the same process (the floor); vector (rule 27) and hybrid queries against exact
//! brute force over a flat `f32` array (the floor); and freshness, an append through one
//! store handle to its hit through another. The index reads entries only, so one backend (SQLite)
//! stands for all.

use anyhow::Result;
use serde_json::json;

use super::probe::probe;
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size};
use crate::flags::SearchArgs;

pub(crate) fn run(a: &SearchArgs) -> Result<()> {
    let mut common = a.common.clone();
    common.backends = vec!["sqlite".into()];
    let bin = bench_binary(&common)?;
    let out = out_dir(&common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let mut rows = Vec::new();
    for size in &a.sizes {
        let records = parse_size(size)?;
        let db = scratch.join(format!("search-{records}.db"));
        let _ = std::fs::remove_file(&db);
        let store = format!("sqlite:{}", db.display());
        let (n, q, seed, dims) = (
            records.to_string(),
            a.queries.to_string(),
            a.seed.to_string(),
            a.dims.to_string(),
        );
        let v = probe(
            &bin,
            &store,
            false,
            &[
                "search",
                "--records",
                &n,
                "--queries",
                &q,
                "--seed",
                &seed,
                "--dims",
                &dims,
            ],
        )?;
        super::stores::remove_store(&store);
        rows.push(v);
    }
    let stamp = chrono_stamp();
    let doc = json!({"kind": "search", "date": stamp, "machine": machine(), "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("search-{stamp}.json")), &text)?;
    std::fs::write(out.join("search-latest.json"), &text)?;
    if common.quiet {
        return Ok(());
    }
    if common.json {
        println!("{text}");
        return Ok(());
    }
    println!(
        "| records | index build s (FTS5) | index RSS MB (× raw text) | query p50 / p99 ms (FTS5) | in a session p50 / p99 ms (FTS5) | p99 / FTS5 p99 (all, session) | freshness p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    for r in &rows {
        println!(
            "| {} | {:.1} ({:.1}) | {:.0} ({:.2}×) | {:.2} / {:.2} ({:.2} / {:.2}) | {:.2} / {:.2} ({:.2} / {:.2}) | {:.2}×, {:.2}× | {:.2} / {:.2} |",
            r["records"],
            f(&r["index"]["build_s"]),
            f(&r["fts5"]["build_s"]),
            f(&r["index"]["rss_kb"]) / 1024.0,
            f(&r["index"]["rss_over_raw_text"]),
            f(&r["query"]["p50_ms"]),
            f(&r["query"]["p99_ms"]),
            f(&r["fts5"]["query"]["p50_ms"]),
            f(&r["fts5"]["query"]["p99_ms"]),
            f(&r["query_in_session"]["p50_ms"]),
            f(&r["query_in_session"]["p99_ms"]),
            f(&r["fts5"]["query_in_session"]["p50_ms"]),
            f(&r["fts5"]["query_in_session"]["p99_ms"]),
            f(&r["ratios"]["query_p99_over_fts5"]),
            f(&r["ratios"]["query_in_session_p99_over_fts5"]),
            f(&r["freshness"]["p50_ms"]),
            f(&r["freshness"]["p99_ms"]),
        );
    }
    if a.dims > 0 {
        println!();
        println!(
            "| records × dims | vector k=10 p50 / p99 ms (exact f32 floor) | p99 / floor p99 | recall@10 vs the floor | hybrid p50 / p99 ms | index RSS over raw vector bytes |"
        );
        println!("|---|---|---|---|---|---|");
        for r in &rows {
            let v = &r["vectors"];
            println!(
                "| {} × {} | {:.2} / {:.2} ({:.2} / {:.2}) | {:.2}× | {:.3} | {:.2} / {:.2} | {:.2}× |",
                r["records"],
                v["dims"],
                f(&v["query"]["p50_ms"]),
                f(&v["query"]["p99_ms"]),
                f(&v["floor"]["p50_ms"]),
                f(&v["floor"]["p99_ms"]),
                f(&v["query_p99_over_floor"]),
                f(&v["recall_at_10"]),
                f(&v["hybrid"]["p50_ms"]),
                f(&v["hybrid"]["p99_ms"]),
                f(&r["index"]["rss_over_raw_vectors"]),
            );
        }
    }
    println!();
    println!("| records | saved index MB | save s | cold load s (read, decode) | cold load / build |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        let s = &r["saved_index"];
        println!(
            "| {} | {:.0} | {:.2} | {:.2} ({:.2}, {:.2}) | {:.3}× |",
            r["records"],
            f(&s["bytes"]) / 1e6,
            f(&s["save_s"]),
            f(&s["cold_load_s"]),
            f(&s["read_s"]),
            f(&s["decode_s"]),
            f(&r["ratios"]["cold_load_over_build"]),
        );
    }
    println!(
        "goals: text query p99 ≤ 20 ms at 1M records; vector p99 ≤ 20 ms at recall@10 ≥ 0.95; freshness p99 ≤ 200 ms (the watch's latency, local); a cold replica's load ≤ 0.2× the build"
    );
    eprintln!("xtask: figures in {}", out.join("search-latest.json").display());
    Ok(())
}
