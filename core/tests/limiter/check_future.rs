//! The future `Limiter::check` returns: it decides in its first poll, and
//! a caller that polls it again after it answered gets a panic, never a
//! second decision.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use tollgate_limiter::{Context, Limit, Limiter, ManualClock, Policy, Scope, Subject, Timestamp};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

const START: Timestamp = Timestamp::from_micros(1_779_999_960_000_000);

#[test]
fn a_check_polled_again_after_it_answered_panics_and_charges_nothing_more() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let limit = Limit::fixed_window(5, Duration::from_secs(60)).unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, Policy::new("api", limit).unwrap())
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("client-1").unwrap());
    let mut cx = TaskContext::from_waker(Waker::noop());

    let mut check = pin!(limiter.check(&ctx, 1));
    match check.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(decision)) => assert_eq!(decision.layers()[0].verdict().remaining, 4),
        other => panic!("the first poll decides: {other:?}"),
    }
    let again = catch_unwind(AssertUnwindSafe(|| check.as_mut().poll(&mut cx)));
    assert!(again.is_err(), "a second poll must not decide again");

    let next = ready(limiter.check(&ctx, 1)).unwrap();
    assert_eq!(
        next.layers()[0].verdict().remaining,
        3,
        "only the two decisions were charged"
    );
}
