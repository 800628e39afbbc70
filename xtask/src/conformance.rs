//! `cargo xtask conformance`: the conformance suite on every backend (each backend crate's
//! `tests/conformance.rs`, the reference store's, and the multi-process cases of
//! the CLI), as one table grouped by rule. Each test run appends its result to a report
//! (`CTXLOG_CONFORMANCE_REPORT`), which this task reads back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::cargo;

/// The environment variable the suite's runner writes its results to (see
/// `ctxlog_conformance::REPORT_ENV`).
const REPORT_ENV: &str = "CTXLOG_CONFORMANCE_REPORT";

pub(crate) fn run(backend: Option<String>, filter: Option<String>, json: Option<PathBuf>) -> Result<()> {
    let dir = cargo::target_dir()?.join("ctxlog-conformance");
    std::fs::create_dir_all(&dir)?;
    let report = dir.join("report.jsonl");
    let _ = std::fs::remove_file(&report);
    let mut expr = String::from("(binary(conformance) | binary(multiprocess))");
    if let Some(b) = &backend {
        expr = format!("{expr} & test(/^{}::/)", regex_escape(b));
    }
    if let Some(f) = &filter {
        expr = format!("{expr} & test(~{f})");
    }
    let mut cmd = cargo::nextest(&[
        "run",
        "--workspace",
        "--all-features",
        "--profile",
        "ci",
        "--no-fail-fast",
        "-E",
        &expr,
    ])?;
    cmd.env(REPORT_ENV, &report);
    let ran = cargo::step("conformance suite", &mut cmd);

    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let results: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()
        .context("the conformance report")?;
    let results: Vec<Value> = results
        .into_iter()
        .filter(|r| backend.as_deref().is_none_or(|b| r["backend"] == b))
        .collect();
    println!("{}", table(&results));
    if let Some(path) = json {
        std::fs::write(&path, serde_json::to_string_pretty(&results)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|r| r["passed"] == false)
        .map(|r| {
            format!(
                "{}::{}: {}",
                r["backend"].as_str().unwrap_or("?"),
                r["case"].as_str().unwrap_or("?"),
                r["error"].as_str().unwrap_or("")
            )
        })
        .collect();
    for f in &failed {
        eprintln!("xtask: FAILED {f}");
    }
    ran?;
    if results.is_empty() {
        bail!("no conformance case ran (filter: {expr})");
    }
    if !failed.is_empty() {
        bail!("{} conformance case(s) failed", failed.len());
    }
    Ok(())
}

/// A markdown table per rule: one row per case, one column per backend.
fn table(results: &[Value]) -> String {
    let mut backends: Vec<String> = results
        .iter()
        .filter_map(|r| r["backend"].as_str().map(String::from))
        .collect();
    backends.sort();
    backends.dedup();
    let mut by_rule: BTreeMap<String, BTreeMap<String, BTreeMap<String, &Value>>> = BTreeMap::new();
    for r in results {
        let (Some(rule), Some(case), Some(backend)) = (r["rule"].as_str(), r["case"].as_str(), r["backend"].as_str())
        else {
            continue;
        };
        by_rule
            .entry(rule.to_string())
            .or_default()
            .entry(case.to_string())
            .or_default()
            .insert(backend.to_string(), r);
    }
    // In the contract's order: by the first rule number a group names.
    let number = |rule: &str| -> u32 {
        let digits: String = rule
            .chars()
            .skip_while(|c| !c.is_ascii_digit())
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or(u32::MAX)
    };
    let mut groups: Vec<_> = by_rule.iter().collect();
    groups.sort_by_key(|(rule, _)| (number(rule), rule.len()));
    let mut out = String::new();
    let (mut passed, mut total) = (0, 0);
    for (rule, cases) in groups {
        out.push_str(&format!("\n### {rule}\n\n| case | {} |\n|---|", backends.join(" | ")));
        out.push_str(&"---|".repeat(backends.len()));
        out.push('\n');
        for (case, per_backend) in cases {
            out.push_str(&format!("| {case} |"));
            for b in &backends {
                let cell = match per_backend.get(b) {
                    None => " |".to_string(),
                    Some(r) => {
                        total += 1;
                        let secs = r["seconds"].as_f64().unwrap_or(0.0);
                        if r["passed"] == true {
                            passed += 1;
                            format!(" ok {secs:.2} s |")
                        } else if r["passed"].is_null() {
                            total -= 1;
                            " n/a |".to_string()
                        } else {
                            " FAILED |".to_string()
                        }
                    }
                };
                out.push_str(&cell);
            }
            out.push('\n');
        }
    }
    out.push_str(&format!("\n{passed} of {total} passed\n"));
    out
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                vec![c]
            } else {
                vec!['\\', c]
            }
        })
        .collect()
}
