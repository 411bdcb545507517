//! Helpers shared by the Redis store's integration tests.
#![allow(dead_code)] // each test binary uses a different part

pub mod keyspace;
pub mod load;

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use tollgate_limiter::{Clock, ManualClock};
use tollgate_redis::{ConnectionMode, Engine, RedisStore};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;

/// A store on `url` with a prefix no other test uses, reading time from `clock`.
pub async fn store_at(url: &str, clock: ManualClock, mode: ConnectionMode) -> RedisStore {
    store_with(url, clock, mode, Engine::Auto).await
}

/// The same, running its code as `engine` says.
pub async fn store_with(
    url: &str,
    clock: ManualClock,
    mode: ConnectionMode,
    engine: Engine,
) -> RedisStore {
    RedisStore::builder(url)
        .prefix(unique("t"))
        .clock(Arc::new(clock) as Arc<dyn Clock>)
        .connection_mode(mode)
        .engine(engine)
        .connect()
        .await
        .expect("connect to the test redis-server")
}

/// A store on the shared server (multiplexed), reading time from `clock`.
pub async fn store(clock: ManualClock) -> RedisStore {
    store_at(
        RedisServer::shared().url(),
        clock,
        ConnectionMode::Multiplexed,
    )
    .await
}

/// A plain connection, for looking at what the store wrote.
pub async fn raw(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test redis-server")
}

/// Every state key under `prefix`, by SCAN (the permission check's keys,
/// which live for a millisecond after connect, are not states).
pub async fn keys_under(con: &mut MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .expect("SCAN");
        keys.extend(
            batch
                .into_iter()
                .filter(|k| !k.contains("{tollgate-probe}")),
        );
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// Writes values Tollgate did not write at a store's keys, as another
/// application sharing the Redis and the prefix would (standalone or
/// Cluster: any connection).
pub struct RedisForeign<C> {
    pub con: C,
    pub prefix: String,
}

impl<C> RedisForeign<C> {
    fn key(&self, key: &tollgate_limiter::StoreKey<'_>) -> String {
        format!("{}:{key}", self.prefix)
    }
}

#[tollgate_limiter::async_trait]
impl<C> tollgate_testkit::conformance::ForeignWriter for RedisForeign<C>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync,
{
    fn kinds(&self) -> Vec<&'static str> {
        vec![
            "string",
            "numbers",
            "list",
            "number-list",
            "descending-times",
            "comma-times",
            "hash",
            "set",
        ]
    }

    async fn plant(&self, key: &tollgate_limiter::StoreKey<'_>, kind: &str) {
        let mut con = self.con.clone();
        let key = self.key(key);
        let mut cmd = match kind {
            "string" | "numbers" | "comma-times" => redis::cmd("SET"),
            "list" | "number-list" | "descending-times" => redis::cmd("RPUSH"),
            "hash" => redis::cmd("HSET"),
            _ => redis::cmd("SADD"),
        };
        cmd.arg(&key);
        match kind {
            "string" => cmd.arg("garbage"),
            // Two numbers: close to a counter state, but not one.
            "numbers" => cmd.arg("12 34"),
            // Two times in range, in order, of a text log's length: close
            // to a concurrency limit's holders, but a comma apart.
            "comma-times" => cmd.arg(COMMA_TIMES),
            "list" => cmd.arg("x").arg("y"),
            // Numbers, but not times: close to a sliding log, but not one.
            "number-list" => cmd.arg("1").arg("2").arg("3"),
            // Times in range, newest first: close to a sliding log, but
            // its ends are out of order.
            "descending-times" => cmd.arg(DESCENDING[0]).arg(DESCENDING[1]),
            "hash" => cmd.arg("field").arg("value"),
            _ => cmd.arg("member"),
        };
        cmd.query_async::<()>(&mut con).await.expect("plant");
    }

    async fn intact(&self, key: &tollgate_limiter::StoreKey<'_>, kind: &str) -> bool {
        let mut con = self.con.clone();
        let key = self.key(key);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .expect("PTTL");
        let value: Vec<String> = match kind {
            "string" | "numbers" | "comma-times" => vec![redis::cmd("GET")
                .arg(&key)
                .query_async(&mut con)
                .await
                .expect("GET")],
            "list" | "number-list" | "descending-times" => redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .expect("LRANGE"),
            "hash" => redis::cmd("HGETALL")
                .arg(&key)
                .query_async(&mut con)
                .await
                .expect("HGETALL"),
            _ => redis::cmd("SMEMBERS")
                .arg(&key)
                .query_async(&mut con)
                .await
                .expect("SMEMBERS"),
        };
        let expected: &[&str] = match kind {
            "string" => &["garbage"],
            "numbers" => &["12 34"],
            "comma-times" => &[COMMA_TIMES],
            "list" => &["x", "y"],
            "number-list" => &["1", "2", "3"],
            "descending-times" => &DESCENDING,
            "hash" => &["field", "value"],
            _ => &["member"],
        };
        ttl == -1 && value == expected
    }
}

/// The value of the `comma-times` kind.
const COMMA_TIMES: &str = "1800000000000000,1800000000000009";

/// The items of the `descending-times` kind.
const DESCENDING: [&str; 2] = ["1800000000000009", "1800000000000000"];

/// The time scale of a built-in policy: its period, window, or burst ×
/// interval (µs).
pub fn time_scale(limit: &tollgate_limiter::Limit) -> u64 {
    use tollgate_limiter::Limit;
    match limit {
        Limit::TokenBucket(p) => p.period_us(),
        Limit::Gcra(p) => p.interval_us() * p.burst(),
        Limit::FixedWindow(p) => p.window_us(),
        Limit::SlidingWindow(p) => p.window_us(),
        Limit::SlidingLog(p) => p.window_us(),
        Limit::Concurrency(p) => p.lease_us(),
        Limit::Calendar(_) => tollgate_limiter::duration_micros(limit.window().expect("built-in")),
        Limit::Custom(_) => unreachable!("built-in algorithms only"),
    }
}
