//! The Sentinel store against real processes on loopback — a primary, a
//! replica and three `redis-server --sentinel` — : the conformance suite,
//! and the primary killed under load: the failure mode decides while no
//! primary answers, decisions come back from the store after the
//! promotion, and the gap is printed.

use crate::common;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tollgate_limiter::{
    Clock, Limit, Limiter, ManualClock, OnStoreFailure, Policy, Scope, Source, Store,
};
use tollgate_redis::{AclRule, ConnectionMode, RedisStore, RedisStoreError};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_sentinel::{RedisSentinels, DOWN_AFTER_MS, SERVICE};

use common::load::{max_latency, recovered, Load};

/// The store's deadline in the failover test.
const DEADLINE: Duration = Duration::from_millis(50);

fn group() -> &'static RedisSentinels {
    static GROUP: OnceLock<RedisSentinels> = OnceLock::new();
    GROUP.get_or_init(RedisSentinels::start)
}

mod conformance {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            RedisStore::sentinel(group().sentinel_urls(), SERVICE)
                .prefix(unique("sen"))
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect through the sentinels"),
        ) as Arc<dyn Store>
    });
}

/// The same suite through a pool of connections to the primary.
mod pool_conformance {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(
            RedisStore::sentinel(group().sentinel_urls(), SERVICE)
                .connection_mode(ConnectionMode::Pool { size: 4 })
                .prefix(unique("senp"))
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .connect()
                .await
                .expect("connect a pool through the sentinels"),
        ) as Arc<dyn Store>
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_service_is_named_in_the_error() {
    let error = RedisStore::sentinel(group().sentinel_urls(), "no-such-service")
        .connect()
        .await
        .expect_err("no sentinel monitors it");
    match RedisStoreError::of(&error) {
        Some(RedisStoreError::NoPrimary { service, detail }) => {
            assert_eq!(service, "no-such-service");
            assert!(detail.contains("does not monitor"), "{detail}");
        }
        _ => panic!("expected NoPrimary, got {error:?}"),
    }
}

/// A Redis user with exactly the least-privilege rule for Sentinel
/// decides through the primary; one without `+role` is told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_rule_for_sentinel_decides() {
    // Its own group: the failover tests move the shared one's primary.
    let group = RedisSentinels::start();
    let set_user = |user: &str, rule: AclRule| {
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">pw"];
        let rule = rule.to_string();
        args.extend(rule.split_whitespace());
        let reply = group.primary().command(&args);
        assert_eq!(reply, tollgate_testkit::resp::Reply::Status("OK".into()));
    };
    set_user("tollgate", AclRule::new("acl").sentinel(true));
    set_user("no-role", AclRule::new("acl"));
    let connect = |user: &'static str| {
        RedisStore::sentinel(group.sentinel_urls(), SERVICE)
            .prefix(unique("acl:s"))
            .primary_auth(Some(user), "pw")
            .connect_timeout(Duration::from_secs(2))
            .connect()
    };
    let store = connect("tollgate").await.expect("the rule suffices");
    let policy = Policy::new(
        "api",
        Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap();
    let ctx = tollgate_limiter::Context::for_subject(tollgate_limiter::Subject::new("s").unwrap());
    let decision = limiter.check(&ctx, 1).await.unwrap();
    assert_eq!(decision.layers()[0].source, Source::Store);
    let error = connect("no-role").await.expect_err("ROLE is refused");
    assert!(
        format!("{error}").contains("AclRule::sentinel(true)"),
        "{error}"
    );
}

/// A sentinel that accepts connections and never answers (its host
/// hung) costs nothing when the others answer: they are asked at once,
/// not after it timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_sentinel_does_not_hide_the_others() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut urls = vec![format!("redis://{}/", silent.local_addr().unwrap())];
    urls.extend(group().sentinel_urls());
    let store = RedisStore::sentinel(urls, SERVICE)
        .prefix(unique("silent"))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect("the other sentinels name the primary");
    let policy = Policy::new(
        unique("p"),
        Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap();
    let ctx = tollgate_limiter::Context::for_subject(tollgate_limiter::Subject::new("k").unwrap());
    assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_fail_within_the_connect_timeout() {
    let started = std::time::Instant::now();
    let error = RedisStore::sentinel(["redis://127.0.0.1:1/"], SERVICE)
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            RedisStoreError::of(&error),
            Some(RedisStoreError::NoPrimary { .. })
        ) || matches!(error, tollgate_limiter::StoreError::Timeout(_)),
        "{error:?}"
    );
}

/// The primary is reached as the sentinels are, so they must all be
/// alike: a list mixing TLS and plain (in any spelling) is refused.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_mixing_tls_and_plain_are_refused() {
    for tls in [
        "rediss://127.0.0.1:1/",
        "REDISS://127.0.0.1:1/",
        "valkeys://127.0.0.1:1/",
    ] {
        let error = RedisStore::sentinel([tls, "redis://127.0.0.1:2/"], SERVICE)
            .connect()
            .await
            .expect_err("mixed");
        assert!(
            matches!(
                RedisStoreError::of(&error),
                Some(RedisStoreError::InvalidSetting(why)) if why.contains("mix TLS")
            ),
            "{tls}: {error:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_only_settings_are_refused_on_a_url_store() {
    let error = RedisStore::builder("redis://127.0.0.1:6379/")
        .primary_db(1)
        .build()
        .expect_err("primary_db on a URL store");
    assert!(
        error.to_string().contains("RedisStore::sentinel"),
        "{error}"
    );
}

/// Kill the primary under load: every decision is bounded by the
/// deadline, the failure mode decides while there is no primary, and the
/// store decides again once the sentinels promoted the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_fails_over_and_decisions_resume() {
    fail_over_under_load(ConnectionMode::Multiplexed, Stop::Kill).await;
}

/// A primary frozen (`SIGSTOP`: its sockets stay open, nothing answers, as
/// when its host dies without a word): no call ever fails with an error,
/// yet after a few calls unanswered past their deadline the store asks the
/// sentinels again and finds the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_fails_over_and_decisions_resume() {
    fail_over_under_load(ConnectionMode::Multiplexed, Stop::Freeze).await;
}

/// How the primary stops.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Kill,
    Freeze,
}

/// The same with a pool: its connections to the dead primary are dropped
/// and new ones reach the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_fails_over_and_a_pool_resumes() {
    fail_over_under_load(ConnectionMode::Pool { size: 4 }, Stop::Kill).await;
}

/// A frozen primary behind a pool: a connection whose calls go
/// unanswered past their deadline is dropped when it comes back to the
/// pool, and a new one reaches the promoted replica (before, no error ever
/// marked it broken, and every decision timed out until TCP gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_fails_over_and_a_pool_resumes() {
    fail_over_under_load(ConnectionMode::Pool { size: 4 }, Stop::Freeze).await;
}

async fn fail_over_under_load(mode: ConnectionMode, stop: Stop) {
    let group = RedisSentinels::start();
    let store = RedisStore::sentinel(group.sentinel_urls(), SERVICE)
        .connection_mode(mode)
        .prefix(unique("failover"))
        .deadline(DEADLINE)
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect through the sentinels");
    let policy = Policy::new(
        "api",
        Limit::token_bucket(1_000_000, 1_000_000, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
    .with_on_failure(OnStoreFailure::FailClosed)
    .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("client", Scope::Subject, policy)
        .build()
        .unwrap();

    let load = Load::start(&limiter);
    tokio::time::sleep(Duration::from_millis(200)).await;
    match stop {
        Stop::Kill => group.primary().kill(),
        Stop::Freeze => group.primary().pause(),
    }
    let killed_at = load.now();
    let promotion = tokio::task::spawn_blocking(move || {
        let took = group.wait_for_failover();
        (group, took)
    });
    let (group, promoted_after) = promotion.await.expect("failover");
    let back_after = recovered(&load, load.now(), Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = load.finish().await;

    let before: Vec<_> = seen.iter().filter(|(_, s)| s.at < killed_at).collect();
    assert!(
        before.iter().any(|(_, s)| s.source == Source::Store),
        "the store decided before the kill"
    );
    let during: Vec<_> = seen
        .iter()
        .filter(|(_, s)| s.at > killed_at + DEADLINE && s.source != Source::Store)
        .collect();
    assert!(!during.is_empty(), "some decisions met no primary");
    assert!(
        during.iter().all(|(_, s)| !s.allowed),
        "fail-closed denies while there is no primary"
    );
    let last_failed = during.iter().map(|(_, s)| s.at).max().unwrap();
    let first_back = seen
        .iter()
        .filter(|(_, s)| s.at > killed_at && s.source == Source::Store)
        .map(|(_, s)| s.at)
        .min()
        .expect("decisions came back from the store");
    let slowest = max_latency(&seen);
    println!(
        "Sentinel failover, {mode:?}, {stop:?} (down-after {DOWN_AFTER_MS} ms): {} decisions; \
         the sentinels promoted the replica {promoted_after:?} after the kill was noticed; \
         first store decision {:?} after the kill (last failure-mode decision at {:?}); \
         decisions back {back_after:?} after the promotion; slowest decision {slowest:?}",
        seen.len(),
        first_back - killed_at,
        last_failed - killed_at,
    );
    assert!(
        slowest <= DEADLINE + Duration::from_millis(150),
        "a decision took {slowest:?}, past the deadline"
    );
    drop(group);
}

/// With `replica_ack` and a lagging replica, each admitted decision's
/// `WAIT` takes its whole timeout. On one multiplexed connection every
/// call queued behind it waits too, denials included; on a pool a `WAIT`
/// holds up only its own connection. Prints the slowest denial of each
/// mode (before: the multiplexed connection; after: the pool) and holds
/// the pool's under the `WAIT` timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_pool_a_lagging_replica_does_not_hold_up_denials() {
    const WAIT: Duration = Duration::from_millis(100);
    let group = tokio::task::spawn_blocking(RedisSentinels::start)
        .await
        .unwrap();
    let mut slowest = Vec::new();
    for mode in [
        ConnectionMode::Multiplexed,
        ConnectionMode::Pool { size: 16 },
    ] {
        let store = RedisStore::sentinel(group.sentinel_urls(), SERVICE)
            .connection_mode(mode)
            .prefix(unique("lag"))
            .replica_ack(1, WAIT)
            .deadline(Duration::from_millis(400))
            .connect()
            .await
            .expect("connect through the sentinels");
        // One unit per ten minutes, refilled continuously: a fixed window
        // ended at its ten-minute boundary and admitted (a failed test
        // when the boundary fell in the run).
        let policy =
            Policy::new("lag", Limit::gcra(1, Duration::from_secs(600), 1).unwrap()).unwrap();
        let denied_key = || tollgate_limiter::StoreKey::new("lag", &policy, "s", "full");
        let full = [tollgate_limiter::LayerRequest {
            key: denied_key(),
            policy: &policy,
            cost: 1,
        }];
        assert!(
            tollgate_limiter::ask(&store, &full)
                .await
                .expect("charged and acknowledged")[0]
                .allowed
        );

        group.replica().pause();
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (store, policy) = (store.clone(), policy.clone());
                tokio::spawn(async move {
                    for i in 0..6 {
                        let subject = format!("w{w}-{i}");
                        let key = tollgate_limiter::StoreKey::new("lag", &policy, "s", &subject);
                        let layer = [tollgate_limiter::LayerRequest {
                            key,
                            policy: &policy,
                            cost: 1,
                        }];
                        // Charged, then not acknowledged in time (or, on
                        // one connection, not even sent in time).
                        let result = tollgate_limiter::ask(&store, &layer).await;
                        assert!(result.is_err(), "the replica lags: {result:?}");
                    }
                })
            })
            .collect();
        let mut worst = Duration::ZERO;
        tokio::time::sleep(Duration::from_millis(20)).await;
        for _ in 0..40 {
            let started = std::time::Instant::now();
            match tollgate_limiter::ask(&store, &full).await {
                Ok(verdicts) => assert!(!verdicts[0].allowed),
                // Queued behind the WAITs past its deadline.
                Err(e) => assert!(
                    mode == ConnectionMode::Multiplexed
                        && matches!(e, tollgate_limiter::StoreError::Timeout(_)),
                    "{mode:?}: a denial needs no WAIT: {e:?}"
                ),
            }
            worst = worst.max(started.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for writer in writers {
            writer.await.expect("writer");
        }
        group.replica().resume();
        slowest.push((mode, worst));
    }
    println!("slowest denial under a lagging replica (WAIT timeout {WAIT:?}): {slowest:?}");
    let (_, pooled) = slowest[1];
    assert!(
        pooled < WAIT,
        "on a pool a denial waits behind no WAIT: {slowest:?}"
    );
}
