//! The server's listeners with TLS, from outside: gRPC with mutual TLS
//! (refused without a client certificate), the HTTP API over TLS, the gRPC
//! bearer token (UNAUTHENTICATED without it), and certificates replaced on
//! disk taken up by new connections.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate_limiter::{ManualClock, Timestamp};
use tollgate_ratelimit_server::Server;
use tollgate_testkit::tls_certificates::TestCertificates;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const START: Timestamp = Timestamp::from_micros(1_780_000_020_000_000);

/// The test's directory: the configuration and the certificate files.
type Dir = common::TempDir;

/// A configuration in `dir` with `server` settings added to `[server]`.
fn config(dir: &Dir, server: &str, tls: bool) -> PathBuf {
    let tls = if tls {
        format!(
            "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n",
            dir.path("server.crt"),
            dir.path("server.key"),
            dir.path("ca.crt"),
        )
    } else {
        String::new()
    };
    let text = common::one_rule_config("", 3, &format!("{server}\n{tls}"));
    let path = dir.0.join("server.toml");
    std::fs::write(&path, text).expect("write the configuration");
    path
}

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user_id".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// A gRPC channel over TLS trusting `ca`, with a client certificate when
/// `identity` is set.
async fn tls_channel(
    addr: std::net::SocketAddr,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://localhost:{}", addr.port()))
        .expect("a URI")
        .tls_config(tls)?
        .connect()
        .await
}

/// Ask once over `channel`: the overall code, or the gRPC error.
async fn ask(channel: Channel, user: &str) -> Result<i32, tonic::Status> {
    RateLimitServiceClient::new(channel)
        .should_rate_limit(request(user))
        .await
        .map(|r| r.into_inner().overall_code)
}

/// `GET path` over TLS trusting `ca`: the status line.
async fn https_get(addr: std::net::SocketAddr, ca: &str, path: &str) -> std::io::Result<String> {
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.expect("a PEM certificate")).expect("a CA");
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("a name");
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await?;
    Ok(answer.lines().next().unwrap_or_default().to_string())
}

async fn start(config: &Path) -> Server {
    Server::start(config, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts")
}

/// Mutual TLS on gRPC: decided with a client certificate, refused without
/// one (and in plain text); the HTTP API answers over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_takes_mutual_tls_and_http_takes_tls() {
    let certs = TestCertificates::generate();
    let dir = Dir::new("tls");
    dir.install(&certs);
    let server = start(&config(&dir, "", true)).await;
    let client = Some((certs.client_cert_pem(), certs.client_key_pem()));

    let channel = tls_channel(server.grpc_addr(), certs.ca_pem(), client)
        .await
        .expect("mutual TLS");
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(ask(channel.clone(), "u1").await.expect("answered"));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, ok, over], "exact over TLS");

    // No client certificate: the handshake (or the first call) fails.
    let refused = match tls_channel(server.grpc_addr(), certs.ca_pem(), None).await {
        Err(_) => true,
        Ok(channel) => ask(channel, "u2").await.is_err(),
    };
    assert!(refused, "mutual TLS refuses a client without a certificate");
    // Plain text on the TLS port decides nothing.
    let plain = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr())).await;
    let plain_refused = match plain {
        Err(_) => true,
        Ok(mut c) => c.should_rate_limit(request("u3")).await.is_err(),
    };
    assert!(plain_refused, "plain text on the TLS port");

    let status = https_get(server.http_addr(), certs.ca_pem(), "/healthz")
        .await
        .expect("HTTPS");
    assert!(status.contains("200"), "{status}");
    server.shutdown().await;
}

/// With `grpc_token_env`, a call without the bearer token is refused with
/// UNAUTHENTICATED (never decided); with it, decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_without_the_token_is_unauthenticated() {
    std::env::set_var("TOLLGATE_TEST_GRPC_TOKEN", "grpc-s3cret-token");
    let dir = Dir::new("tls");
    let server = start(&config(
        &dir,
        "grpc_token_env = \"TOLLGATE_TEST_GRPC_TOKEN\"",
        false,
    ))
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .expect("connect");
    let refused = client
        .should_rate_limit(request("t1"))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let mut wrong = tonic::Request::new(request("t1"));
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer grpc-s3cret-tokem".parse().unwrap());
    let refused = client
        .should_rate_limit(wrong)
        .await
        .expect_err("wrong token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    for expected in [3, 2] {
        let mut asked = tonic::Request::new(request("t1"));
        asked
            .metadata_mut()
            .insert("authorization", "Bearer grpc-s3cret-token".parse().unwrap());
        let answer = client
            .should_rate_limit(asked)
            .await
            .expect("the token")
            .into_inner();
        assert_eq!(
            answer.statuses[0].limit_remaining,
            expected - 1,
            "the refused calls charged nothing"
        );
    }
    server.shutdown().await;
}

/// Certificates replaced on disk are taken up by new connections (after
/// they stood still for a look): a client trusting only the new CA gets
/// in, one trusting only the old one no longer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_certificates_are_taken_up() {
    let old = TestCertificates::generate();
    let new = TestCertificates::generate();
    let dir = Dir::new("tls");
    dir.install(&old);
    let server = start(&config(&dir, "", true)).await;
    let addr = server.grpc_addr();
    let with = |certs: &TestCertificates| {
        let ca = certs.ca_pem().to_string();
        let identity = (
            certs.client_cert_pem().to_string(),
            certs.client_key_pem().to_string(),
        );
        async move {
            let channel = tls_channel(addr, &ca, Some((&identity.0, &identity.1))).await;
            match channel {
                Ok(channel) => ask(channel, "r1").await.is_ok(),
                Err(_) => false,
            }
        }
    };
    assert!(with(&old).await, "the old certificates at first");
    dir.install(&new);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !with(&new).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificates were not taken up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !with(&old).await,
        "the old CA no longer verifies the server"
    );
    server.shutdown().await;
}

/// TLS settings the server cannot use stop it at start, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_tls_settings_are_named_at_start() {
    let certs = TestCertificates::generate();
    let dir = Dir::new("tls");
    dir.install(&certs);
    let config = config(&dir, "", true);
    std::fs::write(dir.0.join("server.key"), "not a key").expect("write");
    let error = Server::start(&config, Arc::new(ManualClock::new(START)))
        .await
        .expect_err("no private key");
    assert!(error.to_string().contains("server.tls.key_file"), "{error}");
    std::fs::remove_file(dir.0.join("ca.crt")).expect("remove");
    dir.install(&certs);
    std::fs::write(dir.0.join("ca.crt"), "").expect("write");
    let error = Server::start(&config, Arc::new(ManualClock::new(START)))
        .await
        .expect_err("no CA certificate");
    assert!(
        error.to_string().contains("server.tls.client_ca_file"),
        "{error}"
    );
}
