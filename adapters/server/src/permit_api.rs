//! The HTTP API's concurrency limits: `POST /v1/acquire` takes a place on
//! a route of the file (every layer decided together, as in the
//! application), `POST /v1/permits/{id}/renew` keeps it for another lease,
//! `DELETE /v1/permits/{id}` gives it back. Envoy's protocol has no
//! release, so concurrency limits are served here only.

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use tollgate_http::{apply_headers, decision_headers, HeaderStyle};
use tollgate_limiter::{Context, Subject};

use crate::http_api::{authorized, error, json_body, reply, unauthorized};
use crate::permits::Renewed;
use crate::Shared;

/// How often permits whose clients stopped renewing are given back.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    /// A `[routes.<name>]` of the file.
    route: String,
    subject: Option<String>,
    tenant: Option<String>,
    /// The route's cost when not given.
    cost: Option<u64>,
    /// Hash the subject and tenant with the server's hash key (they are
    /// secrets, such as API keys).
    #[serde(default)]
    hashed: bool,
}

pub(crate) async fn acquire(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    if !authorized(&shared, request.headers()) {
        return unauthorized();
    }
    let asked: AcquireRequest = match json_body(&shared, request).await {
        Ok(r) => r,
        Err(answer) => return answer,
    };
    shared.permits.give_back_expired(shared.clock.now());
    // Not bound: a client naming a route must not stop a reload that
    // drops it (a held permit keeps its own limiter).
    let Some(route) = shared.live.route_limits(&asked.route) else {
        let why = format!(
            "route {:?} is not a [routes.<name>] of the file",
            asked.route
        );
        return error(StatusCode::BAD_REQUEST, &why);
    };
    let limiter = route.limiter();
    if !limiter.has_concurrency() {
        let why = "the route has no concurrency limit: decide with /v1/check";
        return error(StatusCode::BAD_REQUEST, why);
    }
    let ctx = match context(&shared, &asked) {
        Ok(ctx) => ctx,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let cost = asked.cost.unwrap_or(route.cost());
    let acquired = match limiter.acquire(&ctx, cost).await {
        Ok(acquired) => acquired,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let decision = acquired.decision;
    let mut body = json!({ "allowed": decision.is_allowed() });
    if let Some(permit) = acquired.permit {
        body["lease_ms"] = json!(permit.lease().as_millis() as u64);
        body["permit"] = json!(shared.permits.insert(permit, shared.clock.now()));
    }
    if let Some(wait) = decision.retry_after() {
        body["retry_after_ms"] = json!(tollgate_http::headers::ceil_millis(wait));
    }
    let status = match (decision.is_allowed(), decision.failed_closed()) {
        (true, _) => StatusCode::OK,
        (false, true) => StatusCode::SERVICE_UNAVAILABLE,
        (false, false) => StatusCode::TOO_MANY_REQUESTS,
    };
    let mut response = reply(status, "application/json", body.to_string());
    let headers = decision_headers(&decision, HeaderStyle::default());
    apply_headers(&headers, response.headers_mut());
    response
}

/// The request's context: its subject and tenant, hashed when asked.
fn context(shared: &Shared, asked: &AcquireRequest) -> Result<Context, String> {
    let rules = shared.rules();
    let subject = |value: &str| match (asked.hashed, rules.hash_key()) {
        (true, Some(key)) => Ok(Subject::hashed(value.as_bytes(), key)),
        (true, None) => {
            Err("hashed needs server.hash_key_env, the variable holding the hash key".into())
        }
        (false, _) => Subject::new(value).map_err(|e| e.to_string()),
    };
    let mut ctx = Context::new();
    if let Some(s) = &asked.subject {
        ctx = ctx.with_subject(subject(s)?);
    }
    if let Some(t) = &asked.tenant {
        ctx = ctx.with_tenant(subject(t)?);
    }
    Ok(ctx)
}

pub(crate) async fn renew(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    shared.permits.give_back_expired(shared.clock.now());
    match shared.permits.renew(&id, &*shared.clock).await {
        Renewed::Held(lease) => reply(
            StatusCode::OK,
            "application/json",
            json!({ "lease_ms": lease.as_millis() as u64 }).to_string(),
        ),
        Renewed::Gone => gone(),
        Renewed::Unavailable => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer: the place is held until its lease runs out; renew again",
        ),
    }
}

pub(crate) async fn release(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&shared, &headers) {
        return unauthorized();
    }
    // (Waits for a renewal of the same permit in flight.)
    let held = shared.permits.remove(&id);
    let permit = match held {
        Some(held) => held.take().await,
        None => None,
    };
    let Some(permit) = permit else {
        return gone();
    };
    match permit.release().await {
        Ok(()) => reply(StatusCode::NO_CONTENT, "application/json", String::new()),
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer: the place comes back when its lease runs out",
        ),
    }
}

/// 404 for a permit the server does not hold.
fn gone() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such permit: released, never given, or its lease ran out (acquire again)",
    )
}

/// Give back expired permits every [`SWEEP_EVERY`] while the server lives,
/// so a place whose client died comes back without another call.
pub(crate) async fn sweep(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Some(giving) = shared.permits.give_back_expired(shared.clock.now()) {
            // One sweep at a time, however long the store takes.
            let _ = giving.await;
        }
    }
}
