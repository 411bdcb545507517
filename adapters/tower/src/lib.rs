//! Tollgate's tower layer: rate limiting for any `tower::Service` over
//! `http::Request` — axum routers and handlers, tonic servers, hyper services.
//!
//! [`RateLimitLayer`] identifies each request, decides it with a
//! [`Limiter`](tollgate_limiter::Limiter), and either calls the inner service (adding the
//! `RateLimit-Policy` and `RateLimit` headers to its response) or answers at
//! once: 429 with `Retry-After` and an `application/problem+json` body, 503
//! when the store failed and the policy fails closed, 401 when the request
//! has no identity, 403 for a denied client — or, for a gRPC call, the gRPC
//! way (`grpc-status` 8, 14, 16, 7 or 13 in a trailers-only response), and
//! however
//! [`reject_with`](GateBuilder::reject_with) says. Admitted requests carry their
//! [`Decision`](tollgate_limiter::Decision) in their extensions.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{net::SocketAddr, sync::Arc, time::Duration};
//! use axum::{routing::get, Router};
//! use tollgate_limiter::{Limit, Limiter, Policy, Scope};
//! use tollgate_tower::{ClientIp, Identity, RateLimitLayer};
//!
//! let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
//!     .layer("ip", Scope::Subject, Policy::new("per-ip", Limit::gcra(10, Duration::from_secs(1), 20)?)?)
//!     .build()?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .route_layer(
//!         RateLimitLayer::builder(limiter)
//!             .identity(Identity::new().client_ip(ClientIp::direct()))
//!             .build()?,
//!     );
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

use tollgate_http::RequestView;
use tollgate_limiter::{Context, LimiterSource};

pub use body::RateLimitBody;
pub use tollgate_http::{
    apply_headers, decision_headers, names, single_header_value, AccessRules, Cidr, CidrError,
    ClientIp, Gate, GateBuilder, GateError, GrpcCode, HeaderStyle, Outcome, PeerAddr, Prepared,
    Problem, Rejection, RejectionKind, Reply, ReplyError, TrustedProxies,
};

/// How requests are identified; see [`tollgate_http::Identity`]. Custom
/// functions receive the request's [`http::request::Parts`].
pub type Identity = tollgate_http::Identity<Parts>;

/// A [`tower_layer::Layer`] that rate limits `http::Request`s with a
/// [`Limiter`](tollgate_limiter::Limiter); see the [crate docs](crate).
///
/// Cloning is cheap. One layer per route (axum's `route_layer`, or a layer on
/// a nested router) gives that route its own limiter or [cost](GateBuilder::cost).
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    gate: Arc<Gate<Parts>>,
}

impl RateLimitLayer {
    /// Configure a layer over `limiter` (a `Limiter`, or a live route of a
    /// reloadable configuration); [`build`](GateBuilder::build)
    /// checks the configuration (an identity for every layer that needs
    /// one, a cost every layer can admit).
    ///
    /// ```
    /// # use std::{sync::Arc, time::Duration};
    /// # use tollgate_limiter::{Limit, Limiter, Policy, Scope};
    /// use tollgate_tower::{ClientIp, GateError, Identity, RateLimitLayer};
    /// # let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
    /// #     .layer("ip", Scope::Subject, Policy::new("per-ip", Limit::gcra(10, Duration::from_secs(1), 20)?)?)
    /// #     .build()?;
    /// let layer = RateLimitLayer::builder(limiter.clone())
    ///     .identity(Identity::new().client_ip(ClientIp::direct()))
    ///     .build()?;
    /// // Nothing identifies requests, and a layer counts per subject:
    /// let err = RateLimitLayer::builder(limiter).build().unwrap_err();
    /// assert!(matches!(err, GateError::NoIdentity { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(limiter: impl Into<LimiterSource>) -> GateBuilder<Parts, RateLimitLayer> {
        GateBuilder::new(limiter)
    }

    /// A layer over a built [`Gate`].
    pub fn new(gate: Gate<Parts>) -> Self {
        RateLimitLayer {
            gate: Arc::new(gate),
        }
    }

    /// The configuration.
    pub fn gate(&self) -> &Gate<Parts> {
        &self.gate
    }
}

impl From<Gate<Parts>> for RateLimitLayer {
    fn from(gate: Gate<Parts>) -> Self {
        RateLimitLayer::new(gate)
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;
    fn layer(&self, inner: S) -> RateLimitService<S> {
        RateLimitService {
            inner,
            gate: self.gate.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around `S` (tower's layer and
/// service pair; actix-web's middleware is `tollgate_actix::RateLimit`).
#[derive(Clone, Debug)]
pub struct RateLimitService<S> {
    inner: S,
    gate: Arc<Gate<Parts>>,
}

/// The request as identification sees it: the parts, plus the peer address
/// from whichever extension the server put it in.
struct View<'a>(&'a Parts);

impl RequestView for View<'_> {
    fn method(&self) -> &str {
        self.0.method.as_str()
    }
    /// The path as sent: under an axum router nested at a prefix, the
    /// request reaching this layer has the prefix stripped, and a path
    /// rule (`skip_path("/metrics")`) would match `/v1/metrics` too.
    fn path(&self) -> &str {
        #[cfg(feature = "axum")]
        if let Some(original) = self.0.extensions.get::<axum::extract::OriginalUri>() {
            return original.0.path();
        }
        self.0.uri.path()
    }
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
        #[cfg(feature = "tonic")]
        let peer = peer.or_else(|| {
            self.0
                .extensions
                .get::<tonic::transport::server::TcpConnectInfo>()
                .and_then(|c| c.remote_addr())
                .map(|a| a.ip())
        });
        peer
    }
    fn extension_context(&self) -> Option<Context> {
        self.0.extension_context()
    }
    fn extension_plan(&self) -> Option<tollgate_limiter::PlanName> {
        self.0.extension_plan()
    }
}

/// The future of [`RateLimitService`]'s responses.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<RateLimitBody<B>>, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
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
        let Some(prepared) = gate.prepare(&parts, &View(&parts)) else {
            // Not rate limited (a skip rule, a CORS preflight).
            let request = Request::from_parts(parts, body);
            return Box::pin(async move {
                let response = inner.call(request).await?;
                Ok(response.map(RateLimitBody::inner))
            });
        };
        Box::pin(async move {
            match gate.decide(&prepared).await {
                Outcome::Allow {
                    decision,
                    headers,
                    holding,
                } => {
                    parts.extensions.insert(decision);
                    // Held through the handler (a panic or cancellation
                    // drops it) and then by the body until it is sent.
                    let response = inner.call(Request::from_parts(parts, body)).await?;
                    let (mut res_parts, res_body) = response.into_parts();
                    apply_headers(&headers, &mut res_parts.headers);
                    Ok(Response::from_parts(
                        res_parts,
                        RateLimitBody::holding(res_body, holding),
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
