//! TLS for the listeners (`--tls-cert`, `--tls-key`), for teams without a proxy in front:
//! one certificate for all three listeners, re-read on SIGHUP so a renewed certificate is
//! served without a restart.
//!
//! Architecture invariant: a certificate and key that cannot be read, do not parse or do
//! not belong together stop start-up and, on SIGHUP, keep the pair in force; the gRPC
//! listener offers only HTTP/2 in ALPN (gRPC clients insist on it), the others HTTP/2 and
//! HTTP/1.1.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

/// Why a certificate and key were not taken.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {error}")]
    Unreadable {
        what: &'static str,
        path: String,
        error: String,
    },
    #[error("{what} {path} is not usable: {problem}")]
    Unusable {
        what: &'static str,
        path: String,
        problem: String,
    },
}

/// The certificate and key in force, read again by `reload`.
#[derive(Debug)]
pub struct Certificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificate {
    pub fn load(cert_path: PathBuf, key_path: PathBuf) -> Result<Arc<Certificate>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = read(&cert_path, &key_path, &provider)?;
        Ok(Arc::new(Certificate {
            cert_path,
            key_path,
            provider,
            current: RwLock::new(Arc::new(current)),
        }))
    }

    /// Re-reads both files; on a problem the pair in force stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = read(&self.cert_path, &self.key_path, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        Ok(())
    }

    /// The acceptor of a listener: `http2_only` offers only `h2` (gRPC).
    pub fn acceptor(self: &Arc<Self>, http2_only: bool) -> TlsAcceptor {
        let config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        let mut config = config;
        config.alpn_protocols = if http2_only {
            vec![b"h2".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn read(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    const CERT: &str = "the certificate file (--tls-cert)";
    const KEY: &str = "the key file (--tls-key)";
    let file = |what, path: &Path| {
        std::fs::read(path).map_err(|error| TlsError::Unreadable {
            what,
            path: path.display().to_string(),
            error: error.to_string(),
        })
    };
    let unusable = |what, path: &Path, problem: String| TlsError::Unusable {
        what,
        path: path.display().to_string(),
        problem,
    };
    let cert_pem = file(CERT, cert_path)?;
    let key_pem = file(KEY, key_path)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| unusable(CERT, cert_path, format!("{error}")))?;
    if chain.is_empty() {
        return Err(unusable(
            CERT,
            cert_path,
            "it holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the server's \
             certificate first, then its intermediates"
                .into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| {
        unusable(
            KEY,
            key_path,
            format!("{error}; expected a PEM private key (PKCS#8, PKCS#1 or SEC1)"),
        )
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|error| {
        unusable(
            KEY,
            key_path,
            format!("{error}; is it the key of the first certificate in --tls-cert?"),
        )
    })
}
