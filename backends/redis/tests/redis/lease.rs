//! Leased layers against a real `redis-server` that stops mid-lease: the
//! batch already charged is admitted, nothing beyond it, and then the
//! layer's failure mode answers. (Exactness across processes and leases
//! coming back are the conformance suite's, on every store.)

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    Clock, Context, Lease, Limit, Limiter, ManualClock, OnStoreFailure, Policy, Scope, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;

#[tokio::test]
async fn redis_stopped_mid_lease_admits_only_what_was_charged() {
    let server = RedisServer::start();
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = RedisStore::builder(server.url())
        .prefix(unique("lease"))
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .deadline(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test redis-server");
    let bucket = Limit::token_bucket(1_000, 100, Duration::from_secs(1)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(50)
        .unwrap();
    let plain = Policy::new("hot", bucket.clone()).unwrap();
    let policy = Policy::new("hot", bucket)
        .and_then(|p| p.leased(lease))
        .and_then(|p| p.with_on_failure(OnStoreFailure::FailClosed))
        .unwrap();
    let store = Arc::new(store);
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("all", Scope::Global, policy)
        .build()
        .unwrap();
    // The store's own count, without this process's batch (the leased
    // limiter's peek adds what the batch still holds).
    let observer = Limiter::builder(store)
        .layer("all", Scope::Global, plain)
        .build()
        .unwrap();
    let ctx = Context::new();
    for i in 0..200 {
        assert!(
            limiter.check(&ctx, 1).await.unwrap().is_allowed(),
            "request {i}"
        );
    }
    let peeked = observer.peek(&ctx, 1).await.unwrap();
    let held = 800 - peeked.layers()[0].verdict().remaining;
    assert!(held > 0, "a batch is held");

    server.kill();
    let mut admitted = 0;
    for _ in 0..100 {
        let decision = limiter.check(&ctx, 1).await.unwrap();
        if decision.is_allowed() {
            admitted += 1;
        } else {
            assert!(decision.failed_closed(), "{decision:?}");
        }
    }
    assert_eq!(admitted, held, "exactly the batch already charged");
}
