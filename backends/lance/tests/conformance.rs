//! The conformance suite on Lance: every case on a local dataset directory
//! (`lance::<case>`), on Lance's in-process object store (`lance_memory::<case>`) and, with
//! the `s3` feature, on the loopback S3 server
//! (`lance_s3::<case>`), each on a fresh store.

mod common;

fn main() -> std::process::ExitCode {
    ctxlog_conformance::main(&[
        common::LANCE,
        common::LANCE_MEMORY,
        #[cfg(feature = "s3")]
        common::LANCE_S3,
    ])
}
