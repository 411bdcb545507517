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

use crate::common;
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

/// A TCP proxy in front of a server that can go silent on the connections
/// it carries (a host gone without closing its sockets): bytes sent on
/// them are swallowed, nothing answers, nothing closes. Or it can send
/// new connections to another server (an address moved to another node),
/// leaving the open ones where they are.
struct Proxy {
    url: String,
    /// Connections numbered below this are silent.
    silent_below: Arc<std::sync::atomic::AtomicU64>,
    next: Arc<std::sync::atomic::AtomicU64>,
    upstream: Arc<std::sync::Mutex<std::net::SocketAddr>>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr) -> Proxy {
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}/", listener.local_addr().unwrap());
        let (silent_below, next) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let upstream = Arc::new(std::sync::Mutex::new(upstream));
        let (silent, counter, target) = (silent_below.clone(), next.clone(), upstream.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let id = counter.fetch_add(1, Ordering::SeqCst);
                let to = *target.lock().unwrap();
                let Ok(outbound) = tokio::net::TcpStream::connect(to).await else {
                    continue;
                };
                let (client_read, client_write) = inbound.into_split();
                let (server_read, server_write) = outbound.into_split();
                tokio::spawn(carry(client_read, server_write, id, silent.clone()));
                tokio::spawn(carry(server_read, client_write, id, silent.clone()));
            }
        });
        Proxy {
            url,
            silent_below,
            next,
            upstream,
        }
    }

    /// Every connection open now goes silent.
    fn silence_open_connections(&self) {
        use std::sync::atomic::Ordering;
        let next = self.next.load(Ordering::SeqCst);
        self.silent_below.store(next, Ordering::SeqCst);
    }

    /// New connections go to `to`.
    fn retarget(&self, to: std::net::SocketAddr) {
        *self.upstream.lock().unwrap() = to;
    }
}

/// Copy `from` to `to` until either closes; once connection `id` is
/// silenced, what arrives is read and dropped.
async fn carry(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    id: u64,
    silent_below: Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if id < silent_below.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A server that goes silent on the store's connection (nothing answers,
/// nothing closes) costs decisions their deadline until three in a row
/// went unanswered; then the store opens a new connection and decides
/// again. (The multiplexed connection waited for the kernel to give up on
/// the socket, many minutes; the pool and Sentinel connections already did
/// this.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.addr()).await;
    let (limiter, ctx) = deciding_through(&proxy, DEADLINE).await;
    proxy.silence_open_connections();
    let mut failed = 0;
    let decided = loop {
        let d = limiter.check(&ctx, 1).await.unwrap();
        if d.store_error().is_none() {
            break d;
        }
        failed += 1;
        assert!(failed < 20, "still failing after {failed} decisions: {d:?}");
    };
    assert!(decided.is_allowed());
    assert!(
        failed >= 3,
        "decided on a silent connection after {failed} failures"
    );
    println!("a silent connection: replaced after {failed} decisions failed");
}

/// The server behind the store's address is demoted to a replica, and the
/// address moves to the new primary (a DNS name or a virtual address that
/// follows failovers): the store's connection still reaches the old
/// server, which answers `READONLY` to every write. The store opens a new
/// connection (at most once a second), which reaches the new primary.
/// (redis-rs's connection manager reopens after an I/O error only: it
/// answered `READONLY` for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_server_behind_a_moved_address_is_left() {
    let (old, new) = (RedisServer::start(), RedisServer::start());
    let proxy = Proxy::start(old.addr()).await;
    let (limiter, ctx) = deciding_through(&proxy, Duration::from_millis(500)).await;
    let port = new.port().to_string();
    old.command(&["REPLICAOF", "127.0.0.1", &port]);
    proxy.retarget(new.addr());
    let demoted = limiter.check(&ctx, 1).await.unwrap();
    assert!(demoted.store_error().is_some(), "{demoted:?}");
    let started = std::time::Instant::now();
    loop {
        let d = limiter.check(&ctx, 1).await.unwrap();
        if d.store_error().is_none() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still on the demoted server: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "a demoted server: decided on the new primary after {:?}",
        started.elapsed()
    );
}

/// A limiter on a store that reaches its server through `proxy`, with the
/// store's `deadline` and a breaker that stays closed (these tests count
/// the store's own answers), and a subject; one decision made.
async fn deciding_through(
    proxy: &Proxy,
    deadline: Duration,
) -> (Limiter, tollgate_limiter::Context) {
    let store = RedisStore::builder(proxy.url.as_str())
        .prefix(unique("fault"))
        .deadline(deadline)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("connect through the proxy");
    let limit = Limit::token_bucket(1_000, 1_000, Duration::from_secs(1)).unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("client", Scope::Subject, Policy::new("api", limit).unwrap())
        .breaker(BreakerConfig {
            failure_threshold: 1_000,
            open_for: Duration::from_millis(1),
        })
        .build()
        .unwrap();
    let ctx = tollgate_limiter::Context::for_subject(
        tollgate_limiter::Subject::new(unique("subject")).unwrap(),
    );
    let first = limiter.check(&ctx, 1).await.unwrap();
    assert!(first.store_error().is_none(), "{first:?}");
    (limiter, ctx)
}
