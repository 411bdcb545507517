//! The Redis Cluster store on a real 3-master, 3-replica cluster: the
//! conformance suite, layers across slots under concurrency (never
//! over-admitting, never leaking a charge), one script call per slot group,
//! a slot migrated under traffic (`ASK`, `MOVED`, `TRYAGAIN`), and, on a
//! cluster of its own, `NOSCRIPT` from any node and a master killed under
//! load (automatic failover, with the failure mode applying during the gap,
//! which is printed).
#![cfg(feature = "cluster")]

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate_limiter::{
    BreakerConfig, Clock, Context, Limit, Limiter, ManualClock, OnStoreFailure, Policy, Scope,
    Source, Store, Subject,
};
use tollgate_redis::cluster::{hash_slot, RedisClusterStore};
use tollgate_testkit::conformance::{decide_concurrently, every_algorithm_over, unique, START};
use tollgate_testkit::redis_cluster::{RedisCluster, Reply, MASTERS};

/// The deadline of stores in tests that do not measure it: long enough that
/// a loaded two-core machine (six servers and the tests) never times out.
const PATIENT: Duration = Duration::from_secs(2);

async fn store_on(cluster: &RedisCluster, clock: Option<ManualClock>) -> RedisClusterStore {
    let mut builder = RedisClusterStore::builder(cluster.urls())
        .prefix(unique("c"))
        .deadline(PATIENT);
    if let Some(clock) = clock {
        builder = builder.clock(Arc::new(clock) as Arc<dyn Clock>);
    }
    builder
        .connect()
        .await
        .expect("connect to the test cluster")
}

/// A store on `cluster` reading `clock`, as a trait object, and its prefix.
async fn shared_store(cluster: &RedisCluster, clock: ManualClock) -> (Arc<dyn Store>, String) {
    let store = store_on(cluster, Some(clock)).await;
    let prefix = store.settings().prefix().to_string();
    (Arc::new(store), prefix)
}

mod conformance {
    use super::*;

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(store_on(RedisCluster::shared(), Some(clock)).await) as Arc<dyn Store>
    });

    /// Data Tollgate did not write is a conflict on the Cluster too, left
    /// exactly as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn foreign_values_are_conflicts() {
        let cluster = RedisCluster::shared();
        let (store, prefix) = shared_store(cluster, ManualClock::new(START)).await;
        let con = redis::cluster::ClusterClient::new(cluster.urls())
            .expect("cluster urls")
            .get_async_connection()
            .await
            .expect("connect to the test cluster");
        let foreign = common::RedisForeign { con, prefix };
        tollgate_testkit::conformance::foreign_values_are_conflicts(store, &foreign).await;
    }
}

/// The same suite on a cluster whose every node loaded Tollgate's module:
/// the store finds it on every master and decides with it.
mod module_conformance {
    use super::*;

    fn module_cluster() -> &'static RedisCluster {
        static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
        CLUSTER.get_or_init(|| RedisCluster::start_with_module(&[]))
    }

    async fn module_store(clock: ManualClock) -> RedisClusterStore {
        let store = store_on(module_cluster(), Some(clock)).await;
        assert!(store.settings().uses_module(), "the store found the module");
        store
    }

    tollgate_testkit::conformance_tests!(|clock: ManualClock| async move {
        Arc::new(module_store(clock).await) as Arc<dyn Store>
    });
}

/// A master without the module (unloaded from one): the store goes on
/// with the function library, where the module's states are the same
/// bytes, and every subject is admitted exactly its capacity whichever
/// master holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_with_and_without_the_module_decide_alike() {
    let cluster = RedisCluster::start_with_module(&["--enable-module-command", "yes"]);
    let clock = ManualClock::new(START);
    let store: Arc<dyn Store> = {
        let store = store_on(&cluster, Some(clock.clone())).await;
        assert!(store.settings().uses_module());
        Arc::new(store)
    };
    let policy = Policy::new(
        "mixed",
        Limit::fixed_window(10, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    // A subject on every master.
    let subjects: Vec<String> = (0..MASTERS)
        .map(|m| find_tag("m", |slot| cluster.master_for_slot(slot) == m))
        .collect();
    let limiter = Limiter::builder(store.clone())
        .layer("key", Scope::Subject, policy)
        .build()
        .expect("valid");
    let mut admitted = vec![0; subjects.len()];
    for round in 0..20 {
        if round == 5 {
            let unloaded = cluster
                .command(0, &["MODULE", "UNLOAD", "tollgate"])
                .expect("MODULE UNLOAD");
            assert_eq!(unloaded, Reply::Status("OK".into()));
        }
        for (i, subject) in subjects.iter().enumerate() {
            let ctx = Context::for_subject(tollgate_limiter::Subject::new(subject).unwrap());
            let d = limiter.check(&ctx, 1).await.expect("decides");
            assert!(d.store_error().is_none(), "{d:?}");
            admitted[i] += usize::from(d.is_allowed());
        }
    }
    assert_eq!(admitted, vec![10; subjects.len()]);
}

/// A subject (without tenant, so its own tag) whose slot is served by
/// another master than `other`'s, and whose slot is below (`below`) or above
/// `other`'s: which group is reserved first.
fn subject_away_from(cluster: &RedisCluster, other: &str, below: bool) -> String {
    let other_slot = cluster.keyslot(other);
    let other_master = cluster.master_for_slot(other_slot);
    find_tag("s", |slot| {
        (slot < other_slot) == below && cluster.master_for_slot(slot) != other_master
    })
}

/// A fresh tag (prefixed `what`) whose slot satisfies `wanted`.
fn find_tag(what: &str, mut wanted: impl FnMut(u16) -> bool) -> String {
    (0..100_000)
        .map(|i| unique(&format!("{what}{i}")))
        .find(|t| wanted(hash_slot(format!("{{{t}}}").as_bytes())))
        .unwrap_or_else(|| panic!("no {what} tag with the wanted slot"))
}

/// What a layer has left, read by a one-layer decision of cost 1 (which
/// charges it, so only at the end of a test).
async fn left(store: &Arc<dyn Store>, scope: Scope, policy: &Policy, ctx: &Context) -> u64 {
    let limiter = Limiter::builder(store.clone())
        .layer("probe", scope, policy.clone())
        .build()
        .expect("valid");
    let d = limiter.check(ctx, 1).await.expect("store answers");
    assert!(d.store_error().is_none(), "{d:?}");
    let l = &d.layers()[0];
    if l.verdict().allowed {
        l.verdict().remaining + 1
    } else {
        l.verdict().remaining
    }
}

/// A concurrency layer on one slot beside a rate layer on another: an
/// admitted acquisition holds its place (reserved across slots, the hold
/// read from the reservation), a denial by the other slot's layer gives
/// the place back at once, and a release frees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_hold_across_slots_is_all_or_nothing() {
    use tollgate_limiter::{LayerRequest, StoreKey};
    let cluster = RedisCluster::shared();
    let (store, _) = shared_store(cluster, ManualClock::new(START)).await;
    let hour = Duration::from_secs(3_600);
    let in_flight = Policy::new(unique("in-flight"), Limit::concurrency(2, hour).unwrap()).unwrap();
    let rate = Policy::new(unique("rate"), Limit::fixed_window(2, hour).unwrap()).unwrap();
    let subject = unique("subject");
    let tenant = std::iter::repeat_with(|| unique("tenant"))
        .find(|t| hash_slot(t.as_bytes()) != hash_slot(subject.as_bytes()))
        .expect("another slot");
    let layers = [
        LayerRequest {
            key: StoreKey::new(&subject, &in_flight, "s", &subject),
            policy: &in_flight,
            cost: 1,
        },
        LayerRequest {
            key: StoreKey::new(&tenant, &rate, "t", &tenant),
            policy: &rate,
            cost: 1,
        },
    ];
    let (first, holds) = store.acquire(&layers).await.unwrap();
    assert!(first.iter().all(|v| v.allowed));
    let hold = holds[0].expect("the concurrency layer holds its place");
    assert_eq!(holds[1], None, "a rate layer holds nothing");
    assert!(store
        .acquire(&layers)
        .await
        .unwrap()
        .0
        .iter()
        .all(|v| v.allowed));
    // The rate layer is spent: denied, and the concurrency layer keeps
    // only the two places already held (the third was given back).
    let (denied, held) = store.acquire(&layers).await.unwrap();
    assert!(!denied[1].allowed);
    assert_eq!(held.len(), layers.len(), "one hold (none) per layer");
    assert!(held.iter().all(Option::is_none));
    store.release(&layers[..1], &[hold]).await.unwrap();
    let (after, _) = store.acquire(&layers[..1]).await.unwrap();
    assert!(after[0].allowed && after[0].remaining == 0, "{after:?}");
}

/// Three subjects, each on its own slot, share a global layer on another
/// slot: 300 concurrent requests. Denials come from both sides, so
/// reservations are refunded all the time. No layer admits more than its
/// capacity, and afterwards every layer's remaining is exactly its capacity
/// minus what it admitted: no charge leaked, no refund given twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cross_slot_layers_under_concurrency_never_over_admit_nor_leak_charges() {
    let cluster = RedisCluster::shared();
    let clock = ManualClock::new(START);
    let (store, prefix) = shared_store(cluster, clock.clone()).await;
    // Hour-long periods: Redis expires keys in real time while the manual
    // clock stands still, and a state must outlive the test (a one-second
    // bucket's state lives ~33 ms per unit, and expired mid-test under load).
    let hour = Duration::from_secs(3_600);
    for limit in every_algorithm_over(20, hour) {
        let name = limit.algorithm_name();
        let per_subject = Policy::new(unique("per-subject"), limit.clone()).unwrap();
        let global_limit = match &limit {
            Limit::TokenBucket(_) => Limit::token_bucket(30, 30, hour),
            Limit::Gcra(_) => Limit::gcra(30, hour, 30),
            Limit::FixedWindow(_) => Limit::fixed_window(30, hour),
            Limit::SlidingWindow(_) => Limit::sliding_window(30, hour),
            _ => Limit::sliding_log(30, hour),
        }
        .unwrap();
        let global = Policy::new(unique("global"), global_limit).unwrap();
        let limiter = Limiter::builder(store.clone())
            .layer("subject", Scope::Subject, per_subject.clone())
            .layer("global", Scope::Global, global.clone())
            .build()
            .unwrap();
        // One subject reserved before the global layer, two after it.
        let global_key = format!("{prefix}:{{global}}");
        let subjects: Vec<Context> = [true, false, false]
            .iter()
            .map(|&below| {
                let s = subject_away_from(cluster, &global_key, below);
                Context::for_subject(Subject::new(s).unwrap())
            })
            .collect();
        let admitted = admitted_concurrently(&limiter, &subjects).await;
        let total: u64 = admitted.iter().sum();
        println!("{name}: admitted {admitted:?} (global capacity 30, per subject 20)");
        assert!(
            total <= 30,
            "{name}: the global layer admitted {total} > 30"
        );
        assert!(total > 0, "{name}: nothing admitted");
        for (ctx, &n) in subjects.iter().zip(&admitted) {
            assert!(n <= 20, "{name}: a subject admitted {n} > 20");
            assert_eq!(
                left(&store, Scope::Subject, &per_subject, ctx).await,
                20 - n,
                "{name}: a subject layer leaked a charge (or got one back twice)"
            );
        }
        assert_eq!(
            left(&store, Scope::Global, &global, &subjects[0]).await,
            30 - total,
            "{name}: the global layer leaked a charge (or got one back twice)"
        );
    }
}

/// Runs of the contended-tenant test: `TOLLGATE_CONTENTION_RUNS` (20 to
/// report the figure in docs/cluster.md), else 3.
fn contention_runs() -> usize {
    std::env::var("TOLLGATE_CONTENTION_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

/// Key, tenant and global layers on three different slots; 3 keys of one
/// tenant, 300 concurrent requests. The tenant layer (capacity 15) binds.
/// Reservations held by requests that end up denied used to make others
/// fail (10-12 of 15 admitted, some keys 0 of 100): a request denied only
/// because of capacity held by reservations in flight is decided again,
/// within its deadline. Never more than 15; the lower bound asserted has
/// a wide margin below what a quiet machine measures (docs/cluster.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_contended_cross_slot_tenant_admits_close_to_its_capacity() {
    let cluster = RedisCluster::shared();
    let runs = contention_runs();
    let mut figures = Vec::new();
    for run in 0..runs {
        let (store, prefix) = shared_store(cluster, ManualClock::new(START)).await;
        let per_key = Policy::new(
            unique("key"),
            Limit::gcra(10, Duration::from_secs(60), 10).unwrap(),
        )
        .unwrap();
        let per_tenant = Policy::new(
            unique("tenant"),
            Limit::fixed_window(15, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let global = Policy::new(
            unique("global"),
            Limit::sliding_window(1_000, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let limiter = Limiter::builder(store.clone())
            .layer("key", Scope::Subject, per_key)
            .layer("tenant", Scope::Attribute("tenant".into()), per_tenant)
            .layer("global", Scope::Global, global)
            .build()
            .unwrap();
        // A tenant on the middle master's slots, keys on other masters'
        // slots (both sides of it), the global layer wherever it falls.
        let global_key = format!("{prefix}:{{global}}");
        let middle = cluster.master_for_slot(8_192);
        let tenant = find_tag("tenant", |slot| {
            cluster.master_for_slot(slot) == middle && slot != cluster.keyslot(&global_key)
        });
        let tenant_key = format!("{prefix}:{{{tenant}}}");
        let keys: Vec<Context> = [true, false, true]
            .iter()
            .map(|&below| {
                let s = subject_away_from(cluster, &tenant_key, below);
                Context::for_subject(Subject::new(s).unwrap())
                    .with_attribute("tenant", Subject::new(tenant.clone()).unwrap())
            })
            .collect();
        let admitted = admitted_concurrently(&limiter, &keys).await;
        let total: u64 = admitted.iter().sum();
        println!("run {run}: tenant admitted {total} of 15, per key {admitted:?}");
        assert!(total <= 15, "the tenant layer admitted {total} > 15");
        figures.push(total);
    }
    figures.sort_unstable();
    println!("tenant admitted over {runs} runs (sorted): {figures:?}");
    assert!(
        figures.iter().all(|&n| n >= 12),
        "under-admission beyond the bound: {figures:?}"
    );
}

/// 300 concurrent requests, spread over the three `contexts` in turn: how
/// many each admitted. No decision may be degraded.
async fn admitted_concurrently(limiter: &Limiter, contexts: &[Context]) -> [u64; 3] {
    let requests = (0..300)
        .map(|i| (limiter.clone(), contexts[i % 3].clone()))
        .collect();
    let mut admitted = [0u64; 3];
    for (i, d) in decide_concurrently(requests).await.iter().enumerate() {
        assert!(d.store_error().is_none(), "{d:?}");
        admitted[i % 3] += u64::from(d.is_allowed());
    }
    admitted
}

/// A `MONITOR` on one node: the script calls clients send for keys under
/// `prefix` (a script's own commands are tagged `lua` and left out).
struct Monitor(BufReader<TcpStream>);

impl Monitor {
    fn start(addr: SocketAddr) -> Monitor {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok.trim_end(), "+OK");
        Monitor(reader)
    }

    /// Calls (`fcall reserve`, `eval peek`, …) since the last call,
    /// up to a marker sent by `send`.
    fn calls(&mut self, prefix: &str, send: impl FnOnce(&str)) -> Vec<String> {
        let marker = unique("marker");
        send(&marker);
        let mut calls = Vec::new();
        // A replica's REPLCONF ACK arrives every second, so the socket's
        // read timeout alone would never end a wait for a lost marker.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(
                Instant::now() < deadline,
                "no marker on the MONITOR stream; calls so far: {calls:?}"
            );
            let mut line = String::new();
            self.0.read_line(&mut line).expect("a MONITOR line");
            if line.contains(&marker) {
                return calls;
            }
            let Some((source, command)) = line
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once("] "))
            else {
                continue;
            };
            if source.ends_with(" lua") || !command.contains(prefix) {
                continue;
            }
            let words: Vec<&str> = command.split('"').skip(1).step_by(2).collect();
            let name = words.first().copied().unwrap_or_default().to_lowercase();
            let mode = words
                .last()
                .copied()
                .filter(|m| matches!(*m, "reserve" | "peek" | "refund"))
                .unwrap_or("decide");
            calls.push(format!("{name} {mode}"));
        }
    }
}

/// Layers sharing a tag are one script call; layers on two slots are one
/// call per slot when admitted, and when the second slot denies: its call
/// and one refund of the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_is_one_script_call_per_slot_group() {
    let cluster = RedisCluster::shared();
    let (store, prefix) = shared_store(cluster, ManualClock::new(START)).await;
    let second = Duration::from_secs(1);
    // A tenant on the master of slot 0 (low slots) and a region tag on a
    // higher slot of another master: the tenant's group is reserved first.
    let low = cluster.master_for_slot(0);
    let tenant = find_tag("tenant", |slot| cluster.master_for_slot(slot) == low);
    let tenant_slot = hash_slot(format!("{prefix}:{{{tenant}}}").as_bytes());
    let global_tag = find_tag("g", |slot| {
        slot > tenant_slot && cluster.master_for_slot(slot) != low
    });
    let shared_tag = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new(unique("k"), Limit::fixed_window(10, second).unwrap()).unwrap(),
        )
        .layer(
            "tenant",
            Scope::Tenant,
            Policy::new(unique("t"), Limit::gcra(10, second, 10).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let narrow = Policy::new(unique("narrow"), Limit::fixed_window(1, second).unwrap()).unwrap();
    let across = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new(unique("k2"), Limit::token_bucket(10, 10, second).unwrap()).unwrap(),
        )
        .layer("global", Scope::Attribute("region".into()), narrow)
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("k-1").unwrap())
        .with_tenant(Subject::new(tenant.clone()).unwrap())
        .with_attribute("region", Subject::new(global_tag).unwrap());

    // The shared cluster never loses a master: its masters are nodes 0-2.
    let mut monitors: Vec<(usize, Monitor)> = (0..MASTERS)
        .map(|m| (m, Monitor::start(cluster.nodes()[m].addr())))
        .collect();
    let calls = |monitors: &mut Vec<(usize, Monitor)>| -> Vec<String> {
        let mut all = Vec::new();
        for (node, monitor) in monitors.iter_mut() {
            all.extend(monitor.calls(&prefix, |marker| {
                let echo = cluster.command(*node, &["ECHO", marker]);
                assert!(matches!(echo, Ok(Reply::Bulk(_))), "ECHO answered {echo:?}");
            }));
        }
        all.sort();
        all
    };
    calls(&mut monitors);

    assert!(shared_tag.check(&ctx, 1).await.unwrap().is_allowed());
    assert_eq!(
        calls(&mut monitors),
        ["fcall decide"],
        "two layers, one tag"
    );

    assert!(across.check(&ctx, 1).await.unwrap().is_allowed());
    assert_eq!(
        calls(&mut monitors),
        ["fcall reserve", "fcall reserve"],
        "two slots, admitted"
    );

    let denied = across.check(&ctx, 1).await.unwrap();
    assert!(!denied.is_allowed() && denied.store_error().is_none());
    assert_eq!(
        denied.layers()[0].verdict().remaining,
        9,
        "the refunded layer reports uncharged"
    );
    assert_eq!(
        calls(&mut monitors),
        ["fcall refund", "fcall reserve", "fcall reserve"],
        "two slots, the second denies: the first is refunded"
    );
}

/// `INFO errorstats` of a node as error code → count.
fn error_counts(cluster: &RedisCluster, node: usize) -> HashMap<String, u64> {
    let text = cluster
        .command(node, &["INFO", "errorstats"])
        .ok()
        .and_then(|r| r.text())
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("errorstat_")?.split_once(':')?;
            Some((
                name.to_string(),
                rest.strip_prefix("count=")?.trim().parse().ok()?,
            ))
        })
        .collect()
}

/// Wait until `done` moved `by` past `from`, or `limit` passed (a stage of
/// traffic; the wait never replaces a condition the test asserts).
async fn traffic(done: &AtomicU64, by: u64, limit: Duration) {
    let from = done.load(Ordering::Relaxed);
    let until = Instant::now() + limit;
    while done.load(Ordering::Relaxed) < from + by && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A slot moves between masters while 8 clients decide on it: keys served
/// by the source, `TRYAGAIN` while a group's keys are split, `ASK` to the
/// target once they moved, `MOVED` after the handover. No decision surfaces
/// an error, no layer admits more than its capacity, and no charge leaks
/// (refunds in the moving slot included).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_migrating_under_traffic_surfaces_no_error_and_admits_nothing_extra() {
    let cluster = RedisCluster::shared();
    let clock = ManualClock::new(START);
    let (store, prefix) = shared_store(cluster, clock).await;
    let second = Duration::from_secs(60);
    // The tenant's slot (the one that moves) is reserved before the global
    // layer's, and the global layer denies first: refunds land in the
    // moving slot.
    let global_slot = hash_slot(format!("{prefix}:{{global}}").as_bytes());
    let global_master = cluster.master_for_slot(global_slot);
    let tenant = find_tag("tenant", |slot| {
        slot < global_slot && cluster.master_for_slot(slot) != global_master
    });
    let slot = hash_slot(format!("{prefix}:{{{tenant}}}").as_bytes());
    let per_subject = Policy::new(unique("sub"), Limit::fixed_window(5, second).unwrap()).unwrap();
    let per_tenant =
        Policy::new(unique("ten"), Limit::token_bucket(60, 1, second).unwrap()).unwrap();
    let global = Policy::new(unique("glo"), Limit::sliding_log(40, second).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("subject", Scope::Subject, per_subject.clone())
        .layer("tenant", Scope::Tenant, per_tenant.clone())
        .layer("global", Scope::Global, global.clone())
        .build()
        .unwrap();
    let contexts: Vec<Context> = (0..20)
        .map(|i| {
            Context::for_subject(Subject::new(format!("u{i}")).unwrap())
                .with_tenant(Subject::new(tenant.clone()).unwrap())
        })
        .collect();
    // Every subject's key exists before the move starts.
    for ctx in &contexts {
        assert!(limiter.check(ctx, 1).await.unwrap().is_allowed());
    }

    let from = cluster.master_for_slot(slot);
    let to = (0..MASTERS)
        .map(|m| cluster.master_for_slot(cluster.slot_of_master(m)))
        .find(|&m| m != from && m != cluster.master_for_slot(global_slot))
        .unwrap();
    let before_from = error_counts(cluster, from);

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let outcomes = Arc::new(Mutex::new(vec![0u64; contexts.len()]));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (limiter, contexts, stop, done, outcomes, errors) = (
                limiter.clone(),
                contexts.clone(),
                stop.clone(),
                done.clone(),
                outcomes.clone(),
                errors.clone(),
            );
            tokio::spawn(async move {
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let s = i % contexts.len();
                    let d = limiter.check(&contexts[s], 1).await.expect("valid request");
                    if let Some(class) = d.store_error() {
                        errors.lock().unwrap().push(class);
                    }
                    if d.is_allowed() {
                        outcomes.lock().unwrap()[s] += 1;
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 7;
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();

    let stage = Duration::from_millis(300);
    traffic(&done, 100, stage).await;
    let migration = cluster.begin_migration(slot, to);
    traffic(&done, 100, stage).await;
    // Half the keys move: groups whose keys are split answer TRYAGAIN,
    // groups fully moved are redirected with ASK.
    assert!(migration.move_keys(10) > 0);
    traffic(&done, 100, stage).await;
    while migration.move_keys(5) > 0 {
        traffic(&done, 20, stage).await;
    }
    traffic(&done, 100, stage).await;
    migration.finish();
    traffic(&done, 200, Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(cluster.master_for_slot(slot), to);

    let errors = errors.lock().unwrap().clone();
    let mut by_class: HashMap<&str, usize> = HashMap::new();
    for class in &errors {
        *by_class.entry(class).or_default() += 1;
    }
    assert!(
        errors.is_empty(),
        "decisions failed during the move: {by_class:?}"
    );
    let after_from = error_counts(cluster, from);
    let grew = |code: &str| {
        after_from.get(code).copied().unwrap_or(0) > before_from.get(code).copied().unwrap_or(0)
    };
    println!(
        "slot {slot} moved from node {from} to {to} under {} decisions; source errorstats before {before_from:?} after {after_from:?}",
        done.load(Ordering::Relaxed)
    );
    assert!(grew("ASK"), "no ASK redirection was exercised");
    assert!(grew("MOVED"), "no MOVED redirection was exercised");

    let outcomes = outcomes.lock().unwrap().clone();
    // The first decision of each subject (before the move) was admitted too.
    let admitted: Vec<u64> = outcomes.iter().map(|n| n + 1).collect();
    let total: u64 = admitted.iter().sum();
    assert!(total <= 40, "the global layer admitted {total} > 40");
    for (ctx, &n) in contexts.iter().zip(&admitted) {
        assert!(n <= 5, "a subject admitted {n} > 5");
        assert_eq!(left(&store, Scope::Subject, &per_subject, ctx).await, 5 - n);
    }
    assert_eq!(
        left(&store, Scope::Tenant, &per_tenant, &contexts[0]).await,
        60 - total
    );
    assert_eq!(
        left(&store, Scope::Global, &global, &contexts[0]).await,
        40 - total
    );
}

/// The decisions of a run: when, whether the store decided, allowed.
type Log = Arc<Mutex<Vec<(Duration, bool, bool)>>>;

/// On the test's own cluster: `FUNCTION FLUSH` and `SCRIPT FLUSH` on every
/// node, then decisions across slots load the library where it is missing
/// (`Function not found` from any node). Then a master is killed
/// (`SIGKILL`) under load. Its replica is promoted by automatic failover;
/// meanwhile every decision on its keys fails closed (503, never an
/// admission), and afterwards decisions resume — on a node whose functions
/// are flushed as it takes over, so through loading the library there.
/// Prints the gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_under_load_is_survived_by_failover() {
    let mut cluster = RedisCluster::start();
    let store = RedisClusterStore::builder(cluster.urls())
        .prefix(unique("failover"))
        .deadline(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let prefix = store.settings().prefix().to_string();
    // A subject on master 0, a region (own slot) on master 1.
    let tagged = |master: usize| find_tag("x", |slot| cluster.master_for_slot(slot) == master);
    let (subject, region) = (tagged(0), tagged(1));
    let victim_slot = hash_slot(format!("{prefix}:{{{subject}}}").as_bytes());
    let victim = cluster.master_for_slot(victim_slot);
    let replica = cluster.replica_of(victim).expect("a replica");
    let store: Arc<dyn Store> = Arc::new(store);
    // The subject's layer lives on the victim, the region's on another master.
    let ctx = Context::for_subject(Subject::new(subject).unwrap())
        .with_attribute("region", Subject::new(region).unwrap());

    // First, `NOSCRIPT` from every node: the script is flushed everywhere
    // (this cluster is the test's own), and decisions across the two slots
    // surface no error and admit exactly the capacity.
    let minute = Duration::from_secs(60);
    let exact = Limiter::builder(store.clone())
        .layer(
            "subject",
            Scope::Subject,
            Policy::new("log", Limit::sliding_log(3, minute).unwrap()).unwrap(),
        )
        .layer(
            "region",
            Scope::Attribute("region".into()),
            Policy::new("bucket", Limit::token_bucket(100, 1, minute).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    assert!(exact.check(&ctx, 1).await.unwrap().is_allowed());
    for node in 0..cluster.nodes().len() {
        // Replicas refuse FUNCTION FLUSH (READONLY); their masters' flush
        // reaches them by replication.
        let _ = cluster.command(node, &["FUNCTION", "FLUSH"]);
        assert_eq!(
            cluster.command(node, &["SCRIPT", "FLUSH"]).unwrap(),
            Reply::Status("OK".into())
        );
    }
    let mut admitted = 1;
    for _ in 0..5 {
        let d = exact.check(&ctx, 1).await.unwrap();
        assert!(d.store_error().is_none(), "after the flush: {d:?}");
        admitted += usize::from(d.is_allowed());
    }
    assert_eq!(admitted, 3, "exactly the capacity, across the flush");
    // The masters have the script again; the replica that takes over must
    // not (so decisions resume through NOSCRIPT and EVAL).
    assert_eq!(
        cluster.command(replica, &["SCRIPT", "FLUSH"]).unwrap(),
        Reply::Status("OK".into())
    );

    let big = Limit::token_bucket(1_000_000, 1_000_000, Duration::from_secs(1)).unwrap();
    let closed = |name: &str| {
        Policy::new(name, big.clone())
            .unwrap()
            .with_on_failure(OnStoreFailure::FailClosed)
            .unwrap()
    };
    let limiter = Limiter::builder(store)
        .layer("subject", Scope::Subject, closed("per-subject"))
        .layer(
            "region",
            Scope::Attribute("region".into()),
            closed("per-region"),
        )
        .breaker(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_millis(50),
        })
        .build()
        .unwrap();

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // Every decision: when (from the start), whether the store decided, allowed.
    let seen: Log = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, ctx, stop, seen) =
                (limiter.clone(), ctx.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let d = limiter.check(&ctx, 1).await.expect("valid request");
                    let from_store = d.layers().iter().all(|l| l.source == Source::Store);
                    assert!(
                        from_store || (d.failed_closed() && !d.is_allowed()),
                        "a store failure must fail closed: {d:?}"
                    );
                    seen.lock()
                        .unwrap()
                        .push((start.elapsed(), from_store, d.is_allowed()));
                    if !from_store {
                        // An open breaker answers at once, without awaiting
                        // anything: pace the client like a real one (and let
                        // the test's own task run).
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            })
        })
        .collect();

    let progress = |seen: &Log| seen.lock().unwrap().len();
    let warm = Instant::now() + Duration::from_secs(5);
    while progress(&seen) < 200 && Instant::now() < warm {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(progress(&seen) >= 200, "no traffic before the kill");
    let killed_at = start.elapsed();
    let (promoted, took) = tokio::task::block_in_place(|| {
        cluster.kill(victim);
        cluster.wait_for_failover(victim, victim_slot)
    });
    assert_eq!(promoted, replica);
    // The promoted replica got the library by replication; take it away,
    // under load, so decisions resume through loading it there.
    assert_eq!(
        cluster.command(promoted, &["FUNCTION", "FLUSH"]).unwrap(),
        Reply::Status("OK".into())
    );
    // Decisions resume: wait for a run of store decisions after the failover.
    let resumed = Instant::now() + Duration::from_secs(10);
    loop {
        let tail_ok = {
            let seen = seen.lock().unwrap();
            seen.len() > 100
                && seen
                    .iter()
                    .rev()
                    .take(100)
                    .all(|&(at, ok, _)| ok && at > killed_at)
        };
        if tail_ok {
            break;
        }
        assert!(
            Instant::now() < resumed,
            "decisions did not resume after the failover"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let failed: Vec<Duration> = seen.iter().filter(|s| !s.1).map(|s| s.0).collect();
    let first_ok_after = seen
        .iter()
        .filter(|s| s.1 && s.0 > killed_at && failed.last().is_some_and(|&f| s.0 > f))
        .map(|s| s.0)
        .min()
        .expect("a store decision after the gap");
    println!(
        "failover: {} decisions failed closed; gap from the kill to decisions resuming {:?} \
         (last failed-closed decision {:?} after the kill; the cluster reported the new master \
         after {took:?}); {} decisions in all",
        failed.len(),
        first_ok_after - killed_at,
        failed.last().map(|&f| f - killed_at),
        seen.len()
    );
    assert!(
        !failed.is_empty(),
        "the gap was not seen: no decision failed closed"
    );
    assert!(
        failed.iter().all(|&f| f >= killed_at),
        "failures before the kill"
    );
    assert!(
        seen.iter().filter(|s| s.1).all(|s| s.2),
        "the store denied (capacity is huge)"
    );
}

/// A decision across slots dropped after its first group was charged, on
/// a thread outside any runtime (a future handed to a plain thread): its
/// refund still goes out, on the runtime the decision started on (before,
/// the refund found no runtime and its drop called itself until the stack
/// overflowed).
#[test]
fn a_decision_dropped_off_its_runtime_refunds_its_charges() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cluster = RedisCluster::start();
    let store: Arc<dyn Store> = Arc::new(runtime.block_on(store_on(&cluster, None)));
    let low = cluster.master_for_slot(0);
    let tenant = find_tag("tenant", |slot| cluster.master_for_slot(slot) == low);
    let tenant_slot = cluster.keyslot(&tenant);
    let away = find_tag("g", |slot| {
        slot > tenant_slot && cluster.master_for_slot(slot) != low
    });
    let paused = cluster.master_for_slot(cluster.keyslot(&away));
    let minute = Duration::from_secs(60);
    let per_tenant = Policy::new(unique("t"), Limit::fixed_window(5, minute).unwrap()).unwrap();
    let per_region = Policy::new(unique("r"), Limit::fixed_window(5, minute).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("tenant", Scope::Tenant, per_tenant.clone())
        .layer("region", Scope::Attribute("region".into()), per_region)
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("k-1").unwrap())
        .with_tenant(Subject::new(tenant.clone()).unwrap())
        .with_attribute("region", Subject::new(away).unwrap());
    // The second group's master answers nothing for a while: the decision
    // waits there, its first group charged.
    let pause = cluster.command(paused, &["CLIENT", "PAUSE", "1500", "ALL"]);
    assert_eq!(pause, Ok(Reply::Status("OK".into())));
    let owned = ctx.clone();
    let mut decision = Box::pin(async move { limiter.check(&owned, 1).await });
    let waited = runtime
        .block_on(async { tokio::time::timeout(Duration::from_millis(300), &mut decision).await });
    assert!(waited.is_err(), "still waiting on the paused master");
    std::thread::spawn(move || drop(decision))
        .join()
        .expect("dropped without a runtime");
    runtime.block_on(async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(
            left(&store, Scope::Tenant, &per_tenant, &ctx).await,
            5,
            "the tenant's charge was given back"
        );
    });
}

/// A concurrency key outgrowing its text form while its slot is being
/// migrated keeps its holders: the module writes the new list through the
/// key API. Before, it deleted the key and then ran `RPUSH` through Redis,
/// which redirects a command on a missing key of a migrating slot: the
/// `RPUSH` failed after the delete, and every holder was lost.
#[test]
fn a_log_rewritten_in_a_migrating_slot_keeps_its_holders() {
    let cluster = RedisCluster::start_with_module(&[]);
    let key = format!("{{{}}}:exports:v1:cc:s", unique("mig"));
    let slot = cluster.keyslot(&key);
    let from = cluster.master_for_slot(slot);
    let to = (0..MASTERS)
        .map(|m| cluster.master_for_slot(cluster.slot_of_master(m)))
        .find(|&m| m != from)
        .expect("another master");
    // A place each, 100 at most, held 30 s: (code 7, cost, limit, lease µs).
    let acquire = || {
        let args = [
            "TOLLGATE.DECIDE",
            "1",
            &key,
            "",
            "",
            "7",
            "1",
            "100",
            "30000000",
            "0",
        ];
        cluster.command(from, &args).expect("answered")
    };
    for _ in 0..32 {
        assert!(matches!(acquire(), Reply::Array(_)), "admitted");
        std::thread::sleep(Duration::from_millis(1));
    }
    let migration = cluster.begin_migration(slot, to);
    let answer = acquire();
    let held = cluster.command(from, &["LLEN", &key]).expect("answered");
    assert!(matches!(answer, Reply::Array(_)), "{answer:?}");
    assert_eq!(held, Reply::Int(33), "every holder kept");
    migration.finish();
}

/// A release across slots gives back every slot group's places, even when
/// one group's master does not answer within the deadline: the groups are
/// sent together, none waiting for another (before, they went one after
/// another under one deadline, and a group behind a slow master was never
/// sent: its places stayed taken for the whole lease).
#[test]
fn a_release_gives_back_a_healthy_masters_places_beside_a_slow_one() {
    use tollgate_limiter::{LayerRequest, StoreError, StoreKey};
    // One thread: a call begun after its deadline is dropped before the
    // client's task could send it, every time (on more threads, only
    // under load).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cluster = RedisCluster::start();
    let store = runtime.block_on(async {
        RedisClusterStore::builder(cluster.urls())
            .prefix(unique("c"))
            .deadline(Duration::from_millis(300))
            .connect()
            .await
            .expect("connect to the test cluster")
    });
    // The slow master's group comes first in slot order.
    let slow = cluster.master_for_slot(0);
    let first = find_tag("a", |slot| cluster.master_for_slot(slot) == slow);
    let first_slot = cluster.keyslot(&first);
    let second = find_tag("b", |slot| {
        slot > first_slot && cluster.master_for_slot(slot) != slow
    });
    let hour = Duration::from_secs(3_600);
    let one_place =
        |name: &str| Policy::new(unique(name), Limit::concurrency(1, hour).unwrap()).unwrap();
    let (on_slow, on_healthy) = (one_place("a"), one_place("b"));
    let layers = [
        LayerRequest {
            key: StoreKey::new(&first, &on_slow, "s", &first),
            policy: &on_slow,
            cost: 1,
        },
        LayerRequest {
            key: StoreKey::new(&second, &on_healthy, "s", &second),
            policy: &on_healthy,
            cost: 1,
        },
    ];
    runtime.block_on(async {
        let (verdicts, holds) = store.acquire(&layers).await.unwrap();
        assert!(verdicts.iter().all(|v| v.allowed), "{verdicts:?}");
        let holds: Vec<_> = holds.iter().map(|h| h.expect("a place held")).collect();
        let pause = cluster.command(slow, &["CLIENT", "PAUSE", "1500", "ALL"]);
        assert_eq!(pause, Ok(Reply::Status("OK".into())));
        let released = store.release(&layers, &holds).await;
        assert!(
            matches!(released, Err(StoreError::Timeout(_))),
            "the slow master's group timed out: {released:?}"
        );
        let (again, _) = store.acquire(&layers[1..]).await.unwrap();
        assert!(
            again[0].allowed,
            "the healthy master's place was given back: {again:?}"
        );
    });
}

/// A master added to the cluster owns no slot, so no slot map names it
/// and the client has no connection to it. While the first slot moves onto
/// it, a key already moved answers `ASK` towards it: the store opens a
/// connection of its own there, loads the library where it is missing, and
/// decides. Every decision succeeds and the counts are exact, before and
/// after the handover; the connection is kept, so the client is not made
/// to reconnect to every node at each redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_moving_onto_a_new_master_are_decided_there() {
    const LIMIT: u64 = 30;
    let mut cluster = RedisCluster::start();
    let known = cluster.urls();
    let new = cluster.add_master();
    let store = RedisClusterStore::builder(known)
        .prefix(unique("grow"))
        .deadline(PATIENT)
        // One window throughout, however long the handover takes.
        .clock(Arc::new(ManualClock::new(START)) as Arc<dyn Clock>)
        .connect()
        .await
        .expect("connect");
    let prefix = store.settings().prefix().to_string();
    let window = Limit::fixed_window(LIMIT, Duration::from_secs(3_600)).unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer(
            "subject",
            Scope::Subject,
            Policy::new(unique("p"), window).unwrap(),
        )
        .build()
        .unwrap();
    let subject = find_tag("mover", |_| true);
    let ctx = Context::for_subject(Subject::new(subject.clone()).unwrap());
    let mut admitted = 0;
    let mut decide = async |n: u64| {
        for _ in 0..n {
            let d = limiter.check(&ctx, 1).await.expect("a valid request");
            assert_eq!(d.store_error(), None, "the store answered");
            admitted += u64::from(d.is_allowed());
        }
    };
    decide(1).await;
    let slot = hash_slot(format!("{prefix}:{{{subject}}}").as_bytes());
    let migration = cluster.begin_migration(slot, new);
    let moved = migration.move_keys(100);
    assert_eq!(moved, 1, "the key moved to the new master");
    let bystander = (0..MASTERS)
        .find(|&m| m != migration.from() && cluster.master_for_slot(cluster.slot_of_master(m)) == m)
        .expect("a master the move leaves alone");
    let connections = || {
        let stats = cluster.command(bystander, &["INFO", "stats"]).unwrap();
        let stats = stats.text().unwrap_or_default();
        let line = stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"));
        line.and_then(|n| n.trim().parse::<u64>().ok())
            .expect("INFO stats")
    };
    let before = connections();
    decide(20).await;
    let reconnects = connections() - before;
    assert!(
        reconnects < 5,
        "{reconnects} connections to a bystander for 20 redirections"
    );
    migration.finish();
    decide(LIMIT).await;
    assert_eq!(admitted, LIMIT, "nothing lost or doubled across the move");
}
