//! The S3 server on loopback that tests, soaks and benches run Lance against: one per run.

use anyhow::Result;

use crate::cargo;

/// The S3 server on loopback for this run: moto, installed under the target directory the
/// first time (python3 with venv is all it needs).
pub(crate) fn server() -> Result<s3_loopback::Server> {
    let started = std::time::Instant::now();
    let venv = cargo::target_dir()?
        .join("s3-loopback")
        .join(format!("moto-{}", s3_loopback::MOTO_VERSION));
    let server = s3_loopback::Server::start(&venv).map_err(|e| anyhow::anyhow!("the S3 server on loopback: {e}"))?;
    eprintln!(
        "xtask: S3 server on loopback … ok ({}, {:.1} s)",
        server.endpoint(),
        started.elapsed().as_secs_f64()
    );
    Ok(server)
}
