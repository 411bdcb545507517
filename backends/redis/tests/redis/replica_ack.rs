//! Replica acknowledgement (`replica_ack`) with a real primary and
//! replica: charges acknowledged with it on survive the primary's death
//! (the promoted replica holds every one); with it off a charge the
//! replica never received is lost; with it on, a replica that does not
//! acknowledge fails the decision within the bound instead of admitting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_limiter::{
    Clock, Context, Hold, LayerRequest, Limit, Limiter, ManualClock, Policy, Scope, Store,
    StoreKey, Subject,
};
use tollgate_redis::{RedisStore, RedisStoreError};
use tollgate_testkit::conformance::{unique, START};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::resp::Reply;

/// Requests a key may make: the capacity of the policy.
const CAPACITY: u64 = 20;
/// How long a decision waits for a replica that never acknowledges.
const ACK_TIMEOUT: Duration = Duration::from_millis(300);
/// How long a decision waits for a healthy replica: generous, because the
/// tests of this binary share two cores with a six-node cluster.
const PATIENT_ACK: Duration = Duration::from_secs(3);

/// A primary and a replica following it, with the link up.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let port = primary.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(replication(&replica).contains("master_link_status:up")
        && replication(&primary).contains("state=online"))
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Right after its first sync a replica may take a moment to answer
    // the acknowledgement requests `WAIT` sends: wait for one here, so the
    // tests start from steady replication.
    let acked = primary.command(&["WAIT", "1", "10000"]);
    assert_eq!(acked, Reply::Int(1), "the replica acknowledges");
    (primary, replica)
}

fn replication(server: &RedisServer) -> String {
    server
        .command(&["INFO", "replication"])
        .text()
        .unwrap_or_default()
}

/// A limiter of `CAPACITY` requests per hour on `url`, at the manual
/// clock, waiting up to `ack` for one replica after each charge.
async fn limiter(url: &str, prefix: &str, clock: &ManualClock, ack: Option<Duration>) -> Limiter {
    let mut builder = RedisStore::builder(url)
        .prefix(prefix)
        .deadline(Duration::from_secs(5))
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>);
    if let Some(timeout) = ack {
        builder = builder.replica_ack(1, timeout);
    }
    login_limiter(Arc::new(builder.connect().await.expect("connect")))
}

/// `CAPACITY` requests per hour per user on `store`.
fn login_limiter(store: Arc<dyn Store>) -> Limiter {
    let policy = Policy::new(
        "login",
        Limit::token_bucket(CAPACITY, CAPACITY, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    Limiter::builder(store)
        .layer("user", Scope::Subject, policy)
        .build()
        .unwrap()
}

/// Kill the primary and promote the replica, as a failover would.
fn fail_over(primary: &RedisServer, replica: &RedisServer) {
    primary.kill();
    let reply = replica.command(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(reply, Reply::Status("OK".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_charges_survive_the_primary() {
    let (primary, replica) = primary_and_replica();
    let clock = ManualClock::new(START);
    let prefix = unique("ack");
    let ctx = Context::for_subject(Subject::new("alice").unwrap());
    let on_primary = limiter(primary.url(), &prefix, &clock, Some(PATIENT_ACK)).await;
    for i in 0..CAPACITY {
        let decision = on_primary.check(&ctx, 1).await.expect("acknowledged");
        assert!(decision.is_allowed(), "request {i}: {decision:?}");
    }
    // Killed right after the last acknowledged decision.
    fail_over(&primary, &replica);
    let on_replica = limiter(replica.url(), &prefix, &clock, None).await;
    let decision = on_replica.check(&ctx, 1).await.unwrap();
    assert!(
        !decision.is_allowed(),
        "every acknowledged charge is on the promoted replica"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_charges_are_lost_and_acknowledgement_refuses_them() {
    let (primary, replica) = primary_and_replica();
    // The replica falls behind for good: its link to the primary is cut
    // (it follows a port nobody listens on), as a lagging replica would.
    let reply = replica.command(&["REPLICAOF", "127.0.0.1", "1"]);
    assert_eq!(reply, Reply::Status("OK".into()));
    let clock = ManualClock::new(START);
    let prefix = unique("ack");
    let ctx = Context::for_subject(Subject::new("bob").unwrap());

    // With acknowledgement on, no charge is admitted that no replica holds.
    let acked = limiter(primary.url(), &prefix, &clock, Some(ACK_TIMEOUT)).await;
    let started = Instant::now();
    let decision = acked.check(&ctx, 1).await.unwrap();
    let waited = started.elapsed();
    // The failure mode (fail closed, the default) decides: denied.
    assert!(
        !decision.is_allowed() && decision.failed_closed(),
        "{decision:?}"
    );
    assert!(
        waited >= ACK_TIMEOUT && waited < ACK_TIMEOUT + Duration::from_secs(2),
        "WAIT is bounded by its timeout: {waited:?}"
    );
    let store = RedisStore::builder(primary.url())
        .prefix(unique("ack"))
        .deadline(Duration::from_millis(500))
        .replica_ack(1, Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let policy = Policy::new("login", Limit::gcra(1, Duration::from_secs(1), 5).unwrap()).unwrap();
    let key = StoreKey::new("carol", &policy, "subject", "carol");
    let error = tollgate_limiter::ask(
        &store,
        &[LayerRequest {
            key,
            policy: &policy,
            cost: 1,
        }],
    )
    .await
    .expect_err("not acknowledged");
    assert!(
        matches!(
            RedisStoreError::of(&error),
            Some(RedisStoreError::NotReplicated {
                acknowledged: 0,
                wanted: 1,
                ..
            })
        ),
        "{error:?}"
    );

    // With it off, the primary admits, and the charges die with it.
    let plain = limiter(primary.url(), &prefix, &clock, None).await;
    for i in 0..CAPACITY - 1 {
        let decision = plain.check(&ctx, 1).await.unwrap();
        assert!(decision.is_allowed(), "request {i}");
    }
    fail_over(&primary, &replica);
    let on_replica = limiter(replica.url(), &prefix, &clock, None).await;
    let decision = on_replica.check(&ctx, 1).await.unwrap();
    assert_eq!(
        decision.layers()[0].verdict().remaining,
        CAPACITY - 1,
        "the promoted replica never saw the charges: the key starts full again"
    );
}

/// A primary whose replica is gone (it follows a server that is not
/// there), and two stores on it under one prefix: one waiting `ack` for
/// the replica, one not.
async fn without_its_replica(
    ack: Duration,
) -> ((RedisServer, RedisServer), RedisStore, RedisStore) {
    let (primary, replica) = primary_and_replica();
    let reply = replica.command(&["REPLICAOF", "127.0.0.1", "1"]);
    assert_eq!(reply, Reply::Status("OK".into()));
    let prefix = unique("hold");
    let store = |ack: Option<Duration>| {
        let mut builder = RedisStore::builder(primary.url())
            .prefix(&prefix)
            .deadline(Duration::from_secs(2));
        if let Some(timeout) = ack {
            builder = builder.replica_ack(1, timeout);
        }
        builder.connect()
    };
    let (acked, plain) = (store(Some(ack)).await.unwrap(), store(None).await.unwrap());
    ((primary, replica), acked, plain)
}

/// One place at a time, for a minute.
fn exports() -> Policy {
    Policy::new(
        "exports",
        Limit::concurrency(1, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
}

/// A concurrency hold the replicas did not acknowledge is reported failed,
/// so no permit will give it back: the store gives it back itself (before,
/// every acquire during a replica's lag took a place until its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_hold_is_given_back() {
    let (_servers, acked, plain) = without_its_replica(Duration::from_millis(50)).await;
    let policy = exports();
    let request = [LayerRequest {
        key: StoreKey::new("dave", &policy, "subject", "dave"),
        policy: &policy,
        cost: 1,
    }];
    let error = acked.acquire(&request).await.expect_err("not acknowledged");
    assert!(
        matches!(
            RedisStoreError::of(&error),
            Some(RedisStoreError::NotReplicated { .. })
        ),
        "{error:?}"
    );
    // Given back before the error was answered: free at once.
    let (verdicts, holds) = plain.acquire(&request).await.unwrap();
    assert!(
        verdicts[0].allowed,
        "the place was given back: {verdicts:?}"
    );
    plain.release(&request, &[holds[0].unwrap()]).await.unwrap();
}

/// The hold of `request` once its place is free again: the store gives
/// back an abandoned reservation's holds on a task of its own, soon after.
async fn given_back(store: &RedisStore, request: &[LayerRequest<'_>]) -> Hold {
    for _ in 0..50 {
        let (verdicts, holds) = store.acquire(request).await.unwrap();
        if let (true, Some(hold)) = (verdicts[0].allowed, holds[0]) {
            return hold;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the place did not come back within a second (its lease is a minute)");
}

/// An acquisition abandoned while it waits for its replicas (its deadline,
/// or its caller, gone first) gives its holds back too: before, only a
/// `WAIT` that answered "not acknowledged" did, and a dropped one left the
/// place taken until its lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_abandoned_while_waiting_for_replicas_is_given_back() {
    let (_servers, acked, plain) = without_its_replica(Duration::from_secs(1)).await;
    let policy = exports();
    let request = [LayerRequest {
        key: StoreKey::new("erin", &policy, "subject", "erin"),
        policy: &policy,
        cost: 1,
    }];
    let abandoned = tokio::time::timeout(Duration::from_millis(100), acked.acquire(&request));
    assert!(abandoned.await.is_err(), "abandoned while WAIT waited");
    let hold = given_back(&plain, &request).await;
    plain.release(&request, &[hold]).await.unwrap();
}

/// A `WAIT` that used its timeout leaves the call little of its deadline:
/// the refund, sent as soon as the `WAIT` answers, still runs when the
/// call is cut off before its reply (a command sent is not taken back).
/// Writes are paused from before the `WAIT` ends until after the
/// deadline, so the refund cannot run within the call's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_outlives_the_deadline_its_wait_used_up() {
    let ((primary, _replica), acked, plain) =
        without_its_replica(Duration::from_millis(1_500)).await;
    let policy = exports();
    let request = [LayerRequest {
        key: StoreKey::new("frank", &policy, "subject", "frank"),
        policy: &policy,
        cost: 1,
    }];
    let acquiring = async {
        let error = acked.acquire(&request).await.expect_err("not acknowledged");
        assert_eq!(error.class(), "timeout", "{error:?}");
    };
    let pause = async {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        let reply = primary.command(&["CLIENT", "PAUSE", "1000", "WRITE"]);
        assert_eq!(reply, Reply::Status("OK".into()));
    };
    tokio::join!(acquiring, pause);
    let hold = given_back(&plain, &request).await;
    plain.release(&request, &[hold]).await.unwrap();
}

#[test]
fn settings_that_cannot_be_honoured_are_refused() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    for (replicas, timeout) in [
        (0, Duration::from_millis(10)),
        (1, Duration::ZERO),
        (1, Duration::from_millis(50)),
    ] {
        let error = RedisStore::builder("redis://127.0.0.1:1/")
            .deadline(Duration::from_millis(50))
            .replica_ack(replicas, timeout)
            .build()
            .expect_err("refused");
        assert!(
            matches!(
                RedisStoreError::of(&error),
                Some(RedisStoreError::InvalidReplicaAck(_))
            ),
            "{error:?}"
        );
    }
}

/// The Cluster store waits on the master that took the charge: the
/// replica promoted after that master's death holds every acknowledged
/// charge.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_charges_survive_a_cluster_failover() {
    use tollgate_redis::cluster::RedisClusterStore;
    use tollgate_testkit::redis_cluster::RedisCluster;

    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let prefix = unique("ackc");
    let clock = ManualClock::new(START);
    let cluster_limiter = |cluster: &RedisCluster, ack: bool| {
        let mut builder = RedisClusterStore::builder(cluster.urls())
            .prefix(prefix.clone())
            .deadline(Duration::from_secs(5))
            .clock(Arc::new(clock.clone()) as Arc<dyn Clock>);
        if ack {
            builder = builder.replica_ack(1, PATIENT_ACK);
        }
        async move {
            login_limiter(Arc::new(
                builder.connect().await.expect("connect to the cluster"),
            ))
        }
    };
    let ctx = Context::for_subject(Subject::new("dave").unwrap());
    let key = format!("{prefix}:{{dave}}:login:v1:tb:s");
    let master = cluster.master_for_slot(cluster.keyslot(&key));
    // Steady replication first (see `primary_and_replica`).
    assert_eq!(
        cluster.command(master, &["WAIT", "1", "10000"]),
        Ok(Reply::Int(1))
    );
    let acked = cluster_limiter(&cluster, true).await;
    for i in 0..CAPACITY {
        let decision = acked.check(&ctx, 1).await.expect("acknowledged");
        assert!(decision.is_allowed(), "request {i}: {decision:?}");
    }
    // The state is on the master about to die.
    assert_eq!(
        cluster.command(master, &["EXISTS", &key]),
        Ok(Reply::Int(1)),
        "{key}"
    );
    let slot = cluster.keyslot(&key);
    cluster.kill(master);
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wait_for_failover(master, slot);
        cluster
    })
    .await
    .unwrap();
    let after = cluster_limiter(&cluster, false).await;
    let decision = after.check(&ctx, 1).await.unwrap();
    assert!(
        !decision.is_allowed() && decision.store_error().is_none(),
        "the promoted replica holds every acknowledged charge: {decision:?}"
    );
}

/// On the Cluster, a renewed or released hold is acknowledged by the
/// replicas as a charge is: a renewal a failover undid would let a second
/// holder in while the first still works.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_renewals_and_releases_wait_for_replicas() {
    use tollgate_redis::cluster::RedisClusterStore;
    use tollgate_testkit::command_stats::command_stats;
    use tollgate_testkit::redis_cluster::RedisCluster;

    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisClusterStore::builder(cluster.urls())
        .prefix(unique("ackr"))
        .deadline(Duration::from_secs(5))
        .replica_ack(1, PATIENT_ACK)
        .connect()
        .await
        .expect("connect to the cluster");
    let policy = Policy::new(
        "inflight",
        Limit::concurrency(2, Duration::from_secs(30)).unwrap(),
    )
    .unwrap();
    let scope = Scope::Subject.key_label();
    let key = StoreKey::new("erin", &policy, &scope, "erin");
    let master = cluster.master_for_slot(cluster.keyslot(&store.settings().redis_key(&key)));
    let layers = [LayerRequest {
        key,
        policy: &policy,
        cost: 1,
    }];
    let waits = || match cluster.command(master, &["INFO", "commandstats"]) {
        Ok(Reply::Bulk(Some(info))) => command_stats(&String::from_utf8_lossy(&info))
            .get("wait")
            .map_or(0, |s| s.calls),
        other => panic!("INFO: {other:?}"),
    };
    let (_, held) = store.acquire(&layers).await.expect("acquired");
    let holds: Vec<_> = held.into_iter().map(|h| h.expect("held")).collect();
    let before = waits();
    let renewed = store.renew(&layers, &holds).await.expect("renewed");
    assert!(waits() > before, "the renewal was acknowledged");
    let holds: Vec<_> = renewed
        .into_iter()
        .map(|h| h.expect("still held"))
        .collect();
    let before = waits();
    store.release(&layers, &holds).await.expect("released");
    assert!(waits() > before, "the release was acknowledged");

    // A hold the replicas do not acknowledge is reported failed, and given
    // back: no permit would release it.
    let replica = cluster.replica_of(master).expect("the master's replica");
    cluster.kill(replica);
    let prefix = store.settings().prefix().to_string();
    let on_prefix = |ack: Option<Duration>| {
        let mut builder = RedisClusterStore::builder(cluster.urls())
            .prefix(&prefix)
            .deadline(Duration::from_secs(5));
        if let Some(timeout) = ack {
            builder = builder.replica_ack(1, timeout);
        }
        builder.connect()
    };
    let impatient = on_prefix(Some(Duration::from_millis(50))).await.unwrap();
    for _ in 0..2 {
        let error = impatient
            .acquire(&layers)
            .await
            .expect_err("not acknowledged");
        assert!(
            matches!(
                tollgate_redis::RedisStoreError::of(&error),
                Some(tollgate_redis::RedisStoreError::NotReplicated { .. })
            ),
            "{error:?}"
        );
    }
    let plain = on_prefix(None).await.unwrap();
    for place in 0..2 {
        let (verdicts, _) = plain.acquire(&layers).await.unwrap();
        assert!(verdicts[0].allowed, "place {place} was given back");
    }
}

/// A charge (or an operator's write) redirected while its slot moves
/// (`ASK`: the key is on the target already) is acknowledged by the
/// replicas of the node that took it: `WAIT` goes there. Before, it went to the slot's master in the
/// client's map, which never received the charge and answered at once
/// with its own replica: the charge counted as acknowledged although the
/// target's replica was gone.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirected_charge_waits_for_the_replicas_of_the_node_that_took_it() {
    use tollgate_redis::cluster::RedisClusterStore;
    use tollgate_testkit::redis_cluster::{RedisCluster, MASTERS};

    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let store = RedisClusterStore::builder(cluster.urls())
        .prefix(unique("ackm"))
        .deadline(Duration::from_secs(2))
        .replica_ack(1, Duration::from_millis(300))
        .connect()
        .await
        .expect("connect to the cluster");
    let policy = Policy::new(
        "p",
        Limit::fixed_window(100, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let scope = Scope::Subject.key_label();
    let request = [LayerRequest {
        key: StoreKey::new("dave", &policy, &scope, "dave"),
        policy: &policy,
        cost: 1,
    }];
    let slot = cluster.keyslot(&store.settings().redis_key(&request[0].key));
    let from = cluster.master_for_slot(slot);
    let to = (0..MASTERS)
        .map(|m| cluster.master_for_slot(cluster.slot_of_master(m)))
        .find(|&m| m != from)
        .expect("another master");
    // The target's replica is gone; the source's answers.
    cluster.kill(cluster.replica_of(to).expect("the target's replica"));
    tollgate_limiter::ask(&store, &request)
        .await
        .expect("acknowledged on the source");
    let migration = cluster.begin_migration(slot, to);
    assert_eq!(migration.move_keys(100), 1, "the key moved");
    let not_replicated = |answer: Result<(), tollgate_limiter::StoreError>| match answer {
        Err(e) => matches!(
            RedisStoreError::of(&e),
            Some(RedisStoreError::NotReplicated { .. })
        ),
        Ok(()) => false,
    };
    let decided = tollgate_limiter::ask(&store, &request).await.map(|_| ());
    assert!(
        not_replicated(decided),
        "taken by the target, whose replica is gone"
    );
    // So is an operator's write (a reset here).
    assert!(
        not_replicated(store.reset(&request).await),
        "reset on the target"
    );
    migration.finish();
}
