//! OpenTelemetry traces: a span per decision, continuing the trace the
//! caller sent in `traceparent`, exported over OTLP/HTTP as JSON to a
//! receiver that keeps what it is sent.

use crate::common;

use std::sync::{Arc, Mutex};

use axum::routing::post;
use common::{client, descriptor, TempDir};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::Value;
use tollgate_limiter::{ManualClock, Timestamp};
use tollgate_ratelimit_server::Server;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver on a free port: every body it is sent.
async fn receiver() -> (std::net::SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: String| {
            let kept = kept.clone();
            async move {
                kept.lock()
                    .unwrap()
                    .push(serde_json::from_str(&body).expect("JSON"));
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, bodies)
}

/// One rule of a limit of 1, traced to `collector`.
fn config(collector: std::net::SocketAddr) -> String {
    let traces = format!(
        "[server.traces]\notlp_endpoint = \"http://{collector}/v1/traces\"\nservice_name = \"edge-limits\""
    );
    common::one_rule_config("", 1, &traces)
}

/// Every span the receiver got.
fn spans(bodies: &[Value]) -> Vec<Value> {
    let mut spans = Vec::new();
    for body in bodies {
        let service = &body["resourceSpans"][0]["resource"]["attributes"][0];
        assert_eq!(service["key"], "service.name");
        assert_eq!(service["value"]["stringValue"], "edge-limits");
        for span in body["resourceSpans"][0]["scopeSpans"][0]["spans"]
            .as_array()
            .expect("spans")
        {
            spans.push(span.clone());
        }
    }
    spans
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    let attributes = span["attributes"].as_array().expect("attributes");
    let found = attributes.iter().find(|a| a["key"] == key);
    &found.unwrap_or_else(|| panic!("{key} in {span}"))["value"]
}

/// A sampled caller's decisions become spans of its trace, with the rule
/// and the outcome; an unsampled one's and a caller without a trace's
/// (the ratio is 0) do not; the last spans are sent at shutdown.
#[tokio::test]
async fn decisions_continue_the_callers_trace() {
    let (collector, bodies) = receiver().await;
    let dir = TempDir::new("traces");
    let file = dir.write("server.toml", &config(collector));
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_780_000_020_000_000,
    )));
    let server = Server::start(&file, clock).await.expect("starts");
    let mut grpc = client(server.grpc_addr()).await;
    let ask = |flags: Option<&str>| {
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("user_id", "u1")], None)],
            hits_addend: 0,
        });
        if let Some(flags) = flags {
            let traceparent = format!("00-{TRACE}-{PARENT}-{flags}");
            request
                .metadata_mut()
                .insert("traceparent", traceparent.parse().unwrap());
        }
        request
    };
    for flags in [Some("01"), Some("01"), Some("00"), None] {
        grpc.should_rate_limit(ask(flags)).await.expect("answered");
    }
    server.shutdown().await;

    let spans = spans(&bodies.lock().unwrap());
    assert_eq!(spans.len(), 2, "the two sampled decisions: {spans:?}");
    for span in &spans {
        assert_eq!(span["traceId"], TRACE);
        assert_eq!(span["parentSpanId"], PARENT);
        assert_eq!(span["name"], "ShouldRateLimit");
        assert_eq!(span["kind"], 2);
        assert_eq!(span["spanId"].as_str().map(str::len), Some(16));
        assert_eq!(attribute(span, "ratelimit.domain")["stringValue"], "edge");
        assert_eq!(attribute(span, "ratelimit.rules")["stringValue"], "api");
    }
    let codes: Vec<&Value> = spans
        .iter()
        .map(|s| &attribute(s, "ratelimit.code")["stringValue"])
        .collect();
    assert_eq!(codes, ["OK", "OVER_LIMIT"], "a limit of 1");
    assert_ne!(spans[0]["spanId"], spans[1]["spanId"]);
}

/// An endpoint that is not plain HTTP is refused at start.
#[tokio::test]
async fn an_endpoint_that_is_not_http_is_refused() {
    let dir = TempDir::new("traces");
    let text = config("127.0.0.1:4318".parse().unwrap()).replace("http://", "https://");
    let file = dir.write("server.toml", &text);
    let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
        1_780_000_020_000_000,
    )));
    let refused = Server::start(&file, clock).await.expect_err("refused");
    assert!(refused.to_string().contains("must be http://"), "{refused}");
}
