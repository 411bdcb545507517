//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tollgate_http::{decision_headers, HeaderStyle};

use crate::rules::{Descriptor, Outcome, Rules, Status};
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
            ..Default::default()
        };
    };
    let current_limit = rules.envoy_limit(s).map(|e| RateLimit {
        name: layer.policy().to_string(),
        requests_per_unit: e.requests_per_unit,
        unit: e.unit,
    });
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining: u32::try_from(layer.verdict.remaining).unwrap_or(u32::MAX),
        duration_until_reset: s.until_reset().map(duration),
        ..Default::default()
    }
}

/// The response for `outcome`.
pub(crate) fn response(rules: &Rules, outcome: &Outcome) -> RateLimitResponse {
    let headers = rules.settings().response_headers;
    let overall = if outcome.ok() {
        Code::Ok
    } else {
        Code::OverLimit
    };
    let response_headers_to_add = match (headers, outcome.decisions.first()) {
        (true, Some(decision)) => decision_headers(decision, HeaderStyle::default())
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

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        let descriptors: Vec<Descriptor> = request
            .descriptors
            .iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                hits: d
                    .hits_addend
                    .map_or(u64::from(request.hits_addend), |h| h.value),
            })
            .collect();
        let rules = self.shared.rules();
        let outcome = rules
            .decide(&request.domain, &descriptors)
            .await
            .map_err(|e| tonic::Status::invalid_argument(e.0))?;
        Ok(tonic::Response::new(response(&rules, &outcome)))
    }
}
