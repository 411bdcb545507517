//! The server from outside: a real tonic client sends real
//! `ShouldRateLimit` requests, a real HTTP client calls the API, on the
//! in-process store with a manual clock and on a real Redis.

use crate::common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{client, descriptor};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_limiter::{ManualClock, Timestamp};
use tollgate_ratelimit_server::Server;
use tollgate_testkit::redis_server::RedisServer;

const START: Timestamp = Timestamp::from_micros(1_780_000_020_000_000);

const LIMITS: &str = r#"
[policies.per-user]
algorithm = "fixed_window"
limit = 5
window = "1m"

[policies.per-tenant]
algorithm = "fixed_window"
limit = 8
window = "1m"

[policies.login]
algorithm = "sliding_log"
limit = 2
window = "1m"
on_failure = "fail_closed"

[routes.api]
layers = [
    { name = "user", scope = "subject", policy = "per-user" },
    { name = "tenant", scope = "tenant", policy = "per-tenant" },
]

[routes.login]
layers = [{ name = "ip", scope = "subject", policy = "login" }]

[policies.exports]
algorithm = "concurrency"
limit = 1
lease = "30s"

[routes.export]
layers = [{ name = "in-flight", scope = "subject", policy = "exports" }]
"#;

fn server_section(extra: &str) -> String {
    format!(
        r#"
[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
{extra}

[[server.rules]]
name = "api"
domain = "edge"
route = "api"
entries = {{ user_id = "subject", tenant_id = "tenant" }}

[[server.rules]]
name = "login"
domain = "edge"
route = "login"
entries = {{ remote_address = "subject" }}
values = {{ generic_key = "login" }}
"#
    )
}

/// A configuration file of its own (removed on drop).
struct File(std::path::PathBuf);

impl File {
    fn new(text: &str) -> File {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "tollgate-ratelimit-server-{}-{n}.toml",
            std::process::id()
        ));
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .expect("write the configuration");
        File(path)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A server on its own configuration file: [`LIMITS`] and the
/// `[server]` section with `extra`, on a manual clock at [`START`].
async fn start_with(extra: &str) -> (File, Server) {
    let file = File::new(&format!("{LIMITS}{}", server_section(extra)));
    let server = Server::start(&file.0, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts");
    (file, server)
}

/// A server whose rules answer in `domain` (not "edge"): counters of
/// their own, whatever other tests ask at once.
async fn start_in_domain(domain: &str) -> (File, Server) {
    let section =
        server_section("").replace("domain = \"edge\"", &format!("domain = \"{domain}\""));
    let file = File::new(&format!("{LIMITS}{section}"));
    let server = Server::start(&file.0, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts");
    (file, server)
}

fn user(id: &str, tenant: &str) -> RateLimitDescriptor {
    descriptor(&[("user_id", id), ("tenant_id", tenant)], None)
}

fn login(ip: &str) -> RateLimitDescriptor {
    descriptor(&[("generic_key", "login"), ("remote_address", ip)], None)
}

async fn ask(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .expect("answered")
        .into_inner()
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// A call larger than any real request is refused before it is decoded:
/// open calls cannot hold tonic's default of 4 MiB each.
#[tokio::test]
async fn an_oversized_call_is_refused() {
    let file = File::new(&format!("{LIMITS}{}", server_section("")));
    let server = Server::start(&file.0, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;
    let huge = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![login(&"1".repeat(300 * 1024))],
        hits_addend: 0,
    };
    let refused = c.should_rate_limit(huge).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    let r = ask(&mut c, vec![login("10.0.0.1")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]), "the connection still serves");
}

/// Several descriptors decided together, all-or-nothing, with exact
/// numbers; hits_addend; unknown descriptors allowed by default.
#[tokio::test]
async fn should_rate_limit_decides_descriptors_together() {
    let file = File::new(&format!("{LIMITS}{}", server_section("")));
    let clock = ManualClock::new(START);
    let server = Server::start(&file.0, Arc::new(clock.clone()))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;

    // One request, two descriptors: both charged.
    let r = ask(&mut c, vec![user("u1", "acme"), login("10.0.0.1")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(r.statuses[0].limit_remaining, 4, "per-user: 5 - 1");
    assert_eq!(r.statuses[1].limit_remaining, 1, "login: 2 - 1");
    let limit = r.statuses[0].current_limit.as_ref().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (5, 2),
        "5 per MINUTE"
    );
    assert!(
        r.response_headers_to_add
            .iter()
            .any(|h| h.key == "ratelimit"),
        "{:?}",
        r.response_headers_to_add
    );

    // The login descriptor runs out: the request is over the limit and
    // the api descriptor is not charged.
    let r = ask(&mut c, vec![user("u1", "acme"), login("10.0.0.1")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    let r = ask(&mut c, vec![user("u1", "acme"), login("10.0.0.1")], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    let over = &r.statuses[1];
    assert_eq!(over.limit_remaining, 0);
    let wait = over.duration_until_reset.expect("a wait");
    assert_eq!(
        (wait.seconds, wait.nanos),
        (60, 0),
        "exact: the log's oldest entry ages out in 60 s"
    );
    assert!(r
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "retry-after"));
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "5 - 3: the denied request charged nothing"
    );

    // hits_addend: per request, and per descriptor (which wins).
    let r = ask(&mut c, vec![user("u2", "acme")], 3).await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "5 - 3");
    let r = ask(
        &mut c,
        vec![descriptor(
            &[("user_id", "u2"), ("tenant_id", "acme")],
            Some(2),
        )],
        3,
    )
    .await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OK, 0),
        "2 - 2"
    );
    let r = ask(&mut c, vec![user("u2", "acme")], 9).await;
    assert_eq!(r.overall_code, OVER, "more than the limit can ever hold");
    // A descriptor's own 0 checks without charging: u2 is full, u4 not.
    let check_only = |user: &str| descriptor(&[("user_id", user), ("tenant_id", "acme4")], Some(0));
    let r = ask(
        &mut c,
        vec![descriptor(
            &[("user_id", "u2"), ("tenant_id", "acme")],
            Some(0),
        )],
        3,
    )
    .await;
    assert_eq!(r.overall_code, OVER, "full: one more unit would be refused");
    let checked = ask(&mut c, vec![check_only("u4")], 3).await;
    assert_eq!(checked.overall_code, OK);
    let again = ask(&mut c, vec![check_only("u4")], 3).await;
    assert_eq!(
        again.statuses[0].limit_remaining, checked.statuses[0].limit_remaining,
        "nothing charged"
    );
    let charged = ask(
        &mut c,
        vec![descriptor(
            &[("user_id", "u4"), ("tenant_id", "acme4")],
            None,
        )],
        1,
    )
    .await;
    assert_eq!(
        charged.statuses[0].limit_remaining, 4,
        "the first unit charged: 5 - 1"
    );

    // The tenant layer is shared: u1 and u2 used 3 + 5 of acme's 8.
    let r = ask(&mut c, vec![user("u3", "acme")], 0).await;
    assert_eq!(r.overall_code, OVER, "acme is out: {r:?}");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(8)
    );

    // Unknown descriptors: allowed (Envoy's default), no limit reported.
    let r = ask(
        &mut c,
        vec![descriptor(&[("path", "/x")], None), user("u4", "globex")],
        0,
    )
    .await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert!(r.statuses[0].current_limit.is_none());

    // A window later everything is back.
    clock.advance(Duration::from_secs(60));
    let r = ask(&mut c, vec![user("u1", "acme"), login("10.0.0.1")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));

    // A value that cannot be a subject is counted (hashed), never refused:
    // an error answer would be an allow in Envoy.
    let odd = || vec![user("has space", "globex")];
    let r = ask(&mut c, odd(), 0).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 4));
    let r = ask(&mut c, odd(), 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 3, "the same key");

    // A key named twice matches no rule (here: unknown, allowed), never
    // a rule it only half fits.
    let twice = descriptor(
        &[("remote_address", "10.0.0.1"), ("remote_address", "x")],
        None,
    );
    let r = ask(&mut c, vec![twice], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    assert!(r.statuses[0].current_limit.is_none(), "not the login rule");

    // More descriptors than a request may carry: over the limit, nothing
    // decided.
    let many: Vec<_> = (0..65).map(|i| user(&format!("m{i}"), "many")).collect();
    let r = ask(&mut c, many, 0).await;
    assert_eq!(r.overall_code, OVER);
    let r = ask(&mut c, vec![user("m0", "many")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4, "nothing was charged");
    server.shutdown().await;
}

/// `unknown_descriptors = "deny"`: an unknown descriptor is over the
/// limit, and the known ones are not charged.
#[tokio::test]
async fn unknown_descriptors_can_be_denied() {
    let (_file, server) = start_with("unknown_descriptors = \"deny\"").await;
    let mut c = client(server.grpc_addr()).await;
    let r = ask(
        &mut c,
        vec![user("u1", "acme"), descriptor(&[("path", "/x")], None)],
        0,
    )
    .await;
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 4,
        "the first request charged nothing"
    );
    server.shutdown().await;
}

/// On Redis: a stopped Redis answers per the failure mode, within the
/// deadline — the fail-closed login policy OVER_LIMIT (not a gRPC error),
/// the fail-open api policy OK — and `/readyz` says not ready.
#[tokio::test]
async fn a_stopped_redis_answers_per_the_failure_mode() {
    let redis = RedisServer::start();
    let store = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ndeadline = \"100ms\"\n",
        redis.url()
    );
    let file = File::new(&format!(
        "{store}{}{}",
        LIMITS
            .replace(
                "window = \"1m\"\n\n[policies.per-tenant]",
                "window = \"1m\"\non_failure = \"fail_open\"\n\n[policies.per-tenant]"
            )
            .replace(
                "limit = 8\nwindow = \"1m\"",
                "limit = 8\nwindow = \"1m\"\non_failure = \"fail_open\""
            ),
        server_section("")
    ));
    let server = Server::start(&file.0, Arc::new(tollgate_limiter::MonotonicClock::new()))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;
    let r = ask(&mut c, vec![login("10.0.0.9")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]), "Redis decides");
    let http = format!("http://{}", server.http_addr());
    assert_eq!(get(&format!("{http}/readyz")).await.0, 200);
    // The store's latency is a histogram with buckets, not a summary.
    let (_, metrics) = get(&format!("{http}/metrics")).await;
    assert!(
        metrics.contains("tollgate_store_latency_seconds_bucket{"),
        "{metrics}"
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("tollgate_store_latency_seconds{") && l.contains("quantile")),
        "{metrics}"
    );

    redis.pause();
    let started = Instant::now();
    let r = ask(&mut c, vec![login("10.0.0.9")], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]), "fail-closed: over the limit");
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]), "fail-open: allowed");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "two answers within their deadlines: {:?}",
        started.elapsed()
    );
    assert_eq!(get(&format!("{http}/readyz")).await.0, 503);
    redis.resume();
    server.shutdown().await;
}

async fn get(url: &str) -> (u16, String) {
    send("GET", url, &[], "").await
}

/// `request` written as is to `addr`, and everything the server answers
/// until it closes.
async fn raw_http(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut peer = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    peer.write_all(request.as_bytes()).await.expect("sent");
    let mut answer = Vec::new();
    let read = peer.read_to_end(&mut answer);
    tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .expect("the server answers and closes")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let client: Client<_, Full<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut request = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client
        .request(
            request
                .body(Full::from(body.to_string()))
                .expect("a request"),
        )
        .await
        .expect("answered");
    let status = response.status().as_u16();
    let mut head = String::new();
    for (k, v) in response.headers() {
        head += &format!("{k}: {}\n", v.to_str().unwrap_or(""));
    }
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (
        status,
        format!("{head}\n{}", String::from_utf8_lossy(&body)),
    )
}

/// The HTTP API: the bearer token, the decision with an adapter's headers
/// and status, bad bodies, the body limit, health, and Prometheus metrics
/// that parse.
#[tokio::test]
async fn the_http_api_decides_and_reports() {
    std::env::set_var("TOLLGATE_TEST_API_TOKEN", "s3cret-token");
    let (_file, server) =
        start_with("api_token_env = \"TOLLGATE_TEST_API_TOKEN\"\nmax_body_bytes = 2048").await;
    let base = format!("http://{}", server.http_addr());
    let check = format!("{base}/v1/check");
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"login"},{"key":"remote_address","value":"10.1.1.1"}]}]}"#;
    let auth = [("authorization", "Bearer s3cret-token")];

    let (status, text) = send("POST", &check, &[], body).await;
    assert_eq!(status, 401, "{text}");
    let (status, _) = send(
        "POST",
        &check,
        &[("authorization", "Bearer wrong-token!")],
        body,
    )
    .await;
    assert_eq!(status, 401);
    for expected in [200, 200, 429] {
        let (status, text) = send("POST", &check, &auth, body).await;
        assert_eq!(status, expected, "{text}");
        assert!(text.contains("ratelimit: \"login\";r="), "{text}");
        if expected == 429 {
            assert!(text.contains("retry-after: 60"), "{text}");
            assert!(text.contains(r#""overall":"OVER_LIMIT""#), "{text}");
            assert!(
                text.contains(r#""duration_until_reset_ms":60000"#),
                "{text}"
            );
        }
    }
    let (status, text) = send("POST", &check, &auth, "{not json").await;
    assert_eq!(status, 400, "{text}");
    let big = format!(r#"{{"domain":"{}","descriptors":[]}}"#, "x".repeat(4096));
    let (status, _) = send("POST", &check, &auth, &big).await;
    assert_eq!(status, 413, "over max_body_bytes");
    // A body that cannot be read is the client's error, not a size.
    let malformed = "POST /v1/check HTTP/1.1\r\nhost: x\r\nauthorization: Bearer s3cret-token\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n";
    let answer = raw_http(server.http_addr(), malformed).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);
    let (status, text) = get(&format!("{base}/metrics")).await;
    assert_eq!(status, 200);
    let metrics = text.split_once("\n\n").map_or("", |(_, b)| b);
    let mut decisions = 0.0;
    for line in metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line.rsplit_once(' ').expect("name value");
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        if name.starts_with("tollgate_decisions_total{policy=\"login\"") {
            decisions += value;
        }
    }
    assert!(
        decisions >= 3.0,
        "the three login decisions are counted:\n{metrics}"
    );
    server.shutdown().await;
}

/// A changed file is applied by a reload; an invalid one is refused and
/// the running limits are kept.
#[tokio::test]
async fn reloads_apply_valid_files_only() {
    let (file, server) = start_with("").await;
    let mut c = client(server.grpc_addr()).await;
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    std::fs::write(
        &file.0,
        format!(
            "{}{}",
            LIMITS.replacen("limit = 5", "limit = 9", 1),
            server_section("")
        ),
    )
    .expect("rewrite");
    server.reload().await.expect("reloaded");
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    // The tightest layer is now the tenant's (8 - 2), not the user's (9 - 2;
    // 5 - 2 without the reload): the count is kept, the limit raised.
    assert_eq!(r.statuses[0].limit_remaining, 6);
    let limit = r.statuses[0].current_limit.as_ref();
    assert_eq!(limit.map(|l| l.requests_per_unit), Some(8));
    std::fs::write(
        &file.0,
        format!(
            "{LIMITS}{}",
            server_section("").replace("route = \"login\"", "route = \"nowhere\"")
        ),
    )
    .expect("rewrite");
    let e = server.reload().await.expect_err("refused");
    assert!(e.to_string().contains("nowhere"), "{e}");
    std::fs::write(
        &file.0,
        format!(
            "{LIMITS}{}",
            server_section("").replace("127.0.0.1:0", "127.0.0.1:1")
        ),
    )
    .expect("rewrite");
    let e = server.reload().await.expect_err("refused");
    assert!(e.to_string().contains("restart"), "{e}");
    // A new in-process store would start empty: a restart's, too.
    let resized = format!(
        "[store]\nkind = \"memory\"\nmax_keys = 5000\n{LIMITS}{}",
        server_section("")
    );
    std::fs::write(&file.0, resized).expect("rewrite");
    let e = server.reload().await.expect_err("refused");
    assert!(e.to_string().contains("restart"), "{e}");
    assert!(e.to_string().contains("[store]"), "{e}");
    let r = ask(&mut c, vec![user("u1", "acme")], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 5,
        "8 - 3: the running limits were kept"
    );
    server.shutdown().await;
}

/// On a 6-node Redis Cluster: descriptors whose subjects live on different
/// slots are still decided together, all-or-nothing.
#[tokio::test]
async fn a_cluster_store_decides_descriptors_together() {
    let cluster = tollgate_testkit::redis_cluster::RedisCluster::shared();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let file = File::new(&format!(
        "[store]\nkind = \"redis-cluster\"\nnodes = [{}]\nprefix = \"{}\"\n{LIMITS}{}",
        nodes.join(", "),
        tollgate_testkit::conformance::unique("srv"),
        server_section("")
    ));
    let server = Server::start(&file.0, Arc::new(tollgate_limiter::MonotonicClock::new()))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;
    let both = || vec![user("cu1", "cacme"), login("10.2.0.1")];
    assert_eq!(codes(&ask(&mut c, both(), 0).await), (OK, vec![OK, OK]));
    assert_eq!(codes(&ask(&mut c, both(), 0).await), (OK, vec![OK, OK]));
    assert_eq!(codes(&ask(&mut c, both(), 0).await), (OVER, vec![OK, OVER]));
    let r = ask(&mut c, vec![user("cu1", "cacme")], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "5 - 3: the denied request charged nothing"
    );
    server.shutdown().await;
}

/// The watcher applies a changed file by itself.
#[tokio::test]
async fn a_changed_file_is_applied() {
    let (file, server) = start_with("").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _watch = server.watch(Duration::from_millis(20), move |r| {
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let mut c = client(server.grpc_addr()).await;
    std::fs::write(
        &file.0,
        format!(
            "{}{}",
            LIMITS.replacen("limit = 2\n", "limit = 7\n", 1),
            server_section("")
        ),
    )
    .expect("rewrite");
    let applied = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("noticed within 5 s");
    assert_eq!(applied, Some(Ok(())));
    let r = ask(&mut c, vec![login("10.3.0.1")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 6, "login: 7 - 1");
    server.shutdown().await;
}

/// A shutdown lets the request in flight finish: a decision waiting on a
/// stalled Redis is answered (per its failure mode) after the shutdown
/// began, and the server then stops.
#[tokio::test]
async fn a_shutdown_lets_requests_in_flight_finish() {
    let redis = RedisServer::start();
    let file = File::new(&format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\ndeadline = \"300ms\"\n{LIMITS}{}",
        redis.url(),
        server_section("")
    ));
    let server = Server::start(&file.0, Arc::new(tollgate_limiter::MonotonicClock::new()))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;
    assert_eq!(
        ask(&mut c, vec![login("10.4.0.1")], 0).await.overall_code,
        OK
    );
    redis.pause();
    let in_flight = tokio::spawn(async move { ask(&mut c, vec![login("10.4.0.1")], 0).await });
    // The request is waiting on Redis (its deadline is 300 ms) when the
    // shutdown begins.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = Instant::now();
    let stopped = tokio::spawn(async move {
        server.shutdown().await;
        began.elapsed()
    });
    let answered = in_flight.await;
    // Resumed before any assertion: a stopped Redis cannot be stopped for good.
    redis.resume();
    let answer = answered.expect("answered, not cut off");
    assert_eq!(answer.overall_code, OVER, "fail-closed after the deadline");
    let took = tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the server stops once it is done")
        .expect("shutdown");
    // The request had about 250 ms of its deadline left.
    assert!(
        took >= Duration::from_millis(200),
        "the shutdown waited for the request in flight ({took:?})"
    );
}

/// `ShouldRateLimit`'s request with values as bytes: what Envoy sends for
/// a header that is not UTF-8, which `string` fields cannot carry.
mod raw {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(string, tag = "1")]
        pub domain: String,
        #[prost(message, repeated, tag = "2")]
        pub descriptors: Vec<Descriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Descriptor {
        #[prost(message, repeated, tag = "1")]
        pub entries: Vec<Entry>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }
}

/// Ask with raw byte values.
async fn ask_raw(addr: SocketAddr, entries: &[(&str, &[u8])]) -> RateLimitResponse {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a URI")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let request = raw::Request {
        domain: "edge".into(),
        descriptors: vec![raw::Descriptor {
            entries: entries
                .iter()
                .map(|(k, v)| raw::Entry {
                    key: k.to_string(),
                    value: v.to_vec(),
                })
                .collect(),
        }],
    };
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    let codec = tonic_prost::ProstCodec::<raw::Request, RateLimitResponse>::default();
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .expect("answered, not a gRPC error (Envoy would allow)")
        .into_inner()
}

/// A value that is not UTF-8 is decided, never an error, which Envoy turns
/// into an allow: counted under its hash, apart from other bytes.
#[tokio::test]
async fn values_that_are_not_utf8_are_counted_not_refused() {
    let (_file, server) = start_with("").await;
    let addr = server.grpc_addr();
    let crafted: &[(&str, &[u8])] = &[("user_id", b"k\xe9y"), ("tenant_id", b"t1")];
    let mut answers = Vec::new();
    for _ in 0..7 {
        answers.push(ask_raw(addr, crafted).await.overall_code);
    }
    assert_eq!(answers, [OK, OK, OK, OK, OK, OVER, OVER], "5 per user");
    // Other bytes, and the lossy reading of these, are other subjects.
    let other: &[(&str, &[u8])] = &[("user_id", b"k\xffy"), ("tenant_id", b"t2")];
    assert_eq!(ask_raw(addr, other).await.overall_code, OK);
    let mut c = client(addr).await;
    let lossy = user("k\u{fffd}y", "t3");
    assert_eq!(ask(&mut c, vec![lossy], 0).await.overall_code, OK);
    // A fixed value is matched on its bytes: these match no rule.
    let r = ask_raw(
        addr,
        &[
            ("generic_key", b"login\xff"),
            ("remote_address", b"10.9.9.9"),
        ],
    )
    .await;
    assert!(r.statuses[0].current_limit.is_none(), "no rule matched");
    server.shutdown().await;
}

/// Values with white space around them are hashed, not trimmed: `" pad "`
/// and `"pad"` have budgets of their own.
#[tokio::test]
async fn values_with_white_space_are_not_trimmed_into_others() {
    let (_file, server) = start_with("").await;
    let mut c = client(server.grpc_addr()).await;
    for _ in 0..5 {
        let r = ask(&mut c, vec![user("pad", "t-pad")], 0).await;
        assert_eq!(r.overall_code, OK);
    }
    assert_eq!(
        ask(&mut c, vec![user("pad", "t-pad2")], 0)
            .await
            .overall_code,
        OVER
    );
    for padded in [" pad ", "pad ", "\tpad"] {
        let r = ask(&mut c, vec![user(padded, "t-pad3")], 0).await;
        assert_eq!(
            r.statuses[0].limit_remaining, 4,
            "{padded:?}: a budget of its own"
        );
    }
    // The hash `" pad "` is counted under is public: sent as a value, it
    // is hashed too, never `" pad "`'s budget (before, it was, and a
    // client could spend the budget of any such value).
    let public =
        tollgate_limiter::HashKey::new(b"tollgate-ratelimit-server: values that are not subjects")
            .unwrap();
    let hashed = tollgate_limiter::Subject::hashed(b" pad ", &public);
    let r = ask(&mut c, vec![user(hashed.as_str(), "t-pad4")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4, "a budget of its own");
    server.shutdown().await;
}

fn with_override(
    mut d: RateLimitDescriptor,
    requests_per_unit: u32,
    unit: i32,
) -> RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit,
    });
    d
}

/// A descriptor's own `limit` (Envoy's dynamic limit) replaces its rule's:
/// counted on its own, stated in `current_limit`; a unit that cannot be
/// counted as a window is over the limit.
#[tokio::test]
async fn a_descriptor_limit_override_is_applied() {
    let (_file, server) = start_with("").await;
    let mut c = client(server.grpc_addr()).await;
    let minute = 2;
    let overridden = || with_override(user("o1", "o-acme"), 2, minute);
    let r = ask(&mut c, vec![overridden()], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]));
    let limit = r.statuses[0].current_limit.as_ref().expect("stated");
    assert_eq!((limit.requests_per_unit, limit.unit), (2, minute));
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(ask(&mut c, vec![overridden()], 0).await.overall_code, OK);
    assert_eq!(ask(&mut c, vec![overridden()], 0).await.overall_code, OVER);
    // The configured limit (5) has counters of its own.
    let r = ask(&mut c, vec![user("o1", "o-acme")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // MONTH (5) counts 30 days from the epoch, as the reference does.
    let r = ask(&mut c, vec![with_override(user("o2", "o-acme"), 100, 5)], 0).await;
    assert_eq!(codes(&r), (OK, vec![OK]), "MONTH");
    let limit = r.statuses[0].current_limit.as_ref().expect("stated");
    assert_eq!((limit.requests_per_unit, limit.unit), (100, 5));
    // UNKNOWN (0) is unknown.
    let r = ask(&mut c, vec![with_override(user("o2", "o-acme"), 100, 0)], 0).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]), "UNKNOWN");
    let r = ask(
        &mut c,
        vec![with_override(user("o3", "o-acme"), 0, minute)],
        0,
    )
    .await;
    assert_eq!(
        codes(&r),
        (OVER, vec![OVER]),
        "a limit of 0: the descriptor is over"
    );
    // Above the most a window counts (u32::MAX: "unlimited" to many): counted at
    // that most, not over the limit (before, every such request was OVER_LIMIT).
    let r = ask(
        &mut c,
        vec![with_override(user("o4", "o-acme"), u32::MAX, minute)],
        0,
    )
    .await;
    assert_eq!(codes(&r), (OK, vec![OK]), "a limit above 10^9");
    let limit = r.statuses[0].current_limit.as_ref().expect("stated");
    assert_eq!(limit.requests_per_unit, u32::MAX, "stated as sent");
    assert_eq!(r.statuses[0].limit_remaining, 999_999_999);
    server.shutdown().await;
}

/// Each distinct override is a policy of its own, kept for good: past
/// 1,024 distinct ones a new one is over the limit (a caller cannot grow
/// the server's memory without bound), while those already counted go on.
#[tokio::test]
async fn distinct_overrides_are_bounded() {
    let (_file, server) = start_with("").await;
    let mut c = client(server.grpc_addr()).await;
    let second = 1;
    for n in 1..=1_024 {
        let r = ask(
            &mut c,
            vec![with_override(user("b1", "b-acme"), n, second)],
            0,
        )
        .await;
        assert_eq!(r.overall_code, OK, "override {n}");
    }
    let r = ask(
        &mut c,
        vec![with_override(user("b1", "b-acme"), 1_025, second)],
        0,
    )
    .await;
    assert_eq!(codes(&r), (OVER, vec![OVER]), "one past the bound");
    let r = ask(
        &mut c,
        vec![with_override(user("b2", "b-acme"), 7, second)],
        0,
    )
    .await;
    assert_eq!(r.overall_code, OK, "an override already counted");
    // A reload keeps the count: the overrides' policies and metric series
    // live as long as the process.
    server.reload().await.expect("reloaded");
    let r = ask(
        &mut c,
        vec![with_override(user("b1", "b-acme"), 1_026, second)],
        0,
    )
    .await;
    assert_eq!(codes(&r), (OVER, vec![OVER]), "still past the bound");
    server.shutdown().await;
}

/// A `grpc.health.v1` client of the server at `addr`.
async fn health_client(
    addr: std::net::SocketAddr,
) -> tonic_health::pb::health_client::HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a URI")
        .connect()
        .await
        .expect("connect");
    tonic_health::pb::health_client::HealthClient::new(channel)
}

/// `grpc.health.v1` answers SERVING for the server and the rate limit
/// service, as Envoy's and Kubernetes' gRPC health checks ask.
#[tokio::test]
async fn grpc_health_is_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    let (_file, server) = start_with("").await;
    let mut health = health_client(server.grpc_addr()).await;
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await;
    assert_eq!(unknown.expect_err("unknown").code(), tonic::Code::NotFound);
    server.shutdown().await;
}

/// With `shutdown_drain`, a health check made after the shutdown began
/// is answered NOT_SERVING (gRPC) and 503 (`/readyz`), and calls are still
/// served meanwhile: Envoy and Kubernetes see the server leave before its
/// listeners close.
#[tokio::test]
async fn a_drained_shutdown_tells_health_checks_first() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    let (_file, server) = start_with("shutdown_drain = \"2s\"\n").await;
    let (http, grpc) = (server.http_addr(), server.grpc_addr());
    let mut health = health_client(server.grpc_addr()).await;
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = health
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("answered while draining")
        .into_inner();
    assert_eq!(answer.status, ServingStatus::NotServing as i32);
    let (status, _) = get(&format!("http://{http}/readyz")).await;
    assert_eq!(status, 503, "not ready while draining");
    let mut c = client(grpc).await;
    let r = ask(&mut c, vec![user("drain", "acme")], 1).await;
    assert_eq!(r.overall_code, OK, "calls still served while draining");
    stopping.await.unwrap();
}

/// Counter `counter` (`total_hits`, `over_limit`, …) of rule "api" in
/// `domain`.
async fn api_rule_count(server: &Server, domain: &str, counter: &str) -> f64 {
    let base = format!("http://{}", server.http_addr());
    let line = format!("tollgate_rule_{counter}_total{{domain=\"{domain}\",rule=\"api\"}}");
    metric(&base, &line).await
}

/// The value of a Prometheus line of `/metrics` (0 when absent).
async fn metric(base: &str, line_start: &str) -> f64 {
    let (_, text) = get(&format!("{base}/metrics")).await;
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Refused reloads are counted like applied ones, by class.
#[tokio::test]
async fn refused_reloads_are_counted() {
    let (file, server) = start_with("").await;
    let base = format!("http://{}", server.http_addr());
    let invalid = "tollgate_config_reloads_total{result=\"invalid\"}";
    let restart = "tollgate_config_reloads_total{result=\"needs_restart\"}";
    let (invalid_before, restart_before) =
        (metric(&base, invalid).await, metric(&base, restart).await);
    std::fs::write(
        &file.0,
        format!(
            "{LIMITS}{}",
            server_section("").replace("route = \"login\"", "route = \"nowhere\"")
        ),
    )
    .expect("rewrite");
    server.reload().await.expect_err("refused");
    std::fs::write(&file.0, "not toml [").expect("rewrite");
    server.reload().await.expect_err("refused");
    std::fs::write(
        &file.0,
        format!(
            "{LIMITS}{}",
            server_section("").replace("127.0.0.1:0", "127.0.0.1:1")
        ),
    )
    .expect("rewrite");
    server.reload().await.expect_err("refused");
    assert!(metric(&base, invalid).await >= invalid_before + 2.0);
    assert!(metric(&base, restart).await >= restart_before + 1.0);
    server.shutdown().await;
}

/// `/v1/check` sends no RateLimit headers when `response_headers = false`.
#[tokio::test]
async fn the_http_api_honours_response_headers_false() {
    let (_file, server) = start_with("response_headers = false").await;
    let check = format!("http://{}/v1/check", server.http_addr());
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"login"},{"key":"remote_address","value":"10.7.7.7"}]}]}"#;
    for expected in [200, 200, 429] {
        let (status, text) = send("POST", &check, &[], body).await;
        assert_eq!(status, expected, "{text}");
        let head = text.split_once("\n\n").map_or("", |(h, _)| h);
        assert!(!head.contains("ratelimit"), "{head}");
        assert!(!head.contains("retry-after"), "{head}");
    }
    let mut c = client(server.grpc_addr()).await;
    let r = ask(&mut c, vec![login("10.7.7.8")], 0).await;
    assert!(r.response_headers_to_add.is_empty());
    server.shutdown().await;
}

/// An edit that keeps the file's length, with its modification time put
/// back, is still applied by the watch.
#[tokio::test]
async fn a_same_length_edit_with_its_time_restored_is_applied() {
    let (file, server) = start_with("").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _watch = server.watch(Duration::from_millis(20), move |r| {
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let before = std::fs::metadata(&file.0).expect("metadata");
    let edited = format!(
        "{}{}",
        LIMITS.replacen("limit = 2\n", "limit = 3\n", 1),
        server_section("")
    );
    assert_eq!(edited.len() as u64, before.len(), "the same length");
    std::fs::write(&file.0, edited).expect("rewrite");
    std::fs::File::options()
        .write(true)
        .open(&file.0)
        .and_then(|f| f.set_modified(before.modified()?))
        .expect("the time put back");
    let applied = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("noticed within 5 s");
    assert_eq!(applied, Some(Ok(())));
    let mut c = client(server.grpc_addr()).await;
    let r = ask(&mut c, vec![login("10.3.0.9")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 2, "login: 3 - 1");
    server.shutdown().await;
}

/// The operators' API: refused without an operator's token (the check
/// API's token is not one), then usage, penalty, reward, block and reset
/// of one client of a rule, each seen by the next decision.
#[tokio::test]
async fn operators_change_one_client_of_a_rule() {
    std::env::set_var("TOLLGATE_TEST_OPS_ALICE", "alice-s3cret-token");
    std::env::set_var("TOLLGATE_TEST_OPS_API", "api-s3cret-token");
    let (_file, server) = start_with("api_token_env = \"TOLLGATE_TEST_OPS_API\"\noperator_tokens = { alice = \"TOLLGATE_TEST_OPS_ALICE\" }").await;
    let base = format!("http://{}/v1/operations", server.http_addr());
    let alice = [("authorization", "Bearer alice-s3cret-token")];
    let who = r#""domain":"edge","entries":[{"key":"user_id","value":"op1"},{"key":"tenant_id","value":"op-acme"}]"#;
    let op = |name: &str, extra: &str| {
        let url = format!("{base}/{name}");
        let body = format!("{{{who}{extra}}}");
        async move { send("POST", &url, &alice, &body).await }
    };
    for token in [
        None,
        Some("Bearer api-s3cret-token"),
        Some("Bearer alice-s3cret-tokem"),
    ] {
        let headers: Vec<(&str, &str)> = token.map(|t| ("authorization", t)).into_iter().collect();
        let (status, _) = send(
            "POST",
            &format!("{base}/usage"),
            &headers,
            &format!("{{{who}}}"),
        )
        .await;
        assert_eq!(status, 401, "{token:?}");
    }
    let mut c = client(server.grpc_addr()).await;
    for _ in 0..2 {
        ask(&mut c, vec![user("op1", "op-acme")], 0).await;
    }
    let (status, text) = op("usage", "").await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""layer":"api.user","limit":5,"plan":null,"policy":"per-user","remaining":3,"resets_in_ms":60000,"used":2"#), "{text}");
    assert!(
        text.contains(
            r#""layer":"api.tenant","limit":8,"plan":null,"policy":"per-tenant","remaining":6"#
        ),
        "{text}"
    );

    let (status, text) = op("penalize", r#","units":2"#).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""remaining":1"#), "user: 3 - 2: {text}");
    assert!(
        !text.contains("api.tenant"),
        "only the client's own layers: {text}"
    );
    let (status, _) = op("reward", r#","units":1"#).await;
    assert_eq!(status, 200);
    let r = ask(&mut c, vec![user("op1", "op-acme")], 0).await;
    assert_eq!(r.statuses[0].limit_remaining, 1, "2 left, this one charged");

    let (status, text) = op("block", r#","block_ms":600000"#).await;
    assert_eq!(status, 200, "{text}");
    let r = ask(&mut c, vec![user("op1", "op-acme")], 0).await;
    assert_eq!(r.overall_code, OVER);
    let wait = r.statuses[0].duration_until_reset.expect("a wait");
    assert_eq!(wait.seconds, 600, "blocked for 10 minutes");
    let (status, _) = op("reset", "").await;
    assert_eq!(status, 200);
    let r = ask(&mut c, vec![user("op1", "op-acme")], 0).await;
    assert_eq!(r.overall_code, OK, "the reset lifted the block");

    let (status, text) = op("penalize", "").await;
    assert_eq!(status, 400, "no units: {text}");
    let (status, _) = op("explode", "").await;
    assert_eq!(status, 404);
    let (status, _) = send(
        "POST",
        &format!("{base}/usage"),
        &alice,
        r#"{"domain":"edge","entries":[{"key":"nothing","value":"x"}]}"#,
    )
    .await;
    assert_eq!(status, 404, "no rule matches");
    server.shutdown().await;
}

/// The reference's per-rule counters, in hits, by domain and rule:
/// 7 requests against a limit of 5 are 7 hits, 5 within the limit, 2 over
/// it and 1 near it (the 5th, past 80 %).
#[tokio::test]
async fn rules_count_hits_as_the_reference_does() {
    let (_file, server) = start_in_domain("stats").await;
    let mut c = client(server.grpc_addr()).await;
    for _ in 0..7 {
        c.should_rate_limit(RateLimitRequest {
            domain: "stats".into(),
            descriptors: vec![user("st1", "st-acme")],
            hits_addend: 0,
        })
        .await
        .expect("answered");
    }
    let count = |counter: &'static str| api_rule_count(&server, "stats", counter);
    assert_eq!(count("total_hits").await, 7.0);
    assert_eq!(count("within_limit").await, 5.0);
    assert_eq!(count("over_limit").await, 2.0);
    assert_eq!(count("near_limit").await, 1.0);
    assert_eq!(count("shadow_mode").await, 0.0);
    server.shutdown().await;
}

/// A descriptor whose own limit cannot be counted (a limit of 0, a unit
/// no window has) is over the limit without a store call, and its hits
/// count on its rule's counters, all over the limit (before, they were
/// counted nowhere).
#[tokio::test]
async fn an_override_denied_without_a_store_call_is_counted() {
    let (_file, server) = start_in_domain("stats0").await;
    let mut c = client(server.grpc_addr()).await;
    let minute = 2;
    for (requests_per_unit, unit) in [(0, minute), (0, minute), (100, 0)] {
        let r = c
            .should_rate_limit(RateLimitRequest {
                domain: "stats0".into(),
                descriptors: vec![with_override(user("z1", "z-acme"), requests_per_unit, unit)],
                hits_addend: 2,
            })
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(codes(&r), (OVER, vec![OVER]));
    }
    let count = |counter: &'static str| api_rule_count(&server, "stats0", counter);
    assert_eq!(count("total_hits").await, 6.0);
    assert_eq!(count("over_limit").await, 6.0);
    assert_eq!(count("within_limit").await, 0.0);
    server.shutdown().await;
}

/// `--check` validates a file as a start would, without listening (its
/// ports may be taken), and names what is wrong; exit 0 or 1.
#[tokio::test]
async fn the_binary_checks_a_file_and_exits() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("an address").port();
    let valid = File::new(&format!(
        "{LIMITS}{}",
        server_section("").replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
    ));
    let check = |path: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-ratelimit-server"))
            .arg("--config")
            .arg(path)
            .arg("--check")
            .output()
            .expect("the binary runs")
    };
    let out = check(&valid.0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout.contains("valid (2 rules)"), "{stdout}");
    let invalid = File::new(&format!(
        "{LIMITS}{}",
        server_section("").replace("route = \"login\"", "route = \"nowhere\"")
    ));
    let out = check(&invalid.0);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nowhere"),
        "{out:?}"
    );
}

/// An override on a route with two layers of one scope (per second and
/// per minute for one user, say) counts once per scope: decided by the
/// override, not refused as two layers on one counter.
#[tokio::test]
async fn an_override_on_layers_sharing_a_scope_counts_once() {
    let limits = LIMITS.replace(
        r#"    { name = "user", scope = "subject", policy = "per-user" },"#,
        r#"    { name = "user", scope = "subject", policy = "per-user" },
    { name = "user-burst", scope = "subject", policy = "per-tenant" },"#,
    );
    assert_ne!(limits, LIMITS);
    let file = File::new(&format!("{limits}{}", server_section("")));
    let server = Server::start(&file.0, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts");
    let mut c = client(server.grpc_addr()).await;
    let overridden = || with_override(user("o9", "o9-acme"), 2, 2);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut c, vec![overridden()], 0).await.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER], "2 per minute, counted once");
    server.shutdown().await;
}

/// Connections to the Redis server now, from `CLIENT LIST`.
fn redis_clients(redis: &RedisServer) -> usize {
    match redis.command(&["CLIENT", "LIST"]) {
        tollgate_testkit::resp::Reply::Bulk(Some(list)) => {
            String::from_utf8_lossy(&list).lines().count()
        }
        other => panic!("CLIENT LIST: {other:?}"),
    }
}

/// On a standalone Redis each gRPC runtime decides over a connection of
/// its own (runtime_stores.rs); counts stay exact across them: many
/// clients at once, on connections the kernel spreads over three
/// runtimes, get exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtimes_with_connections_of_their_own_count_exactly() {
    let redis = RedisServer::start();
    let before = redis_clients(&redis);
    let store = format!("[store]\nkind = \"redis\"\nurl = \"{}\"\n", redis.url());
    let file = File::new(&format!(
        "{store}{LIMITS}{}",
        server_section("grpc_runtimes = 3")
    ));
    let server = Server::start(&file.0, Arc::new(tollgate_limiter::MonotonicClock::new()))
        .await
        .expect("starts");
    // The shared connection, and one per runtime once each has opened it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_clients(&redis) < before + 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        redis_clients(&redis) >= before + 4,
        "a connection per runtime"
    );
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let addr = server.grpc_addr();
        tasks.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            let mut admitted = 0;
            for _ in 0..5 {
                let r = ask(&mut c, vec![login("10.9.9.9")], 0).await;
                admitted += usize::from(r.overall_code == OK);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("a client");
    }
    assert_eq!(
        admitted, 2,
        "the login limit, 2 per minute, across runtimes"
    );
    server.shutdown().await;
}

/// A second server on the port of a running one fails to start: the
/// port is not shared (two in-process stores would count apart).
#[tokio::test]
async fn a_second_server_cannot_share_the_grpc_port() {
    let (_file, server) = start_with("").await;
    let port = server.grpc_addr().port();
    let second = File::new(&format!(
        "{LIMITS}{}",
        server_section("").replacen(
            "grpc_listen = \"127.0.0.1:0\"",
            &format!("grpc_listen = \"127.0.0.1:{port}\""),
            1
        )
    ));
    let refused = Server::start(&second.0, Arc::new(ManualClock::new(START)))
        .await
        .expect_err("the port is taken");
    assert!(refused.to_string().contains("cannot listen"), "{refused}");
    server.shutdown().await;
}

/// The body of an answer of [`send`], as JSON.
fn json_of(text: &str) -> serde_json::Value {
    let body = text.split_once("\n\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Concurrency limits through the HTTP API: a place is held until it is
/// released, kept by renewing past its lease, and given back a lease after
/// a client stops renewing; the full route answers 429 with `Retry-After`.
#[tokio::test]
async fn the_http_api_holds_places_until_released_or_abandoned() {
    let clock = ManualClock::new(START);
    let file = File::new(&format!("{LIMITS}{}", server_section("")));
    let server = Server::start(&file.0, Arc::new(clock.clone()))
        .await
        .expect("starts");
    let base = format!("http://{}", server.http_addr());
    let acquire = |route: &str| {
        let body = format!(r#"{{"route":"{route}","subject":"acme"}}"#);
        let url = format!("{base}/v1/acquire");
        async move { send("POST", &url, &[], &body).await }
    };
    let (status, text) = acquire("export").await;
    assert_eq!(status, 200, "{text}");
    let first = json_of(&text);
    assert_eq!(first["lease_ms"], 30_000);
    let id = first["permit"].as_str().expect("a permit id").to_string();
    let (status, text) = acquire("export").await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("retry-after: 30"), "{text}");

    // Renewed 20 s on, the place outlives its first lease.
    clock.advance(Duration::from_secs(20));
    let renew = format!("{base}/v1/permits/{id}/renew");
    let (status, text) = send("POST", &renew, &[], "").await;
    assert_eq!(
        (status, json_of(&text)["lease_ms"].as_u64()),
        (200, Some(30_000))
    );
    clock.advance(Duration::from_secs(20));
    assert_eq!(acquire("export").await.0, 429, "still held at 40 s");
    let permit = format!("{base}/v1/permits/{id}");
    assert_eq!(send("DELETE", &permit, &[], "").await.0, 204);
    assert_eq!(
        send("DELETE", &permit, &[], "").await.0,
        404,
        "released once"
    );

    // A client that stops renewing loses its place one lease later.
    let (status, text) = acquire("export").await;
    assert_eq!(status, 200, "{text}");
    let abandoned = json_of(&text)["permit"].as_str().unwrap().to_string();
    clock.advance(Duration::from_secs(30));
    assert_eq!(
        acquire("export").await.0,
        200,
        "the abandoned place came back"
    );
    let renew = format!("{base}/v1/permits/{abandoned}/renew");
    assert_eq!(send("POST", &renew, &[], "").await.0, 404);

    let (status, text) = acquire("api").await;
    assert_eq!(status, 400, "a route without a concurrency limit: {text}");
    assert_eq!(acquire("nowhere").await.0, 400);

    // Naming a route in a call does not bind it: a reload may drop it
    // (a place still held keeps its own limiter), and then a call naming
    // it answers 400.
    let without_export = LIMITS
        .split("[policies.exports]")
        .next()
        .expect("the limits before exports");
    std::fs::write(&file.0, format!("{without_export}{}", server_section(""))).unwrap();
    server
        .reload()
        .await
        .expect("a route only named by calls is not kept");
    assert_eq!(acquire("export").await.0, 400);
    server.shutdown().await;
}

/// A gRPC connection whose peer stops answering (an Envoy instance gone
/// without closing it) is pinged once quiet for `grpc_keepalive`, and
/// closed when the ping goes unanswered (before, it was held for good: a
/// pile of such connections runs the server out of descriptors).
#[tokio::test]
async fn a_grpc_peer_that_stops_answering_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_file, server) = start_with("grpc_keepalive = \"1s\"").await;
    let mut peer = tokio::net::TcpStream::connect(server.grpc_addr())
        .await
        .expect("connect");
    // The HTTP/2 preface and an empty SETTINGS frame; then nothing, not
    // even the acknowledgements the server asks for.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    peer.write_all(&hello).await.expect("write");
    const PING: u8 = 6;
    let mut frame_types = Vec::new();
    let read_all = async {
        loop {
            let mut header = [0u8; 9];
            if peer.read_exact(&mut header).await.is_err() {
                return; // closed
            }
            frame_types.push(header[3]);
            let len =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let mut payload = vec![0; len];
            if peer.read_exact(&mut payload).await.is_err() {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read_all)
        .await
        .expect("the server closed the connection");
    assert!(frame_types.contains(&PING), "pinged first: {frame_types:?}");
    server.shutdown().await;
}
