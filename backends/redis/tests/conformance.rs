//! The store conformance suite on the Redis store (multiplexed connection and
//! bb8 pool, function library; the script form; Tollgate's native module),
//! against a real redis-server, time from the manual clock.

mod common;

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
