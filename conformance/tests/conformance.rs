//! The conformance suite on the reference store (`ctxlog-core`'s `testing`
//! feature): every case, named `reference::<case>`. It checks the suite itself without
//! building a storage engine.

fn main() -> std::process::ExitCode {
    ctxlog_conformance::main(&[ctxlog_conformance::reference::REFERENCE])
}
