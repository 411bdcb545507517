//! Tollgate's actix-web middleware.
//!
//! [`RateLimit`] identifies each request, decides it with a [`Limiter`](tollgate_limiter::Limiter), and
//! either calls the wrapped service (adding the `RateLimit-Policy` and
//! `RateLimit` headers to its response) or answers at once: 429 with
//! `Retry-After` and an `application/problem+json` body, 503 when the store
//! failed and the policy fails closed, 401 when the request has no identity.
//! Admitted requests carry their [`Decision`](tollgate_limiter::Decision) in
//! their extensions (`web::ReqData<Decision>`).
//!
//! The responses are byte for byte those of the tower adapter: both are thin
//! wrappers over `tollgate-http`.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use std::{sync::Arc, time::Duration};
//! use actix_web::{web, App, HttpServer};
//! use tollgate_limiter::{Limit, Limiter, Policy, Scope};
//! use tollgate_actix::{ClientIp, Identity, RateLimit};
//!
//! let policy = Policy::new("per-ip", Limit::gcra(10, Duration::from_secs(1), 20).unwrap()).unwrap();
//! let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
//!     .layer("ip", Scope::Subject, policy)
//!     .build()
//!     .unwrap();
//! let rate_limit = RateLimit::builder(limiter)
//!     .identity(Identity::new().client_ip(ClientIp::direct()))
//!     .build()
//!     .expect("an identity for the per-ip layer");
//! HttpServer::new(move || {
//!     // On the route (method) itself: requests answered 404 or 405 by the
//!     // router never reach the limiter, so they are not charged.
//!     App::new().route("/", web::get().to(|| async { "hello" }).wrap(rate_limit.clone()))
//! })
//! .bind(("127.0.0.1", 3000))?
//! .run()
//! .await
//! # }
//! ```
//!
//! The client address is the socket peer (`ServiceRequest::peer_addr`);
//! actix-web's own `realip_remote_addr` trusts forwarding headers from
//! anyone, so it is never used. Configure proxies with [`ClientIp`].
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::future::{ready, Future, Ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpResponse};

use tollgate_http::{is_list_field, Holding, RequestView};

mod body;
pub use body::HoldingBody;
use tollgate_limiter::{Context, LimiterSource, PlanName, Subject};

pub use tollgate_http::{
    decision_headers, names, single_header_value, AccessRules, Cidr, CidrError, ClientIp, Gate,
    GateBuilder, GateError, GrpcCode, HeaderStyle, Outcome, PeerAddr, Prepared, Problem, Rejection,
    RejectionKind, Reply, ReplyError, TrustedProxies,
};

/// How requests are identified; see [`tollgate_http::Identity`]. Custom
/// functions receive the [`ServiceRequest`].
pub type Identity = tollgate_http::Identity<ServiceRequest>;

/// The rate-limiting middleware (an actix-web [`Transform`]); see the
/// [crate docs](crate). Cloning is cheap; wrap a route (`Route::wrap`: the
/// router's 404s and 405s never reach it), a `resource`, a `scope` or the
/// `App` — each its own limiter or [cost](GateBuilder::cost).
#[derive(Clone, Debug)]
pub struct RateLimit {
    gate: Arc<Gate<ServiceRequest>>,
}

impl RateLimit {
    /// Configure middleware over `limiter` (a `Limiter`, or a live route of
    /// a reloadable configuration); [`build`](GateBuilder::build)
    /// checks the configuration (an identity for every layer that needs
    /// one, a cost every layer can admit).
    pub fn builder(limiter: impl Into<LimiterSource>) -> GateBuilder<ServiceRequest, RateLimit> {
        GateBuilder::new(limiter)
    }

    /// Middleware over a built [`Gate`].
    pub fn new(gate: Gate<ServiceRequest>) -> Self {
        RateLimit {
            gate: Arc::new(gate),
        }
    }

    /// The configuration.
    pub fn gate(&self) -> &Gate<ServiceRequest> {
        &self.gate
    }
}

impl From<Gate<ServiceRequest>> for RateLimit {
    fn from(gate: Gate<ServiceRequest>) -> Self {
        RateLimit::new(gate)
    }
}

impl<S, B> Transform<S, ServiceRequest> for RateLimit
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<HoldingBody<B>>>;
    type Error = actix_web::Error;
    type Transform = RateLimitMiddleware<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RateLimitMiddleware {
            service: Rc::new(service),
            gate: self.gate.clone(),
        }))
    }
}

/// The service [`RateLimit`] wraps around `S`.
#[derive(Debug)]
pub struct RateLimitMiddleware<S> {
    service: Rc<S>,
    gate: Arc<Gate<ServiceRequest>>,
}

/// The request as identification sees it.
struct View<'a>(&'a ServiceRequest);

impl RequestView for View<'_> {
    fn method(&self) -> &str {
        self.0.method().as_str()
    }
    fn path(&self) -> &str {
        // The path actix-web routes on (percent-escapes decoded but for
        // `%`, `/` and `+`), not the raw one: `/%61pi/export` is served by
        // the `/api/export` route, so path rules must see it as that.
        self.0.match_info().as_str()
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.0
            .headers()
            .get_all(name)
            .map(HeaderValue::as_bytes)
            .collect()
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        // The socket peer, never `connection_info().realip_remote_addr()`,
        // which believes `Forwarded` / `X-Forwarded-For` from anyone.
        let from_extension = self.0.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        from_extension.or_else(|| self.0.peer_addr().map(|a| a.ip()))
    }
    fn extension_context(&self) -> Option<Context> {
        let extensions = self.0.extensions();
        extensions.get::<Context>().cloned().or_else(|| {
            extensions
                .get::<Subject>()
                .cloned()
                .map(Context::for_subject)
        })
    }
    fn extension_plan(&self) -> Option<PlanName> {
        self.0.extensions().get::<PlanName>().cloned()
    }
}

impl<S, B> Service<ServiceRequest> for RateLimitMiddleware<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<HoldingBody<B>>>;
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

    forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let service = self.service.clone();
        let gate = self.gate.clone();
        Box::pin(async move {
            let Some(prepared) = gate.prepare(&request, &View(&request)) else {
                // Not rate limited (a skip rule, a CORS preflight).
                let response = service.call(request).await?;
                return Ok(holding(response, Holding::default()));
            };
            match gate.decide(&prepared).await {
                Outcome::Allow {
                    decision,
                    headers,
                    holding: held,
                } => {
                    request.extensions_mut().insert(decision);
                    // Held through the handler (a panic or cancellation
                    // drops it) and then by the body until it is sent.
                    let mut response = service.call(request).await?;
                    apply_headers(&headers, response.headers_mut());
                    Ok(holding(response, held))
                }
                Outcome::Reject(reply) => Ok(reject(request, reply)),
                // `Outcome` may grow; anything unknown is not an admission.
                _ => Ok(reject(request, Reply::internal_error())),
            }
        })
    }
}

/// The service's `response`, its body holding `held` until it is sent.
fn holding<B>(
    response: ServiceResponse<B>,
    held: Holding,
) -> ServiceResponse<EitherBody<HoldingBody<B>>> {
    response
        .map_body(|_, body| HoldingBody::new(body, held))
        .map_into_left_body()
}

/// Answer `request` with `reply`, without calling the service.
fn reject<B>(request: ServiceRequest, reply: Reply) -> ServiceResponse<EitherBody<B>> {
    let (status, headers, body) = reply.into_parts();
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::new(status);
    apply_headers(&headers, response.headers_mut());
    let response = response.set_body(body).map_into_boxed_body();
    request.into_response(response).map_into_right_body()
}

/// Add `headers` to an actix-web header map, as `tollgate_http::apply_headers`
/// does for `http` 1.x maps (actix-web 4 uses its own header types).
fn apply_headers(headers: &[(&'static str, String)], map: &mut HeaderMap) {
    for (name, value) in headers {
        // As in `tollgate_http::apply_headers`: a bad name or value is
        // skipped, never a panic.
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
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
