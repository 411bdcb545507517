//! A concurrency layer behind the tower layer: an admitted request holds
//! its place until its response body has been sent, streaming included;
//! meanwhile others get 429 with `Retry-After`, or gRPC's
//! RESOURCE_EXHAUSTED.

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use tokio::sync::mpsc;
use tollgate_limiter::{Limit, Limiter, Policy, Scope};
use tollgate_memory::MemoryStore;
use tollgate_tower::RateLimitLayer;
use tower_layer::Layer;
use tower_service::Service;

/// A streaming body: each chunk sent on the channel, ending when the
/// sender is dropped.
struct Streamed(mpsc::UnboundedReceiver<Bytes>);

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// Answers each request with the next streamed body handed to it.
#[derive(Clone)]
struct Streaming(Arc<Mutex<Vec<Streamed>>>);

impl Service<Request<Empty<Bytes>>> for Streaming {
    type Response = Response<Streamed>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Streamed>, Infallible>> + Send>>;
    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<Empty<Bytes>>) -> Self::Future {
        let body = self
            .0
            .lock()
            .unwrap()
            .pop()
            .expect("a body for each admitted request");
        Box::pin(async move { Ok(Response::new(body)) })
    }
}

async fn send<S>(service: &mut S, grpc: bool) -> S::Response
where
    S: Service<Request<Empty<Bytes>>, Error = Infallible>,
{
    poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
    // A gRPC call is a POST.
    let request = if grpc {
        Request::post("/export").header("content-type", "application/grpc")
    } else {
        Request::get("/export")
    };
    service
        .call(request.body(Empty::new()).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_is_held_until_the_streamed_body_is_sent() {
    let lease = Duration::from_secs(30);
    let policy = Policy::new("exports", Limit::concurrency(1, lease).unwrap()).unwrap();
    let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer("in-flight", Scope::Global, policy)
        .build()
        .unwrap();
    let (first_tx, first_rx) = mpsc::unbounded_channel();
    let (last_tx, last_rx) = mpsc::unbounded_channel::<Bytes>();
    drop(last_tx);
    let bodies = Arc::new(Mutex::new(vec![Streamed(last_rx), Streamed(first_rx)]));
    let layer = RateLimitLayer::builder(limiter).build().unwrap();
    let mut service = layer.layer(Streaming(bodies));

    let first = send(&mut service, false).await;
    assert_eq!(first.status(), StatusCode::OK);
    let mut body = first.into_body();
    first_tx.send(Bytes::from_static(b"part 1")).unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "part 1");

    // The body is still streaming: the place is taken.
    let busy = send(&mut service, false).await;
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.headers()["retry-after"], "30");
    let grpc = send(&mut service, true).await;
    assert_eq!(grpc.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED");

    // The last chunk, then the end: the place comes back.
    first_tx.send(Bytes::from_static(b"part 2")).unwrap();
    drop(first_tx);
    assert_eq!(body.collect().await.unwrap().to_bytes(), "part 2");
    for _ in 0..10_000 {
        let next = send(&mut service, false).await;
        if next.status() == StatusCode::OK {
            return;
        }
        assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
        tokio::task::yield_now().await;
    }
    panic!("the place never came back after the body was sent");
}
