//! TLS for the Redis stores: the CA that signs the servers' certificates
//! and a client certificate for mutual TLS, on top of a `rediss://` URL.
//!
//! The `tls` feature builds redis-rs with rustls (and its `ring` crypto),
//! so no system OpenSSL is needed. Without [`Tls`] a `rediss://` URL is
//! verified against the system's trust store.

use std::fmt;

use redis::{ClientTlsConfig, TlsCertificates};

/// TLS settings beyond the URL (the URL's `rediss://` turns TLS on): a CA
/// to trust instead of the system's trust store, and a client certificate
/// with its key for servers that require one (`tls-auth-clients yes`,
/// Redis's default). Every value is PEM text.
///
/// ```
/// use tollgate_redis::Tls;
///
/// # let (ca, cert, key) = (Vec::<u8>::new(), Vec::<u8>::new(), Vec::<u8>::new());
/// let tls = Tls::new().ca_pem(ca).client_pem(cert, key);
/// # let _ = tls;
/// ```
#[derive(Clone, Default)]
pub struct Tls {
    ca: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    // The key is secret, and certificates are noise in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    /// No CA of its own (the system's trust store), no client certificate.
    pub fn new() -> Self {
        Tls::default()
    }

    /// Trust the CA (or CAs) in `pem` instead of the system's trust store.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Present this certificate (chain) and private key to the server
    /// (mutual TLS).
    pub fn client_pem(mut self, certificate: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client = Some((certificate.into(), key.into()));
        self
    }

    /// As redis-rs takes them.
    pub(crate) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert: client_cert.clone(),
                    client_key: client_key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Make rustls's `ring` provider the process's default, unless one was
/// chosen already. redis-rs builds its TLS configuration with the
/// process's default, and rustls cannot pick one when the build has two
/// (an application whose other crates turn on `aws-lc-rs`, as many HTTP
/// clients do): it panicked inside the connect. An application that
/// chose its own provider keeps it.
pub(crate) fn choose_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
