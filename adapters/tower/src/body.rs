//! The response body: the service's own, or a rejection's problem document.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tollgate_http::Holding;

pin_project! {
    /// The body of a [`RateLimit`](crate::RateLimit) response: the inner
    /// service's body `B`, or the bytes of a rejection.
    ///
    /// Wrapping rather than requiring `B: From<Bytes>` keeps the layer usable
    /// with any body type: axum's, hyper's `Incoming`-based ones, tonic's.
    ///
    /// An admitted request's places in concurrency layers ride with its
    /// body: they are given back once the body has sent its last frame
    /// (streaming bodies included), failed, or been dropped.
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B, holding: Holding },
        Reply { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body.
    pub fn inner(body: B) -> Self {
        Self::holding(body, Holding::default())
    }

    /// The inner service's body, holding `holding` until it ends.
    pub fn holding(body: B, holding: Holding) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body, holding },
        }
    }

    /// A complete body of `data`.
    pub fn reply(data: Bytes) -> Self {
        RateLimitBody {
            kind: Kind::Reply {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { mut body, holding } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let more = matches!(frame, Some(Ok(_))) && !body.is_end_stream();
                if !more {
                    // Sent (or failed): the places come back now, not when
                    // the connection gets round to dropping the body.
                    *holding = Holding::default();
                }
                Poll::Ready(frame)
            }
            KindProj::Reply { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Reply { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Reply { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> std::fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("RateLimitBody::Inner(..)"),
            Kind::Reply { data } => f
                .debug_tuple("RateLimitBody::Reply")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}
