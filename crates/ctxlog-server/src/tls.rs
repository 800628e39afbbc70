//! TLS from a certificate chain and a private key in PEM files (rustls with `ring`, TLS 1.2
//! and 1.3, HTTP/2 and HTTP/1.1 by ALPN). Without them the server speaks plain HTTP and is
//! meant for loopback or a terminating proxy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;

use crate::StartError;

/// The certificate chain and key files of a replica that serves TLS.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM: the server's certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

fn bad(path: &Path, reason: impl ToString) -> StartError {
    StartError::Tls {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

pub(crate) fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, StartError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| bad(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&files.cert, e))?;
    if certs.is_empty() {
        return Err(bad(&files.cert, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| bad(&files.key, e))?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&files.cert, e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        // The key does not match the certificate, or is of a kind rustls does not sign with.
        .map_err(|e| bad(&files.key, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // certificate files, not store files
    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        TlsFiles { cert: c, key: k }
    }

    #[test]
    fn unusable_files_name_the_file_at_fault() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TlsFiles {
            cert: dir.path().join("none.pem"),
            key: dir.path().join("none-key.pem"),
        };
        match acceptor(&missing).err() {
            Some(StartError::Tls { path, .. }) => assert_eq!(path, missing.cert),
            other => panic!("{other:?}"),
        }
        let empty = files(dir.path(), "", "");
        match acceptor(&empty).err() {
            Some(StartError::Tls { path, reason }) => {
                assert_eq!(path, empty.cert);
                assert!(reason.contains("no certificate"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let not_a_cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let no_key = files(dir.path(), not_a_cert, "");
        match acceptor(&no_key).err() {
            Some(StartError::Tls { path, .. }) => assert_eq!(path, no_key.key),
            other => panic!("{other:?}"),
        }
    }
}
