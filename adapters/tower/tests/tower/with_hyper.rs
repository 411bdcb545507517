//! The tower layer around a plain hyper service (no axum): the server puts
//! the peer address in a `PeerAddr` extension per connection.

use crate::common;

use std::convert::Infallible;

use bytes::Bytes;
use common::{memory_store, per_minute, Http};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tollgate_tower::{ClientIp, Identity, PeerAddr, RateLimitLayer};
use tower_layer::Layer;

/// A tower service from a function (the test needs nothing more of `tower`).
#[derive(Clone)]
struct Hello;

impl tower_service::Service<Request<Incoming>> for Hello {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<Incoming>) -> Self::Future {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"hello")))))
    }
}

/// Inserts the connection's peer address before the rate limiter runs.
#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    peer: PeerAddr,
}

impl<S, B> tower_service::Service<Request<B>> for WithPeer<S>
where
    S: tower_service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, mut request: Request<B>) -> S::Future {
        request.extensions_mut().insert(self.peer);
        self.inner.call(request)
    }
}

#[tokio::test]
async fn hyper_service_is_limited_per_peer() {
    let (_clock, store) = memory_store();
    let layer = RateLimitLayer::builder(per_minute(store, "per-ip", 2))
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = WithPeer {
                inner: layer.layer(Hello),
                peer: PeerAddr(peer),
            };
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
            );
        }
    });
    let http = Http::new(addr);
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, "hello");
    assert_eq!(reply.remaining_and_reset(), (1, 60));
    assert_eq!(http.get("/", &[]).await.status, StatusCode::OK);
    let reply = http.get("/", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.header("retry-after"), Some("60"));
}
