//! The soak: a million concurrent decisions per algorithm on standalone
//! Redis and on the Cluster, every one checked. Not part of `cargo xtask
//! test` (it takes minutes); `cargo xtask soak` runs it, with the
//! differential test at a million operations per algorithm.
//!
//! Each round sends 100 concurrent requests to each of 50 keys at one
//! instant of a manual clock; every key must admit exactly its capacity of
//! 20 — no more (over-admission), no less (a lost or double charge). Then
//! the clock moves two periods on, so every key is new again.
#![cfg(feature = "cluster")]

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{Clock, Context, ManualClock, Store, Subject};
use tollgate_redis::cluster::RedisClusterStore;
use tollgate_redis::RedisStore;
use tollgate_testkit::conformance::{
    decide_concurrently, every_algorithm_over, single, unique, START,
};
use tollgate_testkit::redis_cluster::RedisCluster;
use tollgate_testkit::redis_server::RedisServer;

const CAPACITY: u64 = 20;
const KEYS: usize = 50;
const PER_KEY: usize = 100;
/// Long enough that no state expires on Redis's own clock during a round.
const PERIOD: Duration = Duration::from_secs(600);

/// Decisions per algorithm: `TOLLGATE_SOAK_DECISIONS`, a million by default.
fn decisions() -> usize {
    std::env::var("TOLLGATE_SOAK_DECISIONS")
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(1_000_000)
}

async fn soak(store: Arc<dyn Store>, clock: ManualClock, name: &str) {
    let rounds = decisions().div_ceil(KEYS * PER_KEY);
    for limit in every_algorithm_over(CAPACITY, PERIOD) {
        let algorithm = limit.algorithm_name();
        let limiter = single(store.clone(), limit);
        let started = std::time::Instant::now();
        let mut total = 0usize;
        for round in 0..rounds {
            let contexts: Vec<Context> = (0..KEYS)
                .map(|_| Context::for_subject(Subject::new(unique("soak")).expect("valid")))
                .collect();
            let requests = contexts
                .iter()
                .flat_map(|ctx| (0..PER_KEY).map(|_| (limiter.clone(), ctx.clone())))
                .collect();
            let decisions = decide_concurrently(requests).await;
            total += decisions.len();
            for (k, chunk) in decisions.chunks(PER_KEY).enumerate() {
                assert!(
                    chunk.iter().all(|d| d.store_error().is_none()),
                    "{name} {algorithm} round {round}: a store error"
                );
                let admitted = chunk.iter().filter(|d| d.is_allowed()).count() as u64;
                assert_eq!(
                    admitted, CAPACITY,
                    "{name} {algorithm} round {round} key {k}: admitted {admitted} of capacity {CAPACITY}"
                );
            }
            clock.advance(PERIOD * 2);
        }
        println!(
            "soak {name} {algorithm}: {total} concurrent decisions, {} rounds of {KEYS} keys × {PER_KEY}, \
             every key admitted exactly {CAPACITY}: 0 over-admissions, 0 lost charges ({:.1} s)",
            rounds,
            started.elapsed().as_secs_f64()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `cargo xtask soak`"]
async fn a_million_concurrent_decisions_per_algorithm_on_standalone() {
    let clock = ManualClock::new(START);
    let store = RedisStore::builder(RedisServer::shared().url())
        .prefix(unique("soak"))
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .deadline(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    soak(Arc::new(store), clock, "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: run by `cargo xtask soak`"]
async fn a_million_concurrent_decisions_per_algorithm_on_the_cluster() {
    let clock = ManualClock::new(START);
    let store = RedisClusterStore::builder(RedisCluster::shared().urls())
        .prefix(unique("soak"))
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .deadline(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    soak(Arc::new(store), clock, "cluster").await;
}
