//! The store conformance suite.
//!
//! Each case is an `async fn` taking a [`StoreFactory`]: something that,
//! given a [`ManualClock`], returns a store reading its time from that clock.
//! Cases use their own policy names and subjects, so one store (or one Redis
//! database) can serve them all in parallel. [`conformance_tests!`] turns every
//! case into a `#[tokio::test]`.
//!
//! The cases pin down the [`Store`] contract: a new key starts full; exactly
//! the capacity passes in sequence and under concurrency; a denial consumes
//! nothing; retry-after is exact to the microsecond; a clock stepping back
//! neither refills nor drains; layered decisions are all-or-nothing; and
//! subjects never share counters; a state is only read by the algorithm
//! that wrote it (an algorithm swap starts from no state); `peek` charges
//! nothing, `reset` forgets a context's own layers, `penalize` and `reward`
//! move them between empty and full, and `block` denies until its end.
//!
//! Two more cases need a hook into the store, so they are called by hand:
//! [`foreign_values_are_conflicts`] (stores that share a database with other
//! applications, given a [`ForeignWriter`]) and [`key_budgets`] (bounded
//! stores).
//!
//! [`conformance_tests!`]: crate::conformance_tests

mod concurrency;
mod lease;

pub use concurrency::{concurrency_limits_hold_places, mismatched_holds_are_refused};
pub use lease::{leased_layers_never_over_admit, leases_come_back};

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    async_trait, Adjustment, Context, Decision, KeyBudget, LayerRequest, Limit, Limiter,
    ManualClock, Policy, Scope, Store, StoreError, StoreKey, Subject, Timestamp, WhenFull,
};

/// Builds a store whose time comes from the given manual clock.
pub trait StoreFactory: Send + Sync {
    /// The store's future.
    type Fut: Future<Output = Arc<dyn Store>> + Send;
    /// A store reading time from `clock`.
    fn make(&self, clock: ManualClock) -> Self::Fut;
}

impl<F, Fut> StoreFactory for F
where
    F: Fn(ManualClock) -> Fut + Send + Sync,
    Fut: Future<Output = Arc<dyn Store>> + Send,
{
    type Fut = Fut;
    fn make(&self, clock: ManualClock) -> Fut {
        self(clock)
    }
}

/// The instant every case starts at: a realistic wall-clock time (2026).
pub const START: Timestamp = Timestamp::from_micros(1_780_000_000_123_456);

/// One policy of each built-in algorithm, every one with capacity `capacity`
/// and a one-second period or window.
pub fn every_algorithm(capacity: u64) -> Vec<Limit> {
    every_algorithm_over(capacity, Duration::from_secs(1))
}

/// One policy of each built-in algorithm, every one with capacity
/// `capacity` and `period` as its period or window.
///
/// A store on a manual clock still expires keys in real time (Redis counts
/// TTLs on its own clock): a test whose wall-clock run may outlast a
/// state's TTL (a one-second bucket's state lives about `period / capacity`
/// per unit used) needs periods longer than the test, or a state expires
/// while the manual clock stands still and the key starts over.
pub fn every_algorithm_over(capacity: u64, period: Duration) -> Vec<Limit> {
    vec![
        Limit::token_bucket(capacity, capacity, period).expect("valid"),
        Limit::gcra(capacity, period, capacity).expect("valid"),
        Limit::fixed_window(capacity, period).expect("valid"),
        Limit::sliding_window(capacity, period).expect("valid"),
        Limit::sliding_log(capacity, period).expect("valid"),
        calendar_over(capacity, period),
    ]
}

/// A calendar quota of `capacity` per UTC day (no case's clock crosses
/// midnight by `period`: [`START`] is 20:26 UTC, and cases move it by
/// minutes; one that moves past a span's end moves by what a verdict said).
fn calendar_over(capacity: u64, _period: Duration) -> Limit {
    Limit::calendar(capacity, calendar("day", "UTC")).expect("valid")
}

/// Spans of `unit` in `zone`, from 1 January 2025 at 00:00.
fn calendar(unit: &str, zone: &str) -> tollgate_limiter::Recurrence {
    let unit = unit.parse().expect("a calendar unit");
    tollgate_limiter::Recurrence::new(unit, zone, "2025-01-01T00:00").expect("valid")
}

/// A name no other case (in this process or another) uses, so cases can
/// share a store.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// A one-layer limiter over `store` with `limit`.
pub fn single(store: Arc<dyn Store>, limit: Limit) -> Limiter {
    let policy = Policy::new(unique(limit.algorithm_name()), limit).expect("valid policy");
    Limiter::builder(store)
        .layer("only", Scope::Subject, policy)
        .build()
        .expect("valid limiter")
}

/// A context with a fresh subject.
pub fn fresh_subject() -> Context {
    Context::for_subject(Subject::new(unique("subject")).expect("valid subject"))
}

async fn admitted(limiter: &Limiter, ctx: &Context, n: usize, cost: u64) -> usize {
    let mut count = 0;
    for _ in 0..n {
        if limiter
            .check(ctx, cost)
            .await
            .expect("store answers")
            .is_allowed()
        {
            count += 1;
        }
    }
    count
}

/// Decide every `(limiter, context)` request at once (a barrier releases
/// them together, each in its own task): every decision, in order. A
/// request that was not decided at all (an invalid request) fails the test;
/// a store error is a decision (degraded), for the caller to judge.
pub async fn decide_concurrently(requests: Vec<(Limiter, Context)>) -> Vec<Decision> {
    let barrier = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(limiter, ctx)| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                limiter.check(&ctx, 1).await.expect("valid request")
            })
        })
        .collect();
    let mut decisions = Vec::with_capacity(tasks.len());
    for task in tasks {
        decisions.push(task.await.expect("task"));
    }
    decisions
}

/// A new key starts full: `capacity` requests pass, the next is denied.
pub async fn new_key_starts_full(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(5) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        let first = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(first.is_allowed(), "{name}: first request of a new key");
        assert_eq!(
            first.layers()[0].verdict().remaining,
            4,
            "{name}: remaining after one"
        );
        assert_eq!(
            admitted(&limiter, &ctx, 4, 1).await,
            4,
            "{name}: rest of the capacity"
        );
        let denied = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(!denied.is_allowed(), "{name}: request over capacity");
        assert_eq!(
            denied.layers()[0].verdict().remaining,
            0,
            "{name}: nothing left"
        );
        assert!(
            denied.retry_after().expect("a denial has a retry-after") > Duration::ZERO,
            "{name}"
        );
    }
}

/// The seed's case: 5 requests in sequence against a limit of 3 admit exactly 3.
pub async fn sequential_admits_exactly_the_limit(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(3) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        assert_eq!(
            admitted(&limiter, &fresh_subject(), 5, 1).await,
            3,
            "{name}"
        );
    }
}

/// A denied request consumes nothing, and retry-after is exact: one
/// microsecond before it the request is still denied, at it the request passes.
pub async fn retry_after_is_exact_and_denials_are_free(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(4) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        assert_eq!(admitted(&limiter, &ctx, 4, 1).await, 4, "{name}");
        clock.advance(Duration::from_millis(100));
        let denied = limiter.check(&ctx, 3).await.expect("store answers");
        assert!(
            !denied.is_allowed(),
            "{name}: cost 3 with (almost) nothing left"
        );
        let wait = denied.retry_after().expect("retry-after");
        // Hammering while denied must not push the retry point back.
        for _ in 0..10 {
            let again = limiter.check(&ctx, 3).await.expect("store answers");
            assert_eq!(
                again.retry_after(),
                Some(wait),
                "{name}: denials consumed something"
            );
        }
        clock.advance(wait - Duration::from_micros(1));
        assert!(
            !limiter
                .check(&ctx, 3)
                .await
                .expect("store answers")
                .is_allowed(),
            "{name}: 1µs early"
        );
        clock.advance(Duration::from_micros(1));
        assert!(
            limiter
                .check(&ctx, 3)
                .await
                .expect("store answers")
                .is_allowed(),
            "{name}: at retry-after"
        );
    }
}

/// A clock stepping back neither refills the bucket a second time nor takes
/// anything away (GCRA and the token bucket, which keep only when they are
/// full again, may admit less until the clock catches up, never more).
pub async fn backward_clock_neither_refills_nor_drains(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(4) {
        let name = limit.algorithm_name();
        // GCRA and the token bucket keep no time besides when they are
        // full again: they may admit less until the clock catches up.
        let keeps_no_time = matches!(limit, Limit::Gcra(_) | Limit::TokenBucket(_));
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        assert_eq!(admitted(&limiter, &ctx, 2, 1).await, 2, "{name}");
        clock.advance(Duration::from_millis(300));
        let before = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(before.is_allowed(), "{name}");
        let remaining = before.layers()[0].verdict().remaining;
        // Step back 200ms: the same request must not see more, nor less.
        clock.rewind(Duration::from_millis(200));
        let after = limiter.check(&ctx, 1).await.expect("store answers");
        if remaining == 0 {
            assert!(!after.is_allowed(), "{name}: a backward clock refilled");
        } else if keeps_no_time {
            assert!(
                !after.is_allowed() || after.layers()[0].verdict().remaining < remaining,
                "{name}: a backward clock refilled"
            );
        } else {
            assert!(after.is_allowed(), "{name}: a backward clock drained");
            assert_eq!(
                after.layers()[0].verdict().remaining,
                remaining - 1,
                "{name}"
            );
        }
        // Coming forward again to the same instant refills nothing twice:
        // with the request at the step back, exactly what was left.
        clock.advance(Duration::from_millis(200));
        let total = admitted(&limiter, &ctx, 10, 1).await as u64;
        assert_eq!(
            total + u64::from(after.is_allowed()),
            remaining,
            "{name}: refilled twice"
        );
    }
}

/// Many tasks released together on one key at one instant admit exactly the capacity.
pub async fn concurrent_requests_admit_exactly_the_capacity(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(20) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        let requests = (0..200).map(|_| (limiter.clone(), ctx.clone())).collect();
        let count = decide_concurrently(requests)
            .await
            .iter()
            .filter(|d| d.is_allowed())
            .count();
        assert_eq!(count, 20, "{name}: 200 concurrent requests, capacity 20");
    }
}

/// A request denied by one layer charges no layer.
pub async fn layers_are_all_or_nothing(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(10) {
        let name = limit.algorithm_name();
        let wide = Policy::new(unique("wide"), limit).expect("valid");
        let narrow = Policy::new(
            unique("narrow"),
            Limit::fixed_window(2, Duration::from_secs(60)).expect("valid"),
        )
        .expect("valid");
        let limiter = Limiter::builder(store.clone())
            .layer("subject", Scope::Subject, wide)
            .layer("tenant", Scope::Tenant, narrow)
            .build()
            .expect("valid");
        let ctx = fresh_subject().with_tenant(Subject::new(unique("tenant")).expect("valid"));
        assert_eq!(admitted(&limiter, &ctx, 2, 1).await, 2, "{name}");
        for _ in 0..5 {
            let d = limiter.check(&ctx, 1).await.expect("store answers");
            assert!(!d.is_allowed(), "{name}");
            assert!(
                d.layers()[0].verdict().allowed && !d.layers()[1].verdict().allowed,
                "{name}: only the tenant layer denies"
            );
            assert_eq!(
                d.layers()[0].verdict().remaining,
                8,
                "{name}: the denied request charged the subject layer"
            );
        }
    }
}

/// `peek` reports what `check` would decide — per layer, all-or-nothing
/// included — and charges nothing.
pub async fn peek_charges_nothing(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    // A minute: no state expires while the test runs (see every_algorithm_over).
    for limit in every_algorithm_over(5, Duration::from_secs(60)) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        for _ in 0..3 {
            let d = limiter.peek(&ctx, 1).await.expect("store peeks");
            assert!(d.is_allowed(), "{name}: a new key admits");
            assert_eq!(
                d.layers()[0].verdict().remaining,
                5,
                "{name}: nothing was charged"
            );
        }
        assert_eq!(admitted(&limiter, &ctx, 3, 1).await, 3, "{name}");
        let d = limiter.peek(&ctx, 1).await.expect("store peeks");
        assert_eq!(
            d.layers()[0].verdict().remaining,
            2,
            "{name}: peek sees the charges"
        );
        assert!(
            !limiter
                .peek(&ctx, 3)
                .await
                .expect("store peeks")
                .is_allowed(),
            "{name}: 3 > 2"
        );
        assert_eq!(
            admitted(&limiter, &ctx, 2, 1).await,
            2,
            "{name}: peeks took nothing"
        );
        let peeked = limiter.peek(&ctx, 1).await.expect("store peeks");
        let checked = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(!peeked.is_allowed() && !checked.is_allowed(), "{name}");
        assert_eq!(
            peeked.retry_after(),
            checked.retry_after(),
            "{name}: the same wait"
        );
    }
    // Layered: the verdict of each layer, as a denial reports it.
    let wide = Policy::new(
        unique("wide"),
        Limit::fixed_window(10, Duration::from_secs(60)).expect("valid"),
    )
    .expect("valid");
    let narrow = Policy::new(
        unique("narrow"),
        Limit::fixed_window(1, Duration::from_secs(60)).expect("valid"),
    )
    .expect("valid");
    let limiter = Limiter::builder(store)
        .layer("subject", Scope::Subject, wide)
        .layer("tenant", Scope::Tenant, narrow)
        .build()
        .expect("valid");
    let ctx = fresh_subject().with_tenant(Subject::new(unique("tenant")).expect("valid"));
    assert_eq!(admitted(&limiter, &ctx, 1, 1).await, 1);
    let d = limiter.peek(&ctx, 1).await.expect("store peeks");
    assert!(d.layers()[0].verdict().allowed && !d.layers()[1].verdict().allowed);
    assert_eq!(
        d.layers()[0].verdict().remaining,
        9,
        "the subject layer as it is"
    );
}

/// `reset` forgets a context's own (per-subject) layers; the layers other
/// clients share (tenant, global) and other subjects keep their state;
/// resetting keys never written is fine.
pub async fn reset_forgets_the_state(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let minute = Duration::from_secs(60);
    for limit in every_algorithm_over(5, minute) {
        let name = limit.algorithm_name();
        let window = |n| Limit::fixed_window(n, minute).expect("valid");
        let limiter = Limiter::builder(store.clone())
            .layer(
                "subject",
                Scope::Subject,
                Policy::new(unique(name), limit).expect("valid"),
            )
            .layer(
                "tenant",
                Scope::Tenant,
                Policy::new(unique("tenant"), window(6)).expect("valid"),
            )
            .layer(
                "all",
                Scope::Global,
                Policy::new(unique("all"), window(100)).expect("valid"),
            )
            .build()
            .expect("valid");
        let ctx = fresh_subject().with_tenant(Subject::new(unique("t")).expect("valid"));
        let other = fresh_subject().with_tenant(Subject::new(unique("t")).expect("valid"));
        limiter
            .reset(&ctx)
            .await
            .expect("nothing to forget is fine");
        assert_eq!(admitted(&limiter, &ctx, 7, 1).await, 5, "{name}");
        assert_eq!(admitted(&limiter, &other, 2, 1).await, 2, "{name}");
        limiter.reset(&ctx).await.expect("store resets");
        let d = limiter.peek(&ctx, 1).await.expect("store peeks");
        let remaining: Vec<u64> = d.layers().iter().map(|l| l.verdict().remaining).collect();
        assert_eq!(
            remaining,
            [5, 1, 93],
            "{name}: the subject layer is new, the shared ones are not"
        );
        let d = limiter.peek(&other, 1).await.expect("store peeks");
        let remaining: Vec<u64> = d.layers().iter().map(|l| l.verdict().remaining).collect();
        assert_eq!(
            remaining,
            [3, 4, 93],
            "{name}: another subject kept its state"
        );
    }
}

/// `penalize` charges a context's own layers without an admission check,
/// saturating at empty; `reward` gives units back, never above full; both
/// change every per-subject layer at once and never a shared one; no units,
/// or a limiter without a per-subject layer, are refused.
pub async fn penalties_saturate_and_rewards_refill(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let minute = Duration::from_secs(60);
    let window = |n| Limit::fixed_window(n, minute).expect("valid");
    for limit in every_algorithm_over(5, minute) {
        let name = limit.algorithm_name();
        let limiter = Limiter::builder(store.clone())
            .layer(
                "own",
                Scope::Subject,
                Policy::new(unique(name), limit).expect("valid"),
            )
            .layer(
                "own-wide",
                Scope::Subject,
                Policy::new(unique("wide"), window(8)).expect("valid"),
            )
            .layer(
                "tenant",
                Scope::Tenant,
                Policy::new(unique("tenant"), window(100)).expect("valid"),
            )
            .build()
            .expect("valid");
        let ctx = fresh_subject().with_tenant(Subject::new(unique("t")).expect("valid"));
        let left = |d: &Decision| {
            d.layers()
                .iter()
                .map(|l| l.verdict().remaining)
                .collect::<Vec<u64>>()
        };
        let d = limiter.penalize(&ctx, 2).await.expect("store penalizes");
        assert_eq!(left(&d), [3, 6], "{name}: both own layers, nothing else");
        assert!(d.is_allowed(), "{name}");
        let d = limiter.penalize(&ctx, 7).await.expect("store penalizes");
        assert_eq!(left(&d), [0, 0], "{name}: saturated at empty");
        assert!(!d.is_allowed() && d.retry_after().is_some(), "{name}");
        assert_eq!(admitted(&limiter, &ctx, 1, 1).await, 0, "{name}: denied");
        let d = limiter.reward(&ctx, 2).await.expect("store rewards");
        assert_eq!(left(&d), [2, 2], "{name}: two back");
        assert_eq!(admitted(&limiter, &ctx, 3, 1).await, 2, "{name}");
        let d = limiter.reward(&ctx, 50).await.expect("store rewards");
        assert_eq!(left(&d), [5, 8], "{name}: full, never above");
        assert_eq!(admitted(&limiter, &ctx, 6, 1).await, 5, "{name}");
        let shared = limiter.peek(&ctx, 1).await.expect("store peeks");
        assert_eq!(
            shared.layers()[2].verdict().remaining,
            100 - 2 - 5,
            "{name}: the tenant layer counts the checks only"
        );
        assert!(
            matches!(
                limiter.penalize(&ctx, 0).await,
                Err(tollgate_limiter::Error::Operation { .. })
            ),
            "{name}: no units"
        );
    }
    let global_only = Limiter::builder(store)
        .layer(
            "all",
            Scope::Global,
            Policy::new(unique("all"), window(5)).expect("valid"),
        )
        .build()
        .expect("valid");
    assert!(matches!(
        global_only.penalize(&fresh_subject(), 1).await,
        Err(tollgate_limiter::Error::Operation { .. })
    ));
}

/// `block` denies a context's own layers until its end, exactly, whatever
/// the algorithm; peeks see it; it survives penalties and rewards, is never
/// shortened, ends with the layer full, and `reset` lifts it. Durations
/// outside 1 ms to 14 days are refused.
pub async fn blocks_deny_until_their_end(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let ten_minutes = Duration::from_secs(600);
    // Windows of a minute: a state charged meanwhile outlives the test.
    for limit in every_algorithm_over(5, Duration::from_secs(60)) {
        let name = limit.algorithm_name();
        clock.set(START);
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        assert_eq!(admitted(&limiter, &ctx, 2, 1).await, 2, "{name}");
        let d = limiter
            .block(&ctx, ten_minutes)
            .await
            .expect("store blocks");
        assert_eq!(d.retry_after(), Some(ten_minutes), "{name}: exact");
        let d = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(!d.is_allowed(), "{name}: blocked");
        assert_eq!(
            d.retry_after(),
            Some(ten_minutes),
            "{name}: check sees the end"
        );
        let d = limiter
            .block(&ctx, Duration::from_secs(1))
            .await
            .expect("store blocks");
        assert_eq!(
            d.retry_after(),
            Some(ten_minutes),
            "{name}: never shortened"
        );
        for d in [
            limiter.penalize(&ctx, 1).await.expect("store penalizes"),
            limiter.reward(&ctx, 5).await.expect("store rewards"),
            limiter.peek(&ctx, 1).await.expect("store peeks"),
        ] {
            assert_eq!(d.retry_after(), Some(ten_minutes), "{name}: still blocked");
        }
        clock.advance(ten_minutes - Duration::from_micros(1));
        let d = limiter.check(&ctx, 1).await.expect("store answers");
        assert_eq!(d.retry_after(), Some(Duration::from_micros(1)), "{name}");
        clock.advance(Duration::from_micros(1));
        let d = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(d.is_allowed(), "{name}: the block is over");
        assert_eq!(
            d.layers()[0].verdict().remaining,
            4,
            "{name}: it starts full"
        );
        // A reset lifts a block.
        limiter
            .block(&ctx, ten_minutes)
            .await
            .expect("store blocks");
        limiter.reset(&ctx).await.expect("store resets");
        assert_eq!(admitted(&limiter, &ctx, 6, 1).await, 5, "{name}: lifted");
        for wrong in [
            Duration::ZERO,
            tollgate_limiter::MAX_RECOVERY + Duration::from_secs(1),
        ] {
            assert!(
                matches!(
                    limiter.block(&ctx, wrong).await,
                    Err(tollgate_limiter::Error::Operation { .. })
                ),
                "{name}: {wrong:?}"
            );
        }
    }
    // The store refuses such blocks itself, whoever asks.
    let policy = Policy::new(
        unique("block"),
        Limit::gcra(1, Duration::from_secs(1), 1).expect("valid"),
    )
    .expect("valid");
    let subject = unique("s");
    let request = LayerRequest {
        key: StoreKey::new(&subject, &policy, "s", &subject),
        policy: &policy,
        cost: 1,
    };
    for wrong in [Duration::ZERO, Duration::MAX] {
        assert!(
            matches!(
                store.adjust(&[request], Adjustment::Block(wrong)).await,
                Err(StoreError::InvalidBlock(_))
            ),
            "{wrong:?}"
        );
    }
}

/// Different subjects never share a counter; the same policy under another
/// version starts fresh.
pub async fn subjects_and_versions_are_isolated(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(2) {
        let name = limit.algorithm_name();
        let policy = Policy::new(unique("iso"), limit).expect("valid");
        let v1 = Limiter::builder(store.clone())
            .layer("l", Scope::Subject, policy.clone())
            .build()
            .expect("valid");
        let v2 = Limiter::builder(store.clone())
            .layer("l", Scope::Subject, policy.with_version(2))
            .build()
            .expect("valid");
        let (a, b) = (fresh_subject(), fresh_subject());
        assert_eq!(admitted(&v1, &a, 3, 1).await, 2, "{name}");
        assert_eq!(admitted(&v1, &b, 3, 1).await, 2, "{name}: another subject");
        assert_eq!(admitted(&v2, &a, 3, 1).await, 2, "{name}: another version");
    }
}

/// After the reported reset time the key is exactly as new.
pub async fn state_resets_after_reset_after(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(3) {
        let name = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        let mut last = None;
        for _ in 0..3 {
            last = Some(limiter.check(&ctx, 1).await.expect("store answers"));
        }
        let reset = last.expect("three checks").layers()[0]
            .verdict()
            .reset_after;
        clock.advance(reset);
        assert_eq!(
            admitted(&limiter, &ctx, 5, 1).await,
            3,
            "{name}: full again after reset-after"
        );
    }
}

/// Swapping a policy's algorithm under the same name starts every subject
/// from no state (the old state is never read as the new algorithm's);
/// changing only its parameters keeps the state. Every ordered pair of the
/// five built-in algorithms.
pub async fn algorithm_swaps_start_from_no_state(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for (a, old) in every_algorithm(5).into_iter().enumerate() {
        for (b, new) in every_algorithm(5).into_iter().enumerate() {
            let (from, to) = (old.algorithm_name(), new.algorithm_name());
            let name = unique("swap");
            let limiter = |limit: Limit| {
                Limiter::builder(store.clone())
                    .layer(
                        "l",
                        Scope::Subject,
                        Policy::new(&name, limit).expect("valid"),
                    )
                    .build()
                    .expect("valid")
            };
            let ctx = fresh_subject();
            assert_eq!(
                admitted(&limiter(old.clone()), &ctx, 3, 1).await,
                3,
                "{from}"
            );
            let after = limiter(new.clone());
            let first = after.check(&ctx, 1).await.expect("store answers");
            let rest = admitted(&after, &ctx, 10, 1).await;
            if a == b {
                // Same algorithm: the state is shared (2 of 5 left).
                assert!(first.is_allowed(), "{from} kept: first");
                assert_eq!(rest, 1, "{from} kept: shares the state");
            } else {
                assert!(first.is_allowed(), "{from} -> {to}: first");
                assert_eq!(
                    first.layers()[0].verdict().remaining,
                    4,
                    "{from} -> {to}: judged from no state"
                );
                assert_eq!(rest, 4, "{from} -> {to}: exactly the new capacity");
            }
        }
    }
}

/// A fixed window runs up to a year: a 30-day quota admits its limit,
/// then denies until its window ends — aligned to the Unix epoch, so the
/// retry is exact to the microsecond — and a new window starts full.
pub async fn long_fixed_windows_are_quotas(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let month = Duration::from_secs(30 * 24 * 3600);
    for window in [month, tollgate_limiter::MAX_QUOTA_WINDOW] {
        let limiter = single(
            store.clone(),
            Limit::fixed_window(3, window).expect("valid"),
        );
        let ctx = fresh_subject();
        assert_eq!(admitted(&limiter, &ctx, 5, 1).await, 3, "{window:?}");
        let w = window.as_micros() as u64;
        let end = (START.as_micros() / w + 1) * w;
        let denied = limiter.check(&ctx, 1).await.expect("store answers");
        let until_end = Duration::from_micros(end - START.as_micros());
        assert_eq!(
            denied.retry_after(),
            Some(until_end),
            "{window:?}: until the window ends"
        );
        clock.set(Timestamp::from_micros(end));
        assert_eq!(
            admitted(&limiter, &ctx, 5, 1).await,
            3,
            "{window:?}: the next window"
        );
        clock.set(START);
    }
}

/// Calendar quotas count per span of the calendar: a New York month ends
/// at midnight New York time, exactly what a denial says (a µs before it
/// still denies, at it the next month admits); a Berlin day across the
/// change to summer time lasts 23 hours; a clock stepping back across a
/// boundary goes on counting in the later span.
pub async fn calendar_quotas_follow_the_calendar(factory: impl StoreFactory) {
    // 2026-03-31T12:00Z, 2026-04-01T04:00Z (00:00 EDT), 2026-05-01T04:00Z.
    let (march_31, april, may) = (
        1_774_958_400_000_000,
        1_775_016_000_000_000,
        1_777_608_000_000_000,
    );
    let clock = ManualClock::new(Timestamp::from_micros(march_31));
    let store = factory.make(clock.clone()).await;
    let monthly = Limit::calendar(3, calendar("month", "America/New_York")).expect("valid");
    let limiter = single(store.clone(), monthly);
    let ctx = fresh_subject();
    assert_eq!(admitted(&limiter, &ctx, 5, 1).await, 3, "March's three");
    let denied = limiter.check(&ctx, 1).await.expect("store answers");
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_micros(april - march_31))
    );
    clock.set(Timestamp::from_micros(april - 1));
    assert_eq!(admitted(&limiter, &ctx, 1, 1).await, 0, "still March");
    clock.set(Timestamp::from_micros(april));
    let first = limiter.check(&ctx, 1).await.expect("store answers");
    assert!(first.is_allowed(), "April");
    assert_eq!(
        first.layers()[0].verdict().reset_after,
        Duration::from_micros(may - april)
    );
    // A clock a second behind: March on its face, April in the store.
    clock.set(Timestamp::from_micros(april - 1_000_000));
    assert_eq!(admitted(&limiter, &ctx, 5, 1).await, 2, "April's other two");

    // 2026-03-29 in Berlin: 2026-03-28T23:00Z to 2026-03-29T22:00Z.
    let (noon, midnight) = (1_774_785_600_000_000, 1_774_821_600_000_000);
    clock.set(Timestamp::from_micros(noon));
    let daily = Limit::calendar(1, calendar("day", "Europe/Berlin")).expect("valid");
    let limiter = single(store.clone(), daily);
    assert_eq!(admitted(&limiter, &ctx, 2, 1).await, 1);
    let denied = limiter.check(&ctx, 1).await.expect("store answers");
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_micros(midnight - noon))
    );
    billing_date_moved(store, &clock).await;
}

/// A billing date moved from the 17th to the 1st on 20 March (UTC), after
/// the span [17 March, 17 April) was spent: its count stays in that
/// span's state until the span ends (a denial writes nothing, and April's
/// span overlaps it as March's did), and each denial says to wait for that
/// end, when the customer is admitted again.
async fn billing_date_moved(store: Arc<dyn Store>, clock: &ManualClock) {
    // 2026-03-20T12:00Z, 2026-04-01T00:00Z, 2026-04-17T00:00Z.
    let (march_20, april_1, april_17) = (
        1_774_008_000_000_000,
        1_775_001_600_000_000,
        1_776_384_000_000_000,
    );
    clock.set(Timestamp::from_micros(march_20));
    let name = unique("billing");
    let billed_from = |from: &str| {
        let unit = "month".parse().expect("a calendar unit");
        let every = tollgate_limiter::Recurrence::new(unit, "UTC", from).expect("valid");
        let limit = Limit::calendar(2, every).expect("valid");
        let policy = Policy::new(name.clone(), limit).expect("valid policy");
        Limiter::builder(store.clone())
            .layer("only", Scope::Subject, policy)
            .build()
            .expect("valid limiter")
    };
    let ctx = fresh_subject();
    let on_the_17th = billed_from("2025-01-17T00:00");
    assert_eq!(
        admitted(&on_the_17th, &ctx, 3, 1).await,
        2,
        "the 17th's two"
    );
    let on_the_1st = billed_from("2025-01-01T00:00");
    for (now, month) in [(march_20, "March"), (april_1, "April")] {
        clock.set(Timestamp::from_micros(now));
        let denied = on_the_1st.check(&ctx, 1).await.expect("store answers");
        assert!(!denied.is_allowed(), "{month}: the count carried");
        let until = Duration::from_micros(april_17 - now);
        assert_eq!(denied.retry_after(), Some(until), "{month}: until 17 April");
    }
    clock.set(Timestamp::from_micros(april_17));
    let after = admitted(&on_the_1st, &ctx, 3, 1).await;
    assert_eq!(after, 2, "the old span ended: April's two");
}

/// A plan changes a policy's limit, never its key: a window counter keeps
/// the units used under the new limit (8 of 10 used, moved to 50: 42
/// left; moved to 5: denied), a plan with another algorithm starts from no
/// state, and [`Limiter::usage`] reads what was used under the plan.
pub async fn plans_keep_what_was_used(factory: impl StoreFactory) {
    use tollgate_limiter::{Plan, PlanName, Plans};
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let hour = Duration::from_secs(3600);
    // The window counters, by their constructor.
    type Window = fn(u64, Duration) -> Result<Limit, tollgate_limiter::PolicyError>;
    let windows: [Window; 2] = [Limit::fixed_window, Limit::sliding_window];
    for window in windows {
        let name = unique("plans");
        let plans = Plans::new(Plan::new("free").expect("valid"))
            .plan(
                Plan::new("pro")
                    .expect("valid")
                    .limit(&name, window(50, hour).expect("valid")),
            )
            .plan(
                Plan::new("small")
                    .expect("valid")
                    .limit(&name, window(5, hour).expect("valid")),
            )
            .plan(
                Plan::new("bucket")
                    .expect("valid")
                    .limit(&name, Limit::gcra(4, hour, 4).expect("valid")),
            );
        let limiter = Limiter::builder(store.clone())
            .layer(
                "l",
                Scope::Subject,
                Policy::new(&name, window(10, hour).expect("valid")).expect("valid"),
            )
            .plans(plans)
            .build()
            .expect("valid");
        let free = fresh_subject();
        let on = |plan: &str| free.clone().with_plan(PlanName::new(plan).expect("valid"));
        assert_eq!(admitted(&limiter, &free, 8, 1).await, 8);
        let usage = limiter
            .usage(&on("pro"))
            .await
            .expect("store answers")
            .layers[0];
        assert_eq!(
            (usage.used, usage.remaining, usage.limit, usage.plan),
            (8, 42, 50, Some("pro"))
        );
        assert_eq!(
            admitted(&limiter, &on("small"), 3, 1).await,
            0,
            "downgraded"
        );
        assert_eq!(admitted(&limiter, &on("pro"), 50, 1).await, 42, "upgraded");
        assert_eq!(
            admitted(&limiter, &on("bucket"), 10, 1).await,
            4,
            "another algorithm"
        );
        let usage = limiter.usage(&free).await.expect("store answers").layers[0];
        assert_eq!(
            (usage.used, usage.remaining),
            (10, 0),
            "at most the limit reads as used"
        );
    }
}

/// A token bucket or GCRA under a plan keeps the units used, not the time
/// they stand for: 10 used of a 10-an-hour bucket, upgraded to 20 an
/// hour, admits 10 more at once; a unit partly refilled counts as used;
/// downgraded below what was used, a bucket denies until what was used (at
/// the rate it was used at) is below the new capacity; and
/// [`Limiter::usage`] reads the units under any plan.
pub async fn bucket_plans_keep_the_units_used(factory: impl StoreFactory) {
    use tollgate_limiter::{Plan, PlanName, Plans};
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let hour = Duration::from_secs(3600);
    let minute = Duration::from_secs(60);
    type Bucket = fn(u64, Duration) -> Limit;
    let buckets: [(Bucket, Duration); 3] = [
        (|n, per| Limit::gcra(n, per, n).expect("valid"), hour),
        (
            |n, per| Limit::token_bucket(n, n, per).expect("valid"),
            hour,
        ),
        // 7 a minute: a remainder in every state.
        (
            |n, per| Limit::token_bucket(n * 7 / 10, n * 7 / 10, per).expect("valid"),
            minute,
        ),
    ];
    for (bucket, per) in buckets {
        let name = unique("bucket-plans");
        let plan =
            |plan: &str, n: u64| Plan::new(plan).expect("valid").limit(&name, bucket(n, per));
        let plans = Plans::new(plan("free", 10))
            .plan(plan("pro", 20))
            .plan(plan("small", 5));
        let limiter = Limiter::builder(store.clone())
            .layer(
                "l",
                Scope::Subject,
                Policy::new(&name, bucket(10, per)).expect("valid"),
            )
            .plans(plans)
            .build()
            .expect("valid");
        let free = fresh_subject();
        let on =
            |ctx: &Context, plan: &str| ctx.clone().with_plan(PlanName::new(plan).expect("valid"));
        let full = bucket(10, per).capacity();
        assert_eq!(admitted(&limiter, &free, 30, 1).await, full as usize);
        let usage = limiter
            .usage(&on(&free, "pro"))
            .await
            .expect("store answers")
            .layers[0];
        assert_eq!(
            (usage.used, usage.remaining),
            (full, 2 * full - full),
            "{usage:?}"
        );
        assert_eq!(
            admitted(&limiter, &on(&free, "pro"), 30, 1).await,
            full as usize,
            "upgraded: as many more at once"
        );

        // Half an hour and a bit on the free plan: half its units back,
        // and the unit partly refilled counts as used.
        let other = fresh_subject();
        assert_eq!(admitted(&limiter, &other, 30, 1).await, full as usize);
        let interval = per / u32::try_from(full).expect("small");
        clock.advance(interval * u32::try_from(full / 2).expect("small") + Duration::from_secs(1));
        let used = full - full / 2;
        assert_eq!(
            admitted(&limiter, &on(&other, "pro"), 30, 1).await,
            (2 * full - used) as usize,
            "upgraded after a partial refill"
        );

        // Downgraded below what was used: denied until what was used, at
        // the rate it was used at, is below the new capacity.
        let third = fresh_subject();
        let used = full - 2;
        assert_eq!(
            admitted(&limiter, &third, used as usize, 1).await,
            used as usize
        );
        let small = on(&third, "small");
        assert_eq!(admitted(&limiter, &small, 3, 1).await, 0, "downgraded");
        // The denial's wait is counted at the rate the units were used at
        // (a denial writes nothing, so the state refills at that rate),
        // and it is exact: a microsecond earlier is still denied.
        let denied = limiter.check(&small, 1).await.expect("store answers");
        let wait = denied.retry_after().expect("denied, with a wait");
        let below = bucket(5, per).capacity() - 1;
        let at_old_rate = interval * u32::try_from(used - below).expect("small");
        assert!(
            wait.abs_diff(at_old_rate) <= Duration::from_micros(1),
            "{wait:?}, at the old rate {at_old_rate:?}"
        );
        clock.advance(wait - Duration::from_micros(1));
        assert_eq!(admitted(&limiter, &small, 1, 1).await, 0, "a µs early");
        clock.advance(Duration::from_micros(1));
        assert_eq!(
            admitted(&limiter, &small, 3, 1).await,
            1,
            "one unit under the new capacity, when the denial said"
        );
    }
}

/// A layer whose policy is in shadow mode is decided and counted exactly as
/// if enforced (its state evolves the same), but its denial never denies
/// the request; the enforced layers are charged as if it had admitted. A
/// denial by an enforced layer charges nothing, shadow layers included.
pub async fn shadow_layers_count_but_never_deny(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    for limit in every_algorithm(3) {
        let name = limit.algorithm_name();
        let enforced = Policy::new(
            unique("enforced"),
            Limit::fixed_window(5, Duration::from_secs(1)).expect("valid"),
        )
        .expect("valid");
        let shadow = Policy::new(unique("shadow"), limit)
            .expect("valid")
            .shadow();
        let limiter = Limiter::builder(store.clone())
            .layer("enforced", Scope::Subject, enforced.clone())
            .layer("trial", Scope::Subject, shadow.clone())
            .build()
            .expect("valid");
        let alone = |policy: Policy| {
            Limiter::builder(store.clone())
                .layer("l", Scope::Subject, policy)
                .build()
                .expect("valid")
        };
        let ctx = fresh_subject();
        let mut shadow_denied = 0;
        for i in 0..5 {
            let d = limiter.check(&ctx, 1).await.expect("store answers");
            assert!(d.is_allowed(), "{name}: request {i} passes: {d:?}");
            assert_eq!(
                d.layers()[0].verdict().remaining,
                4 - i,
                "{name}: the enforced layer is charged every time"
            );
            shadow_denied += d.shadow_denied().count();
        }
        assert_eq!(shadow_denied, 2, "{name}: 3 of 5 fit the shadow limit");
        // The shadow state is the one enforcement would have left: used up.
        let twin = alone(shadow.clone().enforced());
        assert!(
            !twin
                .check(&ctx, 1)
                .await
                .expect("store answers")
                .is_allowed(),
            "{name}: the shadow layer counted its 3 admissions"
        );
        // An enforced denial charges nothing, the shadow layer included.
        let d = limiter.check(&ctx, 1).await.expect("store answers");
        assert!(!d.is_allowed(), "{name}: the enforced layer is spent");
        let other = fresh_subject();
        let spent = alone(enforced.clone());
        for _ in 0..5 {
            spent.check(&other, 1).await.expect("store answers");
        }
        assert!(!limiter
            .check(&other, 1)
            .await
            .expect("store answers")
            .is_allowed());
        let shadow_left = alone(shadow.clone().enforced())
            .check(&other, 1)
            .await
            .expect("store answers");
        assert_eq!(
            shadow_left.layers()[0].verdict().remaining,
            2,
            "{name}: a denied request charged the shadow layer nothing"
        );
    }
}

/// A rolling deploy: old and new processes decide for the same subjects at
/// once, on one store. After an algorithm swap or a version bump they count
/// on two keys, so a subject gets at most the old limit plus the new one;
/// after a parameter change of one algorithm they share the counter, so at
/// most the larger limit.
pub async fn rolling_deploys_are_bounded(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let hour = Duration::from_secs(3_600);
    let bucket = |n| Limit::token_bucket(n, n, hour).expect("valid");
    let window = |n| Limit::fixed_window(n, hour).expect("valid");
    // (what changed, old policy, new policy, most admitted in all)
    let name = unique("rollout");
    let cases: Vec<(&str, Policy, Policy, usize)> = vec![
        (
            "algorithm swap",
            Policy::new(format!("{name}-swap"), bucket(6)).expect("valid"),
            Policy::new(format!("{name}-swap"), window(4)).expect("valid"),
            10,
        ),
        (
            "version bump",
            Policy::new(format!("{name}-version"), window(6)).expect("valid"),
            Policy::new(format!("{name}-version"), window(4))
                .expect("valid")
                .with_version(2),
            10,
        ),
        (
            "parameter change",
            Policy::new(format!("{name}-params"), window(6)).expect("valid"),
            Policy::new(format!("{name}-params"), window(4)).expect("valid"),
            6,
        ),
    ];
    for (what, old, new, most) in cases {
        let limiter = |policy: Policy| {
            Limiter::builder(store.clone())
                .layer("l", Scope::Subject, policy)
                .build()
                .expect("valid")
        };
        let (old, new) = (limiter(old), limiter(new));
        let subjects: Vec<Context> = (0..3).map(|_| fresh_subject()).collect();
        let requests = (0..60)
            .map(|i| {
                let limiter = if i % 2 == 0 { old.clone() } else { new.clone() };
                (limiter, subjects[i % 3].clone())
            })
            .collect();
        let mut admitted = [0usize; 3];
        let mut degraded = [false; 3];
        for (i, d) in decide_concurrently(requests).await.iter().enumerate() {
            admitted[i % 3] += usize::from(d.is_allowed());
            degraded[i % 3] |= d.store_error().is_some();
        }
        // Ten requests of each version per subject: enough to fill both
        // counters, so the bound is reached exactly (unless the store failed
        // some decisions, as a slow one may under load: then only the bound).
        for (n, degraded) in admitted.into_iter().zip(degraded) {
            assert!(n <= most, "{what}: a subject got {n} > {most}");
            if !degraded {
                assert_eq!(n, most, "{what}: each counter filled exactly");
            }
        }
    }
}

/// A window made longer (a reload, a plan) counts what was used under the
/// shorter one for the longer: a denial writes nothing, so the store keeps
/// the state it read until the denial's reset
/// (`tollgate_algorithms::kept_by_denial`). Left with the shorter
/// window's TTL, the key expired and two more were admitted within the
/// minute. Each window algorithm, alone and beside a layer that admits.
/// Redis expires keys on its own clock: the test also waits past the
/// shorter window's TTL in real time.
pub async fn longer_windows_keep_what_was_used(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let (short, long) = (Duration::from_millis(200), Duration::from_secs(60));
    type Window = fn(u64, Duration) -> Result<Limit, tollgate_limiter::PolicyError>;
    let windows: [Window; 3] = [
        Limit::fixed_window,
        Limit::sliding_window,
        Limit::sliding_log,
    ];
    for (window, layered) in windows.into_iter().flat_map(|w| [(w, false), (w, true)]) {
        clock.set(START);
        let name = unique("longer");
        let beside = Policy::new(
            unique("beside"),
            Limit::fixed_window(100, long).expect("valid"),
        );
        let limiter = |w: Duration| {
            let policy = Policy::new(name.clone(), window(2, w).expect("valid"));
            let builder =
                Limiter::builder(store.clone()).layer("l", Scope::Subject, policy.expect("valid"));
            let builder = match layered {
                true => builder.layer("beside", Scope::Subject, beside.clone().expect("valid")),
                false => builder,
            };
            builder.build().expect("valid limiter")
        };
        let (shorter, longer) = (limiter(short), limiter(long));
        let ctx = fresh_subject();
        let case = format!(
            "{} (layered: {layered})",
            window(2, short).expect("valid").algorithm_name()
        );
        assert_eq!(admitted(&shorter, &ctx, 2, 1).await, 2, "{case}");
        // (Within the shorter window: the fixed one ends 77 ms after START.)
        clock.advance(Duration::from_millis(50));
        let denied = longer.check(&ctx, 1).await.expect("store answers");
        assert!(!denied.is_allowed(), "{case}: counted under the minute");
        let retry = denied.retry_after().expect("a retry");
        assert!(
            retry > Duration::from_secs(10),
            "{case}: retry after {retry:?}"
        );
        clock.advance(Duration::from_millis(300));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            admitted(&longer, &ctx, 2, 1).await,
            0,
            "{case}: the state expired with the shorter window's TTL"
        );
    }
}

/// A store whose clock reads an instant before 2020 or after 2100 (unset,
/// or a test's mistake) refuses to decide with it: every decision fails
/// with [`StoreError::ImplausibleTime`], nothing is admitted and nothing
/// written. Every algorithm, at both ends of time.
pub async fn implausible_times_are_refused(factory: impl StoreFactory) {
    for at in [
        0,
        Timestamp::EARLIEST.as_micros() - 1,
        Timestamp::LATEST.as_micros() + 1,
        u64::MAX,
    ] {
        let clock = ManualClock::new(Timestamp::from_micros(at));
        let store = factory.make(clock.clone()).await;
        for limit in every_algorithm(5) {
            let name = limit.algorithm_name();
            let limiter = single(store.clone(), limit);
            let ctx = fresh_subject();
            for _ in 0..10 {
                let d = limiter.check(&ctx, 1).await.expect("decided");
                assert!(!d.is_allowed(), "{name} at {at}: {d:?}");
                assert_eq!(d.store_error(), Some("implausible_time"), "{name} at {at}");
            }
            // Back at a plausible time, the key is new: nothing was written.
            clock.set(START);
            assert_eq!(
                admitted(&limiter, &ctx, 10, 1).await,
                5,
                "{name}: nothing was written at {at}"
            );
            clock.set(Timestamp::from_micros(at));
        }
    }
}

/// Puts data Tollgate did not write at a store's key, as another
/// application sharing the database would, and checks it is still there.
#[async_trait]
pub trait ForeignWriter: Send + Sync {
    /// The kinds of foreign value to try (for Redis: `"string"`, `"list"`,
    /// `"hash"`, …).
    fn kinds(&self) -> Vec<&'static str>;
    /// Put a value of `kind` where the store keeps `key`.
    async fn plant(&self, key: &StoreKey<'_>, kind: &str);
    /// Whether that value is still there, unchanged.
    async fn intact(&self, key: &StoreKey<'_>, kind: &str) -> bool;
}

/// A key holding data Tollgate did not write is a
/// [`StoreError::Conflict`] naming the policy: never a fresh budget, and the
/// value is left exactly as it was. In a layered decision nothing is
/// charged. `store` must keep its keys where `foreign` writes.
pub async fn foreign_values_are_conflicts(store: Arc<dyn Store>, foreign: &dyn ForeignWriter) {
    for limit in every_algorithm(5) {
        let algorithm = limit.algorithm_name();
        for kind in foreign.kinds() {
            let policy = Policy::new(unique("foreign"), limit.clone()).expect("valid");
            let fine = Policy::new(unique("fine"), limit.clone()).expect("valid");
            let subject = unique("subject");
            // The key the limiter uses for this subject (checked below).
            let scope = Scope::Subject.key_label();
            let key = StoreKey::new(&subject, &policy, &scope, &subject);
            foreign.plant(&key, kind).await;
            let request = LayerRequest {
                key,
                policy: &policy,
                cost: 1,
            };
            match tollgate_limiter::ask(&*store, &[request]).await {
                Err(StoreError::Conflict { policy: named, .. }) => {
                    assert_eq!(
                        named,
                        policy.name(),
                        "{algorithm}, {kind}: names the policy"
                    )
                }
                other => panic!("{algorithm}, {kind}: expected a conflict, got {other:?}"),
            }
            // Layered: the conflict fails the whole decision, the other
            // layer is not charged.
            let fine_key = StoreKey::new(&subject, &fine, &scope, &subject);
            let layered = [
                LayerRequest {
                    key: fine_key,
                    policy: &fine,
                    cost: 1,
                },
                request,
            ];
            assert!(
                matches!(
                    tollgate_limiter::ask(&*store, &layered).await,
                    Err(StoreError::Conflict { .. })
                ),
                "{algorithm}, {kind}: layered"
            );
            let verdicts = tollgate_limiter::ask(&*store, &layered[..1])
                .await
                .expect("the other layer decides");
            assert_eq!(
                verdicts[0].remaining, 4,
                "{algorithm}, {kind}: the other layer was not charged"
            );
            // Neither peeked nor reset: a reset over both layers removes
            // nothing, the other layer keeps its charge.
            assert!(
                matches!(store.peek(&layered).await, Err(StoreError::Conflict { .. })),
                "{algorithm}, {kind}: peek"
            );
            assert!(
                matches!(
                    store.reset(&layered).await,
                    Err(StoreError::Conflict { .. })
                ),
                "{algorithm}, {kind}: reset"
            );
            for adjustment in [
                Adjustment::Penalize,
                Adjustment::Reward,
                Adjustment::Block(Duration::from_secs(60)),
            ] {
                assert!(
                    matches!(
                        store.adjust(&layered, adjustment).await,
                        Err(StoreError::Conflict { .. })
                    ),
                    "{algorithm}, {kind}: {adjustment:?}"
                );
            }
            let verdicts = tollgate_limiter::ask(&*store, &layered[..1])
                .await
                .expect("the other layer decides");
            assert_eq!(
                verdicts[0].remaining, 3,
                "{algorithm}, {kind}: the failed reset and adjustments changed nothing"
            );
            assert!(
                foreign.intact(&key, kind).await,
                "{algorithm}, {kind}: the foreign value is untouched"
            );
            // Through a limiter, the policy's failure mode decides (closed).
            let limiter = Limiter::builder(store.clone())
                .layer("l", Scope::Subject, policy.clone())
                .build()
                .expect("valid");
            let ctx = Context::for_subject(Subject::new(subject.clone()).expect("valid"));
            let d = limiter.check(&ctx, 1).await.expect("decided");
            assert!(
                d.failed_closed() && d.store_error() == Some("conflict"),
                "{algorithm}, {kind}: {d:?}"
            );
        }
    }
}

/// Builds a bounded store: time from the clock, at most `max_keys` keys,
/// `when_full` when full.
pub trait BoundedStoreFactory: Send + Sync {
    /// The store.
    fn make(&self, clock: ManualClock, max_keys: usize, when_full: WhenFull) -> Arc<dyn Store>;
}

impl<F> BoundedStoreFactory for F
where
    F: Fn(ManualClock, usize, WhenFull) -> Arc<dyn Store> + Send + Sync,
{
    fn make(&self, clock: ManualClock, max_keys: usize, when_full: WhenFull) -> Arc<dyn Store> {
        self(clock, max_keys, when_full)
    }
}

/// Key budgets of a bounded store: `max_keys(N)` holds exactly N keys; a
/// full budget that refuses announces when its first key expires; a
/// policy's own budget keeps its traffic out of other policies' room; an
/// evicting budget keeps admitting new subjects, and never evicts the key
/// it just wrote.
pub async fn key_budgets(factory: impl BoundedStoreFactory) {
    let one_per_10s = || Limit::gcra(1, Duration::from_secs(10), 1).expect("valid");
    let limiter = |store: &Arc<dyn Store>, policy: Policy| {
        Limiter::builder(store.clone())
            .layer("l", Scope::Subject, policy)
            .build()
            .expect("valid")
    };
    let new_subject_admitted = |limiter: Limiter| async move {
        let d = limiter.check(&fresh_subject(), 1).await.expect("decided");
        (d.is_allowed(), d)
    };

    // The store's own bound, exact, refusing.
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone(), 100, WhenFull::Refuse);
    let all = limiter(
        &store,
        Policy::new(unique("all"), one_per_10s()).expect("valid"),
    );
    for i in 0..100 {
        assert!(
            new_subject_admitted(all.clone()).await.0,
            "key {i} of 100 fits"
        );
        clock.advance(Duration::from_millis(10));
    }
    let (allowed, d) = new_subject_admitted(all.clone()).await;
    assert!(!allowed && d.store_error() == Some("full"), "{d:?}");
    // The first key (written 1 s ago, 10 s to live) frees room in 9 s.
    let wait = d.retry_after().expect("a wait");
    assert!(
        wait > Duration::from_secs(8) && wait <= Duration::from_secs(9),
        "the wait is the first key's expiry: {wait:?}"
    );
    clock.advance(wait);
    assert!(
        new_subject_admitted(all.clone()).await.0,
        "room once the first key expired"
    );

    // A policy's own budget: its traffic cannot take another's room.
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone(), 1_000, WhenFull::Refuse);
    let busy = Policy::new(unique("busy"), one_per_10s())
        .expect("valid")
        .with_key_budget(KeyBudget::new(10, WhenFull::Refuse).expect("valid"));
    let busy = limiter(&store, busy);
    let other = limiter(
        &store,
        Policy::new(unique("other"), one_per_10s()).expect("valid"),
    );
    for _ in 0..10 {
        assert!(new_subject_admitted(busy.clone()).await.0);
    }
    for _ in 0..5 {
        let (allowed, d) = new_subject_admitted(busy.clone()).await;
        assert!(!allowed && d.store_error() == Some("full"), "{d:?}");
    }
    for _ in 0..20 {
        assert!(
            new_subject_admitted(other.clone()).await.0,
            "another policy keeps its room"
        );
    }

    // An evicting budget keeps admitting new subjects, and a key it just
    // wrote is kept (the evicted key is one nearer to expiry).
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone(), 1_000, WhenFull::Refuse);
    let evicting = Policy::new(unique("evicting"), one_per_10s())
        .expect("valid")
        .with_key_budget(KeyBudget::new(10, WhenFull::EvictNearestExpiry).expect("valid"));
    let evicting = limiter(&store, evicting);
    let first_subject = fresh_subject();
    for i in 0..30 {
        let ctx = if i == 0 {
            first_subject.clone()
        } else {
            fresh_subject()
        };
        let first = evicting.check(&ctx, 1).await.expect("decided");
        assert!(first.is_allowed(), "new subject {i}: {first:?}");
        let second = evicting.check(&ctx, 1).await.expect("decided");
        assert!(
            !second.is_allowed() && second.store_error().is_none(),
            "subject {i}: its new key is kept and limits: {second:?}"
        );
        clock.advance(Duration::from_millis(10));
    }
    // Within its window, but its key was evicted long ago (the nearest to
    // expiry): a store that ignored the budget would still limit it.
    assert!(
        evicting
            .check(&first_subject, 1)
            .await
            .expect("decided")
            .is_allowed(),
        "the first subject's key was evicted: it starts afresh"
    );
}

/// Turns every conformance case into a `#[tokio::test]` (multi-threaded).
///
/// The argument is a closure `|clock: ManualClock| async move { … }` returning
/// an `Arc<dyn Store>` whose time comes from `clock`.
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            new_key_starts_full,
            sequential_admits_exactly_the_limit,
            retry_after_is_exact_and_denials_are_free,
            backward_clock_neither_refills_nor_drains,
            concurrent_requests_admit_exactly_the_capacity,
            layers_are_all_or_nothing,
            subjects_and_versions_are_isolated,
            state_resets_after_reset_after,
            algorithm_swaps_start_from_no_state,
            plans_keep_what_was_used,
            bucket_plans_keep_the_units_used,
            long_fixed_windows_are_quotas,
            calendar_quotas_follow_the_calendar,
            concurrency_limits_hold_places,
            mismatched_holds_are_refused,
            leased_layers_never_over_admit,
            leases_come_back,
            shadow_layers_count_but_never_deny,
            rolling_deploys_are_bounded,
            longer_windows_keep_what_was_used,
            implausible_times_are_refused,
            peek_charges_nothing,
            reset_forgets_the_state,
            penalties_saturate_and_rewards_refill,
            blocks_deny_until_their_end,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::conformance::$case($factory).await;
            }
        )*
    };
}
