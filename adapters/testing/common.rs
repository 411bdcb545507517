//! Test helpers: limiters on a manual clock, a store that is down, a real
//! HTTP client, and the structured-field checks.
//!
//! One file shared by the tower and actix-web adapters' tests (each includes
//! it with `#[path]`), so both adapters are held to the same checks.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tollgate_limiter::{
    Limit, Limiter, ManualClock, Plan, PlanName, Plans, Policy, Scope, Store, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;
#[allow(unused_imports)] // used by some test binaries
pub use tollgate_testkit::DownStore;

/// A start time on a minute boundary, so fixed windows end 60 s later.
pub const START: Timestamp = Timestamp::from_micros(1_779_999_960_000_000);

/// The in-process store on a manual clock.
pub fn memory_store() -> (ManualClock, Arc<dyn Store>) {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    (clock, Arc::new(store))
}

/// `limit` requests per minute per subject, in a fixed window named `name`.
pub fn per_minute(store: Arc<dyn Store>, name: &str, limit: u64) -> Limiter {
    let policy = Policy::new(
        name,
        Limit::fixed_window(limit, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    Limiter::builder(store)
        .layer("subject", Scope::Subject, policy)
        .build()
        .unwrap()
}

/// 3 requests a minute per subject on the free plan, 10 on `pro`.
pub fn per_minute_with_plans(store: Arc<dyn Store>) -> Limiter {
    let minute = Duration::from_secs(60);
    let pro = Plan::new("pro")
        .unwrap()
        .limit("per-user", Limit::fixed_window(10, minute).unwrap());
    let policy = Policy::new("per-user", Limit::fixed_window(3, minute).unwrap()).unwrap();
    Limiter::builder(store)
        .layer("subject", Scope::Subject, policy)
        .plans(Plans::new(Plan::new("free").unwrap()).plan(pro))
        .build()
        .unwrap()
}

/// What the tests' stand-in for authentication makes of an `x-user`
/// header: the user as the subject and, for users named `pro-…`, the plan
/// `pro` — decided by the server from who the caller is.
pub fn authenticated(user: Option<&str>) -> (Option<Subject>, Option<PlanName>) {
    let subject = user.and_then(|v| Subject::new(v).ok());
    let plan = user
        .filter(|u| u.starts_with("pro-"))
        .map(|_| PlanName::new("pro").unwrap());
    (subject, plan)
}

/// Against a server of [`per_minute_with_plans`] behind [`authenticated`]
/// that answers `left: <remaining>`: a `pro-…` user is decided under the
/// pro plan, and a client's headers naming a plan change nothing.
pub async fn assert_plans_from_authentication(http: &Http) {
    let pro = http.get("/", &[("x-user", "pro-ann")]).await;
    assert_eq!((pro.status, pro.body.as_str()), (StatusCode::OK, "left: 9"));
    let claims = [
        ("x-user", "bob"),
        ("x-plan", "pro"),
        ("x-tollgate-plan", "pro"),
    ];
    let free = http.get("/", &claims).await;
    assert_eq!(
        (free.status, free.body.as_str()),
        (StatusCode::OK, "left: 2")
    );
}

/// A response as the test reads it.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The `RateLimit` (or `RateLimit-Policy`) items: policy name → parameters.
    pub fn items(&self, name: &str) -> Vec<(String, HashMap<String, i64>)> {
        let lines: Vec<&str> = self
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert!(!lines.is_empty(), "no {name} header on a {}", self.status);
        let list = sfv::Parser::new(&lines.join(", "))
            .parse::<sfv::List>()
            .unwrap_or_else(|e| panic!("{name} is not a structured-field list: {e:?}"));
        list.into_iter()
            .map(|entry| {
                let sfv::ListEntry::Item(item) = entry else {
                    panic!("{name} has an inner list")
                };
                let policy = item
                    .bare_item
                    .as_string()
                    .expect("item is a string")
                    .as_str()
                    .to_string();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            i64::from(v.as_integer().expect("integer parameter")),
                        )
                    })
                    .collect();
                (policy, params)
            })
            .collect()
    }

    /// `r` and `t` of the single `RateLimit` item.
    pub fn remaining_and_reset(&self) -> (i64, i64) {
        let items = self.items("ratelimit");
        assert_eq!(items.len(), 1);
        (items[0].1["r"], items[0].1["t"])
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// A real HTTP/1.1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Empty<Bytes>>,
    base: String,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", path, headers).await
    }

    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (n, v) in headers {
            request = request.header(*n, *v);
        }
        let response = self
            .client
            .request(request.body(Empty::new()).unwrap())
            .await
            .expect("the server answers");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }
}

/// The Redis store's deadline in the stopped-Redis tests.
pub const REDIS_DEADLINE: Duration = Duration::from_millis(50);

/// A Redis store whose server was running when the store connected and has
/// since been killed (SIGKILL). Keep the server value alive for the test.
pub async fn stopped_redis() -> (tollgate_testkit::redis_server::RedisServer, Arc<dyn Store>) {
    let server = tollgate_testkit::redis_server::RedisServer::start();
    let store = tollgate_redis::RedisStore::builder(server.url())
        .deadline(REDIS_DEADLINE)
        .connect_timeout(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test redis-server");
    server.kill();
    (server, Arc::new(store))
}

/// The answer to a request whose store failed (fail-closed, the default):
/// 503 problem+json naming the policy, with a Retry-After of at least 1 s.
pub fn assert_store_failure_503(reply: &Reply, policy: &str) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let problem = reply.json();
    assert_eq!(problem["status"], 503);
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
    );
    assert_eq!(problem["violated-policies"], serde_json::json!([policy]));
    // Retry-After is never below 1 s.
    let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!(retry >= 1);
    // The store counted nothing: no `RateLimit` item a client could read
    // as a spent quota (r=0), only when to try again.
    assert_eq!(reply.header("ratelimit"), None, "an outage is not a quota");
    assert!(reply.header("ratelimit-policy").is_some());
}

/// Every 401 of Tollgate: problem+json with a `WWW-Authenticate` challenge.
pub fn assert_401(reply: &Reply, challenge: &str) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    assert_eq!(reply.header("www-authenticate"), Some(challenge));
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["status"], 401);
}

/// A running configuration with one route, `api`: a fixed window of
/// `limit` per minute per subject, on the in-process store at `START`.
pub async fn live_config(limit: u64) -> tollgate_config::LiveConfig {
    tollgate_config::LiveConfig::new(
        tollgate_config::Config::from_toml_str(&live_file(limit)).unwrap(),
        Arc::new(ManualClock::new(START)),
    )
    .await
    .unwrap()
}

/// The configuration of [`live_config`] with another limit.
pub fn live_file(limit: u64) -> String {
    format!(
        "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\n\
         [routes.api]\nlayers = [{{ scope = \"subject\", policy = \"api\" }}]\n"
    )
}

/// Reload `live` with the limit `limit`.
pub async fn reload(live: &tollgate_config::LiveConfig, limit: u64) {
    live.reload_with(tollgate_config::Config::from_toml_str(&live_file(limit)).unwrap())
        .await
        .unwrap();
}

/// CORS preflights on `/login` (limit 2, a handler for every method) are
/// charged: two pass through the handler, the third is refused.
pub async fn assert_preflights_are_charged(http: &Http) {
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "POST"),
    ];
    for remaining in [1, 0] {
        let reply = http.send("OPTIONS", "/login", &preflight).await;
        assert_eq!(reply.status, StatusCode::OK, "the handler ran: charged");
        assert_eq!(reply.remaining_and_reset().0, remaining);
    }
    let reply = http.send("OPTIONS", "/login", &preflight).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

/// With `charge_preflights(false)`: three preflights pass uncharged, then
/// the real request still has its full budget (2).
pub async fn assert_preflights_are_free(http: &Http) {
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "POST"),
    ];
    for _ in 0..3 {
        let reply = http.send("OPTIONS", "/login", &preflight).await;
        assert_ne!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.header("ratelimit"), None, "not rate limited");
    }
    let reply = http.send("POST", "/login", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.remaining_and_reset().0,
        1,
        "only the POST was charged"
    );
}

/// With limits on method routes (`POST /login`, `GET`/`HEAD /search`, one
/// bucket of 3): 405s and 404s are free, `HEAD` is charged like `GET`.
pub async fn assert_unrouted_are_free_and_head_is_charged(http: &Http) {
    for _ in 0..3 {
        let reply = http.get("/login", &[]).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(reply.header("ratelimit"), None);
        assert_eq!(
            http.get("/nowhere", &[]).await.status,
            StatusCode::NOT_FOUND
        );
    }
    let reply = http.send("POST", "/login", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 2, "404s and 405s were free");
    let reply = http.send("HEAD", "/search", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 1, "HEAD is charged like GET");
}

/// A missing API key and a duplicated one get the same 401; one key passes.
pub async fn assert_every_401_has_the_challenge(http: &Http) {
    let challenge = r#"ApiKey header="x-api-key""#;
    assert_401(&http.get("/", &[]).await, challenge);
    assert_401(
        &http
            .get("/", &[("x-api-key", "a"), ("x-api-key", "b")])
            .await,
        challenge,
    );
    assert_eq!(
        http.get("/", &[("x-api-key", "a")]).await.status,
        StatusCode::OK
    );
}

/// `GET /` decided by the route `api` of `live` (2 per minute): a reload to
/// 5 is in force at the next request, and the counter was kept; a reload
/// the gate could not serve is refused.
pub async fn assert_reload_applies(http: &Http, live: &tollgate_config::LiveConfig) {
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.items("ratelimit-policy")[0].1["q"], 2);
    assert_eq!(reply.remaining_and_reset().0, 1);
    reload(live, 5).await;
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.items("ratelimit-policy")[0].1["q"], 5);
    assert_eq!(reply.remaining_and_reset().0, 3, "the counter was kept");
    // A tenant layer the gate's identity cannot supply would fail every
    // request (401): refused, and the gate serves on.
    let with_tenant = live_file(5).replace(
        "policy = \"api\" }]",
        "policy = \"api\" }, { scope = \"tenant\", policy = \"api\" }]",
    );
    let config = tollgate_config::Config::from_toml_str(&with_tenant).unwrap();
    let refused = live.reload_with(config).await.unwrap_err();
    assert!(refused.to_string().contains("routes.api"), "{refused}");
    assert!(refused.to_string().contains("tenant"), "{refused}");
    assert_eq!(http.get("/", &[]).await.status, StatusCode::OK);
}

/// The hash key of the API-key identity in the 401 tests.
pub fn api_key() -> tollgate_limiter::HashKey {
    tollgate_limiter::HashKey::new(b"0123456789abcdef0123").unwrap()
}

/// The rejection hook of the custom-rejection tests: an HTML page for a
/// limit (keeping the rate-limit headers), the default for the rest.
pub fn html_rejection(rejection: &tollgate_http::Rejection<'_>) -> Option<tollgate_http::Reply> {
    if rejection.kind() != tollgate_http::RejectionKind::Limited || rejection.is_grpc() {
        return None;
    }
    let mut headers = rejection.rate_limit_headers();
    headers.push(("content-type", "text/html; charset=utf-8".into()));
    let body = format!(
        "<p>Too many requests: try again in {} s.</p>",
        rejection.retry_after()?
    );
    Some(tollgate_http::Reply::new(429, headers, body).expect("a valid reply"))
}

/// `GET /` (limit 2) behind a gate built with [`html_rejection`]: the third
/// gets the HTML page with `Retry-After` and `RateLimit`; a gRPC call is
/// still answered the gRPC way.
pub async fn assert_rejections_your_way(http: &Http) {
    for _ in 0..2 {
        assert_eq!(http.get("/", &[]).await.status, StatusCode::OK);
    }
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        reply.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(reply.body, "<p>Too many requests: try again in 60 s.</p>");
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(reply.remaining_and_reset(), (0, 60));
    let reply = http.send("POST", "/grpc", &GRPC).await;
    assert_eq!(reply.header("grpc-status"), Some("8"));
}

/// A gRPC call's headers.
pub const GRPC: [(&str, &str); 2] = [("content-type", "application/grpc"), ("te", "trailers")];

/// `POST /grpc` (limit 2) called the gRPC way: the third is HTTP 200 with
/// no body and `grpc-status: 8`, the rate-limit headers and `retry-after`
/// as metadata (a gRPC client would read a 429's JSON body as a message
/// frame and fail with INTERNAL).
pub async fn assert_grpc_calls_get_grpc_status(http: &Http) {
    for _ in 0..2 {
        assert_eq!(
            http.send("POST", "/grpc", &GRPC).await.status,
            StatusCode::OK
        );
    }
    let reply = http.send("POST", "/grpc", &GRPC).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "", "trailers-only: no message frame");
    assert_eq!(reply.header("content-type"), Some("application/grpc"));
    assert_eq!(reply.header("grpc-status"), Some("8"));
    let message = reply.header("grpc-message").unwrap();
    assert!(message.contains("retry in 60 s"), "{message}");
    assert_eq!(reply.header("retry-after"), Some("60"));
    assert_eq!(reply.remaining_and_reset(), (0, 60));
    assert!(reply.header("grpc-status-details-bin").is_some());
}

/// The access rules of the allow/deny tests, for an API-key identity under
/// [`api_key`]: the key "ops" is exempt, "stolen" is denied, `/health` and
/// `DELETE` are not limited.
pub fn access_rules() -> tollgate_http::AccessRules {
    use tollgate_limiter::Subject;
    tollgate_http::AccessRules::new()
        .exempt_subject(Subject::hashed("ops", &api_key()))
        .deny_subject(Subject::hashed("stolen", &api_key()))
        .skip_path("/health")
        .skip_method("delete")
}

/// `GET /` (limit 2 per API key) and `GET /health` behind a gate with
/// [`access_rules`]: exempt and skipped requests pass without headers and
/// without a charge, a denied key gets 403 every time, others are limited.
pub async fn assert_access_rules(http: &Http) {
    for _ in 0..4 {
        let reply = http.get("/", &[("x-api-key", "ops")]).await;
        assert_eq!(reply.status, StatusCode::OK, "exempt");
        assert_eq!(reply.header("ratelimit"), None, "exempt: no headers");
    }
    for _ in 0..3 {
        let reply = http.get("/", &[("x-api-key", "stolen")]).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(reply.json()["title"], "Forbidden");
        assert_eq!(reply.header("ratelimit"), None);
        // A denied gRPC call is PERMISSION_DENIED.
        let mut grpc = GRPC.to_vec();
        grpc.push(("x-api-key", "stolen"));
        let reply = http.send("POST", "/grpc", &grpc).await;
        assert_eq!(reply.header("grpc-status"), Some("7"));
    }
    for _ in 0..3 {
        // Skipped: not even identified (no key, no 401).
        let reply = http.get("/health", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("ratelimit"), None);
        let reply = http.send("DELETE", "/", &[]).await;
        assert_ne!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.header("ratelimit"), None);
    }
    assert_eq!(
        http.get("/", &[("x-api-key", "user")]).await.status,
        StatusCode::OK
    );
    let reply = http.get("/", &[("x-api-key", "user")]).await;
    assert_eq!(
        reply.remaining_and_reset().0,
        0,
        "only user's own two requests counted"
    );
    assert_eq!(
        http.get("/", &[("x-api-key", "user")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
