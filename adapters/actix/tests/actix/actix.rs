//! The actix-web middleware in a real actix-web server on 127.0.0.1, driven
//! by a real HTTP client. Time is a manual clock; nothing sleeps.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::Service as _;
use actix_web::dev::ServiceRequest;
use actix_web::{guard, web, App, HttpMessage, HttpServer};
use common::{memory_store, per_minute, DownStore, Http};
use http::StatusCode;
use tollgate_actix::{Cidr, ClientIp, GateBuilder, Identity, RateLimit};
use tollgate_limiter::{Decision, Limiter, Store};

/// Serve one route wrapped in `rate_limit` on a free loopback port. The
/// `auth` stand-in turns an `x-user` header into a subject, as an
/// authentication middleware would.
fn serve(rate_limit: RateLimit) -> Http {
    serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .wrap_fn(|request, service| {
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
                    service.call(request)
                })
                .route(
                    "/",
                    web::get().to(|decision: web::ReqData<Decision>| async move {
                        format!("left: {}", decision.layers()[0].verdict().remaining)
                    }),
                ),
        );
    })
}

fn by_ip(limiter: Limiter, ip: ClientIp) -> RateLimit {
    by_ip_builder(limiter, ip).build().unwrap()
}

fn by_ip_builder(limiter: Limiter, ip: ClientIp) -> GateBuilder<ServiceRequest, RateLimit> {
    RateLimit::builder(limiter).identity(Identity::new().client_ip(ip))
}

#[actix_web::test]
async fn three_pass_then_429_with_exact_headers() {
    let (clock, store) = memory_store();
    let http = serve(by_ip(per_minute(store, "per-ip", 3), ClientIp::direct()));

    for expected_remaining in [2, 1, 0] {
        let reply = http.get("/", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, format!("left: {expected_remaining}"));
        let policy = reply.items("ratelimit-policy");
        assert_eq!(policy[0].0, "per-ip");
        assert_eq!((policy[0].1["q"], policy[0].1["w"]), (3, 60));
        assert_eq!(reply.remaining_and_reset(), (expected_remaining, 60));
        assert_eq!(reply.header("retry-after"), None);
    }

    clock.advance(Duration::from_millis(15_500));
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
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

    clock.advance(Duration::from_millis(44_500));
    assert_eq!(http.get("/", &[]).await.status, StatusCode::OK);
}

#[actix_web::test]
async fn spoofed_forwarded_for_does_not_change_the_bucket() {
    let (_clock, store) = memory_store();
    let http = serve(by_ip(per_minute(store, "per-ip", 3), ClientIp::direct()));
    for spoof in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let reply = http.get("/", &[("x-forwarded-for", spoof)]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    // `Forwarded` is not read either (actix-web's realip would believe it).
    let reply = http
        .get(
            "/",
            &[
                ("x-forwarded-for", "198.51.100.99"),
                ("forwarded", "for=198.51.100.98"),
            ],
        )
        .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[actix_web::test]
async fn clients_behind_a_trusted_proxy_get_their_own_buckets() {
    let (_clock, store) = memory_store();
    let proxy: Cidr = "127.0.0.1/32".parse().unwrap();
    let http = serve(by_ip(
        per_minute(store, "per-ip", 3),
        ClientIp::trusted_proxies([proxy]),
    ));
    let a = [("x-forwarded-for", "203.0.113.7")];
    for _ in 0..3 {
        assert_eq!(http.get("/", &a).await.status, StatusCode::OK);
    }
    assert_eq!(
        http.get("/", &a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let spoofing_a = [("x-forwarded-for", "10.9.9.9, 203.0.113.7")];
    assert_eq!(
        http.get("/", &spoofing_a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let b = [("x-forwarded-for", "203.0.113.8")];
    let reply = http.get("/", &b).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 2);
}

#[actix_web::test]
async fn missing_subject_is_401_and_an_auth_layer_identifies() {
    let (_clock, store) = memory_store();
    let http = serve(
        RateLimit::builder(per_minute(store, "per-user", 3))
            .identity(Identity::new().extension())
            .unauthorized_challenge("Bearer")
            .build()
            .unwrap(),
    );
    common::assert_401(&http.get("/", &[]).await, "Bearer");

    let reply = http.get("/", &[("x-user", "alice")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "left: 2");
}

/// The plan the authentication layer puts into the request's extensions
/// decides the request's limit; a client's header naming a plan does not.
#[actix_web::test]
async fn the_plan_comes_from_the_authentication_never_the_client() {
    let (_clock, store) = memory_store();
    let http = serve(
        RateLimit::builder(common::per_minute_with_plans(store))
            .identity(Identity::new().extension())
            .build()
            .unwrap(),
    );
    common::assert_plans_from_authentication(&http).await;
}

/// Any store can go here; a stopped Redis will once its store lands.
async fn store_failure_is_503_quickly(store: Arc<dyn Store>, within: Duration) {
    let http = serve(by_ip(per_minute(store, "per-ip", 3), ClientIp::direct()));
    let started = Instant::now();
    let reply = http.get("/", &[]).await;
    assert!(started.elapsed() < within, "took {:?}", started.elapsed());
    common::assert_store_failure_503(&reply, "per-ip");
}

#[actix_web::test]
async fn a_store_that_is_down_gives_503() {
    store_failure_is_503_quickly(Arc::new(DownStore), Duration::from_millis(500)).await;
}

#[actix_web::test]
async fn a_stopped_redis_gives_503_within_the_deadline() {
    let (_server, store) = common::stopped_redis().await;
    // The store's deadline, plus a margin for HTTP on a busy two-core machine.
    store_failure_is_503_quickly(store, common::REDIS_DEADLINE + Duration::from_millis(250)).await;
}

#[actix_web::test]
async fn cost_and_legacy_headers() {
    let (_clock, store) = memory_store();
    let http = serve(
        by_ip_builder(per_minute(store, "per-ip", 3), ClientIp::direct())
            .cost(2)
            .legacy_headers(true)
            .x_ratelimit_headers(true)
            .build()
            .unwrap(),
    );
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.remaining_and_reset().0, 1);
    assert_eq!(reply.header("ratelimit-limit"), Some("3"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("1"));
    assert_eq!(reply.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(
        http.get("/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Serve what `routes` configures on a free loopback port.
fn serve_with(routes: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static) -> Http {
    let server = HttpServer::new(move || App::new().configure(routes.clone()))
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    Http::new(addr)
}

/// Path rules see the path actix-web routes on: `/%61pi/free` is served
/// by `/api/free`, and skipped as it.
#[actix_web::test]
async fn path_rules_see_the_routed_path() {
    let (_clock, store) = memory_store();
    let rate_limit = by_ip_builder(per_minute(store, "per-ip", 1), ClientIp::direct())
        .skip_if(|_, view| view.path() == "/api/free")
        .build()
        .unwrap();
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .route("/api/free", web::get().to(|| async { "free" })),
        );
    });
    for path in ["/api/free", "/%61pi/free", "/%61pi/free"] {
        let reply = http.get(path, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(reply.body, "free");
        assert_eq!(reply.header("ratelimit"), None, "{path}: skipped");
    }
}

/// A browser's CORS preflight is charged by default (any client can send
/// one, and `Resource::to` runs its handler for every method); with
/// `charge_preflights(false)` it is not, even with the middleware around
/// the whole app.
#[actix_web::test]
async fn cors_preflights_are_charged_unless_told_otherwise() {
    let (_clock, store) = memory_store();
    let rate_limit = by_ip(per_minute(store.clone(), "login", 2), ClientIp::direct());
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .service(web::resource("/login").to(|| async { "welcome" })),
        );
    });
    common::assert_preflights_are_charged(&http).await;
    let free = by_ip_builder(per_minute(store, "login-free", 2), ClientIp::direct())
        .charge_preflights(false)
        .build()
        .unwrap();
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(free.clone())
                .route("/login", web::post().to(|| async { "welcome" })),
        );
    });
    common::assert_preflights_are_free(&http).await;
}

/// With the middleware on the route itself (`Route::wrap`), requests the
/// router answers 404 or 405 never reach it: not charged. `HEAD` on a
/// `GET` route is charged like `GET`.
#[actix_web::test]
async fn unrouted_requests_are_not_charged_and_head_is_like_get() {
    let (_clock, store) = memory_store();
    let rate_limit = by_ip(per_minute(store, "per-ip", 3), ClientIp::direct());
    let http = serve_with(move |cfg| {
        cfg.service(
            web::resource("/login").route(
                web::post()
                    .to(|| async { "welcome" })
                    .wrap(rate_limit.clone()),
            ),
        )
        .service(
            // actix-web's `web::get()` does not answer HEAD: a route that
            // does is charged for it like GET.
            web::resource("/search").route(
                web::route()
                    .guard(guard::Any(guard::Get()).or(guard::Head()))
                    .to(|| async { "results" })
                    .wrap(rate_limit.clone()),
            ),
        );
    });
    common::assert_unrouted_are_free_and_head_is_charged(&http).await;
}

/// Every 401 has one shape: a missing API key and a duplicated one alike
/// get problem+json with the `WWW-Authenticate` challenge of the identity.
#[actix_web::test]
async fn every_401_has_the_challenge() {
    let (_clock, store) = memory_store();
    let key = common::api_key();
    let rate_limit = RateLimit::builder(per_minute(store, "per-key", 3))
        .identity(Identity::new().api_key("x-api-key", key))
        .build()
        .unwrap();
    let http = serve_with(move |cfg| {
        cfg.route(
            "/",
            web::get().to(|| async { "ok" }).wrap(rate_limit.clone()),
        );
    });
    common::assert_every_401_has_the_challenge(&http).await;
}

/// A route bound by name to a running configuration: a reload changes its
/// limit for the next request, without a restart (same algorithm: the
/// counter is kept).
#[actix_web::test]
async fn a_reload_changes_the_limits_of_a_running_route() {
    let live = common::live_config(2).await;
    let http = serve(
        RateLimit::builder(live.route("api").unwrap())
            .identity(Identity::new().client_ip(ClientIp::direct()))
            .build()
            .unwrap(),
    );
    common::assert_reload_applies(&http, &live).await;
}

/// A gRPC call that is rate limited gets `grpc-status: 8` in a
/// trailers-only answer, not a 429 whose body a gRPC client cannot read.
#[actix_web::test]
async fn grpc_calls_get_grpc_status() {
    let (_clock, store) = memory_store();
    let rate_limit = by_ip(per_minute(store, "api", 2), ClientIp::direct());
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .route("/grpc", web::post().to(|| async { "" })),
        );
    });
    common::assert_grpc_calls_get_grpc_status(&http).await;
}

/// `reject_with` answers a limit with the application's own page.
#[actix_web::test]
async fn rejections_your_way() {
    let (_clock, store) = memory_store();
    let rate_limit = by_ip_builder(per_minute(store, "api", 2), ClientIp::direct())
        .reject_with(common::html_rejection)
        .build()
        .unwrap();
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .route("/", web::get().to(|| async { "ok" }))
                .route("/grpc", web::post().to(|| async { "" })),
        );
    });
    common::assert_rejections_your_way(&http).await;
}

/// Allow lists, deny lists and skip rules over real HTTP.
#[actix_web::test]
async fn access_rules_exempt_deny_and_skip() {
    let (_clock, store) = memory_store();
    let rate_limit = RateLimit::builder(per_minute(store, "api", 2))
        .identity(Identity::new().api_key("x-api-key", common::api_key()))
        .access(common::access_rules())
        .build()
        .unwrap();
    let http = serve_with(move |cfg| {
        cfg.service(
            web::scope("")
                .wrap(rate_limit.clone())
                .route("/", web::get().to(|| async { "ok" }))
                .route("/", web::delete().to(|| async { "gone" }))
                .route("/health", web::get().to(|| async { "healthy" }))
                .route("/grpc", web::post().to(|| async { "" })),
        );
    });
    common::assert_access_rules(&http).await;
}
