//! The Redis store side by side with a hand-written token-bucket script,
//! in one run, on one redis-server the bench starts itself.
//!
//! Every case decides over 10,000 keys with a quota no decision exceeds, so
//! every decision admits and writes (the expensive path):
//!
//! - `limiter/module`: `Limiter::check` on a `RedisStore` (multiplexed
//!   connection), one token-bucket layer, decided by Tollgate's native
//!   module (`TOLLGATE.DECIDE`; the bench's server loads it, the store
//!   finds it); `limiter/module-3layers` three layers in one call;
//! - `limiter/fcall`: the same store and layer with the code run as a
//!   Redis function (`FCALL`, what a server without the module gets on
//!   Redis 7);
//! - `limiter/evalsha`: the same with `Engine::Eval` (the script form,
//!   as on Redis 6.2);
//! - `limiter/fcall-3layers`: three layers (subject, tenant, global), one
//!   call;
//! - `raw-fcall`: the same `FCALL` the store sends for one layer, through
//!   redis-rs alone (no limiter, no store): what the client path costs;
//!   `raw-fcall+deadline` the same under a `tokio::time::timeout`, as the
//!   store bounds every call: what the deadline's timer costs;
//! - `classic-script`: the classic token bucket users write by hand
//!   (`fixtures/classic_token_bucket.lua`, a hash per key, `EVALSHA`)
//!   through redis-rs on one multiplexed connection — the peer.
//!
//! Criterion reports decisions per second (`thrpt`) at concurrency 1, 16
//! and 64. After it the bench prints, from fixed runs: decisions/s and
//! p50/p99 latency per case and concurrency with the ratio to the classic
//! script; Redis CPU per call (`INFO commandstats` `usec_per_call`) per
//! algorithm, one and three layers, beside the classic script's, in
//! interleaved rounds; and `MEMORY USAGE` per key.
//!
//! Run: `cargo bench -p tollgate-redis --bench redis`
//! (only the reports, without criterion: `REPORTS_ONLY=1 cargo bench -p tollgate-redis --bench redis`;
//! `TARGETS=limiter/module,classic-script` keeps those targets only,
//! `REPORTS=latency` that report only: `latency`, `cost`, `memory`)

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use redis::aio::MultiplexedConnection;
use tokio::runtime::Runtime;
use tollgate_limiter::{
    CalendarUnit, Context, LayerRequest, Limit, Limiter, Policy, Recurrence, Scope, Store,
    StoreKey, Subject,
};
use tollgate_redis::{Engine, RedisStore};
use tollgate_testkit::command_stats::command_stats;
use tollgate_testkit::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Decisions per case and round in the latency run.
const LATENCY_RUN: usize = 40_000;
/// Rounds of the latency run (interleaved; medians are printed).
const LATENCY_ROUNDS: usize = 3;
/// Decisions per case and round in the Redis CPU report.
const COST_RUN: usize = 40_000;
/// Rounds of the Redis CPU report (interleaved; the median is printed).
const COST_ROUNDS: usize = 5;
/// The classic script users write by hand: a hash per key, `HMGET`,
/// `HSET`, `PEXPIRE` (a copy of the peers' fixture).
const CLASSIC: &str = include_str!("fixtures/classic_token_bucket.lua");

#[derive(Clone)]
enum Target {
    Limiter(Limiter, Arc<Vec<Context>>),
    Classic(MultiplexedConnection, Arc<Vec<String>>, String),
    /// Tollgate's `FCALL` as the store sends it, through redis-rs alone;
    /// with `true`, under a deadline as the store puts every call (what
    /// the timer costs).
    RawFcall(MultiplexedConnection, Arc<Vec<String>>, bool),
    /// A request through a concurrency layer: acquired, then released.
    Permits(Limiter, Arc<Vec<Context>>),
    /// `Limiter::check`, answered by the store, admitted or not (the
    /// denial case).
    Decided(Limiter, Arc<Vec<Context>>),
}

/// One decision on key `i`.
async fn decide(target: &mut Target, i: usize) {
    match target {
        Target::Limiter(limiter, contexts) => {
            let d = limiter.check(&contexts[i], 1).await.expect("decision");
            assert!(d.is_allowed() && d.store_error().is_none(), "{d:?}");
        }
        Target::Decided(limiter, contexts) => {
            let d = limiter.check(&contexts[i], 1).await.expect("decision");
            assert!(d.store_error().is_none(), "{d:?}");
        }
        Target::Permits(limiter, contexts) => {
            let acquired = limiter.acquire(&contexts[i], 1).await.expect("decision");
            // Dropped, as an adapter drops it: given back in the
            // background, batched with other requests' places.
            drop(acquired.permit.expect("admitted, holding its place"));
        }
        Target::Classic(con, keys, sha) => {
            let reply: Vec<i64> = redis::cmd("EVALSHA")
                .arg(sha.as_str())
                .arg(1)
                .arg(&keys[i])
                .arg(1_000_000)
                .arg(1_000_000)
                .arg(1)
                .query_async(con)
                .await
                .expect("decision");
            assert_eq!(reply[0], 1);
        }
        Target::RawFcall(con, keys, deadline) => {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(tollgate_redis::function_name())
                .arg(1)
                .arg(&keys[i])
                .arg("")
                .arg("");
            // Token bucket (code 1), cost 1, the bench's big bucket.
            for a in [1u64, 1, 1_000_000, 1_000_000, 1_000_000] {
                cmd.arg(a);
            }
            let call = cmd.query_async::<Vec<i64>>(con);
            let reply = if *deadline {
                tokio::time::timeout(Duration::from_secs(2), call)
                    .await
                    .expect("in time")
            } else {
                call.await
            };
            assert_eq!(reply.expect("decision")[0], 1);
        }
    }
}

/// `total` decisions by `concurrency` tasks over every key; the wall time,
/// and each decision's latency when `record`.
async fn run(
    target: &Target,
    concurrency: usize,
    total: u64,
    record: bool,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let mut target = target.clone();
            let share =
                total / concurrency as u64 + u64::from((t as u64) < total % concurrency as u64);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(if record { share as usize } else { 0 });
                for j in 0..share as usize {
                    let i = (t * 7919 + j * concurrency) % KEYS;
                    let at = Instant::now();
                    decide(&mut target, i).await;
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
}

/// A quota no decision of the bench exceeds.
fn roomy(name: &str, limit: Limit) -> Policy {
    Policy::new(name, limit).expect("valid")
}

fn big_bucket() -> Limit {
    Limit::token_bucket(1_000_000, 1_000_000, Duration::from_secs(1)).expect("valid")
}

/// A limiter over `store` with one token-bucket layer, or three.
fn limiter(store: RedisStore, three: bool) -> Limiter {
    let mut builder = Limiter::builder(Arc::new(store) as Arc<dyn Store>).layer(
        "key",
        Scope::Subject,
        roomy("api", big_bucket()),
    );
    if three {
        builder = builder
            .layer("tenant", Scope::Tenant, roomy("tenant", big_bucket()))
            .layer("all", Scope::Global, roomy("all", big_bucket()));
    }
    builder.build().expect("valid limiter")
}

/// The 10,000 requests: subjects of 16 characters, each its own tenant
/// (so three layers need one call on standalone Redis).
fn contexts() -> Vec<Context> {
    (0..KEYS)
        .map(|i| {
            let s = Subject::new(format!("key-{i:012}")).expect("valid");
            Context::for_subject(s.clone()).with_tenant(s)
        })
        .collect()
}

async fn store(url: &str, prefix: &str, engine: Engine) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .engine(engine)
        // Long enough that queueing shows as latency (p99), not as failed
        // decisions.
        .deadline(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect")
}

async fn classic(url: &str) -> (MultiplexedConnection, String) {
    let mut con = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(CLASSIC)
        .query_async(&mut con)
        .await
        .expect("SCRIPT LOAD");
    (con, sha)
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // The module built for this profile (release under `cargo bench`).
    let server = RedisServer::start_with_module(&[]);
    let url = server.url().to_string();
    let contexts = Arc::new(contexts());
    let targets = rt.block_on(async {
        let module = store(&url, "bench-module", Engine::Auto).await;
        assert!(
            module.settings().uses_module(),
            "the server loaded the module"
        );
        let module_three = store(&url, "bench-module-3", Engine::Module).await;
        let fcall = store(&url, "tollgate", Engine::Functions).await;
        assert!(fcall.settings().uses_functions(), "Redis 7 runs functions");
        let evalsha = store(&url, "bench-eval", Engine::Eval).await;
        let three = store(&url, "bench-3", Engine::Functions).await;
        let (con, sha) = classic(&url).await;
        let keys: Vec<String> = (0..KEYS).map(|i| format!("tb:key-{i:012}")).collect();
        let raw_keys: Vec<String> = (0..KEYS)
            .map(|i| format!("bench-raw:{{key-{i:012}}}:api:v1:tb:s"))
            .collect();
        vec![
            (
                "limiter/module",
                Target::Limiter(limiter(module, false), contexts.clone()),
            ),
            (
                "limiter/module-3layers",
                Target::Limiter(limiter(module_three, true), contexts.clone()),
            ),
            (
                "limiter/fcall",
                Target::Limiter(limiter(fcall, false), contexts.clone()),
            ),
            (
                "limiter/evalsha",
                Target::Limiter(limiter(evalsha, false), contexts.clone()),
            ),
            (
                "limiter/fcall-3layers",
                Target::Limiter(limiter(three, true), contexts.clone()),
            ),
            (
                "raw-fcall",
                Target::RawFcall(con.clone(), Arc::new(raw_keys.clone()), false),
            ),
            (
                "raw-fcall+deadline",
                Target::RawFcall(con.clone(), Arc::new(raw_keys), true),
            ),
            ("classic-script", Target::Classic(con, Arc::new(keys), sha)),
        ]
    });
    // `TARGETS=limiter/module,classic`: only the targets named (to profile one).
    let targets = match std::env::var("TARGETS") {
        Ok(only) => targets
            .into_iter()
            .filter(|(name, _)| only.split(',').any(|o| o == *name))
            .collect(),
        Err(_) => targets,
    };
    Setup {
        rt,
        _server: server,
        url,
        targets,
    }
}

fn throughput(c: &mut Criterion, setup: &Setup) {
    for &concurrency in &CONCURRENCY {
        let mut group = c.benchmark_group(format!("redis/concurrency-{concurrency}"));
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
                    let (elapsed, _) = setup.rt.block_on(run(target, concurrency, n, false));
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU time this process's threads have used so far (the client's: the
/// server is a process of its own), summed from each thread's
/// `/proc/self/task/<tid>/schedstat` (nanoseconds on a CPU).
fn client_cpu() -> Duration {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux's /proc");
    let nanos: u64 = tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Duration::from_nanos(nanos)
}

/// One end-to-end run of `target` at `concurrency`: decisions/s, p50,
/// p99, and the bench process's CPU per decision (µs).
fn end_to_end(
    setup: &Setup,
    target: &Target,
    concurrency: usize,
) -> (f64, Duration, Duration, f64) {
    let cpu = client_cpu();
    let (elapsed, mut latencies) =
        setup
            .rt
            .block_on(run(target, concurrency, LATENCY_RUN as u64, true));
    let cpu_us = (client_cpu() - cpu).as_secs_f64() * 1e6 / LATENCY_RUN as f64;
    latencies.sort_unstable();
    (
        LATENCY_RUN as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        cpu_us,
    )
}

fn latency_report(setup: &Setup) {
    println!();
    println!(
        "end to end ({LATENCY_RUN} decisions per case and round, {LATENCY_ROUNDS} interleaved rounds, \
         medians; {KEYS} keys, all admitted; ratio: decisions/s over the classic script's at the \
         same concurrency; client µs: the bench process's CPU per decision, and its ratio to the \
         classic's, per round in brackets)"
    );
    println!(
        "{:<24} {:>5} {:>12} {:>8} {:>8} {:>7} {:>9} {:>7}",
        "target", "conc", "decisions/s", "p50 µs", "p99 µs", "ratio", "client µs", "ratio"
    );
    for &concurrency in &CONCURRENCY {
        // rounds[t][r]: target t's run in round r.
        let mut rounds: Vec<Vec<(f64, Duration, Duration, f64)>> =
            vec![Vec::new(); setup.targets.len()];
        for _ in 0..LATENCY_ROUNDS {
            for (t, (_, target)) in setup.targets.iter().enumerate() {
                rounds[t].push(end_to_end(setup, target, concurrency));
            }
        }
        let classic = setup
            .targets
            .iter()
            .position(|(n, _)| *n == "classic-script");
        let per_round = |t: usize, r: usize| {
            let (rate, _, _, cpu) = rounds[t][r];
            classic.map_or((1.0, 1.0), |c| {
                (rate / rounds[c][r].0, cpu / rounds[c][r].3)
            })
        };
        for (t, (name, _)) in setup.targets.iter().enumerate() {
            let of = |f: fn(&(f64, Duration, Duration, f64)) -> f64| {
                median(rounds[t].iter().map(f).collect())
            };
            let cpu_ratios: Vec<f64> = (0..LATENCY_ROUNDS).map(|r| per_round(t, r).1).collect();
            let shown: Vec<String> = cpu_ratios.iter().map(|x| format!("{x:.2}")).collect();
            println!(
                "{name:<24} {concurrency:>5} {:>12.0} {:>8.0} {:>8.0} {:>7.2} {:>9.2} {:>7.2} [{}]",
                of(|r| r.0),
                of(|r| r.1.as_micros() as f64),
                of(|r| r.2.as_micros() as f64),
                median((0..LATENCY_ROUNDS).map(|r| per_round(t, r).0).collect()),
                of(|r| r.3),
                median(cpu_ratios),
                shown.join(" ")
            );
        }
    }
}

/// Redis CPU of `command` per request over `requests` requests, from
/// `INFO commandstats` (`usec_per_call` × `calls`): one call per request
/// for a decision, two for a concurrency layer's acquire and release.
async fn usec_per_request(
    con: &mut MultiplexedConnection,
    command: &str,
    requests: usize,
) -> (f64, f64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .expect("INFO");
    let stats = command_stats(&info);
    let stats = stats
        .get(command)
        .unwrap_or_else(|| panic!("no {command} in INFO commandstats"));
    let calls = stats.calls as f64 / requests as f64;
    (stats.usec_per_call * calls, calls)
}

/// Redis CPU per call for each algorithm (one layer, functions), one layer
/// through the script form, three layers, and the classic script, in
/// interleaved rounds at concurrency 16.
fn cost_report(setup: &Setup) {
    let second = Duration::from_secs(1);
    let limits = [
        ("token bucket", big_bucket()),
        (
            "gcra",
            Limit::gcra(1_000_000, second, 1_000_000).expect("valid"),
        ),
        (
            "fixed window",
            Limit::fixed_window(1_000_000, second).expect("valid"),
        ),
        (
            "sliding window",
            Limit::sliding_window(1_000_000, second).expect("valid"),
        ),
        // The largest log allowed; each key holds the few entries of the
        // last second (a handful per round).
        (
            "sliding log",
            Limit::sliding_log(10_000, second).expect("valid"),
        ),
        // The calendar quota's goal: a calendar month against a fixed
        // window of the same length.
        (
            "fixed window 30 d",
            Limit::fixed_window(1_000_000, 30 * 24 * 3600 * second).expect("valid"),
        ),
        // Denials: one token a day per key, spent by the first round (a
        // denial reads the state, writes nothing, and checks its TTL).
        (
            "token bucket denied",
            Limit::token_bucket(1, 1, 86_400 * second).expect("valid"),
        ),
        (
            "calendar month",
            Limit::calendar(
                1_000_000,
                Recurrence::new(CalendarUnit::Month, "America/New_York", "2025-01-01T00:00")
                    .expect("valid"),
            )
            .expect("valid"),
        ),
    ];
    setup.rt.block_on(async {
        let url = setup.url.as_str();
        let mut admin = classic(url).await.0;
        let mut cases: Vec<(String, &'static str, Target)> = Vec::new();
        for (name, limit) in &limits {
            for (way, engine, command) in [
                ("module", Engine::Module, "tollgate.decide"),
                ("fcall", Engine::Functions, "fcall"),
            ] {
                let store = store(url, "bench-cost", engine).await;
                // (The denials' bucket under a policy of its own: under
                // "api" it would share the token bucket's keys.)
                let denied = name.ends_with("denied");
                let policy = roomy(if denied { "denied" } else { "api" }, limit.clone());
                let limiter = Limiter::builder(Arc::new(store) as Arc<dyn Store>)
                    .layer("key", Scope::Subject, policy)
                    .build()
                    .expect("valid");
                let contexts = Arc::new(contexts());
                let target = match denied {
                    true => Target::Decided(limiter, contexts),
                    false => Target::Limiter(limiter, contexts),
                };
                cases.push((format!("{name}, 1 layer, {way}"), command, target));
            }
        }
        // The concurrency goal: a layer of requests in flight (each
        // acquired, then released) against a token bucket's decision.
        for (way, engine, command) in [
            ("module", Engine::Module, "tollgate.decide"),
            ("fcall", Engine::Functions, "fcall"),
        ] {
            let store = store(url, "bench-cost", engine).await;
            let in_flight = Limit::concurrency(10_000, 30 * second).expect("valid");
            let limiter = Limiter::builder(Arc::new(store) as Arc<dyn Store>)
                .layer("key", Scope::Subject, roomy("in-flight", in_flight))
                .build()
                .expect("valid");
            cases.push((
                format!("concurrency, acquire + release, {way}"),
                command,
                Target::Permits(limiter, Arc::new(contexts())),
            ));
        }
        for (name, _) in &setup.targets {
            let (label, command) = match *name {
                "limiter/module-3layers" => ("token bucket, 3 layers, module", "tollgate.decide"),
                "limiter/evalsha" => ("token bucket, 1 layer, evalsha", "evalsha"),
                "limiter/fcall-3layers" => ("token bucket, 3 layers, fcall", "fcall"),
                "classic-script" => ("classic token bucket (evalsha)", "evalsha"),
                _ => continue,
            };
            let target = setup
                .targets
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .expect("target");
            cases.push((label.to_string(), command, target));
        }
        // `COST_CASES=acquire + release|token bucket, 1`: only the cases whose
        // label holds one of these (to profile one; the classic's stays).
        if let Ok(only) = std::env::var("COST_CASES") {
            cases.retain(|(label, _, _)| {
                label.starts_with("classic") || only.split('|').any(|w| label.contains(w))
            });
        }
        let mut seen: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        let mut calls_seen: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        for _ in 0..COST_ROUNDS {
            for (i, (_, command, target)) in cases.iter().enumerate() {
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query_async(&mut admin)
                    .await
                    .expect("RESETSTAT");
                run(target, 16, COST_RUN as u64, false).await;
                // Releases of dropped permits finish in the background.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let (usec, calls) = usec_per_request(&mut admin, command, COST_RUN).await;
                seen[i].push(usec);
                calls_seen[i].push(calls);
            }
        }
        let classic = median(seen.last().expect("the classic case").clone());
        println!();
        println!(
            "Redis CPU per request (INFO commandstats usec_per_call x calls / requests, median of \
             {COST_ROUNDS} interleaved rounds of {COST_RUN} requests at concurrency 16)"
        );
        println!("{:<36} {:>8} {:>9}", "call", "µs", "vs classic");
        let mut medians = Vec::new();
        for ((label, _, _), rounds) in cases.iter().zip(seen) {
            let us = median(rounds);
            println!("{label:<36} {us:>8.2} {:>9.2}", us / classic);
            medians.push((label.as_str(), us));
        }
        let of = |label: &str| medians.iter().find(|(l, _)| *l == label).map(|(_, us)| *us);
        let calls_of = |label: &str| {
            let i = cases.iter().position(|(l, _, _)| l == label).expect("a case");
            median(calls_seen[i].clone())
        };
        println!();
        println!("concurrency goal: a request's acquire + release / a token bucket's decision, Redis CPU per request (goal <= 1.30)");
        for way in ["module", "fcall"] {
            let label = format!("concurrency, acquire + release, {way}");
            let (Some(held), Some(bucket)) = (of(&label), of(&format!("token bucket, 1 layer, {way}")))
            else {
                continue;
            };
            let ratio = held / bucket;
            let met = if ratio <= 1.30 { "met" } else { "not met" };
            // One acquire per request; the rest are releases, batched.
            let calls = calls_of(&label);
            println!("  {way:<7} {held:.2} / {bucket:.2} µs = {ratio:.2}  {met}; store calls per request {calls:.2} (1 acquire + {:.2} batched releases; goal: the acquire alone)", calls - 1.0);
        }
        println!("calendar quota goal: a calendar month / a 30-day fixed window, Redis CPU per call (goal <= 1.10)");
        for way in ["module", "fcall"] {
            let calendar = of(&format!("calendar month, 1 layer, {way}"));
            let fixed = of(&format!("fixed window 30 d, 1 layer, {way}"));
            let (Some(calendar), Some(fixed)) = (calendar, fixed) else {
                continue;
            };
            let ratio = calendar / fixed;
            let met = if ratio <= 1.10 { "met" } else { "not met" };
            println!("  {way:<7} {calendar:.2} / {fixed:.2} µs = {ratio:.2}  {met}");
        }
    });
}

fn memory_report(setup: &Setup) {
    let second = Duration::from_secs(1);
    let cases = [
        ("token_bucket", big_bucket(), 1),
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
        (
            "calendar (a month)",
            Limit::calendar(
                100,
                Recurrence::new(CalendarUnit::Month, "UTC", "2025-01-01T00:00").unwrap(),
            )
            .unwrap(),
            1,
        ),
    ];
    setup.rt.block_on(async {
        // The default prefix, a policy named `api`, the limiter's scope.
        let store = RedisStore::builder(setup.url.as_str())
            .connect()
            .await
            .expect("connect");
        let mut con = classic(&setup.url).await.0;
        println!();
        println!(
            "MEMORY USAGE per key (bytes, key name included; default prefix, policy `api`, \
             subject scope)"
        );
        let scope = Scope::Subject.key_label();
        for subject_len in [16, 34] {
            for (n, (name, limit, cost)) in cases.iter().enumerate() {
                let policy = Policy::new("api", limit.clone()).unwrap();
                // A fresh subject of the length wanted per case (34: a
                // `Subject::hashed` API key's length).
                let subject: String =
                    format!("{n}{}", "x".repeat(subject_len))[..subject_len].to_string();
                let key = StoreKey::new(&subject, &policy, &scope, &subject);
                tollgate_limiter::ask(
                    &store,
                    &[LayerRequest {
                        key,
                        policy: &policy,
                        cost: *cost,
                    }],
                )
                .await
                .expect("decision");
                let redis_key = store.settings().redis_key(&key);
                let bytes: i64 = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(&redis_key)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                println!("{name:<28} {bytes:>6}   {redis_key}");
                let _: () = redis::cmd("DEL")
                    .arg(&redis_key)
                    .query_async(&mut con)
                    .await
                    .unwrap();
            }
        }
        // The classic script's hash, for comparison.
        let (mut con, sha) = classic(&setup.url).await;
        let key = format!("tb:{}", "x".repeat(16));
        let _: Vec<i64> = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(100)
            .arg(100)
            .arg(1)
            .query_async(&mut con)
            .await
            .unwrap();
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap();
        println!("{:<28} {bytes:>6}   {key}", "classic script (hash)");
    });
}

fn main() {
    let reports_only = std::env::var_os("REPORTS_ONLY").is_some();
    let mut c = Criterion::default().configure_from_args();
    let setup = setup();
    if !reports_only {
        throughput(&mut c, &setup);
    }
    // `REPORTS=latency,cost`: only the reports named (default: all three).
    let only = std::env::var("REPORTS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|r| r == name))
    };
    if wanted("latency") {
        latency_report(&setup);
    }
    if wanted("cost") {
        cost_report(&setup);
    }
    if wanted("memory") {
        memory_report(&setup);
    }
    if !reports_only {
        c.final_summary();
    }
}
