//! The conformance suite on Lance: every case, named `lance::<case>`, each on a fresh
//! dataset directory.

mod common;

fn main() -> std::process::ExitCode {
    ctxlog_conformance::main(&[common::LANCE])
}
