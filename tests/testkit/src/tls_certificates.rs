//! Certificates for TLS test servers, made at run time: a CA, a server
//! certificate for `localhost` and `127.0.0.1` signed by it, and a client
//! certificate signed by it, written as PEM files into a temporary
//! directory that is removed on drop.
//!
//! ```no_run
//! use tollgate_testkit::redis_server::RedisServer;
//! use tollgate_testkit::tls_certificates::TestCertificates;
//!
//! let certs = TestCertificates::generate();
//! let server = RedisServer::start_tls(&certs, &[]);
//! let url = server.tls_url().unwrap(); // "rediss://127.0.0.1:<port>/"
//! let ca = certs.ca_pem();             // for the client's trust store
//! # let _ = (url, ca);
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA with a server and a client certificate, as PEM text and files.
#[derive(Debug)]
pub struct TestCertificates {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    dir: PathBuf,
}

/// The server certificate a [`TestCertificates`] makes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerCertificate {
    /// For `localhost` and `127.0.0.1`, valid now.
    Valid,
    /// For `localhost` and `127.0.0.1`, expired (valid in 2001–2002).
    Expired,
    /// Valid now, for this host name only (not the loopback a test
    /// connects to).
    ForHost(String),
}

impl TestCertificates {
    /// Make a fresh CA and the two certificates it signs, and write them.
    ///
    /// # Panics
    ///
    /// When a key cannot be generated or the files cannot be written.
    pub fn generate() -> TestCertificates {
        Self::generate_with(ServerCertificate::Valid)
    }

    /// As [`generate`](Self::generate), with a server certificate that is
    /// `server` (expired, or for another host: to see how a client
    /// reports it).
    ///
    /// # Panics
    ///
    /// As [`generate`](Self::generate).
    pub fn generate_with(server: ServerCertificate) -> TestCertificates {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Tollgate test CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("self-signed CA");

        let leaf = |names: Vec<String>, common_name: &str, expired: bool| {
            let mut params = CertificateParams::new(names).expect("leaf params");
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            if expired {
                params.not_before = rcgen::date_time_ymd(2001, 1, 1);
                params.not_after = rcgen::date_time_ymd(2002, 1, 1);
            }
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &ca).expect("leaf signed by the CA");
            (cert.pem(), key.serialize_pem())
        };
        // Redis presents the server certificate on the cluster bus and to
        // its primary too, so it has no usage restriction.
        let loopback = || vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let (server_cert, server_key) = match server {
            ServerCertificate::Valid => leaf(loopback(), "redis", false),
            ServerCertificate::Expired => leaf(loopback(), "redis", true),
            ServerCertificate::ForHost(host) => leaf(vec![host], "redis", false),
        };
        let (client_cert, client_key) = leaf(Vec::new(), "tollgate-client", false);

        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let certs = TestCertificates {
            ca: ca.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
            dir,
        };
        for (name, text) in [
            ("ca.crt", &certs.ca),
            ("server.crt", &certs.server_cert),
            ("server.key", &certs.server_key),
        ] {
            std::fs::write(certs.dir.join(name), text).expect("write a certificate file");
        }
        certs
    }

    /// The CA certificate (PEM): what a client trusts.
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The client certificate (PEM), signed by the CA.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert
    }

    /// The client certificate's private key (PEM).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key
    }

    /// The directory holding `ca.crt`, `server.crt` and `server.key`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `redis-server` arguments presenting the server certificate and
    /// trusting the CA (for client certificates, replication and the
    /// cluster bus).
    pub fn server_args(&self) -> Vec<String> {
        let file = |name: &str| self.dir.join(name).to_string_lossy().into_owned();
        vec![
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
        ]
    }
}

impl Drop for TestCertificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
