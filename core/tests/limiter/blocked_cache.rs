//! The blocked-key cache repeats long denials without a store call, and
//! never admits what the store would deny.
#![cfg(feature = "blocked-cache")]

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BlockedCacheConfig, Context, Limit, Limiter, ManualClock, Policy, Scope, Source, Subject,
    Timestamp,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::RemoteStore;

fn setup(limit: Limit) -> (ManualClock, Arc<RemoteStore>, Limiter) {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(RemoteStore::new(Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    )));
    let limiter = Limiter::builder(store.clone())
        .layer("key", Scope::Subject, Policy::new("p", limit).unwrap())
        .blocked_cache(BlockedCacheConfig {
            threshold: Duration::from_secs(1),
            max_entries: 1000,
        })
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    (clock, store, limiter)
}

fn ctx() -> Context {
    Context::for_subject(Subject::new("abuser").unwrap())
}

#[tokio::test]
async fn long_denials_are_answered_locally_until_the_retry_time() {
    let (clock, store, limiter) = setup(Limit::fixed_window(3, Duration::from_secs(10)).unwrap());
    let start = 1_780_000_000_000_000u64;
    clock.set(Timestamp::from_micros(start - start % 10_000_000)); // window start
    for _ in 0..3 {
        assert!(limiter.check(&ctx(), 1).await.unwrap().is_allowed());
    }
    let denied = limiter.check(&ctx(), 1).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(10)));
    let calls = store.decides();
    clock.advance(Duration::from_secs(4));
    for _ in 0..1000 {
        let d = limiter.check(&ctx(), 1).await.unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.layers()[0].source, Source::Cache);
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(6)),
            "the wait is aged, not repeated"
        );
    }
    assert_eq!(store.decides(), calls, "no store call while blocked");
    // At the retry time the store decides again, and admits.
    clock.advance(Duration::from_secs(6));
    let d = limiter.check(&ctx(), 1).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.layers()[0].source, Source::Store);
}

#[tokio::test]
async fn other_costs_and_a_short_denial_still_ask_the_store() {
    // 10 tokens, one per second: cost 5 with 4 left waits 1s, cost 1 passes.
    let (_, store, limiter) = setup(Limit::token_bucket(10, 1, Duration::from_secs(1)).unwrap());
    assert!(limiter.check(&ctx(), 6).await.unwrap().is_allowed());
    let denied = limiter.check(&ctx(), 5).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
    let calls = store.decides();
    let cheap = limiter.check(&ctx(), 1).await.unwrap();
    assert!(
        cheap.is_allowed(),
        "the cache must not deny a cheaper request the store admits"
    );
    assert_eq!(store.decides(), calls + 1);
    // A costlier request is denied for longer: the store tells how long
    // (the cached wait would send the client back too early).
    let (_, _, limiter) = setup(Limit::token_bucket(10, 1, Duration::from_secs(1)).unwrap());
    assert!(limiter.check(&ctx(), 10).await.unwrap().is_allowed());
    let denied = limiter.check(&ctx(), 2).await.unwrap();
    assert_eq!(denied.retry_after(), Some(Duration::from_secs(2)));
    let costlier = limiter.check(&ctx(), 8).await.unwrap();
    assert_eq!(costlier.retry_after(), Some(Duration::from_secs(8)));
    assert_eq!(costlier.layers()[0].source, Source::Store);
    // A denial shorter than the threshold is not cached.
    let (_, store, limiter) = setup(Limit::gcra(10, Duration::from_secs(1), 1).unwrap());
    limiter.check(&ctx(), 1).await.unwrap();
    let before = store.decides();
    for _ in 0..5 {
        assert_eq!(
            limiter.check(&ctx(), 1).await.unwrap().layers()[0].source,
            Source::Store
        );
    }
    assert_eq!(store.decides(), before + 5);
}

/// An operator's change shows at once: a reset or a reward forgets the
/// cached denial, and a block made after a cached denial is what the next
/// check answers.
#[tokio::test]
async fn operators_changes_forget_the_cached_denial() {
    let (clock, _store, limiter) = setup(Limit::fixed_window(3, Duration::from_secs(10)).unwrap());
    let start = 1_780_000_000_000_000u64;
    clock.set(Timestamp::from_micros(start - start % 10_000_000));
    let deny = || async {
        while limiter.check(&ctx(), 1).await.unwrap().is_allowed() {}
        let cached = limiter.check(&ctx(), 1).await.unwrap();
        assert_eq!(cached.layers()[0].source, Source::Cache, "cached");
    };
    deny().await;
    limiter.reset(&ctx()).await.unwrap();
    assert!(
        limiter.check(&ctx(), 1).await.unwrap().is_allowed(),
        "reset shows"
    );
    deny().await;
    limiter.reward(&ctx(), 1).await.unwrap();
    assert!(
        limiter.check(&ctx(), 1).await.unwrap().is_allowed(),
        "reward shows"
    );
    deny().await;
    limiter
        .block(&ctx(), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        limiter.check(&ctx(), 1).await.unwrap().retry_after(),
        Some(Duration::from_secs(3600)),
        "the block, not the cached window"
    );
}

/// A reset naming fewer layers than the cached requests carry (the
/// subject's, not the client address's) still forgets their denial.
#[tokio::test]
async fn a_reset_of_one_layer_forgets_denials_of_requests_with_more() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let window = || Limit::fixed_window(3, Duration::from_secs(10)).unwrap();
    let limiter = Limiter::builder(store)
        .layer("key", Scope::Subject, Policy::new("p", window()).unwrap())
        .layer(
            "ip",
            Scope::Attribute("ip".into()),
            Policy::new(
                "per-ip",
                Limit::fixed_window(100, Duration::from_secs(10)).unwrap(),
            )
            .unwrap(),
        )
        .blocked_cache(BlockedCacheConfig {
            threshold: Duration::from_secs(1),
            max_entries: 1000,
        })
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let start = 1_780_000_000_000_000u64;
    clock.set(Timestamp::from_micros(start - start % 10_000_000));
    let full = || ctx().with_attribute("ip", Subject::new("10.0.0.1").unwrap());
    while limiter.check(&full(), 1).await.unwrap().is_allowed() {}
    let cached = limiter.check(&full(), 1).await.unwrap();
    assert_eq!(cached.layers()[0].source, Source::Cache, "cached");
    limiter.reset(&ctx()).await.unwrap();
    assert!(
        limiter.check(&full(), 1).await.unwrap().is_allowed(),
        "reset shows"
    );
}
