//! The HTTP API beside the gRPC service: `POST /v1/check`, concurrency
//! limits (`POST /v1/acquire`, `permit_api.rs`), `GET /healthz`,
//! `GET /readyz`, `GET /metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::json;
use tollgate_http::{apply_headers, decision_headers, HeaderStyle};
use tollgate_limiter::{LayerRequest, Limit, Policy, StoreKey};

use crate::rules::Descriptor;
use crate::traces::{decision_attributes, TraceContext};
use crate::Shared;

/// How long `/readyz` waits for the store.
const READY_WITHIN: Duration = Duration::from_secs(2);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    domain: String,
    descriptors: Vec<DescriptorJson>,
    #[serde(default)]
    hits_addend: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorJson {
    entries: Vec<EntryJson>,
    #[serde(default)]
    hits_addend: Option<u64>,
}

/// One descriptor entry as JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntryJson {
    pub(crate) key: String,
    pub(crate) value: String,
}

/// The router (`POST /v1/check` reads at most `server.max_body_bytes`).
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route(
            "/v1/operations/{operation}",
            post(crate::operations::operate),
        )
        .route("/v1/acquire", post(crate::permit_api::acquire))
        .route(
            "/v1/permits/{id}",
            axum::routing::delete(crate::permit_api::release),
        )
        .route("/v1/permits/{id}/renew", post(crate::permit_api::renew))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

pub(crate) fn reply(status: StatusCode, content_type: &str, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        "content-type",
        content_type.parse().expect("a valid content type"),
    );
    response
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    reply(
        status,
        "application/json",
        json!({ "error": message }).to_string(),
    )
}

/// Whether the request carries the API's bearer token (when it has one).
pub(crate) fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    shared
        .token
        .as_ref()
        .is_none_or(|token| crate::auth::bearer_matches(headers.get("authorization"), token))
}

/// 401, asking for a bearer token.
pub(crate) fn unauthorized() -> Response {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "send Authorization: Bearer <token>",
    );
    r.headers_mut()
        .insert("www-authenticate", "Bearer".parse().expect("valid"));
    r
}

/// Whether reading a body failed on its length limit, not on the body
/// itself (a malformed chunk, a client gone mid-body).
fn over_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = cause {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The body of `request` as JSON, at most `server.max_body_bytes`; or the
/// answer saying what is wrong with it (413, 400).
pub(crate) async fn json_body<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    request: Request,
) -> Result<T, Response> {
    let limit = shared.started.max_body_bytes;
    let within = crate::http_serve::BODY_WITHIN;
    let read = tokio::time::timeout(within, axum::body::to_bytes(request.into_body(), limit));
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) if over_limit(&e) => {
            let why = format!("the body is over {limit} bytes (server.max_body_bytes)");
            return Err(error(StatusCode::PAYLOAD_TOO_LARGE, &why));
        }
        Ok(Err(_)) => {
            let why = "the body could not be read (malformed chunked encoding, or cut short)";
            return Err(error(StatusCode::BAD_REQUEST, why));
        }
        Err(_) => {
            let why = format!("the body did not arrive within {within:?}");
            return Err(error(StatusCode::REQUEST_TIMEOUT, &why));
        }
    };
    serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, &format!("the request body: {e}")))
}

/// One descriptor's status as `/v1/check` answers it.
fn status_json(rules: &crate::Rules, s: &crate::Status) -> serde_json::Value {
    let mut v = json!({ "code": if s.ok { "OK" } else { "OVER_LIMIT" } });
    if s.unlimited {
        v["unlimited"] = json!(true);
    }
    if let (Some(layer), Some(until)) = (&s.tightest, s.until_reset()) {
        v["policy"] = json!(layer.policy());
        v["limit_remaining"] = json!(layer.verdict().remaining);
        v["duration_until_reset_ms"] = json!(tollgate_http::headers::ceil_millis(until));
        if let Some(e) = rules.envoy_limit(s) {
            v["current_limit"] = json!({
                "requests_per_unit": e.requests_per_unit,
                "unit": e.unit_name,
                "exact": e.exact,
            });
        }
    }
    v
}

async fn check(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    // The token first: a body is read only for those who may send one.
    if !authorized(&shared, request.headers()) {
        return unauthorized();
    }
    let span = shared
        .tracer
        .as_ref()
        .and_then(|tracer| tracer.begin(TraceContext::parse(request.headers().get("traceparent"))));
    let request: CheckRequest = match json_body(&shared, request).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    let descriptors: Vec<Descriptor> = request
        .descriptors
        .into_iter()
        .map(|d| {
            let entries = d.entries.into_iter().map(|e| (e.key, e.value));
            // As on gRPC: the request's 0 (unset) means 1, a descriptor's
            // own 0 checks without charging.
            let hits = d.hits_addend.unwrap_or(request.hits_addend.max(1));
            Descriptor::new(entries, hits)
        })
        .collect();
    let rules = shared.rules();
    let outcome = rules.decide(&request.domain, &descriptors).await;
    if let (Some(tracer), Some(span)) = (&shared.tracer, span) {
        let attributes =
            decision_attributes(&request.domain, descriptors.len(), outcome.as_ref().ok());
        tracer.finish(span, "POST /v1/check", attributes);
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.0),
    };
    let statuses: Vec<serde_json::Value> = outcome
        .statuses
        .iter()
        .map(|s| status_json(&rules, s))
        .collect();
    let overall = if outcome.ok() { "OK" } else { "OVER_LIMIT" };
    let status = match (outcome.ok(), outcome.failed_closed()) {
        (true, _) => StatusCode::OK,
        (false, true) => StatusCode::SERVICE_UNAVAILABLE,
        (false, false) => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut response = reply(
        status,
        "application/json",
        json!({ "overall": overall, "statuses": statuses }).to_string(),
    );
    let decision = outcome.for_headers();
    if let (true, Some(decision)) = (rules.settings().response_headers, decision) {
        apply_headers(
            &decision_headers(&decision, HeaderStyle::default()),
            response.headers_mut(),
        );
    }
    response
}

/// Ready when no shutdown has begun, the store answers a peek within two
/// seconds and no circuit breaker is open.
async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    if shared.stopping.load(std::sync::atomic::Ordering::Relaxed) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    let rules = shared.rules();
    if !rules.breakers_closed() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "a circuit breaker is open");
    }
    let policy = Policy::new(
        "readyz",
        Limit::fixed_window(1, Duration::from_secs(1)).expect("valid"),
    )
    .expect("valid");
    let probe = [LayerRequest {
        key: StoreKey::new("readyz", &policy, "g", "readyz"),
        policy: &policy,
        cost: 1,
    }];
    match tokio::time::timeout(READY_WITHIN, rules.store().peek(&probe)).await {
        Ok(Ok(_)) => reply(StatusCode::OK, "text/plain", "ready\n".into()),
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, &format!("the store: {e}")),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the store did not answer within {READY_WITHIN:?}"),
        ),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    match &shared.metrics {
        Some(handle) => reply(StatusCode::OK, "text/plain; version=0.0.4", handle.render()),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "another metrics recorder was installed first in this process",
        ),
    }
}
