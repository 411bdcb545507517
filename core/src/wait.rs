//! Waiting for capacity, for clients that send rather than serve: an
//! outbound API client, a queue consumer, a WebSocket writer.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures_core::Stream;

use crate::context::Context;
use crate::decision::Decision;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::time::duration_micros;

/// The shortest sleep between two tries of [`Limiter::wait`].
const MIN_SLEEP: Duration = Duration::from_millis(1);

/// The longest sleep after a denial that says to retry at once.
const MAX_BLIND_SLEEP: Duration = Duration::from_secs(1);

impl Limiter {
    /// Decide a request of `cost` units for `ctx`, waiting for capacity:
    /// while it is denied, sleep until the layers say it may pass (plus a
    /// little jitter, so waiters denied together do not all come back
    /// together) and ask again — for at most `max_wait` in all.
    ///
    /// Returns the last decision: admitted, or the denial that came with a
    /// wait that would run past `max_wait` (at once, rather than after
    /// sleeping in vain), or one that names no time to wait or a wait of
    /// forever ([`Duration::MAX`]: a breaker open for good). A denial
    /// that says to retry at once is tried again after 1 ms, then 2, 4, …
    /// up to a second while such denials come in a row. It never
    /// reserves capacity: every attempt is an ordinary
    /// [`check`](Limiter::check), which charges only when it admits. It
    /// sleeps on the limiter's clock ([`Clock::sleep_until`](crate::Clock::sleep_until)):
    /// tokio's timer by default, a [`ManualClock`](crate::ManualClock) in
    /// tests. Errors are [`check`](Limiter::check)'s.
    ///
    /// ```no_run
    /// # async fn send(limiter: tollgate_limiter::Limiter) -> Result<(), tollgate_limiter::Error> {
    /// use std::time::Duration;
    /// use tollgate_limiter::Context;
    /// // A limiter with a global layer: the partner API's quota.
    /// let decision = limiter.wait(&Context::new(), 1, Duration::from_secs(5)).await?;
    /// if decision.is_allowed() {
    ///     // send the request
    /// } else {
    ///     // still denied after 5 s: give up, or queue it
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait(
        &self,
        ctx: &Context,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let clock = self.clock();
        let start = clock.now();
        let jitter_seed = RandomState::new();
        let mut attempt = 0u32;
        let mut at_once_in_a_row = 0u32;
        // The sleeps asked for: a lower bound of the time waited that a
        // clock stepping back cannot undo.
        let mut slept = Duration::ZERO;
        loop {
            let decision = self.check(ctx, cost).await?;
            if decision.is_allowed() {
                return Ok(decision);
            }
            // None, or forever (a breaker open for good): waiting would
            // never admit, whatever the bound.
            let Some(retry_after) = decision.retry_after().filter(|r| *r != Duration::MAX) else {
                return Ok(decision);
            };
            let now = clock.now();
            let elapsed = Duration::from_micros(now.as_micros().saturating_sub(start.as_micros()));
            let left = max_wait.saturating_sub(elapsed.max(slept));
            // (A retry "at once" once no wait is left is no wait either:
            // a breaker open for 0 s answers one, and would loop.)
            if retry_after > left || left.is_zero() {
                return Ok(decision);
            }
            // A retry "at once" (a breaker open for 0 s, a custom
            // algorithm that cannot tell) would otherwise ask again in a
            // busy loop; a retry of under a millisecond is a real one
            // (a fast limit), kept to the shortest sleep.
            let floor = if retry_after.is_zero() {
                at_once_in_a_row = at_once_in_a_row.saturating_add(1);
                blind_sleep(at_once_in_a_row)
            } else {
                at_once_in_a_row = 0;
                MIN_SLEEP
            };
            let sleep = retry_after
                .saturating_add(jitter(&jitter_seed, attempt, retry_after))
                .max(floor)
                .min(left);
            clock.sleep_until(now.saturating_add(sleep)).await;
            slept = slept.saturating_add(sleep);
            attempt = attempt.wrapping_add(1);
        }
    }

    /// `stream`'s items, each charged `cost` units for `ctx` as it comes:
    /// an admitted item is yielded as `Ok(item)`; a denied one, with
    /// [`WhenLimited::Wait`] once waiting up to its bound did not admit it,
    /// is handed back as `Err(Rejected)` — to drop, queue or answer as the
    /// application chooses. Items are decided one at a time, in order.
    ///
    /// ```no_run
    /// # fn run<S: futures_core::Stream<Item = String> + Unpin>(limiter: tollgate_limiter::Limiter, messages: S) {
    /// use std::time::Duration;
    /// use tollgate_limiter::{Context, Subject, WhenLimited};
    /// let ctx = Context::for_subject(Subject::new("connection-7").unwrap());
    /// // Each message waits up to 200 ms for capacity; the rest come back as `Err(Rejected)`.
    /// let throttled = limiter.throttle(messages, ctx, 1, WhenLimited::Wait { max_wait: Duration::from_millis(200) });
    /// # let _ = throttled; }
    /// ```
    pub fn throttle<S: Stream + Unpin>(
        &self,
        stream: S,
        ctx: Context,
        cost: u64,
        when_limited: WhenLimited,
    ) -> Throttle<S> {
        Throttle {
            stream,
            limiter: self.clone(),
            ctx,
            cost,
            max_wait: match when_limited {
                WhenLimited::Wait { max_wait } => max_wait,
                WhenLimited::Drop => Duration::ZERO,
            },
            pending: None,
        }
    }
}

/// The sleep after the `in_a_row`-th denial in a row that said to retry
/// at once: 1 ms, doubling each time, at most [`MAX_BLIND_SLEEP`]. Such a
/// denial tells nothing about when capacity comes back, and asking every
/// millisecond until the bound would only load the store.
fn blind_sleep(in_a_row: u32) -> Duration {
    let doublings = in_a_row.saturating_sub(1).min(10);
    MIN_SLEEP
        .saturating_mul(1 << doublings)
        .min(MAX_BLIND_SLEEP)
}

/// Up to a tenth of `wait` (at most 100 ms), different for every waiter
/// and every attempt.
fn jitter(seed: &RandomState, attempt: u32, wait: Duration) -> Duration {
    let span = duration_micros(wait / 10).min(100_000);
    if span == 0 {
        return Duration::ZERO;
    }
    Duration::from_micros(seed.hash_one(attempt) % span)
}

/// What [`Limiter::throttle`] does with an item the limits deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenLimited {
    /// Wait for capacity, as [`Limiter::wait`] does, for up to `max_wait`
    /// per item; an item still denied then is handed back.
    Wait {
        /// The longest an item waits.
        max_wait: Duration,
    },
    /// Hand the item back at once.
    Drop,
}

/// An item [`Limiter::throttle`] did not admit, handed back with why.
#[derive(Debug)]
pub struct Rejected<T> {
    /// The item.
    pub item: T,
    /// The denial, or the error deciding it.
    pub outcome: Result<Decision, Error>,
}

type Deciding = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send>>;

/// The stream of [`Limiter::throttle`].
pub struct Throttle<S: Stream> {
    stream: S,
    limiter: Limiter,
    ctx: Context,
    cost: u64,
    max_wait: Duration,
    /// The item being decided, and its decision.
    pending: Option<(S::Item, Deciding)>,
}

// No field is pinned structurally: the stream is `Unpin` and the decision
// is boxed, so moving a `Throttle` moves nothing that is pinned.
impl<S: Stream + Unpin> Unpin for Throttle<S> {}

impl<S: Stream + Unpin> Stream for Throttle<S> {
    type Item = Result<S::Item, Rejected<S::Item>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some((_, deciding)) = &mut this.pending {
                let outcome = match deciding.as_mut().poll(cx) {
                    Poll::Ready(outcome) => outcome,
                    Poll::Pending => return Poll::Pending,
                };
                let (item, _) = this.pending.take().expect("an item is being decided");
                return Poll::Ready(Some(match outcome {
                    Ok(decision) if decision.is_allowed() => Ok(item),
                    outcome => Err(Rejected { item, outcome }),
                }));
            }
            let item = match Pin::new(&mut this.stream).poll_next(cx) {
                Poll::Ready(Some(item)) => item,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let (limiter, ctx, cost, max_wait) = (
                this.limiter.clone(),
                this.ctx.clone(),
                this.cost,
                this.max_wait,
            );
            this.pending = Some((
                item,
                Box::pin(async move { limiter.wait(&ctx, cost, max_wait).await }),
            ));
        }
    }
}

impl<S: Stream> std::fmt::Debug for Throttle<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("cost", &self.cost)
            .field("max_wait", &self.max_wait)
            .field("deciding", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}
