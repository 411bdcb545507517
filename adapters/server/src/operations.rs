//! `POST /v1/operations/{operation}`: an operator's calls on one client of
//! a rule — its usage, a peek, and the per-key operations (reset, penalty,
//! reward, block) on the rule's per-client layers — behind the operators'
//! named tokens, each change logged with the token's name.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use tollgate_http::headers::ceil_millis;
use tollgate_limiter::{Decision, Error, Usage};

use crate::http_api::{error, json_body, reply, unauthorized, EntryJson};
use crate::rules::{Descriptor, Target};
use crate::Shared;

/// The body: which client (a descriptor of a domain, as Envoy sends it)
/// and the operation's amount.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationRequest {
    domain: String,
    entries: Vec<EntryJson>,
    /// Units of a penalty or a reward; a peek's cost (default 1).
    #[serde(default)]
    units: Option<u64>,
    /// A block's length in milliseconds.
    #[serde(default)]
    block_ms: Option<u64>,
}

/// Why an operation was not carried out: the status and what to fix.
struct Refusal(StatusCode, String);

impl Refusal {
    fn new(status: StatusCode, why: impl Into<String>) -> Self {
        Refusal(status, why.into())
    }
}

/// The operator whose token `request` carries, by name.
fn operator<'s>(shared: &'s Shared, request: &Request) -> Option<&'s str> {
    let sent = request.headers().get("authorization");
    shared
        .operators
        .iter()
        .find(|(_, token)| crate::auth::bearer_matches(sent, token))
        .map(|(name, _)| name.as_str())
}

pub(crate) async fn operate(
    State(shared): State<Arc<Shared>>,
    Path(operation): Path<String>,
    request: Request,
) -> Response {
    // The token first: a body is read only for those who may send one.
    let Some(operator) = operator(&shared, &request).map(str::to_string) else {
        return unauthorized();
    };
    let body: OperationRequest = match json_body(&shared, request).await {
        Ok(body) => body,
        Err(answer) => return answer,
    };
    let entries = body
        .entries
        .iter()
        .map(|e| (e.key.clone(), e.value.clone()));
    let descriptor = Descriptor::new(entries, 1);
    let rules = shared.rules();
    let target = match rules.target(&body.domain, &descriptor) {
        Some(Ok(target)) => target,
        Some(Err(e)) => return error(StatusCode::BAD_REQUEST, &e.0),
        None => {
            return error(
                StatusCode::NOT_FOUND,
                "no rule of the domain matches these entries",
            )
        }
    };
    let outcome = run(&target, &operation, &body).await;
    let changes = matches!(
        operation.as_str(),
        "reset" | "penalize" | "reward" | "block"
    );
    if changes {
        // Who changed what: the token's name, never the token; secrets
        // among the entries are hashed (the rule's `hashed`).
        let amount = match (body.units, body.block_ms) {
            (Some(units), _) if operation != "block" => format!(" units={units}"),
            (_, Some(ms)) if operation == "block" => format!(" block_ms={ms}"),
            _ => String::new(),
        };
        let result = match &outcome {
            Ok(_) => "done".to_string(),
            Err(refusal) => format!("refused ({})", refusal.0),
        };
        eprintln!(
            "operation: {operator} {operation} rule={} {}{amount}: {result}",
            target.rule,
            target.subjects.join(" "),
        );
    }
    match outcome {
        Ok(layers) => reply(
            StatusCode::OK,
            "application/json",
            json!({ "operation": operation, "rule": target.rule, "layers": layers }).to_string(),
        ),
        Err(Refusal(status, why)) => error(status, &why),
    }
}

/// Carry `operation` out on `target`: each layer's state afterwards.
async fn run(
    target: &Target,
    operation: &str,
    body: &OperationRequest,
) -> Result<Vec<serde_json::Value>, Refusal> {
    let (limiter, ctx) = (&target.limiter, &target.context);
    let own = limiter.on_scope(&target.own);
    let units = || {
        body.units
            .ok_or_else(|| Refusal::new(StatusCode::BAD_REQUEST, "give units (at least 1)"))
    };
    let decided = match operation {
        "usage" => return limiter.usage(ctx).await.map(usage).map_err(refused),
        "peek" => limiter.peek(ctx, body.units.unwrap_or(1)).await,
        "reset" => match own.reset(ctx).await {
            Ok(()) => limiter.peek(ctx, 1).await,
            Err(e) => Err(e),
        },
        "penalize" => own.penalize(ctx, units()?).await,
        "reward" => own.reward(ctx, units()?).await,
        "block" => {
            let ms = body
                .block_ms
                .ok_or_else(|| Refusal::new(StatusCode::BAD_REQUEST, "give block_ms"))?;
            own.block(ctx, Duration::from_millis(ms)).await
        }
        other => {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("no operation {other:?}: usage, peek, reset, penalize, reward or block"),
            ))
        }
    };
    decided
        .map(|d| layers(&d, operation == "peek"))
        .map_err(refused)
}

/// Each layer's state: what is used and left of its limit, and when it
/// is full again (and for a peek, whether the cost would pass).
fn layers(decision: &Decision, peek: bool) -> Vec<serde_json::Value> {
    decision
        .layers()
        .iter()
        .map(|l| {
            let v = &l.verdict();
            let mut layer = json!({
                "layer": l.layer(),
                "policy": l.policy(),
                "limit": v.limit,
                "used": v.limit.saturating_sub(v.remaining),
                "remaining": v.remaining,
                "resets_in_ms": ceil_millis(v.reset_after),
            });
            if peek || !v.allowed {
                layer["allowed"] = json!(v.allowed);
                layer["retry_after_ms"] = json!(v.retry_after.map(ceil_millis));
            }
            layer
        })
        .collect()
}

/// Each layer's usage ([`Limiter::usage`](tollgate_limiter::Limiter::usage)):
/// used, limit and remaining, when it is full again, and the plan.
fn usage(usage: Usage) -> Vec<serde_json::Value> {
    usage
        .layers
        .iter()
        .map(|l| {
            json!({
                "layer": l.layer,
                "policy": l.policy,
                "plan": l.plan,
                "limit": l.limit,
                "used": l.used,
                "remaining": l.remaining,
                "resets_in_ms": ceil_millis(l.resets_in),
            })
        })
        .collect()
}

/// An operation the limiter refused.
fn refused(e: Error) -> Refusal {
    let status = match &e {
        Error::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    };
    Refusal(status, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_limiter::{Decision, Layer, LayerDecision, Limit, Policy, Scope, Source, Verdict};

    /// Waits in a body are whole milliseconds rounded up: a client that
    /// retries after 333 ms of a 333.3 ms wait would be denied again.
    #[test]
    fn waits_are_rounded_up_to_the_millisecond() {
        let limit = Limit::gcra(3, Duration::from_secs(1), 1).unwrap();
        let layer = Layer::new("key", Scope::Subject, Policy::new("p", limit).unwrap());
        let verdict = Verdict {
            allowed: false,
            limit: 1,
            remaining: 0,
            reset_after: Duration::from_nanos(333_333_334),
            retry_after: Some(Duration::from_nanos(333_333_334)),
        };
        let decision = Decision::new([LayerDecision::new(&layer, verdict, Source::Store)]);
        let body = &super::layers(&decision, true)[0];
        assert_eq!(body["retry_after_ms"], 334, "{body}");
        assert_eq!(body["resets_in_ms"], 334, "{body}");
    }
}
