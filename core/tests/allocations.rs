//! A decision on the in-process store allocates nothing in steady state
//! (existing keys, one to four layers, every counter algorithm), with the
//! default features and with every feature on (`metrics` counting into a
//! recorder, `tracing`, the blocked-key cache). The sliding log is left
//! out: its log may grow.
//!
//! One test in this binary: the allocator's counts are process-wide.

use std::alloc::System;
use std::sync::Arc;
use std::time::Duration;

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tollgate_limiter::{
    Context, Limit, Limiter, ManualClock, Plan, PlanName, Plans, Policy, Scope, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KEYS: usize = 64;

fn limits() -> Vec<(&'static str, Limit)> {
    let hour = Duration::from_secs(3_600);
    vec![
        (
            "token-bucket",
            Limit::token_bucket(1_000, 1, Duration::from_secs(1)).unwrap(),
        ),
        (
            "gcra",
            Limit::gcra(1, Duration::from_secs(1), 1_000).unwrap(),
        ),
        (
            "fixed-window",
            Limit::fixed_window(1_000_000, hour).unwrap(),
        ),
        (
            "sliding-window",
            Limit::sliding_window(1_000_000, hour).unwrap(),
        ),
    ]
}

/// A limiter with `layers` layers of `limit`: per subject, per tenant,
/// global, per route attribute (in that order).
/// With `plans`, half the clients are on a plan of their own (from the
/// static table), the others on the default.
fn limiter(limit: &Limit, layers: usize, clock: &ManualClock, plans: bool) -> Limiter {
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let scopes = [
        Scope::Subject,
        Scope::Tenant,
        Scope::Global,
        Scope::Attribute("route".into()),
    ];
    let mut builder = Limiter::builder(Arc::new(store)).clock(Arc::new(clock.clone()));
    for (i, scope) in scopes.into_iter().take(layers).enumerate() {
        let policy = Policy::new(format!("layer-{i}"), limit.clone()).unwrap();
        builder = builder.layer(format!("layer-{i}"), scope, policy);
    }
    #[cfg(feature = "blocked-cache")]
    {
        builder = builder.blocked_cache(tollgate_limiter::BlockedCacheConfig::default());
    }
    if plans {
        let pro = Plan::new("pro").unwrap().limit("layer-0", limit.clone());
        let mut table = Plans::new(Plan::new("free").unwrap()).plan(pro);
        for i in (0..KEYS).step_by(2) {
            let subject = Subject::new(format!("client-{i}")).unwrap();
            table = table.assign(subject, PlanName::new("pro").unwrap());
        }
        builder = builder.plans(table);
    }
    builder.build().unwrap()
}

#[test]
fn steady_state_decisions_allocate_nothing() {
    #[cfg(feature = "metrics")]
    tollgate_testkit::AtomicRecorder::install();
    let clock = ManualClock::new(Timestamp::from_micros(1_800_000_000_000_000));
    let contexts: Vec<Context> = (0..KEYS)
        .map(|i| {
            Context::for_subject(Subject::new(format!("client-{i}")).unwrap())
                .with_tenant(Subject::new(format!("tenant-{}", i % 4)).unwrap())
                .with_attribute("route", Subject::new("search").unwrap())
        })
        .collect();
    for (name, limit) in limits() {
        for (layers, plans) in (1..=4).flat_map(|n| [(n, false), (n, true)]) {
            let limiter = limiter(&limit, layers, &clock, plans);
            // Every key exists, every metric handle is made.
            for ctx in &contexts {
                assert!(ready(limiter.check(ctx, 1)).unwrap().is_allowed());
            }
            // The allocator's counts are the process's: the test harness's
            // own thread, delayed on a loaded machine, once allocated in the
            // first region measured. A decision's allocation comes back in
            // every region; another thread's one-off does not, so a region
            // that saw some is measured once more.
            let mut stats = rounds(&limiter, &contexts, &clock, name, layers);
            if (stats.allocations, stats.reallocations) != (0, 0) {
                stats = rounds(&limiter, &contexts, &clock, name, layers);
            }
            assert_eq!(
                (stats.allocations, stats.reallocations),
                (0, 0),
                "{name} with {layers} layers (plans: {plans}): {} decisions allocated {} times and reallocated {} times ({} bytes)",
                10 * KEYS,
                stats.allocations,
                stats.reallocations,
                stats.bytes_allocated
            );
        }
    }
}

/// Ten rounds of a decision for every context, measured.
fn rounds(
    limiter: &Limiter,
    contexts: &[Context],
    clock: &ManualClock,
    name: &str,
    layers: usize,
) -> stats_alloc::Stats {
    let region = Region::new(GLOBAL);
    for round in 0..10 {
        clock.advance(Duration::from_millis(1));
        for ctx in contexts {
            let d = ready(limiter.check(ctx, 1)).unwrap();
            assert!(d.is_allowed(), "{name}, {layers} layers, round {round}");
        }
    }
    region.change()
}
