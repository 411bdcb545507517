//! Tollgate's tower layer: rate limiting for any `tower::Service` over
//! `http::Request` — axum routers and handlers, tonic servers, hyper services.
//!
//! [`RateLimitLayer`] identifies each request, decides it with a
//! [`Limiter`], and either calls the inner service (adding the
//! `RateLimit-Policy` and `RateLimit` headers to its response) or answers at
//! once: 429 with `Retry-After` and an `application/problem+json` body, 503
//! when the store failed and the policy fails closed, 401 when the request
//! has no identity. Admitted requests carry their
//! [`Decision`](tollgate_core::Decision) in their extensions.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{net::SocketAddr, sync::Arc, time::Duration};
//! use axum::{routing::get, Router};
//! use tollgate_core::{Limit, Limiter, Policy, Scope};
//! use tollgate_tower::{ClientIp, Identity, RateLimitLayer};
//!
//! let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
//!     .layer("ip", Scope::Subject, Policy::new("per-ip", Limit::gcra(10, Duration::from_secs(1), 20)?)?)
//!     .build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter).identity(Identity::new().client_ip(ClientIp::direct())));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // `ConnectInfo` gives the layer the client's socket address.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! The response body becomes [`RateLimitBody`]`<B>`: the inner service's body,
//! or the problem document of a rejection. axum, hyper and tonic accept it
//! as is. The HTTP guide (`docs/http.md`) shows hyper and tonic set-ups.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use tollgate_core::{Context, Error, Limiter};
use tollgate_http::{apply_headers, RequestView};

pub use body::RateLimitBody;
pub use tollgate_http::{
    decision_headers, names, Cidr, ClientIp, ConfigError, Gate, HeaderStyle, Outcome, PeerAddr,
    Problem, Reply, TrustedProxies,
};

/// How requests are identified; see [`tollgate_http::Identity`]. Custom
/// functions receive the request's [`http::request::Parts`].
pub type Identity = tollgate_http::Identity<Parts>;

/// A [`tower_layer::Layer`] that rate limits `http::Request`s with a
/// [`Limiter`]; see the [crate docs](crate).
///
/// Cloning is cheap. One layer per route (axum's `route_layer`, or a layer on
/// a nested router) gives that route its own limiter or [cost](Self::cost).
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    gate: Arc<Gate<Parts>>,
}

impl RateLimitLayer {
    /// A layer over `limiter`. Requests are identified by the request
    /// extensions only (what an authentication layer inserted: a
    /// [`Context`] or a [`Subject`](tollgate_core::Subject)) until
    /// [`identity`](Self::identity) says otherwise; each costs 1.
    pub fn new(limiter: Limiter) -> Self {
        RateLimitLayer::from_gate(Gate::new(limiter))
    }

    /// A layer over a fully configured [`Gate`].
    pub fn from_gate(gate: Gate<Parts>) -> Self {
        RateLimitLayer {
            gate: Arc::new(gate),
        }
    }

    fn map(mut self, f: impl FnOnce(Gate<Parts>) -> Gate<Parts>) -> Self {
        let gate = Arc::unwrap_or_clone(self.gate);
        self.gate = Arc::new(f(gate));
        self
    }

    /// How requests are identified.
    pub fn identity(self, identity: Identity) -> Self {
        self.map(|g| g.identity(identity))
    }

    /// Every request costs `cost` units (default 1).
    pub fn cost(self, cost: u64) -> Self {
        self.map(|g| g.cost(cost))
    }

    /// The cost is `f(&parts)`, for example by method.
    pub fn cost_with(self, f: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.map(|g| g.cost_with(f))
    }

    /// Also send `RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn legacy_headers(self, on: bool) -> Self {
        self.map(|g| g.legacy_headers(on))
    }

    /// Also send `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    pub fn x_ratelimit_headers(self, on: bool) -> Self {
        self.map(|g| g.x_ratelimit_headers(on))
    }

    /// The `WWW-Authenticate` value sent with 401.
    pub fn unauthorized_challenge(self, challenge: &str) -> Self {
        self.map(|g| g.unauthorized_challenge(challenge))
    }

    /// Called with every limiter error before it becomes a 401, 500 or 503.
    pub fn on_error(self, f: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        self.map(|g| g.on_error(f))
    }

    /// The configuration.
    pub fn gate(&self) -> &Gate<Parts> {
        &self.gate
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S`.
#[derive(Clone, Debug)]
pub struct RateLimit<S> {
    inner: S,
    gate: Arc<Gate<Parts>>,
}

/// The request as identification sees it: the parts, plus the peer address
/// from whichever extension the server put it in.
struct View<'a>(&'a Parts);

impl RequestView for View<'_> {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.0.header_values(name)
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        let peer = self.0.peer_ip();
        #[cfg(feature = "axum")]
        let peer = peer.or_else(|| {
            self.0
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip())
        });
        peer
    }
    fn extension_context(&self) -> Option<Context> {
        self.0.extension_context()
    }
}

/// The future of [`RateLimit`]'s responses.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready is the one to call; leave a
        // fresh clone in its place for the next request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        let (mut parts, body) = request.into_parts();
        let (ctx, cost) = gate.prepare(&parts, &View(&parts));
        Box::pin(async move {
            match gate.decide(&ctx, cost).await {
                Outcome::Allow { decision, headers } => {
                    parts.extensions.insert(decision);
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    let (mut res_parts, res_body) = response.into_parts();
                    apply_headers(&headers, &mut res_parts.headers);
                    Ok(Response::from_parts(
                        res_parts,
                        RateLimitBody::inner(res_body),
                    ))
                }
                Outcome::Reject(reply) => Ok(reply_response(reply)),
                // `Outcome` may grow; anything unknown is not an admission.
                _ => Ok(reply_response(Reply::internal_error())),
            }
        })
    }
}

/// The `http` response for a rejection.
fn reply_response<B>(reply: Reply) -> Response<RateLimitBody<B>> {
    let (status, headers, body) = reply.into_parts();
    let mut response = Response::new(RateLimitBody::reply(Bytes::from(body)));
    *response.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    apply_headers(&headers, response.headers_mut());
    response
}
