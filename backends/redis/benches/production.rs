//! What the production settings cost, side by side in one run on one
//! primary with a replica (both started here): the plain store, the same
//! over TLS (mutual, certificates made here), and with `replica_ack(1, _)`
//! on a multiplexed connection and on a pool of 16.
//!
//! Every case decides over 10,000 keys, one token-bucket layer, every
//! decision admitted (each one a charge, so each waits for the replica
//! when acknowledgement is on). Printed: decisions/s, p50 and p99 latency
//! at concurrency 1, 16 and 64, and the ratio to the plain store.
//!
//! Run: `cargo bench -p tollgate-redis --bench production`

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
use tollgate_redis::{ConnectionMode, RedisStore, RedisStoreBuilder, Tls};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::resp::Reply;
use tollgate_testkit::tls_certificates::TestCertificates;

const KEYS: usize = 10_000;
const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Decisions per case and concurrency.
const RUN: usize = 20_000;
/// Rounds (interleaved: every case once per round); the median round is
/// printed.
const ROUNDS: usize = 3;

fn limiter(store: RedisStore) -> Limiter {
    let limit = Limit::token_bucket(1_000_000, 1_000_000, Duration::from_secs(1)).expect("valid");
    Limiter::builder(Arc::new(store))
        .layer(
            "key",
            Scope::Subject,
            Policy::new("api", limit).expect("valid"),
        )
        .build()
        .expect("limiter")
}

async fn connect(builder: RedisStoreBuilder, prefix: &str) -> Limiter {
    let store = builder
        .prefix(prefix)
        .deadline(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect");
    limiter(store)
}

/// `RUN` decisions by `concurrency` tasks: decisions/s, p50, p99.
async fn run(
    limiter: &Limiter,
    contexts: &Arc<Vec<Context>>,
    concurrency: usize,
) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let (limiter, contexts) = (limiter.clone(), contexts.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                for j in 0..RUN / concurrency {
                    let ctx = &contexts[(t * 7919 + j * concurrency) % KEYS];
                    let at = Instant::now();
                    let d = limiter.check(ctx, 1).await.expect("decision");
                    assert!(d.is_allowed() && d.store_error().is_none(), "{d:?}");
                    latencies.push(at.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("task"));
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    (rate, at(0.50), at(0.99))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let certs = TestCertificates::generate();
    let primary = RedisServer::start_tls(&certs, &["--repl-diskless-sync-delay", "0"]);
    let port = primary.port().to_string();
    let _replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert_eq!(
        primary.command(&["WAIT", "1", "10000"]),
        Reply::Int(1),
        "the replica is in sync"
    );
    let url = primary.url().to_string();
    let tls_url = primary.tls_url().expect("TLS");
    let tls = Tls::new()
        .ca_pem(certs.ca_pem())
        .client_pem(certs.client_cert_pem(), certs.client_key_pem());
    let ack = Duration::from_millis(100);
    let cases: Vec<(&str, Limiter)> = rt.block_on(async {
        vec![
            ("plain", connect(RedisStore::builder(&url), "plain").await),
            (
                "tls",
                connect(RedisStore::builder(&tls_url).tls(tls), "tls").await,
            ),
            (
                "replica_ack",
                connect(RedisStore::builder(&url).replica_ack(1, ack), "ack").await,
            ),
            (
                "replica_ack, pool 16",
                connect(
                    RedisStore::builder(&url)
                        .replica_ack(1, ack)
                        .connection_mode(ConnectionMode::Pool { size: 16 }),
                    "ackpool",
                )
                .await,
            ),
        ]
    });
    let contexts: Arc<Vec<Context>> = Arc::new(
        (0..KEYS)
            .map(|i| Context::for_subject(Subject::new(format!("key-{i:06}")).expect("subject")))
            .collect(),
    );
    println!("production settings ({RUN} decisions per case, {KEYS} keys, all admitted; median of {ROUNDS} interleaved rounds; ratio: decisions/s over the plain store's)");
    println!(
        "{:<22} {:>5} {:>12} {:>8} {:>8} {:>7}",
        "case", "conc", "decisions/s", "p50 µs", "p99 µs", "ratio"
    );
    for &concurrency in &CONCURRENCY {
        let mut rounds: Vec<Vec<(f64, Duration, Duration)>> = vec![Vec::new(); cases.len()];
        for _ in 0..ROUNDS {
            for (i, (_, limiter)) in cases.iter().enumerate() {
                rounds[i].push(rt.block_on(run(limiter, &contexts, concurrency)));
            }
        }
        let medians: Vec<(f64, Duration, Duration)> = rounds
            .into_iter()
            .map(|mut r| {
                r.sort_by(|a, b| a.0.total_cmp(&b.0));
                r[r.len() / 2]
            })
            .collect();
        let plain = medians[0].0;
        for ((name, _), (rate, p50, p99)) in cases.iter().zip(medians) {
            println!(
                "{name:<22} {concurrency:>5} {rate:>12.0} {:>8} {:>8} {:>7.2}",
                p50.as_micros(),
                p99.as_micros(),
                rate / plain
            );
        }
    }
}
