//! A hot global layer on Redis, leased and not, in one run on one
//! redis-server the bench starts itself.
//!
//! - `hot_global/per_decision`: every decision one store call (a global
//!   fixed window no decision exceeds, 16 tasks on one limiter);
//! - `hot_global/leased`: the same layer leased (batches of up to 1,000).
//!
//! After criterion, the report prints decisions/s of both in interleaved
//! rounds (median and ratio), then four limiters with their own leases
//! (four processes) sharing one leased window of 20,000 per second,
//! asked twice that each window: admitted per window (never above the
//! limit) and its share of the limit. Windows there are moved by a manual
//! clock between rounds, so each round is exactly one window.
//!
//! Run: `cargo bench -p tollgate-redis --bench lease` (only the report:
//! `REPORTS_ONLY=1 cargo bench -p tollgate-redis --bench lease`)

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tokio::runtime::Runtime;
use tollgate_limiter::{
    Clock, Context, Lease, Limit, Limiter, ManualClock, MonotonicClock, Policy, Scope, Timestamp,
};
use tollgate_redis::RedisStore;
use tollgate_testkit::redis_server::RedisServer;

/// Tasks deciding at once on one limiter.
const TASKS: usize = 16;
/// Decisions per task and measurement in the report.
const PER_TASK: usize = 2_000;
const ROUNDS: usize = 5;
/// The shared window of the four-process report.
const SHARED_LIMIT: u64 = 20_000;
const SHARED_BATCH: u64 = 200;
const PROCESSES: usize = 4;

async fn store(url: &str, prefix: &str, clock: Arc<dyn Clock>) -> Arc<RedisStore> {
    let store = RedisStore::builder(url)
        .prefix(prefix)
        .clock(clock)
        .deadline(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    Arc::new(store)
}

fn limiter(store: Arc<RedisStore>, clock: Arc<dyn Clock>, policy: Policy) -> Limiter {
    Limiter::builder(store)
        .clock(clock)
        .layer("all", Scope::Global, policy)
        .build()
        .expect("valid limiter")
}

/// A window no decision of the bench exceeds, leased or not.
fn roomy(leased: bool) -> Policy {
    let window = Limit::fixed_window(1_000_000_000, Duration::from_secs(1)).expect("valid");
    let policy = Policy::new("hot", window).expect("valid");
    if !leased {
        return policy;
    }
    let lease = Lease::new(Duration::from_secs(1))
        .and_then(|l| l.with_max_batch(1_000))
        .expect("valid");
    policy.leased(lease).expect("leasable")
}

/// `per_task` decisions in each of `tasks` tasks on `limiter`: how many
/// were admitted.
async fn hammer(limiter: &Limiter, tasks: usize, per_task: usize) -> u64 {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let ctx = Context::new();
                let mut admitted = 0;
                for _ in 0..per_task {
                    let d = limiter.check(&ctx, 1).await.expect("decides");
                    assert!(d.store_error().is_none(), "{d:?}");
                    admitted += u64::from(d.is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for h in handles {
        admitted += h.await.expect("task");
    }
    admitted
}

fn throughput(c: &mut Criterion, rt: &Runtime, targets: &[(&str, Limiter)]) {
    let mut group = c.benchmark_group("hot_global");
    group.throughput(Throughput::Elements((TASKS * 100) as u64));
    for (name, limiter) in targets {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        hammer(limiter, TASKS, 100).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn throughput_report(rt: &Runtime, targets: &[(&str, Limiter)]) {
    println!("\nhot global layer, {TASKS} tasks, decisions/s (rounds interleaved)");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for _ in 0..ROUNDS {
        for (i, (_, limiter)) in targets.iter().enumerate() {
            let start = Instant::now();
            rt.block_on(hammer(limiter, TASKS, PER_TASK));
            rates[i].push((TASKS * PER_TASK) as f64 / start.elapsed().as_secs_f64());
        }
    }
    let base = median(rates[0].clone());
    for ((name, _), r) in targets.iter().zip(&rates) {
        let per_round: Vec<String> = r.iter().map(|x| format!("{:.0}", x)).collect();
        let m = median(r.clone());
        println!(
            "  {name:<14} {m:>12.0}/s  {:>6.2}x per-decision  ({})",
            m / base,
            per_round.join(" ")
        );
    }
}

fn shared_report(rt: &Runtime, url: &str) {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let window = Limit::fixed_window(SHARED_LIMIT, Duration::from_secs(1)).expect("valid");
    let lease = Lease::default()
        .with_max_batch(SHARED_BATCH)
        .expect("valid");
    let policy = Policy::new("shared", window)
        .and_then(|p| p.leased(lease))
        .expect("valid");
    let processes: Vec<Limiter> = rt.block_on(async {
        let mut processes = Vec::new();
        for _ in 0..PROCESSES {
            let store = store(url, "bench-shared", shared.clone()).await;
            processes.push(limiter(store, shared.clone(), policy.clone()));
        }
        processes
    });
    println!(
        "\n{PROCESSES} limiters sharing a leased window of {SHARED_LIMIT}/s (batches ≤ {SHARED_BATCH}), \
         asked {}x the limit per window",
        2
    );
    let asked_per_task = 2 * SHARED_LIMIT as usize / (PROCESSES * 8);
    for window in 0..ROUNDS {
        let admitted: u64 = rt.block_on(async {
            let runs: Vec<_> = (processes.iter().cloned())
                .map(|p| tokio::spawn(async move { hammer(&p, 8, asked_per_task).await }))
                .collect();
            let mut total = 0;
            for run in runs {
                total += run.await.expect("process");
            }
            total
        });
        let share = admitted as f64 / SHARED_LIMIT as f64;
        let over = admitted.saturating_sub(SHARED_LIMIT);
        println!("  window {window}: admitted {admitted} ({share:.4} of the limit), over-admitted {over}");
        clock.advance(Duration::from_secs(1));
    }
}

fn main() {
    let reports_only = std::env::var_os("REPORTS_ONLY").is_some();
    let mut c = Criterion::default().configure_from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = RedisServer::start();
    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
    let targets: Vec<(&str, Limiter)> = rt.block_on(async {
        let plain = store(server.url(), "bench-plain", clock.clone()).await;
        let leased = store(server.url(), "bench-leased", clock.clone()).await;
        vec![
            ("per_decision", limiter(plain, clock.clone(), roomy(false))),
            ("leased", limiter(leased, clock.clone(), roomy(true))),
        ]
    });
    if !reports_only {
        throughput(&mut c, &rt, &targets);
    }
    throughput_report(&rt, &targets);
    shared_report(&rt, server.url());
    if !reports_only {
        c.final_summary();
    }
}
