//! Redis store throughput and latency, side by side with the raw script call.
//!
//! Starts its own redis-server (the testkit harness) and measures, at
//! concurrency 1, 16 and 64 over 10,000 keys (token bucket, 100 per second
//! per key, so every decision admits and writes):
//!
//! - `store/multiplexed`: `RedisStore::decide`, one multiplexed connection;
//! - `store/pool16`: `RedisStore::decide`, a bb8 pool of 16 connections;
//! - `raw-script`: the same `EVALSHA` sent through the redis crate on one
//!   multiplexed connection, without the store (the ceiling).
//!
//! The stores run with a 2 s deadline, so waiting (for a pool connection,
//! behind other requests) shows up as latency rather than as timeouts.
//! Criterion reports decisions per second (`thrpt`). After it, the bench
//! prints p50/p99 latency and decisions/s from a fixed run of each case, and
//! `MEMORY USAGE` per key for every algorithm (and for the hash encoding the
//! counter states could have used).
//!
//! Run: `cargo bench -p tollgate-redis --bench redis`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;
use tollgate_limiter::{LayerRequest, Limit, Policy, Store, StoreKey};
use tollgate_redis::script::{layer_args, sha1};
use tollgate_redis::{ConnectionMode, RedisStore};
use tollgate_testkit::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
const POOL_SIZE: u32 = 16;
/// Decisions per case in the latency run.
const LATENCY_RUN: usize = 40_000;

#[derive(Clone)]
enum Target {
    Store(Arc<RedisStore>),
    Raw(MultiplexedConnection, Arc<Vec<String>>),
}

struct Workload {
    policy: Policy,
    subjects: Vec<String>,
    args: [u64; 5],
}

impl Workload {
    fn new() -> Workload {
        let policy = Policy::new(
            "bench",
            Limit::token_bucket(100, 100, Duration::from_secs(1)).expect("valid"),
        )
        .expect("valid");
        let subjects: Vec<String> = (0..KEYS).map(|i| format!("s{i}")).collect();
        let key = StoreKey::new("s0", &policy, "subject", "s0");
        let args = layer_args(&LayerRequest {
            key,
            policy: &policy,
            cost: 1,
        })
        .expect("built-in");
        Workload {
            policy,
            subjects,
            args,
        }
    }
}

/// One decision on key `i`.
async fn decide(target: &mut Target, w: &Workload, i: usize) {
    match target {
        Target::Store(store) => {
            let s = &w.subjects[i];
            let key = StoreKey::new(s, &w.policy, "subject", s);
            let v = store
                .decide(&[LayerRequest {
                    key,
                    policy: &w.policy,
                    cost: 1,
                }])
                .await
                .expect("decision");
            assert!(v[0].allowed);
        }
        Target::Raw(con, keys) => {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha1()).arg(1).arg(&keys[i]).arg("").arg("");
            for a in w.args {
                cmd.arg(a);
            }
            let reply: Vec<i64> = cmd.query_async(con).await.expect("decision");
            assert_eq!(reply[0], 1);
        }
    }
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
            let (mut target, w) = (target.clone(), w.clone());
            let share =
                total / concurrency as u64 + u64::from((t as u64) < total % concurrency as u64);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(if record { share as usize } else { 0 });
                for j in 0..share as usize {
                    let i = (t * 7919 + j * concurrency) % KEYS;
                    let at = Instant::now();
                    decide(&mut target, &w, i).await;
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
    url: String,
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
    let url = server.url().to_string();
    let workload = Arc::new(Workload::new());
    let targets = rt.block_on(async {
        let store = |prefix: &'static str, mode| {
            let url = url.clone();
            async move {
                RedisStore::builder(url)
                    .prefix(prefix)
                    .connection_mode(mode)
                    // Long enough that queueing shows as latency (p99), not
                    // as failed decisions.
                    .deadline(Duration::from_secs(2))
                    .connect()
                    .await
                    .expect("connect")
            }
        };
        let multiplexed = store("bench-mx", ConnectionMode::Multiplexed).await;
        let pool = store("bench-pool", ConnectionMode::Pool { size: POOL_SIZE }).await;
        let raw = redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let keys: Vec<String> = workload
            .subjects
            .iter()
            .map(|s| {
                format!(
                    "bench-raw:{}",
                    StoreKey::new(s, &workload.policy, "subject", s)
                )
            })
            .collect();
        vec![
            ("store/multiplexed", Target::Store(Arc::new(multiplexed))),
            ("store/pool16", Target::Store(Arc::new(pool))),
            ("raw-script", Target::Raw(raw, Arc::new(keys))),
        ]
    });
    Setup {
        rt,
        _server: server,
        url,
        targets,
        workload,
    }
}

fn throughput(c: &mut Criterion, setup: &Setup) {
    for &concurrency in &CONCURRENCY {
        let mut group = c.benchmark_group(format!("redis/concurrency-{concurrency}"));
        group.throughput(Throughput::Elements(1));
        group.sample_size(20);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(4));
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

fn latency_report(setup: &Setup) {
    println!();
    println!("latency ({LATENCY_RUN} decisions per case, {KEYS} keys, token bucket, all admitted)");
    println!(
        "{:<20} {:>5} {:>14} {:>10} {:>10}",
        "target", "conc", "decisions/s", "p50 µs", "p99 µs"
    );
    for &concurrency in &CONCURRENCY {
        for (name, target) in &setup.targets {
            let (elapsed, mut latencies) = setup.rt.block_on(run(
                target,
                &setup.workload,
                concurrency,
                LATENCY_RUN as u64,
                true,
            ));
            latencies.sort_unstable();
            println!(
                "{:<20} {:>5} {:>14.0} {:>10} {:>10}",
                name,
                concurrency,
                LATENCY_RUN as f64 / elapsed.as_secs_f64(),
                percentile(&latencies, 0.50).as_micros(),
                percentile(&latencies, 0.99).as_micros(),
            );
        }
    }
}

fn memory_report(setup: &Setup) {
    let second = Duration::from_secs(1);
    let cases = [
        (
            "token_bucket",
            Limit::token_bucket(100, 100, second).unwrap(),
            1,
        ),
        ("gcra", Limit::gcra(100, second, 100).unwrap(), 1),
        ("fixed_window", Limit::fixed_window(100, second).unwrap(), 1),
        (
            "sliding_window",
            Limit::sliding_window(100, second).unwrap(),
            1,
        ),
        (
            "sliding_log (1 entry)",
            Limit::sliding_log(100, second).unwrap(),
            1,
        ),
        (
            "sliding_log (100 entries)",
            Limit::sliding_log(100, second).unwrap(),
            100,
        ),
    ];
    setup.rt.block_on(async {
        let store = RedisStore::builder(setup.url.as_str())
            .prefix("bench-mem")
            .connect()
            .await
            .expect("connect");
        let mut con = redis::Client::open(setup.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        println!();
        println!("MEMORY USAGE per key (bytes, key name included)");
        let mut counter_key = None;
        for (n, (name, limit, cost)) in cases.into_iter().enumerate() {
            let policy = Policy::new(name.split(' ').next().unwrap(), limit).unwrap();
            // A realistic subject length, and a fresh key per case.
            let subject = format!("user-{}", 123_456 + n);
            let key = StoreKey::new(&subject, &policy, "subject", &subject);
            store
                .decide(&[LayerRequest {
                    key,
                    policy: &policy,
                    cost,
                }])
                .await
                .expect("decision");
            let redis_key = store.redis_key(&key);
            let bytes: i64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&redis_key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut con)
                .await
                .unwrap();
            println!("{name:<28} {bytes:>6}   {redis_key}");
            if name == "token_bucket" {
                counter_key = Some(redis_key);
            }
        }
        // The alternative encoding for counter states: a hash of three fields.
        let key = counter_key.expect("token bucket key");
        let text: String = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        let cells: Vec<&str> = text.split(' ').collect();
        let hash_key = format!("{key}:as-hash");
        let _: () = redis::cmd("HSET")
            .arg(&hash_key)
            .arg("a")
            .arg(cells[0])
            .arg("b")
            .arg(cells[1])
            .arg("c")
            .arg(cells[2])
            .query_async(&mut con)
            .await
            .unwrap();
        let _: () = redis::cmd("PEXPIRE")
            .arg(&hash_key)
            .arg(60_000)
            .query_async(&mut con)
            .await
            .unwrap();
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&hash_key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap();
        println!(
            "{:<28} {bytes:>6}   (same cells as a hash: a/b/c fields)",
            "token_bucket as hash"
        );
    });
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let setup = setup();
    throughput(&mut c, &setup);
    latency_report(&setup);
    memory_report(&setup);
    c.final_summary();
}
