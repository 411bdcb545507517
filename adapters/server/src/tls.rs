//! TLS on the server's listeners: `[server.tls]`, its certificates read
//! from files (and read again when they change), optional client
//! certificates on gRPC (mutual TLS: Envoy's cluster `transport_socket`).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

use crate::error::ServerError;

/// `[server.tls]`: TLS on both listeners.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// When set, gRPC clients must present a certificate signed by one of
    /// these CAs (PEM): mutual TLS. The HTTP API authenticates with its
    /// bearer token instead.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
}

/// Which listener a configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// gRPC: HTTP/2, client certificates when a client CA is set.
    Grpc,
    /// The HTTP API: HTTP/1.1, no client certificates.
    Http,
}

/// What the files held when they were read: compared to see a change.
pub(crate) type Contents = Vec<Option<Vec<u8>>>;

impl TlsSettings {
    /// The files' contents now (`None` for one that cannot be read).
    pub(crate) fn contents(&self) -> Contents {
        let mut files = vec![&self.cert_file, &self.key_file];
        files.extend(&self.client_ca_file);
        files.into_iter().map(|f| std::fs::read(f).ok()).collect()
    }

    /// The rustls configuration of `listener`, from the files.
    pub(crate) fn server_config(
        &self,
        listener: Listener,
    ) -> Result<Arc<ServerConfig>, ServerError> {
        let chain = certificates(&self.cert_file, "cert_file")?;
        let key = read(&self.key_file, "key_file").and_then(|pem| {
            PrivateKeyDer::from_pem_slice(&pem)
                .map_err(|e| invalid("key_file", &self.key_file, &format!("no private key: {e}")))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("cert_file", &self.cert_file, &e.to_string()))?;
        let builder = match (&self.client_ca_file, listener) {
            (Some(ca_file), Listener::Grpc) => {
                let mut roots = RootCertStore::empty();
                for ca in certificates(ca_file, "client_ca_file")? {
                    roots
                        .add(ca)
                        .map_err(|e| invalid("client_ca_file", ca_file, &e.to_string()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| invalid("client_ca_file", ca_file, &e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| invalid("key_file", &self.key_file, &e.to_string()))?;
        config.alpn_protocols = match listener {
            Listener::Grpc => vec![b"h2".to_vec()],
            Listener::Http => vec![b"http/1.1".to_vec()],
        };
        Ok(Arc::new(config))
    }
}

fn read(path: &PathBuf, field: &'static str) -> Result<Vec<u8>, ServerError> {
    std::fs::read(path).map_err(|e| invalid(field, path, &e.to_string()))
}

/// Every certificate of a PEM file (at least one).
fn certificates(
    path: &PathBuf,
    field: &'static str,
) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let pem = read(path, field)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(field, path, &e.to_string()))?;
    if chain.is_empty() {
        return Err(invalid(field, path, "no PEM certificate in it"));
    }
    Ok(chain)
}

fn invalid(field: &'static str, path: &std::path::Path, why: &str) -> ServerError {
    ServerError::Settings(format!("server.tls.{field} ({}): {why}", path.display()))
}
