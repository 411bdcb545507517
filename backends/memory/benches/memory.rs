//! In-process decisions per second, side by side with governor, in one run.
#![allow(missing_docs)] // criterion_group! generates undocumented items
//!
//! Run: `cargo bench -p tollgate-memory --bench memory` (and
//! `cargo xtask bench`, which prints the ratios).
//!
//! One group, `in_process`, each case on 1 and 2 threads; Tollgate goes
//! through the whole public path (`Limiter::check` on a `MemoryStore`,
//! default features, GCRA unless said otherwise):
//! - `tollgate_keyed` / `governor_keyed_string` / `governor_keyed_u64`:
//!   10,000 subjects round robin under a quota no decision exceeds, so every
//!   decision is an admission and a write; `…_random`: the same subjects in
//!   a pseudo-random order (what a service sees: in-order walks keep the
//!   next entry in cache and hide what a decision touches);
//! - `tollgate_keyed_denied` / `governor_keyed_string_denied`: the same keys,
//!   every one already spent: every decision is a denial;
//! - `tollgate_hot_global` / `governor_direct`: one key, a `Scope::Global`
//!   layer (its key fixed when the limiter is built) against governor's
//!   direct limiter; `tollgate_hot_subject`: one subject's key in a
//!   `Scope::Subject` layer (found per decision);
//! - `tollgate_three_layers`: per subject (GCRA), per tenant (token bucket)
//!   and global (fixed window), decided together, all admitting;
//! - `tollgate_keyed_plan_cached` / `tollgate_keyed_plan_table`: as
//!   `tollgate_keyed`, each subject's plan (half of them on a plan of their
//!   own) from a plan source's cache, every answer cached before the run,
//!   or from the static table.
//!
//! Built with `--features metrics`, the Tollgate cases are named
//! `…+metrics` and a recorder counting into atomics is installed first, so
//! `cargo xtask bench` can compare them with the run without the feature.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use tollgate_limiter::{
    CalendarUnit, Context, Limit, Limiter, Plan, PlanCacheConfig, PlanName, PlanSource,
    PlanSourceError, Plans, Policy, Recurrence, Scope, Subject,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

const KEYS: usize = 10_000;
const TENANTS: usize = 100;
const OPS: u64 = 10_000;

/// A fixed pseudo-random permutation of `0..KEYS` (Fisher–Yates driven by
/// xorshift): walked in turn, every key is visited as often as in order, in
/// an order no prefetcher follows.
fn scattered() -> Vec<usize> {
    let mut order: Vec<usize> = (0..KEYS).collect();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for i in (1..KEYS).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// Run `iters` calls of `op(i)` split over `threads` threads; the wall time.
fn timed(threads: usize, iters: u64, op: &(dyn Fn(u64) + Sync)) -> Duration {
    let per = iters / threads as u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let base = t as u64 * 7_919;
                for i in 0..per {
                    op(base + i);
                }
            });
        }
    });
    start.elapsed()
}

/// A limit no benchmark run exceeds, for one of 10,000 keys: one per
/// second with a burst of a million. Each key is decided far more often than
/// once a second, so its state lives on (an existing key, as in a service
/// with many active clients) and every decision admits and writes. (A
/// higher rate would let each state expire between two visits.)
fn roomy_keyed() -> Limit {
    Limit::gcra(1, Duration::from_secs(1), 1_000_000).expect("valid")
}

/// The same for one hot key: a million per second, a burst of a billion.
fn roomy_hot() -> Limit {
    Limit::gcra(1_000_000, Duration::from_secs(1), 1_000_000_000).expect("valid")
}

/// One request per hour: after the first, every decision denies.
fn spent() -> Limit {
    Limit::gcra(1, Duration::from_secs(3_600), 1).expect("valid")
}

fn limiter(scope: Scope, limit: Limit) -> Limiter {
    let store = Arc::new(MemoryStore::builder().max_keys(4 * KEYS).build());
    Limiter::builder(store)
        .layer("key", scope, Policy::new("bench", limit).expect("valid"))
        .build()
        .expect("valid")
}

fn three_layers() -> Limiter {
    let store = Arc::new(MemoryStore::builder().max_keys(4 * KEYS).build());
    let tenant = Limit::token_bucket(1_000_000_000, 1_000, Duration::from_secs(1));
    let global = Limit::fixed_window(1_000_000_000, Duration::from_secs(3_600));
    Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("per-key", roomy_keyed()).expect("valid"),
        )
        .layer(
            "tenant",
            Scope::Tenant,
            Policy::new("per-tenant", tenant.expect("valid")).expect("valid"),
        )
        .layer(
            "all",
            Scope::Global,
            Policy::new("global", global.expect("valid")).expect("valid"),
        )
        .build()
        .expect("valid")
}

/// Subjects of even number are on the plan `pro`, the others on the
/// default: from a source whose every answer is cached before the run, or
/// from the static table.
fn planned(contexts: &[Context], from_source: bool) -> Limiter {
    #[derive(Debug)]
    struct Evens;
    #[tollgate_limiter::async_trait]
    impl PlanSource for Evens {
        async fn plan_of(&self, who: &Subject) -> Result<Option<PlanName>, PlanSourceError> {
            let n: usize = who.as_str()["client-".len()..]
                .parse()
                .expect("a bench subject");
            Ok(n.is_multiple_of(2)
                .then(|| PlanName::new("pro").expect("valid")))
        }
    }
    let pro = Plan::new("pro")
        .expect("valid")
        .limit("bench", roomy_keyed());
    let mut plans = Plans::new(Plan::new("free").expect("valid")).plan(pro);
    if from_source {
        plans = plans.source(
            Arc::new(Evens),
            PlanCacheConfig::default().ttl(Duration::from_secs(3_600)),
        );
    } else {
        for ctx in contexts.iter().step_by(2) {
            let subject = ctx.subject().expect("a subject").clone();
            plans = plans.assign(subject, PlanName::new("pro").expect("valid"));
        }
    }
    let store = Arc::new(MemoryStore::builder().max_keys(4 * KEYS).build());
    let limiter = Limiter::builder(store)
        .layer(
            "key",
            Scope::Subject,
            Policy::new("bench", roomy_keyed()).expect("valid"),
        )
        .plans(plans)
        .build()
        .expect("valid");
    // Every plan asked once (the source's answers now cached).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    for ctx in contexts {
        runtime.block_on(limiter.check(ctx, 1)).expect("decides");
    }
    limiter
}

/// Governor's quota of the same shape: never exceeded, or spent.
fn quota(roomy: bool) -> Quota {
    if roomy {
        Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"))
    } else {
        Quota::per_hour(NonZeroU32::new(1).expect("non-zero"))
    }
}

/// Case names: `…+metrics` when built with the `metrics` feature.
fn name(case: &str) -> String {
    if cfg!(feature = "metrics") {
        format!("{case}+metrics")
    } else {
        case.to_string()
    }
}

fn bench(c: &mut Criterion) {
    #[cfg(feature = "metrics")]
    tollgate_testkit::AtomicRecorder::install();
    let names: Vec<String> = (0..KEYS).map(|i| format!("client-{i}")).collect();
    let ids: Vec<u64> = (0..KEYS as u64).collect();
    let order = scattered();
    let contexts: Vec<Context> = names
        .iter()
        .map(|n| Context::for_subject(Subject::new(n).expect("valid")))
        .collect();
    let with_tenants: Vec<Context> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            Context::for_subject(Subject::new(n).expect("valid"))
                .with_tenant(Subject::new(format!("tenant-{}", i % TENANTS)).expect("valid"))
        })
        .collect();
    let check = |limiter: &Limiter, ctx: &Context| {
        black_box(ready(limiter.check(ctx, 1)).expect("decides").is_allowed())
    };

    let mut group = c.benchmark_group("in_process");
    group.throughput(Throughput::Elements(OPS));
    for threads in [1, 2] {
        let mut case = |label: &str, op: &(dyn Fn(u64) + Sync)| {
            group.bench_with_input(BenchmarkId::new(label, threads), &threads, |b, &t| {
                b.iter_custom(|iters| timed(t, iters * OPS, op))
            });
        };

        let keyed = limiter(Scope::Subject, roomy_keyed());
        case(&name("tollgate_keyed"), &|i| {
            check(&keyed, &contexts[i as usize % KEYS]);
        });
        let governor = RateLimiter::<String, _, _>::keyed(quota(true));
        case("governor_keyed_string", &|i| {
            black_box(governor.check_key(&names[i as usize % KEYS]).is_ok());
        });
        case(&name("tollgate_keyed_random"), &|i| {
            check(&keyed, &contexts[order[i as usize % KEYS]]);
        });
        case("governor_keyed_string_random", &|i| {
            black_box(governor.check_key(&names[order[i as usize % KEYS]]).is_ok());
        });
        let governor = RateLimiter::<u64, _, _>::keyed(quota(true));
        case("governor_keyed_u64", &|i| {
            black_box(governor.check_key(&ids[i as usize % KEYS]).is_ok());
        });
        case("governor_keyed_u64_random", &|i| {
            black_box(governor.check_key(&ids[order[i as usize % KEYS]]).is_ok());
        });

        let denied = limiter(Scope::Subject, spent());
        for ctx in &contexts {
            check(&denied, ctx);
        }
        case(&name("tollgate_keyed_denied"), &|i| {
            check(&denied, &contexts[i as usize % KEYS]);
        });
        let governor = RateLimiter::<String, _, _>::keyed(quota(false));
        for n in &names {
            let _ = governor.check_key(n);
        }
        case("governor_keyed_string_denied", &|i| {
            black_box(governor.check_key(&names[i as usize % KEYS]).is_ok());
        });

        let hot = limiter(Scope::Global, roomy_hot());
        let anyone = &contexts[0];
        case(&name("tollgate_hot_global"), &|_| {
            check(&hot, anyone);
        });
        let one = limiter(Scope::Subject, roomy_hot());
        case(&name("tollgate_hot_subject"), &|_| {
            check(&one, anyone);
        });
        let governor = RateLimiter::direct(quota(true));
        case("governor_direct", &|_| {
            black_box(governor.check().is_ok());
        });

        for (label, from_source) in [
            ("tollgate_keyed_plan_cached", true),
            ("tollgate_keyed_plan_table", false),
        ] {
            let planned = planned(&contexts, from_source);
            case(&name(label), &|i| {
                check(&planned, &contexts[i as usize % KEYS]);
            });
        }

        // A calendar month (New York time) beside a fixed window of the
        // same length: what finding the span in the time zone costs.
        let month = Duration::from_secs(30 * 24 * 3600);
        let every = Recurrence::new(CalendarUnit::Month, "America/New_York", "2025-01-01T00:00");
        for (label, limit) in [
            (
                "tollgate_keyed_fixed_30d",
                Limit::fixed_window(1_000_000_000, month),
            ),
            (
                "tollgate_keyed_calendar_month",
                Limit::calendar(1_000_000_000, every.expect("valid")),
            ),
        ] {
            let quota = limiter(Scope::Subject, limit.expect("valid"));
            case(&name(label), &|i| {
                check(&quota, &contexts[i as usize % KEYS]);
            });
        }

        let layered = three_layers();
        case(&name("tollgate_three_layers"), &|i| {
            check(&layered, &with_tenants[i as usize % KEYS]);
        });
        case(&name("tollgate_three_layers_random"), &|i| {
            check(&layered, &with_tenants[order[i as usize % KEYS]]);
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
