//! The Redis store's own guarantees, on real redis-server processes:
//! atomicity across connections, one script call per decision, recovery from
//! `SCRIPT FLUSH`, TTLs on every key, deadlines, and the checks on
//! caller-supplied time.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_limiter::{
    Algorithm, Clock, Context, LayerRequest, Limit, Limiter, ManualClock, Policy, Scope, State,
    Store, StoreError, StoreKey, Subject, SystemClock, Timestamp, Transition, Verdict,
    MAX_QUOTA_WINDOW, MAX_RECOVERY, MAX_WINDOW,
};
use tollgate_redis::{ConnectionMode, Engine, RedisStore, RedisStoreError};
use tollgate_testkit::command_stats::command_stats;
use tollgate_testkit::conformance::{self, every_algorithm, fresh_subject, single, unique, START};
use tollgate_testkit::redis_server::RedisServer;

const MODES: [ConnectionMode; 2] = [
    ConnectionMode::Multiplexed,
    ConnectionMode::Pool { size: 4 },
];

/// One layer decided by the store itself (the limiter would turn store
/// errors into its failure mode; these tests look at the errors).
async fn decide_one(
    store: &dyn Store,
    policy: &Policy,
    subject: &str,
    cost: u64,
) -> Result<Verdict, StoreError> {
    let key = StoreKey::new(subject, policy, "subject", subject);
    let verdicts = tollgate_limiter::ask(store, &[LayerRequest { key, policy, cost }]).await?;
    assert_eq!(verdicts.len(), 1);
    Ok(verdicts[0])
}

fn policy(limit: Limit) -> Policy {
    Policy::new(unique(limit.algorithm_name()), limit).expect("valid policy")
}

fn limiter(store: Arc<dyn Store>, policy: &Policy) -> Limiter {
    Limiter::builder(store)
        .layer("only", Scope::Subject, policy.clone())
        .build()
        .expect("valid limiter")
}

/// 200 decisions at once on one key, spread over 8 multiplexed connections
/// and a pool of 8 (16 connections), admit exactly the capacity of 20; 20
/// at once against a limit of 3 admit exactly 3. For every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_over_many_connections_admit_exactly_the_capacity() {
    let clock = ManualClock::new(START);
    let url = RedisServer::shared().url();
    let prefix = unique("atomic");
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for i in 0..9 {
        let mode = if i < 8 {
            ConnectionMode::Multiplexed
        } else {
            ConnectionMode::Pool { size: 8 }
        };
        let store = RedisStore::builder(url)
            .prefix(prefix.clone())
            .clock(Arc::new(clock.clone()))
            .connection_mode(mode)
            .connect()
            .await
            .expect("connect");
        stores.push(Arc::new(store));
    }
    for (capacity, tasks) in [(20u64, 200usize), (3, 20)] {
        for limit in every_algorithm(capacity) {
            let name = limit.algorithm_name();
            let policy = Policy::new(unique(name), limit).expect("valid");
            let limiters: Vec<Limiter> =
                stores.iter().map(|s| limiter(s.clone(), &policy)).collect();
            let ctx = fresh_subject();
            let barrier = Arc::new(tokio::sync::Barrier::new(tasks));
            let handles: Vec<_> = (0..tasks)
                .map(|i| {
                    let limiter = limiters[i % limiters.len()].clone();
                    let (ctx, barrier) = (ctx.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        limiter
                            .check(&ctx, 1)
                            .await
                            .expect("store answers")
                            .is_allowed()
                    })
                })
                .collect();
            let mut admitted = 0;
            for handle in handles {
                admitted += u64::from(handle.await.expect("task"));
            }
            assert_eq!(
                admitted, capacity,
                "{name}: {tasks} concurrent decisions against a capacity of {capacity}"
            );
        }
    }
}

/// `INFO commandstats` as command → calls (commands a script runs count too).
async fn command_calls(con: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO");
    command_stats(&info)
        .into_iter()
        .map(|(name, stats)| (name, stats.calls))
        .collect()
}

/// A `MONITOR` connection: lists the commands clients send (a script's own
/// commands are tagged `lua` and left out).
struct Monitor(BufReader<TcpStream>);

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut stream = TcpStream::connect(server.addr()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("+OK");
        assert_eq!(ok.trim_end(), "+OK");
        Monitor(reader)
    }

    /// Client commands since the last call, up to an ECHO sent by `admin`.
    async fn client_commands(
        &mut self,
        admin: &mut redis::aio::MultiplexedConnection,
    ) -> Vec<String> {
        let marker = unique("marker");
        let _: String = redis::cmd("ECHO")
            .arg(&marker)
            .query_async(admin)
            .await
            .unwrap();
        let mut commands = Vec::new();
        loop {
            let mut line = String::new();
            self.0.read_line(&mut line).expect("a MONITOR line");
            if line.contains(&marker) {
                return commands;
            }
            // +<time> [<db> <client address or "lua">] "<command>" "<arg>" …
            let Some((source, command)) = line
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once("] "))
            else {
                continue;
            };
            if source.ends_with(" lua") {
                continue;
            }
            let name = command
                .split('"')
                .nth(1)
                .unwrap_or_default()
                .to_ascii_lowercase();
            if !matches!(name.as_str(), "config" | "info" | "echo") {
                commands.push(name);
            }
        }
    }
}

/// A three-layer decision is one call, admitted or denied, with either
/// connection mode and either way of running the code: one FCALL (or one
/// EVALSHA with `Engine::Eval`) and no other client command (no PING
/// per pool checkout, no load, no second round trip).
#[tokio::test]
async fn a_three_layer_decision_is_one_script_call() {
    // Its own server: the counts are server-wide.
    let server = RedisServer::start();
    let mut admin = common::raw(server.url()).await;
    let mut monitor = Monitor::start(&server);
    let ways = [(Engine::Auto, "fcall"), (Engine::Eval, "evalsha")];
    for (mode, (engine, command)) in MODES.into_iter().flat_map(|m| ways.map(|w| (m, w))) {
        let store = common::store_with(server.url(), ManualClock::new(START), mode, engine).await;
        assert_eq!(store.settings().uses_functions(), command == "fcall");
        let store: Arc<dyn Store> = Arc::new(store);
        let second = Duration::from_secs(1);
        let limiter = Limiter::builder(store)
            .layer(
                "key",
                Scope::Subject,
                Policy::new("key", Limit::token_bucket(5, 5, second).unwrap()).unwrap(),
            )
            .layer(
                "tenant",
                Scope::Tenant,
                Policy::new("tenant", Limit::sliding_log(2, second).unwrap()).unwrap(),
            )
            .layer(
                "all",
                Scope::Global,
                Policy::new("all", Limit::gcra(100, second, 100).unwrap()).unwrap(),
            )
            .build()
            .unwrap();
        let ctx = fresh_subject().with_tenant(Subject::new(unique("tenant")).unwrap());
        // Warm up: the connections and the script are in place.
        assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
        monitor.client_commands(&mut admin).await;
        for expect_allowed in [true, false] {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut admin)
                .await
                .unwrap();
            let decision = limiter.check(&ctx, 1).await.unwrap();
            assert_eq!(decision.is_allowed(), expect_allowed, "{mode:?}");
            assert_eq!(decision.store_error(), None, "{mode:?}");
            let calls = command_calls(&mut admin).await;
            assert_eq!(calls.get(command), Some(&1), "{mode:?}: {calls:?}");
            for other in ["fcall", "evalsha", "eval", "script|load", "function|load"] {
                if other != command {
                    assert_eq!(calls.get(other), None, "{mode:?}: {calls:?}");
                }
            }
            assert_eq!(
                monitor.client_commands(&mut admin).await,
                vec![command.to_string()],
                "{mode:?}: the commands one decision sent"
            );
        }
    }
}

/// After `FUNCTION FLUSH` (functions) or `SCRIPT FLUSH` (the script) the
/// next decision reloads the code and succeeds, on the state the key
/// already had; a store built lazily loads it on its first decision.
#[tokio::test]
async fn decisions_survive_function_and_script_flush() {
    let server = RedisServer::start();
    let mut admin = common::raw(server.url()).await;
    for mode in MODES {
        for engine in [Engine::Auto, Engine::Functions, Engine::Eval] {
            let store =
                common::store_with(server.url(), ManualClock::new(START), mode, engine).await;
            let limiter = single(
                Arc::new(store),
                Limit::fixed_window(5, Duration::from_secs(60)).unwrap(),
            );
            let ctx = fresh_subject();
            assert_eq!(
                limiter.check(&ctx, 1).await.unwrap().layers()[0]
                    .verdict()
                    .remaining,
                4
            );
            flush_code(&mut admin).await;
            let after = limiter.check(&ctx, 1).await.expect("reloaded and retried");
            assert_eq!(after.store_error(), None, "{mode:?} {engine:?}");
            assert_eq!(
                after.layers()[0].verdict().remaining,
                3,
                "{mode:?} {engine:?}: the state was kept"
            );
        }
    }
    for engine in [Engine::Auto, Engine::Eval] {
        flush_code(&mut admin).await;
        let lazy = RedisStore::builder(server.url())
            .prefix(unique("lazy"))
            .engine(engine)
            .build()
            .expect("valid configuration");
        let limiter = single(
            Arc::new(lazy),
            Limit::gcra(1, Duration::from_secs(1), 1).unwrap(),
        );
        let d = limiter.check(&fresh_subject(), 1).await.unwrap();
        assert!(d.is_allowed() && d.store_error().is_none(), "{d:?}");
    }
}

/// Forget every function and script the server holds.
async fn flush_code(admin: &mut redis::aio::MultiplexedConnection) {
    for what in ["FUNCTION", "SCRIPT"] {
        let _: () = redis::cmd(what)
            .arg("FLUSH")
            .query_async(admin)
            .await
            .unwrap();
    }
}

/// `FUNCTION FLUSH` and `SCRIPT FLUSH` every few milliseconds while four tasks
/// decide on one key: no decision fails, and the key admits exactly as
/// many as were sent (its limit is not reached), each counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_under_load_loses_no_decision_and_counts_each_once() {
    /// Flushes per engine mode; the decisions run until they are done.
    const FLUSHES: usize = 6;
    let server = RedisServer::start();
    let admin = common::raw(server.url()).await;
    for engine in [Engine::Auto, Engine::Eval] {
        // A generous deadline: the test is about reloading, not speed.
        let store = RedisStore::builder(server.url())
            .prefix(unique("flush"))
            .clock(Arc::new(ManualClock::new(START)) as Arc<dyn Clock>)
            .deadline(Duration::from_secs(2))
            .engine(engine)
            .connect()
            .await
            .expect("connect");
        let limit = Limit::fixed_window(1_000_000, Duration::from_secs(600)).unwrap();
        let limiter = single(Arc::new(store), limit);
        let ctx = fresh_subject();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flusher = {
            let done = done.clone();
            let mut admin = admin.clone();
            tokio::spawn(async move {
                // Flushes 10 ms apart: a decision is reloaded and sent
                // again up to three times in a row, so only four flushes
                // inside one decision's reloads and resends would fail it.
                for _ in 0..FLUSHES {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    flush_code(&mut admin).await;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (limiter, ctx, done) = (limiter.clone(), ctx.clone(), done.clone());
                tokio::spawn(async move {
                    let mut sent = 0u64;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let d = limiter.check(&ctx, 1).await.expect("decided");
                        assert!(
                            d.is_allowed() && d.store_error().is_none(),
                            "{engine:?}: {d:?}"
                        );
                        sent += 1;
                    }
                    sent
                })
            })
            .collect();
        let mut sent = 0;
        for task in tasks {
            sent += task.await.expect("no decision failed");
        }
        flusher.await.unwrap();
        assert!(sent > 0, "{engine:?}: no decision sent");
        let d = limiter.check(&ctx, 1).await.unwrap();
        assert_eq!(
            d.layers()[0].verdict().remaining,
            1_000_000 - sent - 1,
            "{engine:?}: every decision counted once"
        );
    }
}

/// `Engine::Functions` is what it says; the library and the script are
/// the same code, so a key written through one is read through the other.
#[tokio::test]
async fn functions_and_the_script_share_states() {
    let url = RedisServer::shared().url();
    let prefix = unique("both");
    let make = |engine| {
        RedisStore::builder(url)
            .prefix(prefix.clone())
            .clock(Arc::new(ManualClock::new(START)) as Arc<dyn Clock>)
            .engine(engine)
            .connect()
    };
    let functions = make(Engine::Functions)
        .await
        .expect("Redis 7 has functions");
    assert!(functions.settings().uses_functions());
    let script = make(Engine::Eval).await.expect("connect");
    assert!(!script.settings().uses_functions());
    let policy = policy(Limit::gcra(10, Duration::from_secs(1), 10).unwrap());
    let subject = unique("s");
    for (i, store) in [&functions, &script, &functions].into_iter().enumerate() {
        let v = decide_one(store, &policy, &subject, 2).await.unwrap();
        assert_eq!(v.remaining, 10 - 2 * (i as u64 + 1));
    }
}

/// After the conformance workload (and decisions at the largest windows
/// and recovery times), every key under the store's prefix has a TTL, none
/// longer than the policy maximum.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_has_a_bounded_ttl() {
    let url = RedisServer::shared().url();
    let prefix = unique("ttl");
    let factory = {
        let prefix = prefix.clone();
        move |clock: ManualClock| {
            let prefix = prefix.clone();
            async move {
                Arc::new(
                    RedisStore::builder(url)
                        .prefix(prefix)
                        .clock(Arc::new(clock))
                        .connect()
                        .await
                        .expect("connect"),
                ) as Arc<dyn Store>
            }
        }
    };
    conformance::new_key_starts_full(&factory).await;
    conformance::sequential_admits_exactly_the_limit(&factory).await;
    conformance::retry_after_is_exact_and_denials_are_free(&factory).await;
    conformance::backward_clock_neither_refills_nor_drains(&factory).await;
    conformance::concurrent_requests_admit_exactly_the_capacity(&factory).await;
    conformance::layers_are_all_or_nothing(&factory).await;
    conformance::subjects_and_versions_are_isolated(&factory).await;
    conformance::state_resets_after_reset_after(&factory).await;
    conformance::penalties_saturate_and_rewards_refill(&factory).await;

    // The longest TTLs any policy can ask for.
    let store = factory(ManualClock::new(START)).await;
    let longest = [
        Limit::token_bucket(14 * 24 * 3600, 1, Duration::from_secs(1)).unwrap(),
        Limit::gcra(1, Duration::from_secs(24 * 3600), 14).unwrap(),
        Limit::fixed_window(10, MAX_WINDOW).unwrap(),
        Limit::fixed_window(10, MAX_QUOTA_WINDOW).unwrap(),
        Limit::sliding_window(10, MAX_WINDOW).unwrap(),
        Limit::sliding_log(10, MAX_WINDOW).unwrap(),
    ];
    for limit in longest {
        let cap = limit.capacity();
        let limiter = single(store.clone(), limit);
        assert!(limiter
            .check(&fresh_subject(), cap)
            .await
            .unwrap()
            .is_allowed());
    }

    // And the longest block.
    let blocked = single(
        store.clone(),
        Limit::gcra(1, Duration::from_secs(1), 1).unwrap(),
    );
    blocked.block(&fresh_subject(), MAX_RECOVERY).await.unwrap();

    let mut con = common::raw(url).await;
    let keys = common::keys_under(&mut con, &prefix).await;
    assert!(keys.len() >= 6, "the workload left keys: {keys:?}");
    // The reference TTL plus the store's one-millisecond margin, and a
    // second for this test's own run time: a year's fixed window is the
    // longest (it lives until its window ends, up to the whole window).
    let max_ms = MAX_QUOTA_WINDOW.as_millis() as i64 + 1 + 1_000;
    let mut longest_seen = 0;
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        if ttl == -2 {
            continue; // expired since SCAN saw it
        }
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        assert!(ttl <= max_ms, "{key} lives {ttl} ms, more than {max_ms} ms");
        longest_seen = longest_seen.max(ttl);
    }
    assert!(
        longest_seen > MAX_RECOVERY.as_millis() as i64 - 60_000,
        "the longest TTL ({longest_seen} ms) reaches the policy maximum"
    );
}

/// A block lives in the layer's own key — a counter's string or a log's
/// list holds `b<end µs>` — with a TTL that covers it (plus the store's
/// millisecond), and the next decision after its end overwrites it.
#[tokio::test]
async fn a_block_lives_in_the_layer_key_with_a_ttl_covering_it() {
    let url = RedisServer::shared().url();
    let prefix = unique("block");
    let clock = ManualClock::new(START);
    let store: Arc<dyn Store> = Arc::new(
        RedisStore::builder(url)
            .prefix(prefix.clone())
            .clock(Arc::new(clock.clone()))
            .connect()
            .await
            .expect("connect"),
    );
    let mut con = common::raw(url).await;
    let minute = Duration::from_secs(60);
    for (limit, list) in [
        (Limit::gcra(5, minute, 5).unwrap(), false),
        (Limit::sliding_log(5, minute).unwrap(), true),
    ] {
        clock.set(START);
        let limiter = single(store.clone(), limit);
        let ctx = fresh_subject();
        limiter.check(&ctx, 1).await.unwrap();
        limiter.block(&ctx, minute).await.unwrap();
        let keys = common::keys_under(&mut con, &prefix).await;
        let subject = ctx.subject().unwrap().as_str().to_string();
        let key = keys
            .iter()
            .find(|k| k.contains(&subject))
            .expect("the layer's key");
        let value: String = if list {
            redis::cmd("LINDEX")
                .arg(key)
                .arg(0)
                .query_async(&mut con)
                .await
                .unwrap()
        } else {
            redis::cmd("GET")
                .arg(key)
                .query_async(&mut con)
                .await
                .unwrap()
        };
        let end = START.as_micros() + 60_000_000;
        assert_eq!(value, format!("b{end}"), "{key}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!((59_000..=60_001).contains(&ttl), "{key}: {ttl} ms");
        clock.advance(minute);
        assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(kind, if list { "list" } else { "string" });
        if list {
            let entries: Vec<u64> = redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!(entries, [end], "the block gave way to a log of one entry");
        }
    }
}

/// Sends `SIGCONT` on drop, so a failing test never leaves a server stopped.
struct Paused<'a>(&'a RedisServer);

impl<'a> Paused<'a> {
    fn new(server: &'a RedisServer) -> Self {
        signal(server, "-STOP");
        Paused(server)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(server: &RedisServer, sig: &str) {
    let status = std::process::Command::new("kill")
        .arg(sig)
        .arg(server.pid().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {}", server.pid());
}

/// A stalled Redis (SIGSTOP) costs a decision its deadline, not more, in
/// either mode; once it resumes, decisions succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_costs_at_most_the_deadline() {
    let server = RedisServer::start();
    let deadline = Duration::from_millis(100);
    for mode in MODES {
        let store = RedisStore::builder(server.url())
            .prefix(unique("stall"))
            .connection_mode(mode)
            .deadline(deadline)
            .connect()
            .await
            .unwrap();
        let policy = policy(Limit::gcra(100, Duration::from_secs(1), 100).unwrap());
        assert!(decide_one(&store, &policy, "s", 1).await.unwrap().allowed);
        {
            let _paused = Paused::new(&server);
            for _ in 0..3 {
                let started = Instant::now();
                let err = decide_one(&store, &policy, "s", 1)
                    .await
                    .expect_err("the server is stopped");
                let took = started.elapsed();
                assert!(
                    matches!(err, StoreError::Timeout(d) if d == deadline),
                    "{mode:?}: {err:?}"
                );
                assert!(
                    took < deadline + Duration::from_millis(150),
                    "{mode:?}: took {took:?}"
                );
            }
        }
        let mut ok = false;
        for _ in 0..50 {
            if decide_one(&store, &policy, "s", 1).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok, "{mode:?}: decisions succeed again after SIGCONT");
    }
}

/// Nothing listening: connecting fails within the connect timeout, and a
/// lazily built store fails each decision within its deadline.
#[tokio::test]
async fn an_unreachable_server_fails_fast() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("redis://127.0.0.1:{port}/");
    for mode in MODES {
        let started = Instant::now();
        let err = RedisStore::builder(url.as_str())
            .connection_mode(mode)
            .connect_timeout(Duration::from_millis(300))
            .connect()
            .await
            .expect_err("nothing listens");
        assert!(
            matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
            "{mode:?}: {err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2), "{mode:?}");

        let store = RedisStore::builder(url.as_str())
            .connection_mode(mode)
            .deadline(Duration::from_millis(50))
            .build()
            .unwrap();
        let policy = policy(Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
        let started = Instant::now();
        let err = decide_one(&store, &policy, "s", 1)
            .await
            .expect_err("nothing listens");
        assert!(
            matches!(err, StoreError::Unavailable(_) | StoreError::Timeout(_)),
            "{mode:?}: {err:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(500), "{mode:?}");
    }
}

/// A pool that cannot connect says so at once, and why: a decision waiting
/// for a connection hears of the failed connect (bb8 tells only its error
/// sink), rather than waiting out its deadline for a timeout.
#[tokio::test]
async fn a_pool_that_cannot_connect_says_so_at_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let store = RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
        .connection_mode(ConnectionMode::Pool { size: 2 })
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let policy = policy(Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    for _ in 0..2 {
        let started = Instant::now();
        let err = decide_one(&store, &policy, "s", 1)
            .await
            .expect_err("nothing listens");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}

/// A caller-supplied time before 2020 or after 2100 is refused, never used.
#[tokio::test]
async fn implausible_caller_time_is_refused() {
    for at in [
        Timestamp::from_micros(0),
        Timestamp::from_micros(1_577_836_799_999_999), // 2019-12-31T23:59:59.999999Z
        Timestamp::from_micros(4_102_444_800_000_001), // just after 2100-01-01
    ] {
        let store = common::store(ManualClock::new(at)).await;
        let prefix = store.settings().prefix().to_string();
        let policy = policy(Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
        let err = decide_one(&store, &policy, "s", 1)
            .await
            .expect_err("refused");
        assert!(
            matches!(err, StoreError::ImplausibleTime(t) if t == at),
            "{err}"
        );
        let mut con = common::raw(RedisServer::shared().url()).await;
        assert!(
            common::keys_under(&mut con, &prefix).await.is_empty(),
            "nothing written"
        );
    }
}

/// With `max_skew`, a caller time further than that from the server's TIME
/// is refused by the script; a close one is used.
#[tokio::test]
async fn caller_time_is_checked_against_the_server_clock() {
    let now = SystemClock.now();
    let policy = policy(Limit::gcra(1, Duration::from_secs(1), 1).unwrap());
    let far = ManualClock::new(Timestamp::from_micros(now.as_micros() - 30_000_000));
    let store = RedisStore::builder(RedisServer::shared().url())
        .prefix(unique("skew"))
        .clock(Arc::new(far))
        .max_skew(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let err = decide_one(&store, &policy, "s", 1)
        .await
        .expect_err("too far");
    match RedisStoreError::of(&err) {
        Some(RedisStoreError::ClockSkew { skew, max_skew, .. }) => {
            assert!(*skew >= Duration::from_secs(25), "{err}");
            assert_eq!(*max_skew, Duration::from_secs(5));
        }
        other => panic!("expected ClockSkew, got {other:?} ({err})"),
    }
    assert!(!err.is_outage(), "a wrong clock is not an outage");
    assert_eq!(err.class(), "clock_skew");

    let close = ManualClock::new(now);
    let store = RedisStore::builder(RedisServer::shared().url())
        .prefix(unique("skew"))
        .clock(Arc::new(close))
        .max_skew(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    assert!(decide_one(&store, &policy, "s", 1).await.unwrap().allowed);
}

/// The server's clock by default: retry-after counts real time.
#[tokio::test]
async fn server_time_by_default() {
    let store = RedisStore::builder(RedisServer::shared().url())
        .prefix(unique("server-time"))
        .connect()
        .await
        .unwrap();
    let limiter = single(
        Arc::new(store),
        Limit::fixed_window(1, Duration::from_secs(3600)).unwrap(),
    );
    let ctx = fresh_subject();
    assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    let denied = limiter.check(&ctx, 1).await.unwrap();
    assert!(!denied.is_allowed());
    let wait = denied.retry_after().unwrap();
    // The window ends on an hour boundary of the server's clock.
    let now = SystemClock.now().as_micros();
    let window_end = (now / 3_600_000_000 + 1) * 3_600_000_000;
    let expected = Duration::from_micros(window_end - now);
    let diff = wait.abs_diff(expected);
    assert!(
        diff < Duration::from_secs(1),
        "retry-after {wait:?}, expected about {expected:?}"
    );
}

#[derive(Debug)]
struct Custom;

impl Algorithm for Custom {
    fn name(&self) -> &'static str {
        "custom-test"
    }
    fn capacity(&self) -> u64 {
        1
    }
    fn decide(&self, _: Option<&State>, _: Timestamp, _: u64) -> Transition {
        unreachable!("the Redis store never runs a custom algorithm")
    }
}

/// A custom algorithm has no Lua counterpart: `Unsupported`, before any I/O.
#[tokio::test]
async fn custom_algorithms_are_unsupported() {
    let store = common::store(ManualClock::new(START)).await;
    let policy = Policy::new("custom", Limit::custom(Arc::new(Custom))).unwrap();
    let err = decide_one(&store, &policy, "s", 1)
        .await
        .expect_err("unsupported");
    assert!(
        matches!(err, StoreError::Unsupported("custom-test")),
        "{err:?}"
    );
}

/// Keys are `<prefix>:{tag}:<policy>:v<version>:<algorithm>:<scope>:<subject>`,
/// without the `:<subject>` when the subject is the tag, with the short
/// scopes; only the configured prefix is touched.
#[tokio::test]
async fn keys_follow_the_documented_layout() {
    let store = common::store(ManualClock::new(START)).await;
    let prefix = store.settings().prefix().to_string();
    let policy =
        |name: &str, limit: Limit| Policy::new(unique(name), limit).unwrap().with_version(3);
    let minute = Duration::from_secs(60);
    let (key, tenant, route) = (
        policy("key", Limit::fixed_window(5, minute).unwrap()),
        policy("tenant", Limit::gcra(5, minute, 5).unwrap()),
        policy("route", Limit::token_bucket(5, 5, minute).unwrap()),
    );
    let limiter = Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, key.clone())
        .layer("tenant", Scope::Tenant, tenant.clone())
        .layer("route", Scope::Attribute("route:x".into()), route.clone())
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("user-1").unwrap())
        .with_tenant(Subject::new("acme").unwrap())
        .with_attribute("route", Subject::new("/a").unwrap())
        .with_attribute("route:x", Subject::new("/b").unwrap());
    limiter.check(&ctx, 1).await.unwrap();
    let mut con = common::raw(RedisServer::shared().url()).await;
    let mut keys = common::keys_under(&mut con, &prefix).await;
    keys.sort();
    let mut expected = vec![
        format!("{prefix}:{{acme}}:{}:v3:fw:s:user-1", key.name()),
        format!("{prefix}:{{acme}}:{}:v3:gcra:t", tenant.name()),
        format!("{prefix}:{{/b}}:{}:v3:tb:a.route%3Ax", route.name()),
    ];
    expected.sort();
    assert_eq!(keys, expected);
}

/// Bad configuration is reported before any connection.
#[tokio::test]
async fn bad_configuration_is_refused() {
    for prefix in ["", "a{b}", "has space", &"x".repeat(65)] {
        let err = RedisStore::builder(RedisServer::shared().url())
            .prefix(prefix)
            .connect()
            .await
            .expect_err("bad prefix");
        assert!(
            matches!(
                RedisStoreError::of(&err),
                Some(RedisStoreError::InvalidPrefix(_))
            ),
            "{prefix:?}: {err}"
        );
    }
    // A zero wait panicked inside the pool, a huge one overflowed the
    // Cluster's deadline arithmetic at the first decision.
    let pool = ConnectionMode::Pool { size: 2 };
    for (deadline, connect) in [
        (Duration::ZERO, Duration::from_secs(1)),
        (Duration::MAX, Duration::from_secs(1)),
        (Duration::from_millis(50), Duration::ZERO),
    ] {
        let err = RedisStore::builder(RedisServer::shared().url())
            .connection_mode(pool)
            .deadline(deadline)
            .connect_timeout(connect)
            .connect()
            .await
            .expect_err("a wait out of range");
        assert!(
            matches!(
                RedisStoreError::of(&err),
                Some(RedisStoreError::InvalidSetting(_))
            ),
            "{deadline:?}, {connect:?}: {err}"
        );
    }
    let err = RedisStore::builder("http://user:hunter2@example/")
        .connect()
        .await
        .expect_err("bad url");
    assert!(
        matches!(
            RedisStoreError::of(&err),
            Some(RedisStoreError::InvalidUrl(_))
        ),
        "{err}"
    );
    assert!(
        !err.to_string().contains("hunter2"),
        "the password is not repeated: {err}"
    );
    // A skew bound without a clock of the store's own bounded nothing,
    // silently.
    let err = RedisStore::builder(RedisServer::shared().url())
        .max_skew(Duration::from_millis(1))
        .build()
        .expect_err("max_skew without a clock");
    assert!(
        matches!(
            RedisStoreError::of(&err),
            Some(RedisStoreError::InvalidSetting(m)) if m.contains("clock")
        ),
        "{err}"
    );
}

/// A Redis out of memory refuses the script's writes: the decision fails as
/// `Unavailable` (the failure mode decides), never as a silent admission.
/// Connecting fails the same way with functions (`FUNCTION LOAD` is a
/// write); a store built without connecting gets the same answer from its
/// decisions, and so does the script form (`SCRIPT LOAD` is not a write).
#[tokio::test]
async fn a_full_server_is_unavailable() {
    let server =
        RedisServer::start_with_args(&["--maxmemory", "1", "--maxmemory-policy", "noeviction"]);
    let refused = RedisStore::builder(server.url()).connect().await;
    assert!(
        matches!(refused, Err(StoreError::Unavailable(ref m)) if m.contains("OOM")),
        "{refused:?}"
    );
    let lazy = RedisStore::builder(server.url())
        .clock(Arc::new(ManualClock::new(START)) as Arc<dyn Clock>)
        .build()
        .unwrap();
    let script = common::store_with(
        server.url(),
        ManualClock::new(START),
        ConnectionMode::Multiplexed,
        Engine::Eval,
    )
    .await;
    let policy = policy(Limit::gcra(10, Duration::from_secs(1), 10).unwrap());
    for store in [&lazy, &script] {
        let err = decide_one(store, &policy, "s", 1)
            .await
            .expect_err("out of memory");
        assert!(
            matches!(err, StoreError::Unavailable(ref m) if m.contains("OOM")),
            "{err:?}"
        );
    }
}

/// A decision's future, boxed once per decision, stays within what the
/// system allocator (glibc) keeps in its per-thread caches, 1,032 bytes:
/// a larger one takes an allocator lock, which the runtime's threads
/// contend for. It was 6,912 bytes (a future handed to an async function
/// is kept twice in the state of the one awaiting it), ten times the
/// `futex` calls of a bare redis-rs client (docs/benchmarks.md).
#[tokio::test]
async fn a_decisions_future_fits_the_allocators_thread_cache() {
    let store = common::store(ManualClock::new(START)).await;
    let policy = policy(Limit::token_bucket(10, 10, Duration::from_secs(1)).unwrap());
    let key = StoreKey::new("k", &policy, "subject", "k");
    let layers = [LayerRequest {
        key,
        policy: &policy,
        cost: 1,
    }];
    let mut verdicts = tollgate_limiter::Verdicts::new();
    match store.decide(&layers, &mut verdicts) {
        tollgate_limiter::Decide::Later(call) => {
            let size = std::mem::size_of_val(&*call);
            assert!(size <= 1_032, "a decision's future is {size} bytes");
            call.await.expect("decided");
        }
        tollgate_limiter::Decide::Now(_) => panic!("a Redis store waits for its call"),
    }
    assert!(verdicts[0].allowed);
}
