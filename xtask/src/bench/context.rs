//! `cargo xtask bench context`: what an agent's context costs to read (rule 21). A session of
//! `--records` records is added to a generated log of `--size` entries, with a summary that
//! covers all but its last `--uncovered`; fresh processes then read its context view, and
//! its whole session view, each after a first scan. Reported as medians, with the bytes read
//! (SQLite: bytes the process read from its files; Lance: bytes its object store returned)
//! and the ratio of the context view to the full read, measured in the same run.

use anyhow::Result;
use serde_json::{Value, json};

use super::first_scan::generated_store;
use super::probe::probe;
use super::stats::Stat;
use super::stores::copy_store;
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size, progress, size_label};
use crate::flags::ContextArgs;

pub(crate) fn run(a: &ContextArgs) -> Result<()> {
    let bin = bench_binary(&a.common)?;
    let out = out_dir(&a.common)?;
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let size = parse_size(&a.size)?;
    let quiet = a.common.json || a.common.quiet;
    let mut rows = Vec::new();
    for backend in &a.common.backends {
        let generated = generated_store(&bin, backend, size, (4, 42, quiet), &out)?;
        let store = copy_store(&bin, &generated, &scratch)?;
        let (records, uncovered) = (a.records.to_string(), a.uncovered.to_string());
        probe(
            &bin,
            &store,
            false,
            &["context-setup", "--records", &records, "--uncovered", &uncovered],
        )?;
        // As the generated log is: everything folded into the base table (Lance).
        probe(&bin, &store, false, &["compact"])?;
        let pb = progress(quiet, (2 * a.runs + 1) as u64, &format!("context {backend}"));
        probe(&bin, &store, false, &["context-read"])?; // warm the page cache, untimed
        pb.inc(1);
        let mut series: [(Vec<f64>, Vec<f64>, Value); 2] = Default::default();
        for _ in 0..a.runs {
            for (i, full) in [false, true].into_iter().enumerate() {
                let mut args = vec!["context-read"];
                if full {
                    args.push("--full");
                }
                let v = probe(&bin, &store, false, &args)?;
                series[i].0.push(v["seconds"].as_f64().unwrap_or(0.0));
                series[i].1.push(v["bytes_read"].as_f64().unwrap_or(0.0));
                series[i].2 = v;
                pb.inc(1);
            }
        }
        pb.finish_and_clear();
        let [context, full] = series;
        let (ct, ft) = (Stat::of(context.0), Stat::of(full.0));
        let (cb, fb) = (Stat::of(context.1), Stat::of(full.1));
        let ratio = |a: &Option<Stat>, b: &Option<Stat>| match (a, b) {
            (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
            _ => None,
        };
        rows.push(json!({
            "backend": backend,
            "log_entries": size,
            "session_records": a.records,
            "uncovered": a.uncovered,
            "context_seconds": ct,
            "full_seconds": ft,
            "context_bytes": cb,
            "full_bytes": fb,
            "time_ratio": ratio(&ct, &ft),
            "bytes_ratio": ratio(&cb, &fb),
            "context_last": context.2,
            "full_last": full.2,
        }));
        super::stores::remove_store(&store);
    }
    let stamp = chrono_stamp();
    let doc = json!({"kind": "context", "date": stamp, "machine": machine(), "runs": a.runs, "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("context-{stamp}.json")), &text)?;
    std::fs::write(out.join("context-latest.json"), &text)?;
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    println!(
        "| backend | log | context view ({} of {} records) | full session read | time ratio | bytes (context / full) | bytes ratio |",
        a.uncovered + 1,
        a.records + 1
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let show = |k: &str| {
            serde_json::from_value::<Stat>(r[k].clone())
                .map(|s| s.show())
                .unwrap_or_else(|_| "–".into())
        };
        let bytes = |k: &str| r[k]["median"].as_f64().map_or("–".into(), |b| format!("{:.0}", b));
        let ratio = |k: &str| r[k].as_f64().map_or("–".into(), |x| format!("{x:.4}×"));
        println!(
            "| {} | {} | {} | {} | {} | {} / {} | {} |",
            r["backend"].as_str().unwrap_or(""),
            size_label(size),
            show("context_seconds"),
            show("full_seconds"),
            ratio("time_ratio"),
            bytes("context_bytes"),
            bytes("full_bytes"),
            ratio("bytes_ratio"),
        );
    }
    println!("goal: the context view ≤ 0.05× the full session read at 1M entries");
    eprintln!("xtask: figures in {}", out.join("context-latest.json").display());
    Ok(())
}
