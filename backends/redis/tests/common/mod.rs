//! Helpers shared by the Redis store's integration tests.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use tollgate_core::{Clock, ManualClock};
use tollgate_redis::{ConnectionMode, RedisStore};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;

/// A store on `url` with a prefix no other test uses, reading time from `clock`.
pub async fn store_at(url: &str, clock: ManualClock, mode: ConnectionMode) -> RedisStore {
    RedisStore::builder(url)
        .prefix(unique("t"))
        .clock(Arc::new(clock) as Arc<dyn Clock>)
        .connection_mode(mode)
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

/// Every key under `prefix`, by SCAN.
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
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}
