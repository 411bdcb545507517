//! One abusive client hammering a blocked key, with and without the
//! blocked-key cache, on the same Redis in the same run.
//!
//! The key's limit (GCRA, 1 per week) is spent before measuring, so every
//! decision is a denial with a long retry-after: without the cache each one
//! is a script call; with it, only the first is.
//!
//! Run: `cargo bench -p tollgate-redis --bench blocked_cache`
#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokio::runtime::Runtime;
use tollgate_limiter::{BlockedCacheConfig, Context, Limit, Limiter, Policy, Scope, Subject};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis_server::RedisServer;

const OPS: u64 = 1_000;

fn bench(c: &mut Criterion) {
    let server = RedisServer::start();
    let rt = Runtime::new().expect("tokio runtime");
    let store = rt.block_on(async {
        RedisStore::builder(server.url())
            .deadline(Duration::from_secs(2))
            .connect()
            .await
            .expect("connect")
    });
    let store = Arc::new(store);
    let week = Duration::from_secs(7 * 24 * 3600);
    let policy = Policy::new("login", Limit::gcra(1, week, 1).expect("valid")).expect("valid");
    let plain = Limiter::builder(store.clone())
        .layer("ip", Scope::Subject, policy.clone())
        .build()
        .expect("valid");
    let cached = Limiter::builder(store)
        .layer("ip", Scope::Subject, policy)
        .blocked_cache(BlockedCacheConfig::default())
        .build()
        .expect("valid");
    let abuser = Context::for_subject(Subject::new("203.0.113.7").expect("valid"));
    rt.block_on(async {
        // Spend the week's single request; both limiters share the key.
        assert!(plain.check(&abuser, 1).await.expect("decides").is_allowed());
        assert!(!cached
            .check(&abuser, 1)
            .await
            .expect("decides")
            .is_allowed());
    });

    let mut group = c.benchmark_group("abusive_hot_key");
    group.throughput(Throughput::Elements(OPS));
    for (name, limiter) in [("without_cache", &plain), ("with_cache", &cached)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters * OPS {
                        let d = limiter.check(&abuser, 1).await.expect("decides");
                        assert!(!d.is_allowed());
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
