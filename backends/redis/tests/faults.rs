//! Real faults against real `redis-server` processes: killed, frozen,
//! restarted empty, scripts flushed, connections killed. Each test drives a
//! limiter under load, injects the fault, asserts the configured failure mode
//! exactly, and prints what it observed (latency maximum, time to recover).

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BreakerConfig, Fallback, Limit, Limiter, OnStoreFailure, Policy, Scope, Source,
};
use tollgate_memory::MemoryStore;
use tollgate_redis::RedisStore;
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;

mod common;
use common::load::{max_latency, recovered, Load, Seen, CLIENTS};

/// The store's per-decision deadline in these tests.
const DEADLINE: Duration = Duration::from_millis(50);
/// What a decision may take beyond the deadline on a busy two-core machine.
const MARGIN: Duration = Duration::from_millis(150);
/// Emergency limit of the fallback tests, per client.
const FALLBACK_LIMIT: u64 = 5;

async fn limiter(server: &RedisServer, mode: OnStoreFailure) -> Limiter {
    let store = RedisStore::builder(server.url())
        .prefix(unique("fault"))
        .deadline(DEADLINE)
        .connect_timeout(Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test redis-server");
    // Generous enough that the store never denies in these runs.
    let policy = Policy::new(
        "api",
        Limit::token_bucket(1_000_000, 1_000_000, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
    .with_on_failure(mode)
    .unwrap();
    Limiter::builder(Arc::new(store))
        .layer("client", Scope::Subject, policy)
        .fallback_store(Arc::new(MemoryStore::default()))
        .breaker(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_millis(200),
        })
        .build()
        .unwrap()
}

fn assert_bounded(name: &str, seen: &[(usize, Seen)]) {
    let max = max_latency(seen);
    println!(
        "{name}: {} decisions, slowest {max:?} (deadline {DEADLINE:?})",
        seen.len()
    );
    assert!(
        max <= DEADLINE + MARGIN,
        "{name}: a decision took {max:?}, more than the deadline {DEADLINE:?} + {MARGIN:?}"
    );
}

async fn killed_under_load(mode: OnStoreFailure) -> Vec<(usize, Seen)> {
    let server = RedisServer::start();
    let limiter = limiter(&server, mode).await;
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    let killed_at = load.now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = load.finish().await;
    assert_bounded("SIGKILL, every decision", &seen);
    assert!(
        seen.iter()
            .any(|(_, s)| s.at < killed_at && s.source == Source::Store),
        "the store decided before the kill"
    );
    // Decisions started well after the kill (the in-flight ones may still have
    // been answered) are all decided by the failure mode.
    seen.into_iter()
        .filter(|(_, s)| s.at > killed_at + DEADLINE + MARGIN)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fail_open_admits_within_the_deadline() {
    let after = killed_under_load(OnStoreFailure::FailOpen).await;
    assert_bounded("SIGKILL, fail-open", &after);
    assert!(!after.is_empty());
    assert!(after
        .iter()
        .all(|(_, s)| s.allowed && s.source == Source::FailOpen));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fail_closed_rejects_as_a_store_failure() {
    let after = killed_under_load(OnStoreFailure::FailClosed).await;
    assert_bounded("SIGKILL, fail-closed", &after);
    assert!(!after.is_empty());
    assert!(after
        .iter()
        .all(|(_, s)| !s.allowed && s.source == Source::FailClosed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fallback_enforces_the_local_bucket() {
    let emergency = Limit::fixed_window(FALLBACK_LIMIT, Duration::from_secs(60)).unwrap();
    let after = killed_under_load(OnStoreFailure::Fallback(Fallback::Limit(emergency))).await;
    assert_bounded("SIGKILL, fallback", &after);
    assert!(after.iter().all(|(_, s)| s.source == Source::Fallback));
    for client in 0..CLIENTS {
        let admitted = after
            .iter()
            .filter(|(c, s)| *c == client && s.allowed)
            .count() as u64;
        assert!(
            admitted <= FALLBACK_LIMIT,
            "client {client}: {admitted} admitted by a bucket of {FALLBACK_LIMIT}"
        );
    }
    assert!(
        after.iter().any(|(_, s)| !s.allowed),
        "the emergency bucket ran out for nobody"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_server_costs_at_most_the_deadline_and_recovers() {
    let server = RedisServer::start();
    let limiter = limiter(&server, OnStoreFailure::FailClosed).await;
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.pause();
    let paused_at = load.now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.resume();
    let resumed_at = load.now();
    let took = recovered(&load, resumed_at, Duration::from_secs(5)).await;
    let seen = load.finish().await;
    assert_bounded("SIGSTOP", &seen);
    let during: Vec<_> = seen
        .iter()
        .filter(|(_, s)| s.at > paused_at + DEADLINE && s.at + DEADLINE < resumed_at)
        .collect();
    assert!(!during.is_empty());
    assert!(
        during.iter().all(|(_, s)| s.source == Source::FailClosed),
        "a frozen store decided"
    );
    println!("SIGSTOP: store decisions resumed {took:?} after SIGCONT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_empty_server_is_used_again_without_a_manual_step() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, OnStoreFailure::FailClosed).await;
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart();
    let restarted_at = load.now();
    let took = recovered(&load, restarted_at, Duration::from_secs(5)).await;
    let seen = load.finish().await;
    assert_bounded("restart", &seen);
    println!("restart: store decisions resumed {took:?} after the new server answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_surfaces_no_error() {
    let server = RedisServer::start();
    let limiter = limiter(&server, OnStoreFailure::FailClosed).await;
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let load = Load::start(&limiter);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    let seen = load.finish().await;
    assert_bounded("SCRIPT FLUSH", &seen);
    let degraded = seen
        .iter()
        .filter(|(_, s)| s.source != Source::Store)
        .count();
    assert_eq!(
        degraded,
        0,
        "{degraded} of {} decisions did not come from the store",
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_reopened() {
    let server = RedisServer::start();
    let limiter = limiter(&server, OnStoreFailure::FailClosed).await;
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    let killed_at = load.now();
    assert!(
        killed >= 1,
        "the limiter's connection was not there to kill"
    );
    let took = recovered(
        &load,
        killed_at + Duration::from_millis(1),
        Duration::from_secs(5),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = load.finish().await;
    assert_bounded("CLIENT KILL", &seen);
    let degraded = seen
        .iter()
        .filter(|(_, s)| s.source != Source::Store)
        .count();
    let late = seen
        .iter()
        .filter(|(_, s)| s.at > killed_at + took + Duration::from_millis(50));
    assert!(
        late.clone().count() > 0 && late.clone().all(|(_, s)| s.source == Source::Store),
        "did not carry on"
    );
    println!("CLIENT KILL: {killed} connections killed; store decisions resumed after {took:?}; {degraded} decisions degraded meanwhile");
}

/// Loading the code on request is bounded like every other call: a
/// frozen server costs the connect timeout, then a timeout error, and
/// the code loads again once the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_script_on_a_frozen_server_gives_up_at_the_connect_timeout() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("fault"))
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connects");
    server.pause();
    let started = std::time::Instant::now();
    let loaded = tokio::time::timeout(Duration::from_secs(10), store.load_script()).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(loaded, Ok(Err(tollgate_limiter::StoreError::Timeout(_)))),
        "{loaded:?}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    store
        .load_script()
        .await
        .expect("loads once the server answers");
}
