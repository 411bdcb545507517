//! The headers and responses for a [`Decision`], as plain names, strings and
//! status codes, so every framework adapter sends exactly the same bytes.

use std::fmt::Write;
use std::time::Duration;

use tollgate_limiter::Decision;

use crate::grpc::{self, GrpcCode};
use crate::headers;

/// Header names, lowercase (HTTP/2 and HTTP/3 require it; HTTP/1.1 ignores case).
pub mod names {
    /// `RateLimit-Policy`: the policies, one list item per layer.
    pub const RATELIMIT_POLICY: &str = "ratelimit-policy";
    /// `RateLimit`: what is left, one list item per layer.
    pub const RATELIMIT: &str = "ratelimit";
    /// `Retry-After`, in whole seconds.
    pub const RETRY_AFTER: &str = "retry-after";
    /// Legacy (drafts before -07): the tightest layer's limit.
    pub const RATELIMIT_LIMIT: &str = "ratelimit-limit";
    /// Legacy: the tightest layer's remaining units.
    pub const RATELIMIT_REMAINING: &str = "ratelimit-remaining";
    /// Legacy: seconds until the tightest layer resets.
    pub const RATELIMIT_RESET: &str = "ratelimit-reset";
    /// De-facto `X-` form of `RateLimit-Limit`.
    pub const X_RATELIMIT_LIMIT: &str = "x-ratelimit-limit";
    /// De-facto `X-` form of `RateLimit-Remaining`.
    pub const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
    /// De-facto `X-` form of `RateLimit-Reset` (seconds from now, not a Unix time).
    pub const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";
    /// `Content-Type`.
    pub const CONTENT_TYPE: &str = "content-type";
    /// `WWW-Authenticate`, on every 401.
    pub const WWW_AUTHENTICATE: &str = "www-authenticate";
}

/// The media type of every error body (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Problem type of a 429 (draft-ietf-httpapi-ratelimit-headers-10, §5.1).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// Problem type of a 503 from a layer that failed closed (same draft, §5.2).
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// Whether a header is a structured-field list, which a response may carry
/// on several field lines (an inner and an outer limiter each add theirs);
/// every other rate-limit header has one value, and the first one set wins.
pub fn is_list_field(name: &str) -> bool {
    name == names::RATELIMIT || name == names::RATELIMIT_POLICY
}

/// Which headers go on responses besides the standard ones.
///
/// `RateLimit-Policy` and `RateLimit` are always sent, and `Retry-After` on
/// every denial.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderStyle {
    legacy: bool,
    x_ratelimit: bool,
    shadow: bool,
}

impl HeaderStyle {
    /// Also send `RateLimit-Limit`, `-Remaining` and `-Reset` for the tightest layer.
    pub fn legacy(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }
    /// Also send `X-RateLimit-Limit`, `-Remaining` and `-Reset` for the tightest layer.
    pub fn x_ratelimit(mut self, on: bool) -> Self {
        self.x_ratelimit = on;
        self
    }
    /// Also show layers whose policy is in shadow mode in `RateLimit-Policy`
    /// and `RateLimit` (default: left out, since they do not limit).
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }
}

/// Header name and value pairs, in the order to send them.
pub type Headers = Vec<(&'static str, String)>;

/// The rate-limit headers for `decision`: `RateLimit-Policy` (one item per
/// layer) and `RateLimit` (one item per layer the store counted: a layer
/// decided by its failure mode, its store being down, announces no `r` or
/// `t`), the optional legacy ones (for the tightest counted layer), and
/// `Retry-After` when it is denied (whole seconds, rounded up, at least 1,
/// never before any denying layer's `t`; for a store outage, when to try
/// again).
///
/// ```
/// # use std::time::Duration;
/// # use tollgate_limiter::*;
/// use tollgate_http::{decision_headers, HeaderStyle};
/// let policy = Policy::new("search", Limit::fixed_window(10, Duration::from_secs(60))?)?;
/// let layer = Layer::new("key", Scope::Subject, policy);
/// let decision = Decision::new([LayerDecision::new(&layer, Verdict {
///     allowed: false, limit: 10, remaining: 0,
///     reset_after: Duration::from_secs(30), retry_after: Some(Duration::from_millis(29_200)),
/// }, Source::Store)]);
/// let headers = decision_headers(&decision, HeaderStyle::default());
/// assert_eq!(headers, vec![
///     ("ratelimit-policy", r#""search";q=10;w=60"#.to_string()),
///     ("ratelimit", r#""search";r=0;t=30"#.to_string()),
///     ("retry-after", "30".to_string()),
/// ]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decision_headers(decision: &Decision, style: HeaderStyle) -> Headers {
    let mut out = Vec::with_capacity(9);
    if decision.layers().is_empty() {
        return out;
    }
    let policy = headers::rate_limit_policy(decision, style.shadow);
    if policy.is_empty() {
        return out;
    }
    out.push((names::RATELIMIT_POLICY, policy));
    let rate_limit = headers::rate_limit(decision, style.shadow);
    if !rate_limit.is_empty() {
        out.push((names::RATELIMIT, rate_limit));
    }
    let tightest = decision
        .layers()
        .iter()
        .filter(|l| headers::is_counted(l) && !l.is_shadow())
        .min_by_key(|l| l.tightness());
    if let Some(layer) = tightest {
        let t = headers::layer_t(layer).to_string();
        if style.legacy {
            out.push((names::RATELIMIT_LIMIT, layer.verdict().limit.to_string()));
            out.push((
                names::RATELIMIT_REMAINING,
                layer.verdict().remaining.to_string(),
            ));
            out.push((names::RATELIMIT_RESET, t.clone()));
        }
        if style.x_ratelimit {
            out.push((names::X_RATELIMIT_LIMIT, layer.verdict().limit.to_string()));
            out.push((
                names::X_RATELIMIT_REMAINING,
                layer.verdict().remaining.to_string(),
            ));
            out.push((names::X_RATELIMIT_RESET, t));
        }
    }
    if let Some(secs) = headers::retry_after_secs(decision) {
        out.push((names::RETRY_AFTER, secs.to_string()));
    }
    out
}

/// An RFC 9457 problem: the JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `type`: a URI naming the problem (`about:blank` for plain HTTP errors).
    pub kind: &'static str,
    /// `title`: the problem type's short summary.
    pub title: &'static str,
    /// `status`: the HTTP status code.
    pub status: u16,
    /// `detail`: what happened to this request.
    pub detail: String,
    /// `violated-policies`: names of the policies that denied (omitted when empty).
    pub violated_policies: Vec<String>,
}

impl Problem {
    /// The JSON text.
    ///
    /// ```
    /// use tollgate_http::Problem;
    /// let p = Problem { kind: "about:blank", title: "Unauthorized", status: 401,
    ///     detail: "say \"who\"".into(), violated_policies: vec![] };
    /// assert_eq!(p.to_json(),
    ///     r#"{"type":"about:blank","title":"Unauthorized","status":401,"detail":"say \"who\""}"#);
    /// ```
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(256);
        out.push_str("{\"type\":");
        json_string(&mut out, self.kind);
        out.push_str(",\"title\":");
        json_string(&mut out, self.title);
        let _ = write!(out, ",\"status\":{}", self.status);
        out.push_str(",\"detail\":");
        json_string(&mut out, &self.detail);
        if !self.violated_policies.is_empty() {
            out.push_str(",\"violated-policies\":[");
            for (i, name) in self.violated_policies.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(&mut out, name);
            }
            out.push(']');
        }
        out.push('}');
        out
    }
}

/// `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A complete response to send instead of calling the service: status,
/// headers (with `Content-Type`) and a body — an `application/problem+json`
/// document for HTTP, nothing for gRPC (its status travels in the headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    status: u16,
    headers: Headers,
    body: String,
}

/// A [`Reply::new`] that could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// The status is not a final HTTP status.
    #[error("status {0} is not between 200 and 599")]
    Status(u16),
    /// A header name is not a valid lowercase token (HTTP/2 requires
    /// lowercase names).
    #[error("header name {0:?} is not a lowercase HTTP token")]
    HeaderName(&'static str),
    /// A header that frames the message or belongs to one connection
    /// (`content-length`, `transfer-encoding`, `connection`, …): the server
    /// sets those itself, and HTTP/2 forbids the connection ones.
    #[error("header {0:?} is set by the server, not by a reply")]
    FramingHeader(&'static str),
    /// A body on a status that has none (204, 304).
    #[error("status {0} carries no body")]
    BodyNotAllowed(u16),
    /// A header value holds control characters or non-ASCII bytes.
    #[error("the value of header {name:?} is not visible ASCII: {value:?}")]
    HeaderValue {
        /// The header's name.
        name: &'static str,
        /// The value given.
        value: String,
    },
}

impl Reply {
    /// A response of your own (see `GateBuilder::reject_with`): `status`,
    /// `headers` (lowercase names; set `content-type` yourself) and `body`.
    ///
    /// ```
    /// use tollgate_http::Reply;
    /// let reply = Reply::new(429, vec![("content-type", "text/plain".into())], "slow down")?;
    /// assert_eq!(reply.status(), 429);
    /// assert!(Reply::new(429, vec![("Content-Type", "text/plain".into())], "").is_err());
    /// # Ok::<(), tollgate_http::ReplyError>(())
    /// ```
    pub fn new(status: u16, headers: Headers, body: impl Into<String>) -> Result<Self, ReplyError> {
        if !(200..=599).contains(&status) {
            return Err(ReplyError::Status(status));
        }
        let body = body.into();
        if matches!(status, 204 | 304) && !body.is_empty() {
            return Err(ReplyError::BodyNotAllowed(status));
        }
        for (name, value) in &headers {
            let lowercase_token = http::HeaderName::from_bytes(name.as_bytes())
                .is_ok_and(|parsed| parsed.as_str() == *name);
            if !lowercase_token {
                return Err(ReplyError::HeaderName(name));
            }
            const FRAMING: [&str; 7] = [
                "content-length",
                "transfer-encoding",
                "connection",
                "keep-alive",
                "te",
                "upgrade",
                "proxy-connection",
            ];
            if FRAMING.contains(name) {
                return Err(ReplyError::FramingHeader(name));
            }
            if !is_header_text(value) {
                return Err(ReplyError::HeaderValue {
                    name,
                    value: value.clone(),
                });
            }
        }
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// A reply with `problem` as its body, after `headers`.
    pub fn problem(problem: &Problem, mut headers: Headers) -> Self {
        headers.push((names::CONTENT_TYPE, PROBLEM_JSON.to_string()));
        Reply {
            status: problem.status,
            headers,
            body: problem.to_json(),
        }
    }

    /// `problem` the gRPC way: HTTP 200, no body, and after `headers`
    /// (which reach the client as metadata) `content-type:
    /// application/grpc`, the `grpc-status` for the problem's HTTP status
    /// (429 → 8 RESOURCE_EXHAUSTED, 503 → 14 UNAVAILABLE, 401 → 16
    /// UNAUTHENTICATED, 403 → 7 PERMISSION_DENIED, else 13 INTERNAL), its
    /// detail and violated policies as `grpc-message`, and with
    /// `retry_after` a `google.rpc.RetryInfo` in `grpc-status-details-bin`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_http::{Problem, Reply};
    /// let problem = Problem { kind: "about:blank", title: "Quota Exceeded", status: 429,
    ///     detail: "retry in 2 s".into(), violated_policies: vec!["api".into()] };
    /// let reply = Reply::grpc(&problem, vec![("retry-after", "2".into())], Some(Duration::from_secs(2)));
    /// assert_eq!(reply.status(), 200);
    /// assert!(reply.body().is_empty());
    /// assert!(reply.headers().contains(&("grpc-status", "8".to_string())));
    /// assert!(reply.headers().contains(&("grpc-message", "retry in 2 s (policies: api)".to_string())));
    /// ```
    pub fn grpc(problem: &Problem, headers: Headers, retry_after: Option<Duration>) -> Self {
        let mut message = problem.detail.clone();
        if !problem.violated_policies.is_empty() {
            let _ = write!(
                message,
                " (policies: {})",
                problem.violated_policies.join(", ")
            );
        }
        Reply {
            status: 200,
            headers: grpc::trailers_only(
                GrpcCode::for_http_status(problem.status),
                &message,
                retry_after,
                headers,
            ),
            body: String::new(),
        }
    }

    /// 429 for a decision denied by its limits: the rate-limit headers,
    /// `Retry-After`, and a `quota-exceeded` problem naming the denying
    /// layers' policies.
    pub fn too_many_requests(decision: &Decision, style: HeaderStyle) -> Self {
        Reply::problem(
            &too_many_requests(decision, style),
            decision_headers(decision, style),
        )
    }

    /// 503 for a decision denied because a layer's store failed and its
    /// policy fails closed: a `temporary-reduced-capacity` problem naming
    /// those layers' policies (a client did nothing wrong, so not 429).
    pub fn failed_closed(decision: &Decision, style: HeaderStyle) -> Self {
        Reply::problem(
            &failed_closed(decision, style),
            decision_headers(decision, style),
        )
    }

    /// 503 when the store failed and no failure mode produced a decision.
    /// The error itself is not shown: it may name internal hosts.
    pub fn store_unavailable() -> Self {
        let problem = Problem {
            kind: "about:blank",
            title: "Service Unavailable",
            status: 503,
            detail: "The rate limiter could not reach its store; retry later".into(),
            violated_policies: Vec::new(),
        };
        Reply::problem(&problem, Vec::new())
    }

    /// 401 when the request has no identity a layer needs, with
    /// `challenge` as its `WWW-Authenticate` header (RFC 9110 requires one
    /// on every 401). Every 401 of Tollgate has this shape; an
    /// authentication layer can send the same with this function.
    pub fn unidentified(challenge: &str) -> Self {
        Reply::problem(&unidentified(), challenge_header(challenge))
    }

    /// 500 for any other limiter error (an invalid cost, a misconfigured
    /// limiter); the details stay on the server.
    pub fn internal_error() -> Self {
        Reply::problem(&internal_error(), Vec::new())
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }
    /// The headers, `Content-Type` included.
    pub fn headers(&self) -> &[(&'static str, String)] {
        &self.headers
    }
    /// The body: a JSON problem, empty for gRPC.
    pub fn body(&self) -> &str {
        &self.body
    }
    /// Status, headers and body.
    pub fn into_parts(self) -> (u16, Headers, String) {
        (self.status, self.headers, self.body)
    }
}

/// The problem of a decision denied by its limits (429).
pub(crate) fn too_many_requests(decision: &Decision, style: HeaderStyle) -> Problem {
    let retry = headers::retry_after_secs(decision).unwrap_or(1);
    Problem {
        kind: QUOTA_EXCEEDED,
        title: "Quota Exceeded",
        status: 429,
        detail: format!(
            "Request cannot be satisfied as assigned quota has been exceeded; retry in {retry} s"
        ),
        violated_policies: policy_names(decision, style, |_| true),
    }
}

/// The problem of a decision a failing store denied (503).
pub(crate) fn failed_closed(decision: &Decision, style: HeaderStyle) -> Problem {
    Problem {
        kind: TEMPORARY_REDUCED_CAPACITY,
        title: "Temporary Reduced Capacity",
        status: 503,
        detail: "The rate limiter's store is unavailable and this policy rejects requests until it is back".into(),
        violated_policies: policy_names(decision, style, |l| {
            l.source == tollgate_limiter::Source::FailClosed
        }),
    }
}

/// The problem of a request without the identity a layer needs (401).
pub(crate) fn unidentified() -> Problem {
    Problem {
        kind: "about:blank",
        title: "Unauthorized",
        status: 401,
        detail: "This endpoint is rate limited per client and the request carries no identity the server accepts".into(),
        violated_policies: Vec::new(),
    }
}

/// The problem of a client on a deny list (403).
pub(crate) fn forbidden() -> Problem {
    Problem {
        kind: "about:blank",
        title: "Forbidden",
        status: 403,
        detail: "This client is not allowed to use this service".into(),
        violated_policies: Vec::new(),
    }
}

/// The problem of any other limiter error (500).
pub(crate) fn internal_error() -> Problem {
    Problem {
        kind: "about:blank",
        title: "Internal Server Error",
        status: 500,
        detail: "The rate limiter could not decide this request".into(),
        violated_policies: Vec::new(),
    }
}

/// `WWW-Authenticate: challenge`, which every 401 carries.
pub(crate) fn challenge_header(challenge: &str) -> Headers {
    vec![(names::WWW_AUTHENTICATE, challenge.to_string())]
}

/// The names of the denying layers that match `keep`, each once, in order,
/// as `RateLimit-Policy` names them (by policy, or by layer where two
/// layers shown decide by one policy).
fn policy_names(
    decision: &Decision,
    style: HeaderStyle,
    keep: impl Fn(&tollgate_limiter::LayerDecision) -> bool,
) -> Vec<String> {
    let shown = || {
        decision
            .layers()
            .iter()
            .filter(|l| headers::is_shown(l, style.shadow))
    };
    let mut names: Vec<String> = Vec::new();
    for layer in decision.denied_layers().filter(|l| keep(l)) {
        let name = headers::item_name(layer, shown());
        if !names.iter().any(|n| *n == name) {
            names.push(name.into_owned());
        }
    }
    names
}

/// Add `headers` to an `http` 1.x header map: list fields are appended
/// (several limiters each add their items), single-value fields are set only
/// when not already present (the innermost limiter's value wins).
pub fn apply_headers(headers: &[(&'static str, String)], map: &mut http::HeaderMap) {
    for (name, value) in headers {
        // Every name and value Tollgate formats is valid, and `Reply::new`
        // checks an application's; one that still fails (a `Reply::problem`
        // or `Reply::grpc` built by hand with a bad name) is skipped rather
        // than turned into a panic on every rejected request.
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        if is_list_field(name.as_str()) {
            map.append(name, value);
        } else if !map.contains_key(&name) {
            map.insert(name, value);
        }
    }
}

/// Whether `value` is a header value of visible ASCII (tabs and spaces
/// allowed): `HeaderValue::from_str` also takes bytes above 0x7f, which
/// clients may refuse or read in another encoding.
pub(crate) fn is_header_text(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate_limiter::{Layer, LayerDecision, Limit, Policy, Scope, Source, Verdict};

    fn layer(name: &str, allowed: bool, remaining: u64, source: Source) -> LayerDecision {
        layer_of(name, allowed, remaining, source, false)
    }

    fn layer_of(
        name: &str,
        allowed: bool,
        remaining: u64,
        source: Source,
        shadow: bool,
    ) -> LayerDecision {
        let policy = Policy::new(
            name,
            Limit::sliding_log(5, Duration::from_secs(10)).unwrap(),
        )
        .unwrap();
        let policy = if shadow { policy.shadow() } else { policy };
        let verdict = Verdict {
            allowed,
            limit: 5,
            remaining,
            reset_after: Duration::from_millis(8_500),
            retry_after: (!allowed).then(|| Duration::from_millis(1_001)),
        };
        LayerDecision::new(&Layer::new(name, Scope::Subject, policy), verdict, source)
    }

    /// Shadow layers do not limit: they are left out of the headers (and
    /// out of the tightest layer), unless the style asks for them.
    #[test]
    fn shadow_layers_are_left_out_unless_asked_for() {
        let trial = layer_of("trial", false, 0, Source::Store, true);
        let d = Decision::new(vec![layer("per-key", true, 3, Source::Store), trial]);
        assert!(d.is_allowed(), "a shadow denial does not deny");
        let style = HeaderStyle::default().legacy(true);
        let h = decision_headers(&d, style);
        let get = |h: &Headers, n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        assert_eq!(get(&h, names::RATELIMIT).unwrap(), r#""per-key";r=3;t=9"#);
        assert!(!get(&h, names::RATELIMIT_POLICY).unwrap().contains("trial"));
        assert_eq!(get(&h, names::RATELIMIT_REMAINING).unwrap(), "3");
        assert_eq!(get(&h, names::RETRY_AFTER), None);
        let shown = decision_headers(&d, style.shadow(true));
        assert!(get(&shown, names::RATELIMIT)
            .unwrap()
            .contains(r#""trial";r=0"#));
    }

    /// The single-value headers describe the enforced layer a client must
    /// wait for longest when denied (its `Reset` is the `Retry-After`),
    /// never a shadow layer's limit.
    #[test]
    fn single_value_headers_name_the_longest_wait_and_no_shadow_layer() {
        let denied = |name: &str, retry_secs: u64| {
            let l = layer(name, false, 0, Source::Store);
            l.with_verdict(Verdict {
                retry_after: Some(Duration::from_secs(retry_secs)),
                reset_after: Duration::from_secs(retry_secs),
                ..l.verdict()
            })
        };
        let get = |h: &Headers, n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone());
        let style = HeaderStyle::default().legacy(true).x_ratelimit(true);
        let d = Decision::new(vec![denied("burst", 1), denied("daily", 3_600)]);
        let h = decision_headers(&d, style);
        assert_eq!(get(&h, names::RETRY_AFTER).unwrap(), "3600");
        assert_eq!(get(&h, names::RATELIMIT_RESET).unwrap(), "3600");
        assert_eq!(get(&h, names::X_RATELIMIT_RESET).unwrap(), "3600");
        let trial = layer_of("trial", false, 0, Source::Store, true);
        let d = Decision::new(vec![layer("per-key", true, 3, Source::Store), trial]);
        let h = decision_headers(&d, style.shadow(true));
        assert_eq!(get(&h, names::RATELIMIT_REMAINING).unwrap(), "3");
        assert_eq!(d.tightest().unwrap().policy(), "per-key");
        // The enforced layer not counted (its store failed open): the
        // shadow layer is the only one counted, and still not described.
        let trial = layer_of("trial", true, 3, Source::Store, true);
        let d = Decision::new(vec![layer("per-key", true, 9, Source::FailOpen), trial]);
        let h = decision_headers(&d, style.shadow(true));
        assert_eq!(get(&h, names::RATELIMIT_REMAINING), None, "{h:?}");
        assert_eq!(get(&h, names::X_RATELIMIT_REMAINING), None, "{h:?}");
        // A denial without its own retry time (a custom algorithm's) waits
        // until the layer is full again, in every answer.
        let full_again = denied("custom", 60);
        let full_again = full_again.with_verdict(Verdict {
            retry_after: None,
            ..full_again.verdict()
        });
        let d = Decision::new(vec![denied("burst", 1), full_again]);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(60)));
        assert_eq!(
            get(&decision_headers(&d, style), names::RETRY_AFTER).unwrap(),
            "60"
        );
    }

    /// Two layers deciding by one policy (per subject and per tenant) are
    /// told apart by their layer names: each item names one limit.
    #[test]
    fn layers_sharing_a_policy_are_named_by_layer() {
        let policy = Policy::new(
            "api",
            Limit::fixed_window(5, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let verdict = |remaining| Verdict {
            allowed: true,
            limit: 5,
            remaining,
            reset_after: Duration::from_secs(30),
            retry_after: None,
        };
        let per_key = Layer::new("per-key", Scope::Subject, policy.clone());
        let per_tenant = Layer::new("per-tenant", Scope::Tenant, policy);
        let d = Decision::new(vec![
            LayerDecision::new(&per_key, verdict(0), Source::Store),
            LayerDecision::new(&per_tenant, verdict(4), Source::Store),
        ]);
        let h = decision_headers(&d, HeaderStyle::default());
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(
            get(names::RATELIMIT),
            r#""per-key";r=0;t=30, "per-tenant";r=4;t=30"#
        );
        assert_eq!(
            get(names::RATELIMIT_POLICY),
            r#""per-key";q=5;w=60, "per-tenant";q=5;w=60"#
        );
        // The problem names the denying layer as the headers do.
        let denied = Verdict {
            allowed: false,
            retry_after: Some(Duration::from_secs(30)),
            ..verdict(0)
        };
        let d = Decision::new(vec![
            LayerDecision::new(&per_key, denied, Source::Store),
            LayerDecision::new(&per_tenant, verdict(4), Source::Store),
        ]);
        let r = Reply::too_many_requests(&d, HeaderStyle::default());
        let body: serde_json::Value = serde_json::from_str(r.body()).unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["per-key"]));

        // A layer name that is no plain name ("per key"), or that another
        // layer's policy has ("daily"), gives way to the policy's name and
        // the layer's place: still one name per limit.
        let daily = Policy::new(
            "daily",
            Limit::fixed_window(9, Duration::from_secs(60)).unwrap(),
        );
        let d = Layer::new("d", Scope::Subject, daily.unwrap());
        let spaced = Layer::new("per key", Scope::Subject, per_key.policy().clone());
        let named_daily = Layer::new("daily", Scope::Tenant, per_key.policy().clone());
        let decision = Decision::new(vec![
            LayerDecision::new(&d, verdict(4), Source::Store),
            LayerDecision::new(&spaced, verdict(0), Source::Store),
            LayerDecision::new(&named_daily, verdict(4), Source::Store),
        ]);
        let h = decision_headers(&decision, HeaderStyle::default());
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(
            get(names::RATELIMIT),
            r#""daily";r=4;t=30, "api#2";r=0;t=30, "api#3";r=4;t=30"#
        );
    }

    /// A concurrency limit is announced as places, not as a rate over its
    /// lease.
    #[test]
    fn a_concurrency_limit_is_announced_as_concurrent_requests() {
        let policy = Policy::new(
            "inflight",
            Limit::concurrency(5, Duration::from_secs(30)).unwrap(),
        )
        .unwrap();
        let verdict = Verdict {
            allowed: true,
            limit: 5,
            remaining: 4,
            reset_after: Duration::from_secs(30),
            retry_after: None,
        };
        let layer = Layer::new("inflight", Scope::Subject, policy);
        let d = Decision::new(vec![LayerDecision::new(&layer, verdict, Source::Store)]);
        let h = decision_headers(&d, HeaderStyle::default());
        let policy = &h
            .iter()
            .find(|(k, _)| *k == names::RATELIMIT_POLICY)
            .unwrap()
            .1;
        assert_eq!(policy, r#""inflight";q=5;qu="concurrent-requests""#);
        sfv::Parser::new(policy).parse::<sfv::List>().unwrap();
    }

    #[test]
    fn headers_parse_as_structured_fields() {
        let d = Decision::new(vec![
            layer("per-key", false, 0, Source::Store),
            layer("global", true, 4, Source::Store),
        ]);
        let h = decision_headers(&d, HeaderStyle::default().legacy(true).x_ratelimit(true));
        let get = |n: &str| {
            h.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        let list = sfv::Parser::new(&get(names::RATELIMIT))
            .parse::<sfv::List>()
            .unwrap();
        assert_eq!(list.len(), 2);
        let policy = sfv::Parser::new(&get(names::RATELIMIT_POLICY))
            .parse::<sfv::List>()
            .unwrap();
        assert_eq!(policy.len(), 2);
        assert_eq!(get(names::RETRY_AFTER), "2");
        assert_eq!(get(names::RATELIMIT_REMAINING), "0");
        assert_eq!(get(names::X_RATELIMIT_RESET), "2");
        assert_eq!(
            get(names::RATELIMIT),
            r#""per-key";r=0;t=2, "global";r=4;t=9"#
        );
    }

    #[test]
    fn replies() {
        let d = Decision::new(vec![
            layer("per-key", false, 0, Source::Store),
            layer("tenant", false, 0, Source::FailClosed),
        ]);
        let r = Reply::too_many_requests(&d, HeaderStyle::default());
        assert_eq!(r.status(), 429);
        let body: serde_json::Value = serde_json::from_str(r.body()).unwrap();
        assert_eq!(
            body["violated-policies"],
            serde_json::json!(["per-key", "tenant"])
        );
        assert_eq!(body["status"], 429);
        let r = Reply::failed_closed(&d, HeaderStyle::default());
        assert_eq!(r.status(), 503);
        let body: serde_json::Value = serde_json::from_str(r.body()).unwrap();
        assert_eq!(body["violated-policies"], serde_json::json!(["tenant"]));
        assert_eq!(body["type"], TEMPORARY_REDUCED_CAPACITY);
        let r = Reply::unidentified("Bearer");
        assert_eq!(r.status(), 401);
        assert!(r
            .headers()
            .contains(&(names::WWW_AUTHENTICATE, "Bearer".into())));
        assert!(r
            .headers()
            .contains(&(names::CONTENT_TYPE, PROBLEM_JSON.into())));
    }

    #[test]
    fn json_escapes_control_characters() {
        let mut s = String::new();
        json_string(&mut s, "a\u{1}\n\"\\é");
        assert_eq!(s, r#""a\u0001\u000a\"\\é""#);
    }

    #[test]
    fn applying_headers_appends_lists_and_keeps_first_singles() {
        let mut map = http::HeaderMap::new();
        apply_headers(
            &[
                (names::RATELIMIT, "\"a\";r=1".into()),
                (names::RETRY_AFTER, "3".into()),
            ],
            &mut map,
        );
        apply_headers(
            &[
                (names::RATELIMIT, "\"b\";r=2".into()),
                (names::RETRY_AFTER, "9".into()),
            ],
            &mut map,
        );
        assert_eq!(map.get_all(names::RATELIMIT).iter().count(), 2);
        assert_eq!(map[names::RETRY_AFTER], "3");
    }
}
