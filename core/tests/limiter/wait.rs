//! Waiting for capacity (`Limiter::wait`, `Limiter::throttle`) on a manual
//! clock: a waiter sleeps on the clock, wakes when the test moves it, and
//! never sleeps past its bound. Nothing sleeps for real.
#![cfg(feature = "wait")]

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tollgate_limiter::{
    async_trait, Clock, Context, Decide, LayerRequest, Limit, Limiter, ManualClock, Policy, Scope,
    Store, Subject, Timestamp, Verdict, Verdicts, WhenLimited,
};
use tollgate_memory::MemoryStore;

/// On a minute boundary, so a window's retry-after is exactly 60 s.
const START: Timestamp = Timestamp::from_micros(1_779_999_960_000_000);

/// Two per minute (fixed window) for one subject, store and limiter on `clock`.
fn two_per_minute(clock: &ManualClock) -> Limiter {
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    Limiter::builder(Arc::new(store))
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "api",
                Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

fn ctx() -> Context {
    Context::for_subject(Subject::new("client-1").unwrap())
}

/// Let spawned tasks run until one is asleep on the clock.
async fn until_asleep(clock: &ManualClock) {
    for _ in 0..1_000 {
        if clock.sleepers() > 0 {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("nobody went to sleep on the clock");
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiter_sleeps_until_the_window_opens_then_is_admitted() {
    let clock = ManualClock::new(START);
    let limiter = two_per_minute(&clock);
    for _ in 0..2 {
        assert!(limiter.check(&ctx(), 1).await.unwrap().is_allowed());
    }
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.wait(&ctx(), 1, Duration::from_secs(120)).await })
    };
    until_asleep(&clock).await;
    // Halfway: woken, it looks at the clock and sleeps on.
    clock.advance(Duration::from_secs(30));
    until_asleep(&clock).await;
    assert!(!waiter.is_finished(), "admitted before the window opened");
    // Past the retry-after and its jitter (at most 100 ms).
    clock.advance(Duration::from_millis(30_100));
    let decision = waiter.await.unwrap().unwrap();
    assert!(decision.is_allowed());
    assert_eq!(
        decision.layers()[0].verdict().remaining,
        1,
        "one unit of the new window"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_longer_than_the_bound_returns_the_denial_at_once() {
    let clock = ManualClock::new(START);
    let limiter = two_per_minute(&clock);
    for _ in 0..2 {
        limiter.check(&ctx(), 1).await.unwrap();
    }
    // The window opens in 60 s; the bound is 10 s: no sleep at all.
    let decision = limiter
        .wait(&ctx(), 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(!decision.is_allowed());
    assert_eq!(decision.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(clock.sleepers(), 0);
    assert_eq!(clock.now(), START, "nothing moved the clock");
}

#[tokio::test(flavor = "current_thread")]
async fn an_admitted_request_does_not_wait() {
    let clock = ManualClock::new(START);
    let limiter = two_per_minute(&clock);
    let decision = limiter.wait(&ctx(), 1, Duration::ZERO).await.unwrap();
    assert!(decision.is_allowed());
    assert_eq!(decision.layers()[0].verdict().remaining, 1);
}

/// A stream of `items`, ready at once.
struct Ready<I>(I);

impl<I: Iterator + Unpin> futures_core::Stream for Ready<I> {
    type Item = I::Item;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut TaskContext<'_>) -> Poll<Option<I::Item>> {
        Poll::Ready(self.0.next())
    }
}

async fn next<S: futures_core::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

#[tokio::test(flavor = "current_thread")]
async fn throttle_drops_or_waits_by_choice() {
    let clock = ManualClock::new(START);
    let limiter = two_per_minute(&clock);
    let mut dropping = limiter.throttle(
        Ready(["a", "b", "c"].into_iter()),
        ctx(),
        1,
        WhenLimited::Drop,
    );
    assert_eq!(next(&mut dropping).await.unwrap().unwrap(), "a");
    assert_eq!(next(&mut dropping).await.unwrap().unwrap(), "b");
    let rejected = next(&mut dropping).await.unwrap().unwrap_err();
    assert_eq!(rejected.item, "c");
    assert!(!rejected.outcome.unwrap().is_allowed());
    assert!(next(&mut dropping).await.is_none());

    // The same subject, now waiting: "d" waits for the next window.
    let mut waiting = limiter.throttle(
        Ready(["d"].into_iter()),
        ctx(),
        1,
        WhenLimited::Wait {
            max_wait: Duration::from_secs(90),
        },
    );
    let task = tokio::spawn(async move { next(&mut waiting).await });
    until_asleep(&clock).await;
    assert!(!task.is_finished());
    clock.advance(Duration::from_millis(60_100));
    assert_eq!(task.await.unwrap().unwrap().unwrap(), "d");
}

#[test]
fn a_sleep_is_one_entry_and_leaves_none_when_dropped() {
    let clock = ManualClock::new(START);
    let second = START.saturating_add(Duration::from_secs(1));
    let mut cx = TaskContext::from_waker(std::task::Waker::noop());
    let mut sleep = clock.sleep_until(second);
    for _ in 0..3 {
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(clock.sleepers(), 1, "polled three times, one entry");
    drop(sleep);
    assert_eq!(clock.sleepers(), 0, "a dropped sleep leaves no waker");
    let mut sleep = clock.sleep_until(second);
    assert!(sleep.as_mut().poll(&mut cx).is_pending());
    clock.advance(Duration::from_millis(999));
    assert!(sleep.as_mut().poll(&mut cx).is_pending());
    clock.advance(Duration::from_millis(1));
    assert!(sleep.as_mut().poll(&mut cx).is_ready());
}

/// A store that denies every request, saying to retry after its wait
/// ("at once": as a breaker open for 0 s answers), yielding before each
/// answer; given a clock, it steps the clock back an hour at its first
/// answer. It counts the decisions it runs.
#[derive(Debug)]
struct RetryAfter(Duration, Option<ManualClock>, AtomicUsize);

#[async_trait]
impl Store for RetryAfter {
    fn kind(&self) -> &'static str {
        "retry-after"
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        Decide::Later(Box::pin(async move {
            // Counted when run: a `Later` answer is asked for again on
            // the waiting path, and the first one dropped.
            self.2.fetch_add(1, Ordering::Relaxed);
            tokio::task::yield_now().await;
            if let Some(clock) = &self.1 {
                if clock.now() >= START {
                    clock.rewind(Duration::from_secs(3_600));
                }
            }
            for _ in layers {
                verdicts.push(Verdict {
                    allowed: false,
                    limit: 1,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    retry_after: Some(self.0),
                });
            }
            Ok(())
        }))
    }
}

/// A denial that says "retry at once" is retried after a sleep on the
/// clock, not in a busy loop asking the store again and again.
#[tokio::test(flavor = "current_thread")]
async fn a_retry_at_once_sleeps_on_the_clock() {
    let clock = ManualClock::new(START);
    let limiter = denying(&clock, Duration::ZERO);
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.wait(&ctx(), 1, Duration::from_secs(10)).await })
    };
    until_asleep(&clock).await;
    clock.advance(Duration::from_secs(10));
    let decision = waiter.await.unwrap().unwrap();
    assert!(!decision.is_allowed(), "denied once no wait is left");
}

/// Denials that keep saying "retry at once" are tried again after longer
/// and longer sleeps (1 ms, doubling, at most a second): a 10 s bound
/// sees a score of tries, not one every millisecond. A retry of under a
/// millisecond (a fast limit) is a real one: tried every millisecond.
#[tokio::test(flavor = "current_thread")]
async fn retries_at_once_back_off() {
    let tries = tries_in_ten_seconds(Duration::ZERO).await;
    // 1 + 2 + … + 512 ms in ten sleeps, then a try a second.
    assert!((5..=30).contains(&tries), "{tries} tries in a 10 s wait");
    let tries = tries_in_ten_seconds(Duration::from_micros(500)).await;
    assert!(
        tries >= 5_000,
        "{tries} tries in a 10 s wait of 500 µs retries"
    );
}

/// The decisions a wait of at most 10 s asks of a store that always denies
/// with `retry_after`, the clock moved a millisecond at a time.
async fn tries_in_ten_seconds(retry_after: Duration) -> usize {
    let clock = ManualClock::new(START);
    let store = Arc::new(RetryAfter(retry_after, None, AtomicUsize::new(0)));
    let limiter = on(store.clone(), &clock);
    let waiter =
        tokio::spawn(async move { limiter.wait(&ctx(), 1, Duration::from_secs(10)).await });
    let mut millis = 0;
    while !waiter.is_finished() {
        for _ in 0..100 {
            if clock.sleepers() > 0 || waiter.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        clock.advance(Duration::from_millis(1));
        tokio::task::yield_now().await;
        millis += 1;
        assert!(
            millis <= 11_000,
            "still waiting after {millis} ms of a 10 s bound"
        );
    }
    assert!(!waiter.await.unwrap().unwrap().is_allowed());
    store.2.load(Ordering::Relaxed)
}

/// A limiter on a store that denies, saying to retry after `retry_after`.
fn denying(clock: &ManualClock, retry_after: Duration) -> Limiter {
    on(
        Arc::new(RetryAfter(retry_after, None, AtomicUsize::new(0))),
        clock,
    )
}

/// A one-layer limiter on `store` and `clock`.
fn on(store: Arc<dyn Store>, clock: &ManualClock) -> Limiter {
    Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "api",
                Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

/// The longest waits add up without overflow: the waiter sleeps. A
/// denial for good (a retry of `Duration::MAX`, a breaker open for good)
/// is answered at once, even with no bound on the wait.
#[tokio::test(flavor = "current_thread")]
async fn the_longest_waits_do_not_overflow() {
    let clock = ManualClock::new(START);
    let five_centuries = Duration::from_secs(500 * 365 * 86_400);
    let limiter = denying(&clock, five_centuries);
    let waiter = tokio::spawn(async move { limiter.wait(&ctx(), 1, Duration::MAX).await });
    until_asleep(&clock).await;
    assert!(!waiter.is_finished(), "asleep, not panicked");
    waiter.abort();
    let forever = denying(&clock, Duration::MAX);
    let answer = forever.wait(&ctx(), 1, Duration::MAX).await.unwrap();
    assert_eq!(answer.retry_after(), Some(Duration::MAX), "denied at once");
}

/// A clock stepping back does not give the waiter its bound again: the
/// sleeps it took count, and it gives up once they reach `max_wait`.
#[tokio::test(flavor = "current_thread")]
async fn a_clock_stepping_back_does_not_extend_the_wait() {
    let clock = ManualClock::new(START);
    // Stepped back an hour during the first try: the clock stays behind
    // the wait's start for every later one.
    let store = Arc::new(RetryAfter(
        Duration::from_secs(1),
        Some(clock.clone()),
        AtomicUsize::new(0),
    ));
    let limiter = on(store, &clock);
    let waiter = tokio::spawn(async move { limiter.wait(&ctx(), 1, Duration::from_secs(3)).await });
    let mut wakes = 0;
    while !waiter.is_finished() && wakes < 10 {
        clock.advance(Duration::from_secs(2));
        wakes += 1;
        for _ in 0..1_000 {
            tokio::task::yield_now().await;
            if waiter.is_finished() {
                break;
            }
        }
    }
    assert!(waiter.is_finished(), "still waiting after {wakes} wakes");
    assert!(wakes <= 4, "{wakes} wakes for a 3 s bound of 1 s sleeps");
}
