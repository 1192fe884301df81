//! TLS of the server (`--tls-cert`, `--tls-key`): the certificate chain and private key read
//! from PEM files once, at startup, into a rustls configuration. Anything wrong with them is
//! an error naming the file, before the server listens. The crypto provider is aws-lc-rs,
//! the one reqwest already uses for the client side: one provider in the binary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Where the server's certificate chain and private key are (PEM).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The server certificate first, then any intermediates.
    pub cert: PathBuf,
    /// Its private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("can not read the TLS {what} {}: {error}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("invalid TLS certificate file {}: {message}", path.display())]
    Cert { path: PathBuf, message: String },
    #[error("invalid TLS key file {}: {message}", path.display())]
    Key { path: PathBuf, message: String },
    #[error(
        "the TLS key {} is not the private key of the certificate {} (its first one)",
        key.display(),
        cert.display()
    )]
    Mismatch { cert: PathBuf, key: PathBuf },
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read {
        what,
        path: path.to_path_buf(),
        error,
    })
}

/// The certificates of a PEM file, in order (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read("certificate", path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Cert {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Cert {
            path: path.to_path_buf(),
            message: "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        });
    }
    Ok(certs)
}

/// The first private key of a PEM file.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Key {
        path: path.to_path_buf(),
        message: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key (PKCS#8, RSA or EC) in it".into()
            }
            e => e.to_string(),
        },
    })
}

/// The rustls configuration of a server with these files: TLS 1.2 and 1.3, HTTP/1.1 by ALPN.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = certificates(&files.cert)?;
    let key = private_key(&files.key)?;
    warn_if_readable_by_others(&files.key);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the provider supports the default TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
            },
            // a key the provider can not use (an unsupported algorithm or curve)
            e => TlsError::Key {
                path: files.key.clone(),
                message: e.to_string(),
            },
        })?;
    // HTTP/1.1 only: hyper's header-read timeout, which cuts off slow clients, is HTTP/1's
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A private key every user can read is worth a line in the log (not an error: a
/// container may run with a umask it does not choose; group-readable is a common layout).
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o004 != 0
    {
        tracing::warn!(
            key = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "the TLS private key can be read by every user of this machine; chmod o-r it"
        );
    }
}
