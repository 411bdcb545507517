//! The store conformance suite on the Redis store (multiplexed connection and
//! bb8 pool, function library; the script form; Tollgate's native module),
//! against a real redis-server, time from the manual clock.

use crate::common;

use std::sync::Arc;

use tollgate_limiter::{ManualClock, Store};
use tollgate_redis::ConnectionMode;
use tollgate_testkit::redis_server::RedisServer;

mod multiplexed {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            common::store_at(
                RedisServer::shared().url(),
                clock,
                ConnectionMode::Multiplexed,
            )
            .await,
        ) as Arc<dyn Store>
    });
}

mod pool {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            common::store_at(
                RedisServer::shared().url(),
                clock,
                ConnectionMode::Pool { size: 8 },
            )
            .await,
        ) as Arc<dyn Store>
    });
}

/// The script form (`EVALSHA`, as on Redis 6.2) passes the same suite.
mod eval {
    use super::*;
    use tollgate_redis::Engine;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            common::store_with(
                RedisServer::shared().url(),
                clock,
                ConnectionMode::Multiplexed,
                Engine::Eval,
            )
            .await,
        ) as Arc<dyn Store>
    });

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreign_values_are_conflicts() {
        let store = common::store_with(
            RedisServer::shared().url(),
            ManualClock::new(tollgate_testkit::conformance::START),
            ConnectionMode::Multiplexed,
            Engine::Eval,
        )
        .await;
        let foreign = common::RedisForeign {
            con: common::raw(RedisServer::shared().url()).await,
            prefix: store.settings().prefix().to_string(),
        };
        tollgate_testkit::conformance::foreign_values_are_conflicts(Arc::new(store), &foreign)
            .await;
    }
}

/// Tollgate's native module (`TOLLGATE.DECIDE`) on a server that loaded it
/// passes the same suite: the store finds it and uses it.
mod module {
    use super::*;
    use tollgate_redis::Engine;

    async fn store(clock: ManualClock) -> tollgate_redis::RedisStore {
        let store = common::store_with(
            RedisServer::shared_with_module().url(),
            clock,
            ConnectionMode::Multiplexed,
            Engine::Auto,
        )
        .await;
        assert!(store.settings().uses_module(), "the store found the module");
        store
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(store(clock).await) as Arc<dyn Store>
    });

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreign_values_are_conflicts() {
        let store = store(ManualClock::new(tollgate_testkit::conformance::START)).await;
        let foreign = common::RedisForeign {
            con: common::raw(RedisServer::shared_with_module().url()).await,
            prefix: store.settings().prefix().to_string(),
        };
        tollgate_testkit::conformance::foreign_values_are_conflicts(Arc::new(store), &foreign)
            .await;
    }
}

/// Data Tollgate did not write (another application sharing the Redis and
/// the prefix) is a conflict, left exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_conflicts() {
    let store = common::store(ManualClock::new(tollgate_testkit::conformance::START)).await;
    let foreign = common::RedisForeign {
        con: common::raw(RedisServer::shared().url()).await,
        prefix: store.settings().prefix().to_string(),
    };
    tollgate_testkit::conformance::foreign_values_are_conflicts(Arc::new(store), &foreign).await;
}

/// Counter states no policy writes, with a time in range beside them (a
/// recorded rate with a zero period, a refill of 0 or an interval beyond
/// the longest window; a count or remainder of 2^53 or more; a calendar
/// span that is none) were not written by Tollgate: every engine reports a
/// conflict and leaves them as they were. (Before, the module failed on a
/// zero period, and the Lua read a used-up bucket as full, or wrote its own
/// state over the value.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_no_policy_writes_are_conflicts() {
    use std::time::Duration;
    use tollgate_limiter::{
        CalendarUnit, LayerRequest, Limit, Policy, Recurrence, Scope, StoreError, StoreKey,
    };
    use tollgate_redis::Engine;
    use tollgate_testkit::conformance::START;

    let t = START.as_micros();
    let future = t + 60_000_000;
    // Ten days: beyond the longest window, within a recorded period's bits.
    let far = 10 * 24 * 3600 * 1_000_000u64;
    let limits = [
        (
            Limit::gcra(10, Duration::from_secs(10), 10).unwrap(),
            vec![format!("{future} {far}")],
        ),
        (
            Limit::token_bucket(10, 1, Duration::from_secs(1)).unwrap(),
            // A period of 0 (refill 1); a refill of 0; a period beyond the
            // longest window.
            vec![
                format!("{future} 0 {}", 1u64 << 40),
                format!("{future} 0 5"),
                format!("{future} 0 {}", (1u64 << 40) + far),
                format!("{future} {}", u64::MAX),
                format!("{future} {}", 1u64 << 53),
            ],
        ),
        (
            Limit::fixed_window(10, Duration::from_secs(60)).unwrap(),
            vec![format!("{} {t}", (1u64 << 53) + 1)],
        ),
        (
            Limit::calendar(
                10,
                Recurrence::new(CalendarUnit::Month, "UTC", "2025-01-01T00:00").unwrap(),
            )
            .unwrap(),
            // No end; a span ending before it starts.
            vec![format!("5 {t}"), format!("5 {t} {}", t - 1)],
        ),
    ];
    let servers = [
        (RedisServer::shared(), Engine::Eval),
        (RedisServer::shared(), Engine::Functions),
        (RedisServer::shared_with_module(), Engine::Module),
    ];
    for (server, engine) in servers {
        let store = common::store_with(
            server.url(),
            ManualClock::new(START),
            ConnectionMode::Multiplexed,
            engine,
        )
        .await;
        let mut con = common::raw(server.url()).await;
        for (limit, values) in &limits {
            for (n, value) in values.iter().enumerate() {
                let policy = Policy::new(format!("state{n}"), limit.keeping_units()).unwrap();
                let subject = tollgate_testkit::conformance::unique("subject");
                let scope = Scope::Subject.key_label();
                let key = StoreKey::new(&subject, &policy, &scope, &subject);
                let full = format!("{}:{key}", store.settings().prefix());
                let _: () = redis::cmd("SET")
                    .arg(&full)
                    .arg(value)
                    .arg("PX")
                    .arg(600_000)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                let request = LayerRequest {
                    key,
                    policy: &policy,
                    cost: 1,
                };
                let answer = tollgate_limiter::ask(&store, &[request]).await;
                assert!(
                    matches!(answer, Err(StoreError::Conflict { .. })),
                    "{engine:?}, {}, {value}: {answer:?}",
                    limit.algorithm_name()
                );
                let after: String = redis::cmd("GET")
                    .arg(&full)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                assert_eq!(&after, value, "{engine:?}: left as it was");
            }
        }
    }
}

/// A sliding log kept as a list with an entry that is not a time, among
/// times in order: a one-layer denial that reads that entry, and a
/// decision over two layers (which reads every entry), answer a conflict
/// on every engine, the list untouched. (The Lua read the entry as nil and
/// failed with a protocol error, counted as an outage; over two layers it
/// checked the list's ends only, and appended to it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_entry_that_is_no_time_is_a_conflict_where_read() {
    use std::time::Duration;
    use tollgate_limiter::{LayerRequest, Limit, Policy, Scope, StoreError, StoreKey};
    use tollgate_redis::Engine;
    use tollgate_testkit::conformance::{unique, START};

    let t = START.as_micros();
    let servers = [
        (RedisServer::shared(), Engine::Eval),
        (RedisServer::shared(), Engine::Functions),
        (RedisServer::shared_with_module(), Engine::Module),
    ];
    for (server, engine) in servers {
        let clock = ManualClock::new(START);
        let (store, mut con) = store_and_connection(server, engine, clock.clone()).await;
        let minute = Duration::from_secs(60);
        let log = Policy::new(unique("log"), Limit::sliding_log(2, minute).unwrap()).unwrap();
        let other = Policy::new(unique("other"), Limit::fixed_window(9, minute).unwrap()).unwrap();
        // (one layer, at a time the oldest entry aged out: the search reads
        // the second), (two layers, at the entries' time)
        let cases = [(false, t + 60_000_000), (true, t + 2)];
        for (two_layers, now) in cases {
            clock.set(tollgate_limiter::Timestamp::from_micros(now));
            let subject = unique("subject");
            let scope = Scope::Subject.key_label();
            let key = StoreKey::new(&subject, &log, &scope, &subject);
            let full = format!("{}:{key}", store.settings().prefix());
            let planted = [t.to_string(), "x".to_string(), (t + 1).to_string()];
            let _: () = redis::cmd("RPUSH")
                .arg(&full)
                .arg(&planted[..])
                .query_async(&mut con)
                .await
                .unwrap();
            let other_key = StoreKey::new(&subject, &other, &scope, &subject);
            let mut requests = vec![LayerRequest {
                key,
                policy: &log,
                cost: 1,
            }];
            if two_layers {
                requests.insert(
                    0,
                    LayerRequest {
                        key: other_key,
                        policy: &other,
                        cost: 1,
                    },
                );
            }
            let answer = tollgate_limiter::ask(&store, &requests).await;
            assert!(
                matches!(answer, Err(StoreError::Conflict { .. })),
                "{engine:?}, two layers: {two_layers}: {answer:?}"
            );
            let after: Vec<String> = redis::cmd("LRANGE")
                .arg(&full)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            assert_eq!(after, planted, "{engine:?}: left as it was");
        }
    }
}

/// A call whose time is before 2020 (a server's clock reset to 1970, or
/// a caller's sent unchecked) is refused with `TOLLGATE_TIME`, which the
/// store reads as `StoreError::ImplausibleTime` (`error.rs`), and writes
/// nothing (it
/// wrote a state of 1970, which every later call read as someone else's
/// data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_before_2020_is_refused_by_the_server() {
    use std::time::Duration;
    use tollgate_limiter::{LayerRequest, Limit, Policy, Scope, StoreKey, Timestamp};
    use tollgate_redis::Engine;
    use tollgate_testkit::conformance::{unique, START};

    let servers = [
        (RedisServer::shared(), Engine::Functions, "FCALL"),
        (
            RedisServer::shared_with_module(),
            Engine::Module,
            "TOLLGATE.DECIDE",
        ),
    ];
    for (server, engine, command) in servers {
        // Connecting loads the function library.
        let (store, mut con) = store_and_connection(server, engine, ManualClock::new(START)).await;
        let minute = Duration::from_secs(60);
        let policy = Policy::new(unique("time"), Limit::fixed_window(9, minute).unwrap()).unwrap();
        let subject = unique("subject");
        let scope = Scope::Subject.key_label();
        let key = StoreKey::new(&subject, &policy, &scope, &subject);
        let full = format!("{}:{key}", store.settings().prefix());
        let layer = LayerRequest {
            key,
            policy: &policy,
            cost: 1,
        };
        let mut call = redis::cmd(command);
        if engine == Engine::Functions {
            call.arg(tollgate_redis::function_name());
        }
        call.arg(1).arg(&full).arg(1_000_000).arg("");
        for a in tollgate_redis::script::layer_args(&layer, Timestamp::from_micros(1_000_000))
            .expect("built-in algorithm")
        {
            call.arg(a);
        }
        let answer: redis::RedisResult<Vec<i64>> = call.query_async(&mut con).await;
        let e = answer.expect_err("refused");
        assert_eq!(e.code(), Some("TOLLGATE_TIME"), "{engine:?}: {e}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&full)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(!exists, "{engine:?}: nothing written");
    }
}

/// A store on `server` running its code as `engine` says, and a plain
/// connection to look at its keys.
async fn store_and_connection(
    server: &RedisServer,
    engine: tollgate_redis::Engine,
    clock: ManualClock,
) -> (
    tollgate_redis::RedisStore,
    redis::aio::MultiplexedConnection,
) {
    let store = common::store_with(server.url(), clock, ConnectionMode::Multiplexed, engine).await;
    (store, common::raw(server.url()).await)
}
