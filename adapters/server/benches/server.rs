//! The rate limit server against the library it is built on, in one run:
//! `ShouldRateLimit` through a tonic client (the same generated types) to
//! the server on the in-process store and on Redis, beside
//! `Limiter::check` on the same limits and stores, at concurrency 1, 16 and
//! 64. Client, server and Redis share this machine's cores; the report
//! gives CPU per decision (this process — client and server — plus Redis)
//! as well as throughput and latency.
//!
//! `cargo bench -p tollgate-ratelimit-server --bench server` (criterion
//! throughput at concurrency 16, then the report);
//! `REPORTS_ONLY=1 cargo bench -p tollgate-ratelimit-server --bench server`
//! for the report alone.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tokio::runtime::Runtime;
use tollgate_config::Config;
use tollgate_limiter::{Context, Limiter, MonotonicClock, Subject};
use tollgate_ratelimit_server::Server;
use tollgate_testkit::redis_server::RedisServer;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
const RUN: usize = 20_000;

/// A quota no decision of the bench exceeds: every decision admits and
/// writes.
const LIMITS: &str = r#"
[policies.roomy]
algorithm = "gcra"
rate = 1000000
period = "1s"
burst = 1000000

[routes.api]
layers = [{ name = "user", scope = "subject", policy = "roomy" }]

[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
response_headers = true

[[server.rules]]
name = "api"
domain = "bench"
route = "api"
entries = { user_id = "subject" }
"#;

#[derive(Clone)]
enum Target {
    Library(Arc<Limiter>, Arc<Vec<Context>>),
    Server(RateLimitServiceClient<tonic::transport::Channel>),
}

async fn decide(target: &mut Target, i: usize) {
    match target {
        Target::Library(limiter, contexts) => {
            let d = limiter.check(&contexts[i], 1).await.expect("decided");
            assert!(d.is_allowed());
        }
        Target::Server(client) => {
            let r = client
                .should_rate_limit(RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user_id".into(),
                            value: format!("user-{i}"),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                })
                .await
                .expect("answered")
                .into_inner();
            assert_eq!(r.overall_code, 1, "OK");
        }
    }
}

async fn run(
    target: &Target,
    concurrency: usize,
    total: usize,
    record: bool,
) -> (Duration, Vec<Duration>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let mut target = target.clone();
            let share = total / concurrency + usize::from(t < total % concurrency);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(if record { share } else { 0 });
                for j in 0..share {
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

/// This process's CPU time (user + system), from /proc.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th.
    let after = stat.rsplit_once(')').expect("a command name").1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Redis's CPU time (user + system), from `INFO cpu`.
fn redis_cpu(redis: &RedisServer) -> Duration {
    let info = redis.command(&["INFO", "cpu"]).text().unwrap_or_default();
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Duration::from_secs_f64(field("used_cpu_user") + field("used_cpu_sys"))
}

struct Setup {
    rt: Runtime,
    redis: RedisServer,
    targets: Vec<(&'static str, bool, Target)>,
    _servers: Vec<Server>,
    _files: Vec<std::path::PathBuf>,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let redis = RedisServer::start();
    let contexts: Arc<Vec<Context>> = Arc::new(
        (0..KEYS)
            .map(|i| Context::for_subject(Subject::new(format!("user-{i}")).unwrap()))
            .collect(),
    );
    let memory = LIMITS.to_string();
    let on_redis = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\nprefix = \"bench\"\n{LIMITS}",
        redis.url()
    );
    let mut targets = Vec::new();
    let mut servers = Vec::new();
    let mut files = Vec::new();
    rt.block_on(async {
        for (store, text, on_redis) in [("memory", &memory, false), ("redis", &on_redis, true)] {
            let clock = Arc::new(MonotonicClock::new());
            let config = Config::from_toml_str(text).expect("valid");
            let limiters = config.build(clock.clone()).await.expect("built");
            let limiter = Arc::new(limiters.route("api").expect("route").limiter().clone());
            let path = std::env::temp_dir().join(format!(
                "tollgate-bench-{store}-{}.toml",
                std::process::id()
            ));
            std::fs::File::create(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .expect("write");
            let server = Server::start(&path, clock).await.expect("server");
            let client = RateLimitServiceClient::connect(format!("http://{}", server.grpc_addr()))
                .await
                .expect("connect");
            let (lib, srv) = match store {
                "memory" => ("library/memory", "server/memory"),
                _ => ("library/redis", "server/redis"),
            };
            targets.push((lib, on_redis, Target::Library(limiter, contexts.clone())));
            targets.push((srv, on_redis, Target::Server(client)));
            servers.push(server);
            files.push(path);
        }
    });
    Setup {
        rt,
        redis,
        targets,
        _servers: servers,
        _files: files,
    }
}

fn throughput(c: &mut Criterion, setup: &Setup) {
    let concurrency = 16;
    let mut group = c.benchmark_group(format!("server/concurrency-{concurrency}"));
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for (name, _, target) in &setup.targets {
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| {
                let n = (iters as usize).max(concurrency);
                let (elapsed, _) = setup.rt.block_on(run(target, concurrency, n, false));
                elapsed.mul_f64(iters as f64 / n as f64)
            })
        });
    }
    group.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn report(setup: &Setup) {
    println!();
    println!(
        "{RUN} decisions per case over {KEYS} keys, all admitted; client, server and Redis \
         share this machine; CPU µs per decision = this process (client + server) + Redis"
    );
    println!(
        "{:<16} {:>5} {:>12} {:>8} {:>8} {:>10} {:>10}",
        "target", "conc", "decisions/s", "p50 µs", "p99 µs", "CPU µs", "Redis µs"
    );
    for &concurrency in &CONCURRENCY {
        for (name, on_redis, target) in &setup.targets {
            // Warm the connections and the keys.
            setup.rt.block_on(run(target, concurrency, KEYS, false));
            let (cpu0, redis0) = (process_cpu(), redis_cpu(&setup.redis));
            let (elapsed, mut latencies) = setup.rt.block_on(run(target, concurrency, RUN, true));
            let (cpu1, redis1) = (process_cpu(), redis_cpu(&setup.redis));
            latencies.sort_unstable();
            let redis = if *on_redis {
                redis1.saturating_sub(redis0)
            } else {
                Duration::ZERO
            };
            let per = |d: Duration| d.as_secs_f64() * 1e6 / RUN as f64;
            println!(
                "{name:<16} {concurrency:>5} {:>12.0} {:>8} {:>8} {:>10.1} {:>10.1}",
                RUN as f64 / elapsed.as_secs_f64(),
                percentile(&latencies, 0.50).as_micros(),
                percentile(&latencies, 0.99).as_micros(),
                per(cpu1.saturating_sub(cpu0)) + per(redis),
                per(redis),
            );
        }
    }
}

fn main() {
    let reports_only = std::env::var_os("REPORTS_ONLY").is_some();
    let mut c = Criterion::default().configure_from_args();
    let setup = setup();
    if !reports_only {
        throughput(&mut c, &setup);
    }
    report(&setup);
    for path in &setup._files {
        let _ = std::fs::remove_file(path);
    }
    if !reports_only {
        c.final_summary();
    }
}
