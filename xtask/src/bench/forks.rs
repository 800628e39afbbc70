//! `cargo xtask bench forks`: what a fork costs (rule 25). A session of `--records` records is
//! added to a generated log of `--size` entries; one process then forks it (one record) and
//! copies it (every record read and written again, the peers' way), reads the fork's context
//! view and its parent's, and reads a session of `--small` records as of a position and now.
//! Every figure is a ratio against its baseline in the same run.

use anyhow::Result;
use serde_json::json;

use super::first_scan::generated_store;
use super::probe::probe;
use super::stores::copy_store;
use super::{bench_binary, chrono_stamp, machine, out_dir, parse_size, size_label};
use crate::flags::ForksArgs;

pub(crate) fn run(a: &ForksArgs) -> Result<()> {
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
        let (records, small, runs) = (a.records.to_string(), a.small.to_string(), a.runs.to_string());
        let v = probe(
            &bin,
            &store,
            false,
            &["forks", "--records", &records, "--small", &small, "--runs", &runs],
        )?;
        rows.push(json!({"backend": backend, "log_entries": size, "figures": v}));
        super::stores::remove_store(&store);
    }
    let stamp = chrono_stamp();
    let doc = json!({"kind": "forks", "date": stamp, "machine": machine(), "rows": rows});
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(out.join(format!("forks-{stamp}.json")), &text)?;
    std::fs::write(out.join("forks-latest.json"), &text)?;
    if a.common.quiet {
        return Ok(());
    }
    if a.common.json {
        println!("{text}");
        return Ok(());
    }
    println!(
        "| backend | log | fork of {} records (entries, bytes, s) | copy | fork / copy (time, bytes) | fork's context view / parent's | as-of read of {} records / current |",
        a.records, a.small
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        let f = &r["figures"];
        let cost = |k: &str| {
            format!(
                "{}, {}, {:.4}",
                f[k]["entries"],
                f[k]["bytes"],
                f[k]["seconds"].as_f64().unwrap_or(f64::NAN)
            )
        };
        let x = |k: &str| f[k].as_f64().map_or("–".into(), |v| format!("{v:.4}×"));
        println!(
            "| {} | {} | {} | {} | {} / {} | {} | {} |",
            r["backend"].as_str().unwrap_or(""),
            size_label(size),
            cost("fork"),
            cost("copy"),
            x("fork_over_copy_seconds"),
            x("fork_over_copy_bytes"),
            x("fork_context_over_parent"),
            x("as_of_over_current"),
        );
    }
    println!("goals: a fork ≤ 0.01× a copy at 10,000 records; an as-of read ≤ 2× a current read");
    eprintln!("xtask: figures in {}", out.join("forks-latest.json").display());
    Ok(())
}
