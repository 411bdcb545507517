//! What the gate answers when it does not call the service, and the hook
//! that lets an application answer its own way.

use std::sync::Arc;

use tollgate_limiter::Decision;

use crate::headers;
use crate::response::{self, decision_headers, HeaderStyle, Headers, Problem, Reply};

/// Why a request is answered without calling the service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// A limit denied it: 429 (gRPC: RESOURCE_EXHAUSTED).
    Limited,
    /// A layer's store failed and its policy fails closed: 503 (gRPC:
    /// UNAVAILABLE).
    FailedClosed,
    /// A layer needs an identity the request does not carry: 401 (gRPC:
    /// UNAUTHENTICATED).
    Unidentified,
    /// The client is on a deny list ([`AccessRules`](crate::AccessRules)):
    /// 403 (gRPC: PERMISSION_DENIED).
    Denied,
    /// The limiter could not decide (an invalid cost, a misconfigured
    /// limiter): 500 (gRPC: INTERNAL).
    Internal,
}

/// A request the gate answers itself, as a [rejection
/// hook](crate::GateBuilder::reject_with) sees it: why, the decision (for
/// denials), whether it is a gRPC call, and the reply Tollgate would send.
#[derive(Debug)]
pub struct Rejection<'a> {
    kind: RejectionKind,
    decision: Option<&'a Decision>,
    grpc: bool,
    style: HeaderStyle,
    default: Reply,
}

impl<'a> Rejection<'a> {
    /// Why the request is rejected.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The limiter's decision, for [`Limited`](RejectionKind::Limited) and
    /// [`FailedClosed`](RejectionKind::FailedClosed).
    pub fn decision(&self) -> Option<&'a Decision> {
        self.decision
    }

    /// Whether the request is a gRPC call (`content-type:
    /// application/grpc…`): such a client reads `grpc-status`, not the
    /// HTTP status.
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The rate-limit headers of the decision (`RateLimit-Policy`,
    /// `RateLimit`, the legacy ones the gate sends, `Retry-After`); empty
    /// without a decision. Keep them in your own reply: clients wait by them.
    pub fn rate_limit_headers(&self) -> Headers {
        self.decision
            .map(|d| decision_headers(d, self.style))
            .unwrap_or_default()
    }

    /// Whole seconds until the request may pass, as `Retry-After` says.
    pub fn retry_after(&self) -> Option<u64> {
        self.decision.and_then(headers::retry_after_secs)
    }

    /// The reply Tollgate sends when the hook returns `None`: problem+json,
    /// or the gRPC form for a gRPC call.
    pub fn default_reply(&self) -> &Reply {
        &self.default
    }
}

/// The application's rejection hook.
pub(crate) type RejectHook = Arc<dyn Fn(&Rejection<'_>) -> Option<Reply> + Send + Sync>;

/// The reply for a rejection: the hook's, or else the default in the form
/// the client reads.
pub(crate) fn reply(
    kind: RejectionKind,
    decision: Option<&Decision>,
    grpc: bool,
    style: HeaderStyle,
    challenge: &str,
    hook: Option<&RejectHook>,
) -> Reply {
    let (problem, headers): (Problem, Headers) = match (kind, decision) {
        (RejectionKind::Limited, Some(d)) => (
            response::too_many_requests(d, style),
            decision_headers(d, style),
        ),
        (RejectionKind::FailedClosed, Some(d)) => (
            response::failed_closed(d, style),
            decision_headers(d, style),
        ),
        (RejectionKind::Unidentified, _) => (
            response::unidentified(),
            response::challenge_header(challenge),
        ),
        (RejectionKind::Denied, _) => (response::forbidden(), Vec::new()),
        _ => (response::internal_error(), Vec::new()),
    };
    let default = if grpc {
        // RetryInfo carries the exact wait (a millisecond stays a
        // millisecond); `retry-after` rounds it up to whole seconds.
        Reply::grpc(&problem, headers, decision.and_then(Decision::retry_after))
    } else {
        Reply::problem(&problem, headers)
    };
    let Some(hook) = hook else { return default };
    let rejection = Rejection {
        kind,
        decision,
        grpc,
        style,
        default,
    };
    match hook(&rejection) {
        Some(reply) => reply,
        None => rejection.default,
    }
}
