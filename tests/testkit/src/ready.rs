//! Running futures that never suspend, without a runtime.

use std::future::{Future, IntoFuture};
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// The output of `fut`, which must finish on its first poll — as every
/// decision of the in-process store does. Lets threads and benchmarks call
/// async APIs without a runtime.
///
/// # Panics
///
/// When `fut` is not ready at once (it waits on I/O or a timer).
///
/// ```
/// assert_eq!(tollgate_testkit::ready(async { 7 }), 7);
/// ```
pub fn ready<F: IntoFuture>(fut: F) -> F::Output {
    match pin!(fut.into_future()).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => {
            panic!("the future suspended; `ready` is only for futures that never wait")
        }
    }
}
