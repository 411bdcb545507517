//! The Redis Cluster store side by side with the standalone store, in one run.
//!
//! Starts a standalone redis-server and a 3-master, 3-replica cluster (the
//! testkit harnesses) on the same machine and measures decisions per second
//! at concurrency 1, 16 and 64 over 10,000 keys (token bucket, 100 per
//! second per key, so every decision admits and writes):
//!
//! - `standalone` / `cluster`: one layer per decision (one script call);
//! - `standalone-2layers` / `cluster-2slots`: a per-key layer and a global
//!   layer. Standalone decides both in one call; on the cluster they are on
//!   two slots (on two masters), so each decision is two reservations in turn.
//!
//! The stores run with a 2 s deadline, so queueing shows as latency rather
//! than as failed decisions. Criterion reports decisions per second
//! (`thrpt`); after it, the bench prints decisions/s, p50 and p99 latency of
//! a fixed run of each case, with the cluster's ratio to standalone.
//!
//! Then Redis CPU per call (`INFO commandstats` `usec_per_call` of `FCALL`)
//! on the standalone server and on each Cluster master after the same
//! one-layer run.
//!
//! Run: `cargo bench -p tollgate-redis --features cluster --bench cluster`
//! (`REPORTS_ONLY=1` for the fixed runs alone)

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use tokio::runtime::Runtime;
use tollgate_limiter::{LayerRequest, Limit, Policy, Store, StoreKey};
use tollgate_redis::cluster::RedisClusterStore;
use tollgate_redis::RedisStore;
use tollgate_testkit::command_stats::command_stats;
use tollgate_testkit::redis_cluster::{RedisCluster, Reply, MASTERS};
use tollgate_testkit::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Decisions per case in the fixed run.
const FIXED_RUN: usize = 20_000;

struct Workload {
    per_key: Policy,
    global: Policy,
    subjects: Vec<String>,
}

impl Workload {
    fn new() -> Workload {
        let limit = |n| Limit::token_bucket(n, n, Duration::from_secs(1)).expect("valid");
        Workload {
            per_key: Policy::new("bench", limit(100)).expect("valid"),
            // Never denies in these runs.
            global: Policy::new("bench-global", limit(1_000_000_000)).expect("valid"),
            subjects: (0..KEYS).map(|i| format!("s{i}")).collect(),
        }
    }
}

#[derive(Clone)]
struct Target {
    store: Arc<dyn Store>,
    layers: usize,
}

/// One decision on key `i`.
async fn decide(target: &Target, w: &Workload, i: usize) {
    let s = &w.subjects[i];
    let key = LayerRequest {
        key: StoreKey::new(s, &w.per_key, "s", s),
        policy: &w.per_key,
        cost: 1,
    };
    let global = LayerRequest {
        key: StoreKey::new("global", &w.global, "g", "global"),
        policy: &w.global,
        cost: 1,
    };
    let layers = [key, global];
    let v = tollgate_limiter::ask(&*target.store, &layers[..target.layers])
        .await
        .expect("decision");
    assert!(v.iter().all(|v| v.allowed));
}

/// `total` decisions by `concurrency` tasks over every key; the wall time,
/// and each decision's latency when `record`.
async fn run(
    target: &Target,
    w: &Arc<Workload>,
    concurrency: usize,
    total: u64,
    record: bool,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (target, w) = (target.clone(), w.clone());
            let share =
                total / concurrency as u64 + u64::from((t as u64) < total % concurrency as u64);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(if record { share as usize } else { 0 });
                for j in 0..share as usize {
                    let i = (t * 7919 + j * concurrency) % KEYS;
                    let at = Instant::now();
                    decide(&target, &w, i).await;
                    if record {
                        latencies.push(at.elapsed());
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("task"));
    }
    (started.elapsed(), latencies)
}

struct Setup {
    rt: Runtime,
    _server: RedisServer,
    _cluster: RedisCluster,
    targets: Vec<(&'static str, Target)>,
    workload: Arc<Workload>,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let workload = Arc::new(Workload::new());
    let targets = rt.block_on(async {
        let standalone: Arc<dyn Store> = Arc::new(
            RedisStore::builder(server.url())
                .prefix("bench")
                .deadline(Duration::from_secs(2))
                .connect()
                .await
                .expect("connect"),
        );
        let clustered: Arc<dyn Store> = Arc::new(
            RedisClusterStore::builder(cluster.urls())
                .prefix("bench")
                .deadline(Duration::from_secs(2))
                .connect()
                .await
                .expect("connect"),
        );
        vec![
            (
                "standalone",
                Target {
                    store: standalone.clone(),
                    layers: 1,
                },
            ),
            (
                "cluster",
                Target {
                    store: clustered.clone(),
                    layers: 1,
                },
            ),
            (
                "standalone-2layers",
                Target {
                    store: standalone,
                    layers: 2,
                },
            ),
            (
                "cluster-2slots",
                Target {
                    store: clustered,
                    layers: 2,
                },
            ),
        ]
    });
    Setup {
        rt,
        _server: server,
        _cluster: cluster,
        targets,
        workload,
    }
}

fn throughput(c: &mut Criterion, setup: &Setup) {
    for &concurrency in &CONCURRENCY {
        let mut group = c.benchmark_group(format!("cluster/concurrency-{concurrency}"));
        group.throughput(Throughput::Elements(1));
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        for (name, target) in &setup.targets {
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    // Every task gets work even when criterion asks for
                    // fewer iterations than tasks; scale back to `iters`.
                    let n = iters.max(concurrency as u64);
                    let (elapsed, _) =
                        setup
                            .rt
                            .block_on(run(target, &setup.workload, concurrency, n, false));
                    elapsed.mul_f64(iters as f64 / n as f64)
                })
            });
        }
        group.finish();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn report(setup: &Setup) {
    println!();
    println!("fixed run: {FIXED_RUN} decisions per case, {KEYS} keys, token bucket, all admitted");
    println!(
        "{:<20} {:>5} {:>13} {:>9} {:>9} {:>16}",
        "target", "conc", "decisions/s", "p50 µs", "p99 µs", "vs standalone"
    );
    for &concurrency in &CONCURRENCY {
        let mut baseline = [0.0f64; 3];
        for (name, target) in &setup.targets {
            let (elapsed, mut latencies) = setup.rt.block_on(run(
                target,
                &setup.workload,
                concurrency,
                FIXED_RUN as u64,
                true,
            ));
            latencies.sort_unstable();
            let rate = FIXED_RUN as f64 / elapsed.as_secs_f64();
            let ratio = match *name {
                "standalone" => {
                    baseline[1] = rate;
                    String::new()
                }
                "standalone-2layers" => {
                    baseline[2] = rate;
                    String::new()
                }
                _ => format!("{:.2}×", rate / baseline[target.layers]),
            };
            println!(
                "{:<20} {:>5} {:>13.0} {:>9} {:>9} {:>16}",
                name,
                concurrency,
                rate,
                percentile(&latencies, 0.50).as_micros(),
                percentile(&latencies, 0.99).as_micros(),
                ratio,
            );
        }
    }
}

/// Redis CPU per call (`INFO commandstats`), one layer, concurrency 16:
/// the standalone server and each Cluster master, after the same run.
fn cost_report(setup: &Setup) {
    let text = |reply: Reply| match reply {
        Reply::Bulk(Some(bytes)) => String::from_utf8(bytes).expect("text"),
        other => panic!("INFO answered {other:?}"),
    };
    let cluster = &setup._cluster;
    let standalone = std::cell::RefCell::new(
        redis::Client::open(setup._server.url())
            .expect("url")
            .get_connection()
            .expect("connect"),
    );
    let reset = |node: Option<usize>| match node {
        Some(n) => {
            cluster
                .command(n, &["CONFIG", "RESETSTAT"])
                .expect("RESETSTAT");
        }
        None => redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut *standalone.borrow_mut())
            .expect("RESETSTAT"),
    };
    let info = |node: Option<usize>| match node {
        Some(n) => text(cluster.command(n, &["INFO", "commandstats"]).expect("INFO")),
        None => redis::cmd("INFO")
            .arg("commandstats")
            .query::<String>(&mut *standalone.borrow_mut())
            .expect("INFO"),
    };
    println!();
    println!("Redis CPU per call (INFO commandstats, FCALL, one layer, {FIXED_RUN} decisions at concurrency 16)");
    for (name, target) in setup.targets.iter().filter(|(_, t)| t.layers == 1) {
        reset(None);
        for m in 0..MASTERS {
            reset(Some(m));
        }
        setup
            .rt
            .block_on(run(target, &setup.workload, 16, FIXED_RUN as u64, false));
        if *name == "standalone" {
            if let Some(f) = command_stats(&info(None)).get("fcall") {
                println!(
                    "{:<24} {:>6.2} µs  ({} calls)",
                    "standalone", f.usec_per_call, f.calls
                );
            }
        } else {
            for m in 0..MASTERS {
                if let Some(f) = command_stats(&info(Some(m))).get("fcall") {
                    println!(
                        "{:<24} {:>6.2} µs  ({} calls)",
                        format!("cluster master {m}"),
                        f.usec_per_call,
                        f.calls
                    );
                }
            }
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let setup = setup();
    if std::env::var_os("REPORTS_ONLY").is_none() {
        throughput(&mut c, &setup);
    }
    report(&setup);
    cost_report(&setup);
    c.final_summary();
}
