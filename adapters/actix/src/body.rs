//! The response body of an admitted request: the service's own, holding
//! the request's places in concurrency layers until it has been sent.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project_lite::pin_project;
use tollgate_http::Holding;

pin_project! {
    /// The service's body `B`, holding the request's places in concurrency
    /// layers ([`Holding`]) until its last chunk has been sent (streaming
    /// bodies included), it failed, or it was dropped.
    pub struct HoldingBody<B> {
        #[pin]
        body: B,
        holding: Holding,
    }
}

impl<B> HoldingBody<B> {
    /// `body`, holding `holding` until it ends.
    pub fn new(body: B, holding: Holding) -> Self {
        HoldingBody { body, holding }
    }
}

impl<B: MessageBody> MessageBody for HoldingBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let next = ready!(this.body.poll_next(cx));
        if !matches!(next, Some(Ok(_))) {
            // Sent (or failed): the places come back now.
            *this.holding = Holding::default();
        }
        Poll::Ready(next)
    }
}
