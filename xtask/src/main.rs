//! `cargo xtask`: the project's automation, in Rust. One module per task:
//!
//! - `test`: fmt, tidy, clippy (`-D warnings`), every test under nextest (per-test
//!   timeouts), doc tests, and the bench harness end to end (`smoke`).
//! - `conformance`: the conformance suite on every backend, as a table grouped by rule.
//! - `bench`: `first-scan` and `append` (see `bench/`).
//! - `tidy`: docs and code in step (part of `test`).
//! - `mutants`: mutation testing of the core and the SQLite backend.
//! - `dist`: the Python wheel (carrying the `ctxlog` binary) and sdist, into `target/dist`.
//! - `chaos`: a seeded soak with kills, takeovers, faults and compaction; with `--serve`
//!   (`chaos_serve`), of `ctxlog serve` replicas through HTTP.
//!
//! Every cargo call gets `PROTOC` from a vendored `protoc`, so Lance's build scripts work on
//! a machine with only the Rust toolchain (`cargo.rs`).

// A tool: its reports are dated by the machine's clock.
#![allow(clippy::disallowed_methods)]

mod bench;
mod cargo;
mod chaos;
mod chaos_serve;
mod conformance;
mod dist;
mod flags;
mod imports;
mod mutants;
mod python;
mod s3;
mod smoke;
mod test;
mod tidy;

use clap::Parser;

use crate::flags::{Cli, Task};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cargo::set_verbose(cli.verbose);
    let result = match cli.task {
        Task::Test { args } => test::run(&args),
        Task::Conformance { backend, filter, json } => conformance::run(backend, filter, json),
        Task::Bench(args) => bench::run(args),
        Task::Tidy => tidy::run(),
        Task::Mutants(args) => mutants::run(&args),
        Task::Chaos(args) => chaos::run(&args),
        Task::Dist(args) => dist::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
