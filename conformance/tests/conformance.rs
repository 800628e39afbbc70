//! The conformance suite on the in-memory reference store (`ctxlog-core`'s `testing`
//! feature): every case, named `memory::<case>`. It checks the suite itself without
//! building a storage engine.

fn main() -> std::process::ExitCode {
    ctxlog_conformance::main(&[ctxlog_conformance::memory::MEMORY])
}
