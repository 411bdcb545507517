//! Failure modes and the circuit breaker, with a store that can be switched
//! off (the in-process store behind a switch) and a manual clock. The same
//! modes against real redis-server faults are in the Redis store's tests.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    async_trait, BreakerConfig, BreakerState, Context, Decide, Fallback, LayerRequest, Limit,
    Limiter, ManualClock, OnStoreFailure, Policy, Scope, Source, Store, StoreError, Subject,
    Timestamp, Verdicts,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::RemoteStore;

fn setup(mode: OnStoreFailure) -> (ManualClock, Arc<RemoteStore>, Limiter) {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(RemoteStore::new(Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    )));
    let policy = Policy::new(
        "api",
        Limit::fixed_window(10, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
    .with_on_failure(mode)
    .unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("key", Scope::Subject, policy)
        .fallback_store(Arc::new(
            MemoryStore::builder()
                .clock(Arc::new(clock.clone()))
                .build(),
        ))
        .breaker(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_secs(2),
        })
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    (clock, store, limiter)
}

fn ctx() -> Context {
    Context::for_subject(Subject::new("client").unwrap())
}

#[tokio::test]
async fn fail_open_admits_and_says_so() {
    let (_, store, limiter) = setup(OnStoreFailure::FailOpen);
    store.set_down(true);
    for _ in 0..20 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.layers()[0].source, Source::FailOpen);
        // The first three store errors open the breaker; later decisions skip the store.
        assert!(
            matches!(d.store_error(), Some("unavailable" | "circuit_open")),
            "{:?}",
            d.store_error()
        );
    }
}

#[tokio::test]
async fn fail_closed_rejects_as_a_store_failure_not_a_limit() {
    let (_, store, limiter) = setup(OnStoreFailure::FailClosed);
    store.set_down(true);
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.failed_closed(), "a store failure is a 503, not a 429");
    assert_eq!(d.layers()[0].source, Source::FailClosed);
    assert_eq!(d.store_error(), Some("unavailable"));
}

#[tokio::test]
async fn fallback_enforces_the_emergency_bucket() {
    // The shared limit is 10 per minute; 2 processes share it: 5 each.
    let (_, store, limiter) = setup(OnStoreFailure::Fallback(Fallback::Share { instances: 2 }));
    store.set_down(true);
    let mut admitted = 0;
    for _ in 0..20 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert_eq!(d.layers()[0].source, Source::Fallback);
        admitted += usize::from(d.is_allowed());
    }
    assert_eq!(admitted, 5);
}

#[tokio::test]
async fn the_breaker_opens_skips_the_store_probes_and_recovers() {
    let (clock, store, limiter) = setup(OnStoreFailure::FailClosed);
    store.set_down(true);
    for _ in 0..3 {
        limiter.check(&ctx(), 1).await.unwrap();
    }
    assert_eq!(limiter.breaker().state(), BreakerState::Open);
    let calls = store.decides();
    for _ in 0..100 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert_eq!(d.store_error(), Some("circuit_open"));
        assert!(d.retry_after().unwrap() <= Duration::from_secs(2));
    }
    assert_eq!(
        store.decides(),
        calls,
        "an open breaker does not call the store"
    );

    // Still down at the probe: open again, one call spent.
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.breaker().state(), BreakerState::HalfOpen);
    limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(store.decides(), calls + 1);
    assert_eq!(limiter.breaker().state(), BreakerState::Open);

    // Back up: the next probe closes the breaker with no manual step.
    store.set_down(false);
    clock.advance(Duration::from_secs(2));
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.layers()[0].source, Source::Store);
    assert_eq!(limiter.breaker().state(), BreakerState::Closed);
}

/// A shadow layer whose emergency bucket runs out never lets the
/// enforced layers' requests through uncharged: they are decided again
/// without it, as the store decides, and their own bucket runs out.
#[tokio::test]
async fn a_shadow_layers_fallback_denial_leaves_the_enforced_buckets_charged() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(RemoteStore::new(Arc::new(MemoryStore::default())));
    store.set_down(true);
    let minute = Duration::from_secs(60);
    let fallback = |limit| {
        OnStoreFailure::Fallback(Fallback::Limit(Limit::fixed_window(limit, minute).unwrap()))
    };
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("k", Limit::fixed_window(3, minute).unwrap())
                .unwrap()
                .with_on_failure(fallback(3))
                .unwrap(),
        )
        .layer(
            "trial",
            Scope::Global,
            Policy::new("t", Limit::fixed_window(1, minute).unwrap())
                .unwrap()
                .with_on_failure(fallback(1))
                .unwrap()
                .shadow(),
        )
        .fallback_store(Arc::new(
            MemoryStore::builder()
                .clock(Arc::new(clock.clone()))
                .build(),
        ))
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..10 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert_eq!(d.layers()[0].source, Source::Fallback);
        admitted += usize::from(d.is_allowed());
    }
    assert_eq!(admitted, 3, "the enforced emergency bucket holds 3");
}

/// A cost the emergency policy can never hold fails the request closed,
/// whatever the main policy holds (no arithmetic on a cost past the
/// emergency policy's capacity: a day's interval times 3·10⁸ overflows).
#[tokio::test]
async fn a_cost_past_the_emergency_capacity_fails_closed() {
    let store = Arc::new(RemoteStore::new(Arc::new(MemoryStore::default())));
    store.set_down(true);
    let day = Duration::from_secs(86_400);
    let emergency = Arc::new(MemoryStore::default());
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("k", Limit::gcra(1_000_000_000, day, 1_000_000_000).unwrap())
                .unwrap()
                .with_on_failure(OnStoreFailure::Fallback(Fallback::Limit(
                    Limit::gcra(1, day, 1).unwrap(),
                )))
                .unwrap(),
        )
        .fallback_store(emergency.clone())
        .build()
        .unwrap();
    let d = limiter.check(&ctx(), 300_000_000).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.failed_closed());
    assert!(emergency.is_empty(), "nothing charged");
    // A cost the emergency policy holds is decided by it.
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(d.layers()[0].source, Source::Fallback);
    assert!(d.is_allowed());
}

#[tokio::test]
async fn a_fail_closed_layer_keeps_fallback_layers_uncharged() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(RemoteStore::new(Arc::new(MemoryStore::default())));
    store.set_down(true);
    let emergency = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let minute = Duration::from_secs(60);
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("k", Limit::fixed_window(3, minute).unwrap())
                .unwrap()
                .with_on_failure(OnStoreFailure::Fallback(Fallback::Limit(
                    Limit::fixed_window(3, minute).unwrap(),
                )))
                .unwrap(),
        )
        .layer(
            "all",
            Scope::Global,
            Policy::new("g", Limit::fixed_window(100, minute).unwrap()).unwrap(),
        )
        .fallback_store(emergency.clone())
        .build()
        .unwrap();
    for _ in 0..5 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert!(d.failed_closed());
    }
    assert!(
        emergency.is_empty(),
        "denied requests charged the emergency bucket"
    );
}

#[test]
fn a_fallback_without_an_emergency_store_is_a_build_error() {
    let policy = Policy::new("p", Limit::fixed_window(3, Duration::from_secs(1)).unwrap())
        .unwrap()
        .with_on_failure(OnStoreFailure::Fallback(Fallback::Share { instances: 3 }))
        .unwrap();
    let err = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("fallback_store"), "{err}");
}

// The configuration-file form of a policy is the `serde` feature's.
#[cfg(feature = "serde")]
#[test]
fn policies_with_failure_modes_deserialize() {
    let policy: Policy = serde_json::from_str(
        r#"{ "name": "api", "version": 3,
             "limit": { "algorithm": "gcra", "rate": 100, "period": "1s", "burst": 20 },
             "on_failure": { "fallback_share": 4 } }"#,
    )
    .unwrap();
    assert_eq!(policy.version(), 3);
    assert_eq!(policy.fallback_limit().unwrap().capacity(), 5);
    let err = serde_json::from_str::<Policy>(
        r#"{ "name": "api", "limit": { "algorithm": "fixed_window", "limit": 0, "window": "1s" } }"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("limit.limit"), "{err}");
    let err = serde_json::from_str::<Policy>(
        r#"{ "name": "api", "limit": { "algorithm": "fixed_window", "limit": 5, "window": "1s", "burst": 3 } }"#,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("burst"),
        "unknown fields are errors: {err}"
    );
}

/// A store that fails (an outage) until told otherwise, then answers
/// every decision with a conflict on one key.
#[derive(Debug, Default)]
struct Flaky(std::sync::atomic::AtomicBool);

#[tollgate_limiter::async_trait]
impl tollgate_limiter::Store for Flaky {
    fn kind(&self) -> &'static str {
        "flaky"
    }
    fn decide<'a>(
        &'a self,
        _: &'a [tollgate_limiter::LayerRequest<'a>],
        verdicts: &'a mut tollgate_limiter::Verdicts,
    ) -> tollgate_limiter::Decide<'a> {
        tollgate_limiter::Decide::later(verdicts, async move {
            if self.0.load(std::sync::atomic::Ordering::SeqCst) {
                Err(tollgate_limiter::StoreError::Conflict {
                    policy: "api".into(),
                    found: "wrong type".into(),
                })
            } else {
                Err(tollgate_limiter::StoreError::Unavailable("down".into()))
            }
        })
    }
}

/// A half-open probe answered with an error that is not an outage (the
/// store is there; one key holds foreign data) closes the breaker: it does
/// not stay half-open, skipping the store for good.
#[test]
fn a_probe_answered_with_a_non_outage_error_closes_the_breaker() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(Flaky::default());
    let limiter = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "api",
                Limit::fixed_window(5, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .breaker(BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(1),
        })
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("k").unwrap());
    let d = tollgate_testkit::ready(limiter.check(&ctx, 1)).unwrap();
    assert_eq!(d.store_error(), Some("unavailable"));
    assert_eq!(
        limiter.breaker().state(),
        tollgate_limiter::BreakerState::Open
    );
    store.0.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(2));
    let probe = tollgate_testkit::ready(limiter.check(&ctx, 1)).unwrap();
    assert_eq!(
        probe.store_error(),
        Some("conflict"),
        "the probe reached the store"
    );
    assert_eq!(
        limiter.breaker().state(),
        tollgate_limiter::BreakerState::Closed
    );
    let next = tollgate_testkit::ready(limiter.check(&ctx, 1)).unwrap();
    assert_eq!(
        next.store_error(),
        Some("conflict"),
        "the store is asked again"
    );
}

/// User `u` at the client address `ip` (an attribute).
fn user_at(ip: &str) -> Context {
    Context::for_subject(Subject::new("u").unwrap()).with_attribute("ip", Subject::new(ip).unwrap())
}

/// A full key budget fails its own policy's layers alone: the other
/// layers are still decided (and charged) by the store, so a subject
/// rotating through addresses whose budget is full stays limited by its
/// own layer, even when both policies fail open.
#[tokio::test]
async fn a_full_budget_fails_its_own_policy_alone() {
    use tollgate_limiter::{KeyBudget, WhenFull};
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let window = |n| Limit::fixed_window(n, Duration::from_secs(60)).unwrap();
    let open = |p: Policy| p.with_on_failure(OnStoreFailure::FailOpen).unwrap();
    let per_address = Policy::new("ip", window(100))
        .unwrap()
        .with_key_budget(KeyBudget::new(1, WhenFull::Refuse).unwrap());
    let limiter = Limiter::builder(store)
        .clock(Arc::new(clock.clone()))
        .layer(
            "user",
            Scope::Subject,
            open(Policy::new("user", window(2)).unwrap()),
        )
        .layer("ip", Scope::Attribute("ip".into()), open(per_address))
        .build()
        .unwrap();
    let first = limiter.check(&user_at("a"), 1).await.unwrap();
    assert!(first.is_allowed() && first.store_error().is_none());
    // Address b's key does not fit the budget: that layer fails open, the
    // user layer decides in the store.
    let second = limiter.check(&user_at("b"), 1).await.unwrap();
    assert!(second.is_allowed());
    assert_eq!(second.store_error(), Some("full"));
    assert_eq!(second.layers()[0].source, Source::Store);
    assert_eq!(second.layers()[0].verdict().remaining, 0, "{second:?}");
    assert_eq!(second.layers()[1].source, Source::FailOpen);
    let third = limiter.check(&user_at("c"), 1).await.unwrap();
    assert!(!third.is_allowed(), "the user's own limit: {third:?}");
    assert_eq!(third.denied_layers().next().unwrap().source, Source::Store);
    assert!(!third.failed_closed(), "a 429, not a 503");
}

/// The in-process store, but any request naming policy `ip` finds data
/// it cannot read there (as a Redis key holding someone else's value).
#[derive(Debug)]
struct ForeignAtIp(MemoryStore);

#[async_trait]
impl Store for ForeignAtIp {
    fn kind(&self) -> &'static str {
        "foreign-at-ip"
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        if layers.iter().any(|l| l.policy.name() == "ip") {
            return Decide::Now(Err(StoreError::Conflict {
                policy: "ip".into(),
                found: "a string".into(),
            }));
        }
        self.0.decide(layers, verdicts)
    }
}

/// When the other layers deny, the failing policy's layers are not asked:
/// nothing counted them, so they say so (`FailOpen`, no `RateLimit` item
/// in headers), even when the policy falls back to an emergency bucket
/// (which would have announced a full quota).
#[tokio::test]
async fn a_failing_policy_not_asked_counts_nothing() {
    let store = Arc::new(ForeignAtIp(MemoryStore::builder().build()));
    let window = |n| Limit::fixed_window(n, Duration::from_secs(60)).unwrap();
    let per_address = Policy::new("ip", window(100))
        .unwrap()
        .with_on_failure(OnStoreFailure::Fallback(Fallback::Limit(window(100))))
        .unwrap();
    let limiter = Limiter::builder(store)
        .layer(
            "user",
            Scope::Subject,
            Policy::new("user", window(1)).unwrap(),
        )
        .layer("ip", Scope::Attribute("ip".into()), per_address)
        .fallback_store(Arc::new(MemoryStore::builder().build()))
        .build()
        .unwrap();
    let first = limiter.check(&user_at("a"), 1).await.unwrap();
    assert!(first.is_allowed(), "{first:?}");
    assert_eq!(
        first.layers()[1].source,
        Source::Fallback,
        "asked: its bucket"
    );
    let denied = limiter.check(&user_at("b"), 1).await.unwrap();
    assert!(!denied.is_allowed(), "the user's own limit: {denied:?}");
    assert_eq!(denied.store_error(), Some("conflict"));
    assert_eq!(denied.layers()[1].source, Source::FailOpen, "{denied:?}");
}

/// A request only a shadow layer denies is decided again without it. When
/// that later pass finds the store down, the breaker hears of it as of any
/// failed call, and the request is decided by the failure mode (before,
/// only a request's first call reached the breaker: it stayed closed).
#[tokio::test]
async fn an_outage_in_a_pass_past_a_shadow_denial_reaches_the_breaker() {
    let minute = |n| Limit::fixed_window(n, Duration::from_secs(60)).unwrap();
    // The first request's call and the second's first pass are answered
    // (on a clock that stands still: both requests in one window).
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(
        RemoteStore::new(Arc::new(
            MemoryStore::builder()
                .clock(Arc::new(clock.clone()))
                .build(),
        ))
        .down_after(2),
    );
    let limiter = Limiter::builder(store.clone())
        .layer(
            "trial",
            Scope::Subject,
            Policy::new("trial", minute(1)).unwrap().shadow(),
        )
        .layer(
            "key",
            Scope::Subject,
            Policy::new("api", minute(10))
                .unwrap()
                .with_on_failure(OnStoreFailure::FailClosed)
                .unwrap(),
        )
        .breaker(BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(60),
        })
        .clock(Arc::new(clock))
        .build()
        .unwrap();
    assert!(limiter.check(&ctx(), 1).await.unwrap().is_allowed());
    assert_eq!(limiter.breaker().state(), BreakerState::Closed);
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(store.decides(), 3, "a second pass was made");
    assert!(d.failed_closed(), "{d:?}");
    assert_eq!(d.store_error(), Some("unavailable"));
    assert_eq!(limiter.breaker().state(), BreakerState::Open);
}

/// A decision the emergency store made announces the window of the limit
/// it decided by: an hour's policy falling back to 10 a minute reads as 10
/// a minute (its `RateLimit-Policy` said 10 an hour); the store's own
/// decisions announce the policy's hour.
#[tokio::test]
async fn a_fallback_decision_announces_its_own_window() {
    let store = Arc::new(RemoteStore::new(Arc::new(MemoryStore::default())));
    let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3_600));
    let emergency = Fallback::Limit(Limit::fixed_window(10, minute).unwrap());
    let limiter = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new("k", Limit::fixed_window(1_000, hour).unwrap())
                .unwrap()
                .with_on_failure(OnStoreFailure::Fallback(emergency))
                .unwrap(),
        )
        .fallback_store(Arc::new(MemoryStore::default()))
        .build()
        .unwrap();
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(d.layers()[0].source, Source::Store);
    assert_eq!(d.layers()[0].window(), Some(hour));
    store.set_down(true);
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(d.layers()[0].source, Source::Fallback);
    assert_eq!(d.layers()[0].verdict().limit, 10);
    assert_eq!(
        d.layers()[0].window(),
        Some(minute),
        "the emergency limit's"
    );
}
