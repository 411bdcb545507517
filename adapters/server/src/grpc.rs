//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tollgate_http::{decision_headers, HeaderStyle};

use tonic::codegen::{http, BoxFuture};

use crate::rules::{Answer, Rules, Status};
use crate::traces::{decision_attributes, Span, TraceContext};
use crate::wire::WireRequest;
use crate::Shared;

/// The gRPC service: Envoy's rate limit protocol over the running rules.
#[derive(Debug, Clone)]
pub struct Service {
    pub(crate) shared: Arc<Shared>,
}

fn duration(d: std::time::Duration) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn status(rules: &Rules, s: &Status) -> DescriptorStatus {
    let code = if s.ok { Code::Ok } else { Code::OverLimit };
    let Some(layer) = &s.tightest else {
        return DescriptorStatus {
            code: code as i32,
            limit_remaining: if s.unlimited { u32::MAX } else { 0 },
            ..Default::default()
        };
    };
    let current_limit = rules.envoy_limit(s).map(|e| RateLimit {
        name: rules.limit_name(layer).to_string(),
        requests_per_unit: e.requests_per_unit,
        unit: e.unit,
    });
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining: u32::try_from(layer.verdict().remaining).unwrap_or(u32::MAX),
        duration_until_reset: s.until_reset().map(duration),
        ..Default::default()
    }
}

/// The response for `outcome`.
pub(crate) fn response(rules: &Rules, outcome: &Answer) -> RateLimitResponse {
    let headers = rules.settings().response_headers;
    let overall = if outcome.ok() {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let response_headers_to_add = match (headers, outcome.for_headers()) {
        (true, Some(decision)) => decision_headers(&decision, HeaderStyle::default())
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                value,
                ..Default::default()
            })
            .collect(),
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses: outcome.statuses.iter().map(|s| status(rules, s)).collect(),
        response_headers_to_add,
        ..Default::default()
    }
}

/// The largest request a call may send. A `RateLimitRequest` is a domain
/// and a few descriptors; tonic's default (4 MiB) held by every open call
/// would let one client use gigabytes.
const MAX_MESSAGE: usize = 256 * 1024;

/// The method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

impl tonic::server::NamedService for Service {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl Service {
    /// Decide one request, in `span` when it is traced.
    async fn should_rate_limit(
        &self,
        request: WireRequest,
        span: Option<Span>,
    ) -> RateLimitResponse {
        let (domain, descriptors) = request.into_descriptors();
        let rules = self.shared.rules();
        let outcome = rules.decide(&domain, &descriptors).await;
        if let (Some(tracer), Some(span)) = (&self.shared.tracer, span) {
            let attributes = decision_attributes(&domain, descriptors.len(), outcome.as_ref().ok());
            tracer.finish(span, "ShouldRateLimit", attributes);
        }
        match outcome {
            Ok(outcome) => response(&rules, &outcome),
            // Never a gRPC error, which Envoy would turn into an allow.
            Err(_) => RateLimitResponse {
                overall_code: Code::OverLimit as i32,
                ..Default::default()
            },
        }
    }
}

/// `ShouldRateLimit` as tonic's unary service, decoding [`WireRequest`],
/// in the request's span when it is traced.
struct Unary(Service, Option<Span>);

impl tonic::server::UnaryService<WireRequest> for Unary {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<WireRequest>) -> Self::Future {
        let service = self.0.clone();
        let span = self.1.take();
        Box::pin(async move {
            let response = service.should_rate_limit(request.into_inner(), span).await;
            Ok(tonic::Response::new(response))
        })
    }
}

// The service Envoy calls, written out rather than generated: the
// generated one decodes values as `string` (see `wire.rs`).
impl<B> tonic::codegen::Service<http::Request<B>> for Service
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(tonic::Status::unimplemented("").into_http()) });
        }
        // The token before the body is read: only clients that may ask
        // cost a decode.
        if let Some(token) = &self.shared.grpc_token {
            if !crate::auth::bearer_matches(request.headers().get("authorization"), token) {
                let refused = tonic::Status::unauthenticated(
                    "send the metadata authorization: Bearer <token> (server.grpc_token_env)",
                );
                return Box::pin(async move { Ok(refused.into_http()) });
            }
        }
        // The trace Envoy continues, from its metadata.
        let span = self.shared.tracer.as_ref().and_then(|tracer| {
            tracer.begin(TraceContext::parse(request.headers().get("traceparent")))
        });
        let unary = Unary(self.clone(), span);
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<RateLimitResponse, WireRequest>::default();
            let mut grpc = tonic::server::Grpc::new(codec).max_decoding_message_size(MAX_MESSAGE);
            Ok(grpc.unary(unary, request).await)
        })
    }
}
