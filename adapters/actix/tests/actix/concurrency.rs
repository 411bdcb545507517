//! A concurrency layer behind the actix-web middleware: an admitted
//! request holds its place until its response body has been sent,
//! streaming included; meanwhile others get 429 with `Retry-After`, or
//! gRPC's RESOURCE_EXHAUSTED.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::http::StatusCode;
use actix_web::{test, web, App, HttpResponse};
use bytes::Bytes;
use tokio::sync::mpsc;
use tollgate_actix::RateLimit;
use tollgate_limiter::{Limit, Limiter, Policy, Scope};
use tollgate_memory::MemoryStore;

/// A streaming body: each chunk sent on the channel, ending when the
/// sender is dropped.
struct Streamed(mpsc::UnboundedReceiver<Bytes>);

impl MessageBody for Streamed {
    type Error = std::convert::Infallible;
    fn size(&self) -> BodySize {
        BodySize::Stream
    }
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(Ok))
    }
}

type Bodies = Arc<Mutex<Vec<Streamed>>>;

#[actix_web::test]
async fn a_place_is_held_until_the_streamed_body_is_sent() {
    let policy = Policy::new(
        "exports",
        Limit::concurrency(1, Duration::from_secs(30)).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer("in-flight", Scope::Global, policy)
        .build()
        .unwrap();
    let (first_tx, first_rx) = mpsc::unbounded_channel();
    let (last_tx, last_rx) = mpsc::unbounded_channel::<Bytes>();
    drop(last_tx);
    let bodies: Bodies = Arc::new(Mutex::new(vec![Streamed(last_rx), Streamed(first_rx)]));
    let app = test::init_service(
        App::new()
            .app_data(web::Data::new(bodies))
            .wrap(RateLimit::builder(limiter).build().unwrap())
            .route(
                "/export",
                web::get().to(|bodies: web::Data<Bodies>| async move {
                    let body = bodies.lock().unwrap().pop().expect("a body per admission");
                    HttpResponse::Ok().body(body)
                }),
            ),
    )
    .await;
    let get = || test::TestRequest::get().uri("/export");

    let first = test::call_service(&app, get().to_request()).await;
    assert_eq!(first.status(), StatusCode::OK);
    let mut body = Box::pin(first.into_body());
    first_tx.send(Bytes::from_static(b"part 1")).unwrap();
    let chunk = poll_fn(|cx| body.as_mut().poll_next(cx)).await;
    assert_eq!(chunk.unwrap().unwrap(), "part 1");

    // Still streaming: the place is taken.
    let busy = test::call_service(&app, get().to_request()).await;
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.headers().get("retry-after").unwrap(), "30");
    // (A gRPC call is a POST.)
    let grpc = test::TestRequest::post()
        .uri("/export")
        .insert_header(("content-type", "application/grpc"));
    let grpc = test::call_service(&app, grpc.to_request()).await;
    assert_eq!(
        grpc.headers().get("grpc-status").unwrap(),
        "8",
        "RESOURCE_EXHAUSTED"
    );

    drop(first_tx);
    assert!(poll_fn(|cx| body.as_mut().poll_next(cx)).await.is_none());
    for _ in 0..10_000 {
        let next = test::call_service(&app, get().to_request()).await;
        if next.status() == StatusCode::OK {
            return;
        }
        assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
        tokio::task::yield_now().await;
    }
    panic!("the place never came back after the body was sent");
}
