//! The tower layer in a real axum server on 127.0.0.1, driven by a real
//! HTTP client. Time is a manual clock; nothing sleeps.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use common::{memory_store, per_minute, DownStore, Http};
use http::StatusCode;
use tollgate_limiter::{Decision, Limiter, Store};
use tollgate_tower::{Cidr, ClientIp, Identity, RateLimitLayer};

/// Serve `app` on a free loopback port, with the client's socket address.
async fn serve(app: Router) -> Http {
    // With the `axum` feature the layer reads `ConnectInfo` itself; without
    // it, the server hands the address over as a `PeerAddr`, as a hyper or
    // tonic server would.
    #[cfg(not(feature = "axum"))]
    let app = app.layer(middleware::from_fn(
        |axum::extract::ConnectInfo(addr): axum::extract::ConnectInfo<SocketAddr>,
         mut request: Request,
         next: Next| async move {
            request
                .extensions_mut()
                .insert(tollgate_tower::PeerAddr(addr));
            next.run(request).await
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Http::new(addr)
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn by_ip(limiter: Limiter, ip: ClientIp) -> RateLimitLayer {
    RateLimitLayer::builder(limiter)
        .identity(Identity::new().client_ip(ip))
        .build()
        .unwrap()
}

#[tokio::test]
async fn three_pass_then_429_with_exact_headers() {
    let (clock, store) = memory_store();
    let http = serve(app(by_ip(
        per_minute(store, "per-ip", 3),
        ClientIp::direct(),
    )))
    .await;

    for expected_remaining in [2, 1, 0] {
        let reply = http.get("/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "ok");
        let policy = reply.items("ratelimit-policy");
        assert_eq!(policy[0].0, "per-ip");
        assert_eq!((policy[0].1["q"], policy[0].1["w"]), (3, 60));
        assert_eq!(reply.remaining_and_reset(), (expected_remaining, 60));
        assert_eq!(reply.header("retry-after"), None);
    }

    clock.advance(Duration::from_millis(15_500));
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    // 44.5 s left in the window: t and Retry-After round up to 45.
    assert_eq!(reply.remaining_and_reset(), (0, 45));
    assert_eq!(reply.header("retry-after"), Some("45"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let problem = reply.json();
    assert_eq!(
        problem["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["per-ip"]));
    assert!(problem["title"].is_string() && problem["detail"].is_string());

    // The next window admits again.
    clock.advance(Duration::from_millis(44_500));
    assert_eq!(http.get("/", &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn spoofed_forwarded_for_does_not_change_the_bucket() {
    let (_clock, store) = memory_store();
    let http = serve(app(by_ip(
        per_minute(store, "per-ip", 3),
        ClientIp::direct(),
    )))
    .await;
    for spoof in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let reply = http.get("/", &[("x-forwarded-for", spoof)]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = http.get("/", &[("x-forwarded-for", "198.51.100.99")]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn clients_behind_a_trusted_proxy_get_their_own_buckets() {
    let (_clock, store) = memory_store();
    // The test client plays the proxy: it connects from 127.0.0.1.
    let proxy: Cidr = "127.0.0.1/32".parse().unwrap();
    let http = serve(app(by_ip(
        per_minute(store, "per-ip", 3),
        ClientIp::trusted_proxies([proxy]),
    )))
    .await;
    let a = [("x-forwarded-for", "203.0.113.7")];
    for _ in 0..3 {
        assert_eq!(http.get("/", &a).await.status, StatusCode::OK);
    }
    assert_eq!(
        http.get("/", &a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // A client-written entry left of the proxy's does not help client A...
    let spoofing_a = [("x-forwarded-for", "10.9.9.9, 203.0.113.7")];
    assert_eq!(
        http.get("/", &spoofing_a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...and client B, behind the same proxy, has its own bucket.
    let b = [("x-forwarded-for", "203.0.113.8")];
    let reply = http.get("/", &b).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 2);
}

#[tokio::test]
async fn missing_subject_is_401_and_an_auth_layer_identifies() {
    let (_clock, store) = memory_store();
    // Identity from extensions only (the default): an auth layer sets it.
    let http = serve(authenticated_app(
        RateLimitLayer::builder(per_minute(store, "per-user", 3))
            .identity(Identity::new().extension())
            .unauthorized_challenge("Bearer")
            .build()
            .unwrap(),
    ))
    .await;

    common::assert_401(&http.get("/", &[]).await, "Bearer");

    let reply = http.get("/", &[("x-user", "alice")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "left: 2");
}

/// One route behind `layer`, behind a stand-in for authentication: the
/// `x-user` header becomes the subject (and, for `pro-…` users, the plan)
/// in the request's extensions.
fn authenticated_app(layer: RateLimitLayer) -> Router {
    async fn auth(mut request: Request, next: Next) -> Response {
        let user = request
            .headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok());
        let (user, plan) = common::authenticated(user);
        if let Some(user) = user {
            request.extensions_mut().insert(user);
        }
        if let Some(plan) = plan {
            request.extensions_mut().insert(plan);
        }
        next.run(request).await
    }
    Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                format!("left: {}", decision.layers()[0].verdict().remaining)
            }),
        )
        .layer(layer)
        .layer(middleware::from_fn(auth))
}

/// The plan the authentication layer puts into the request's extensions
/// decides the request's limit; a client's header naming a plan does not.
#[tokio::test]
async fn the_plan_comes_from_the_authentication_never_the_client() {
    let (_clock, store) = memory_store();
    let http = serve(authenticated_app(
        RateLimitLayer::builder(common::per_minute_with_plans(store))
            .identity(Identity::new().extension())
            .build()
            .unwrap(),
    ))
    .await;
    common::assert_plans_from_authentication(&http).await;
}

/// Any store can go here; a stopped Redis will once its store lands.
async fn store_failure_is_503_quickly(store: Arc<dyn Store>, within: Duration) {
    let http = serve(app(by_ip(
        per_minute(store, "per-ip", 3),
        ClientIp::direct(),
    )))
    .await;
    let started = Instant::now();
    let reply = http.get("/", &[]).await;
    assert!(started.elapsed() < within, "took {:?}", started.elapsed());
    common::assert_store_failure_503(&reply, "per-ip");
}

#[tokio::test]
async fn a_store_that_is_down_gives_503() {
    store_failure_is_503_quickly(Arc::new(DownStore), Duration::from_millis(500)).await;
}

#[tokio::test]
async fn a_stopped_redis_gives_503_within_the_deadline() {
    let (_server, store) = common::stopped_redis().await;
    // The store's deadline, plus a margin for HTTP on a busy two-core machine.
    store_failure_is_503_quickly(store, common::REDIS_DEADLINE + Duration::from_millis(250)).await;
}

#[tokio::test]
async fn per_route_cost_and_legacy_headers() {
    let (_clock, store) = memory_store();
    let limiter = per_minute(store, "per-ip", 3);
    let ip = || Identity::new().client_ip(ClientIp::direct());
    let app = Router::new()
        .route("/cheap", get(|| async { "cheap" }))
        .route_layer(
            RateLimitLayer::builder(limiter.clone())
                .identity(ip())
                .build()
                .unwrap(),
        )
        .merge(
            Router::new()
                .route("/export", get(|| async { "export" }))
                .route_layer(
                    RateLimitLayer::builder(limiter)
                        .identity(ip())
                        .cost(2)
                        .legacy_headers(true)
                        .x_ratelimit_headers(true)
                        .build()
                        .unwrap(),
                ),
        );
    let http = serve(app).await;
    let reply = http.get("/export", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 1);
    assert_eq!(reply.header("ratelimit-limit"), Some("3"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("1"));
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(reply.header("x-ratelimit-reset"), Some("60"));
    // Both routes share the bucket: one unit left, an export needs two.
    assert_eq!(
        http.get("/export", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let reply = http.get("/cheap", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("ratelimit-remaining"), None);
    assert_eq!(reply.remaining_and_reset().0, 0);
}

/// A browser's CORS preflight is charged by default (any client can send
/// one, and a route serving every method would run its handler); with
/// `charge_preflights(false)` it is not, even with the limiter around the
/// whole router: three preflights, then the real request still has its
/// full budget.
#[tokio::test]
async fn cors_preflights_are_charged_unless_told_otherwise() {
    let (_clock, store) = memory_store();
    let app = Router::new()
        .route("/login", axum::routing::any(|| async { "welcome" }))
        .layer(by_ip(
            per_minute(store.clone(), "login", 2),
            ClientIp::direct(),
        ));
    let http = serve(app).await;
    common::assert_preflights_are_charged(&http).await;
    let free = RateLimitLayer::builder(per_minute(store, "login-free", 2))
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .charge_preflights(false)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/login", axum::routing::post(|| async { "welcome" }))
        .layer(free);
    let http = serve(app).await;
    common::assert_preflights_are_free(&http).await;
    // A plain OPTIONS (no preflight) is an ordinary request: charged.
    let reply = http.send("OPTIONS", "/login", &[]).await;
    assert_eq!(reply.remaining_and_reset().0, 0);
}

/// With the limiter on the method route (`MethodRouter::route_layer`),
/// requests the router answers 404 or 405 never reach it: not charged.
/// `HEAD` on a `GET` route is charged like `GET`.
#[tokio::test]
async fn unrouted_requests_are_not_charged_and_head_is_like_get() {
    let (_clock, store) = memory_store();
    let limiter = per_minute(store, "per-ip", 3);
    let app = Router::new()
        .route(
            "/login",
            axum::routing::post(|| async { "welcome" })
                .route_layer(by_ip(limiter.clone(), ClientIp::direct())),
        )
        .route(
            "/search",
            get(|| async { "results" }).route_layer(by_ip(limiter, ClientIp::direct())),
        );
    let http = serve(app).await;
    common::assert_unrouted_are_free_and_head_is_charged(&http).await;
}

/// Every 401 has one shape: a missing API key and a duplicated one alike
/// get problem+json with the `WWW-Authenticate` challenge of the identity.
#[tokio::test]
async fn every_401_has_the_challenge() {
    let (_clock, store) = memory_store();
    let key = common::api_key();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        RateLimitLayer::builder(per_minute(store, "per-key", 3))
            .identity(Identity::new().api_key("x-api-key", key))
            .build()
            .unwrap(),
    );
    let http = serve(app).await;
    common::assert_every_401_has_the_challenge(&http).await;
}

/// A route bound by name to a running configuration: a reload changes its
/// limit for the next request, without a restart (same algorithm: the
/// counter is kept).
#[tokio::test]
async fn a_reload_changes_the_limits_of_a_running_route() {
    let live = common::live_config(2).await;
    let layer = RateLimitLayer::builder(live.route("api").unwrap())
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .build()
        .unwrap();
    let http = serve(app(layer)).await;
    common::assert_reload_applies(&http, &live).await;
}

/// A gRPC call that is rate limited gets `grpc-status: 8` in a
/// trailers-only answer, not a 429 whose body a gRPC client cannot read.
#[tokio::test]
async fn grpc_calls_get_grpc_status() {
    let (_clock, store) = memory_store();
    let layer = by_ip(per_minute(store, "api", 2), ClientIp::direct());
    let app = Router::new()
        .route("/grpc", axum::routing::post(|| async { "" }))
        .layer(layer);
    common::assert_grpc_calls_get_grpc_status(&serve(app).await).await;
}

/// `reject_with` answers a limit with the application's own page.
#[tokio::test]
async fn rejections_your_way() {
    let (_clock, store) = memory_store();
    let layer = RateLimitLayer::builder(per_minute(store, "api", 2))
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .reject_with(common::html_rejection)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/grpc", axum::routing::post(|| async { "" }))
        .layer(layer);
    common::assert_rejections_your_way(&serve(app).await).await;
}

/// Allow lists, deny lists and skip rules over real HTTP.
#[tokio::test]
async fn access_rules_exempt_deny_and_skip() {
    let (_clock, store) = memory_store();
    let layer = RateLimitLayer::builder(per_minute(store, "api", 2))
        .identity(Identity::new().api_key("x-api-key", common::api_key()))
        .access(common::access_rules())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }).delete(|| async { "gone" }))
        .route("/health", get(|| async { "healthy" }))
        .route("/grpc", axum::routing::post(|| async { "" }))
        .layer(layer);
    common::assert_access_rules(&serve(app).await).await;
}

/// Under a router nested at `/v1`, path rules see the path as sent: a
/// skip rule for `/metrics` does not skip `/v1/metrics` (axum strips the
/// prefix before the layer; the layer reads `OriginalUri`).
#[cfg(feature = "axum")]
#[tokio::test]
async fn path_rules_see_the_path_as_sent_under_a_nested_router() {
    let (_clock, store) = memory_store();
    let layer = RateLimitLayer::builder(per_minute(store, "api", 1))
        .identity(Identity::new().api_key("x-api-key", common::api_key()))
        .access(tollgate_tower::AccessRules::new().skip_path("/metrics"))
        .build()
        .unwrap();
    let nested = Router::new()
        .route("/metrics", get(|| async { "expensive" }))
        .layer(layer);
    let http = serve(Router::new().nest("/v1", nested)).await;
    let key = [("x-api-key", "k-1")];
    assert_eq!(http.get("/v1/metrics", &key).await.status, StatusCode::OK);
    assert_eq!(
        http.get("/v1/metrics", &key).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "/v1/metrics is not /metrics"
    );
}
