//! `ctxlog-conformance`: run the suite against the compiled backends and print a table
//! (case, passed/failed, time). `cargo xtask conformance` builds and runs this.

use clap::Parser;
use ctxlog_conformance::{CASES, backends, run_case};
use serde::Serialize;

#[derive(Parser)]
struct Args {
    /// Run only this backend (default: every backend compiled in).
    #[arg(long)]
    backend: Option<String>,
    /// Run only cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct Outcome {
    backend: &'static str,
    case: &'static str,
    passed: bool,
    seconds: f64,
    error: Option<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let all = backends::all();
    let chosen: Vec<_> = all
        .iter()
        .filter(|b| args.backend.as_deref().is_none_or(|n| n == b.name))
        .copied()
        .collect();
    if chosen.is_empty() {
        let names: Vec<_> = all.iter().map(|b| b.name).collect();
        eprintln!(
            "error: backend {:?} is not compiled into this build (have: {names:?}); enable its cargo feature",
            args.backend.unwrap_or_default()
        );
        return std::process::ExitCode::from(2);
    }
    let mut outcomes = Vec::new();
    for backend in chosen {
        println!("\n## {}\n", backend.name);
        println!("| case | result | time |");
        println!("|------|--------|------|");
        for (case, run) in CASES {
            if args.filter.as_deref().is_some_and(|f| !case.contains(f)) {
                continue;
            }
            let started = std::time::Instant::now();
            let result = run_case(backend, case, *run);
            let seconds = result
                .as_ref()
                .copied()
                .unwrap_or_else(|_| started.elapsed())
                .as_secs_f64();
            let passed = result.is_ok();
            println!(
                "| {}::{case} | {} | {:.2} s |",
                backend.name,
                if passed { "passed" } else { "FAILED" },
                seconds
            );
            if let Err(e) = &result {
                eprintln!("  {e}");
            }
            outcomes.push(Outcome {
                backend: backend.name,
                case,
                passed,
                seconds,
                error: result.err(),
            });
        }
    }
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    println!(
        "\n{} cases, {} passed, {failed} failed",
        outcomes.len(),
        outcomes.len() - failed
    );
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&outcomes).expect("outcomes serialise");
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("error: cannot write {}: {e}", path.display());
            return std::process::ExitCode::from(4);
        }
    }
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
