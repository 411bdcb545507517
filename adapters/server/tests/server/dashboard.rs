//! The Grafana dashboard (`dashboards/tollgate-ratelimit-server.json`)
//! against a real Prometheus scraping the server under traffic: every
//! panel's query must parse and return series.
//!
//! Prometheus comes from `cargo xtask setup` (Debian's `prometheus`
//! package) or the PATH; without it the test fails and says how to get it.

use crate::common;

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_limiter::MonotonicClock;
use tollgate_ratelimit_server::Server;
use tollgate_testkit::redis_server::RedisServer;

/// Prometheus, killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Every panel's query in the dashboard.
fn queries() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dashboards/tollgate-ratelimit-server.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a title").to_string();
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expr").to_string();
            queries.push((title.clone(), expr));
        }
    }
    assert!(queries.len() >= 8, "{queries:?}");
    queries
}

/// `POST path` with a form body to Prometheus: the status and the body.
async fn post(port: u16, path: &str, form: &[(&str, &str)]) -> (u16, String) {
    let client: Client<_, Full<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let request = hyper::Request::post(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::from(body))
        .expect("a request");
    match client.request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let bytes = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes();
            (status, String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// The series `expr` returns now.
async fn query(port: u16, expr: &str) -> Vec<serde_json::Value> {
    let (status, body) = post(port, "/api/v1/query", &[("query", expr)]).await;
    assert_eq!(status, 200, "{expr}: {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["status"], "success", "{expr}: {body}");
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn start_prometheus(dir: &common::TempDir, target: std::net::SocketAddr, port: u16) -> Prometheus {
    let config = dir.write(
        "prometheus.yml",
        &format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             scrape_configs:\n\
             - job_name: tollgate\n  static_configs: [{{ targets: ['{target}'] }}]\n"
        ),
    );
    let binary = std::env::var_os("TOLLGATE_PROMETHEUS").unwrap_or_else(|| "prometheus".into());
    let child = Command::new(&binary)
        .arg(format!("--config.file={config}"))
        .arg(format!("--storage.tsdb.path={}", dir.path("data")))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run Prometheus ({e}): run `cargo xtask setup` (it installs Debian's \
                 prometheus package), `apt-get install prometheus`, or set TOLLGATE_PROMETHEUS"
            )
        });
    Prometheus(child)
}

/// Decisions of every kind: admitted, denied, and store errors while Redis
/// is stopped; one reload.
async fn traffic(server: &Server, redis: &RedisServer) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
        .await
        .expect("connect");
    let ask = |user: &str| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user_id".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    for i in 0..30 {
        let _ = client.should_rate_limit(ask(&format!("d{}", i % 3))).await;
    }
    redis.pause();
    let _ = client.should_rate_limit(ask("paused")).await;
    redis.resume();
    let _ = server.reload().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_of_the_dashboard_returns_series() {
    let redis = RedisServer::start();
    let dir = common::TempDir::new("dashboard");
    let config = dir.write(
        "server.toml",
        &common::one_rule_config(
            &format!(
                "[store]\nkind = \"redis\"\nurl = \"{}\"\ndeadline = \"100ms\"",
                redis.url()
            ),
            8,
            "",
        ),
    );
    let server = Server::start(&config, Arc::new(MonotonicClock::new()))
        .await
        .expect("starts");
    let port = free_port();
    let _prometheus = start_prometheus(&dir, server.http_addr(), port);

    // Ready, and scraping the server.
    let deadline = Instant::now() + Duration::from_secs(30);
    while query_up(port).await != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "Prometheus scraped nothing within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    traffic(&server, &redis).await;
    // A few scrapes after the traffic: every rate has two samples.
    tokio::time::sleep(Duration::from_secs(4)).await;
    traffic(&server, &redis).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut empty = Vec::new();
    for (title, expr) in queries() {
        if query(port, &expr).await.is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "panels without series:\n{}",
        empty.join("\n")
    );
    server.shutdown().await;
}

/// `up` of the scrape target, once Prometheus answers.
async fn query_up(port: u16) -> Option<f64> {
    let (status, body) = post(port, "/api/v1/query", &[("query", "up")]).await;
    if status != 200 {
        return None;
    }
    let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()?
        .parse()
        .ok()
}
