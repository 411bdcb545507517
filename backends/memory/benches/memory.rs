//! In-process decisions per second, side by side with governor.
#![allow(missing_docs)] // criterion_group! generates undocumented items
//!
//! Run: `cargo bench -p tollgate-memory --bench memory`
//!
//! Groups (each measured on 1 and 2 threads):
//! - `hot_key`: one key; tollgate (GCRA layer through `Limiter::check`) vs
//!   governor's direct limiter;
//! - `keyed_10k`: 10,000 keys round robin; tollgate vs governor's keyed
//!   (DashMap) limiter, both keyed by the same strings;
//! - `map_10k`: the bare map update under tollgate's store (a sharded mutex
//!   map) vs moka's `and_compute_with`, the design card's first choice.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
use tollgate_memory::MemoryStore;
use tollgate_testkit::ready;

const KEYS: usize = 10_000;
const OPS: u64 = 10_000;

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

/// Both libraries get the same quota: `per_second` with a burst of `burst`.
/// The hot key sees a mix of admits and denials; each of the 10,000 keys
/// (visited a few hundred times a second) keeps live state, as in a service
/// with many active clients.
const HOT: (u32, u32) = (1_000, 1_000);
const KEYED: (u32, u32) = (10, 100);

fn limiter(max_keys: usize, (per_second, burst): (u32, u32)) -> Limiter {
    let store = Arc::new(MemoryStore::builder().max_keys(max_keys).build());
    let limit =
        Limit::gcra(per_second.into(), Duration::from_secs(1), burst.into()).expect("valid");
    let policy = Policy::new("bench", limit).expect("valid");
    Limiter::builder(store)
        .layer("key", Scope::Subject, policy)
        .build()
        .expect("valid")
}

fn quota((per_second, burst): (u32, u32)) -> Quota {
    Quota::per_second(NonZeroU32::new(per_second).expect("non-zero"))
        .allow_burst(NonZeroU32::new(burst).expect("non-zero"))
}

fn bench(c: &mut Criterion) {
    let names: Vec<String> = (0..KEYS).map(|i| format!("client-{i}")).collect();
    let contexts: Vec<Context> = names
        .iter()
        .map(|n| Context::for_subject(Subject::new(n).expect("valid")))
        .collect();

    let mut group = c.benchmark_group("hot_key");
    group.throughput(Throughput::Elements(OPS));
    for threads in [1, 2] {
        let tollgate = limiter(16, HOT);
        let hot = &contexts[0];
        group.bench_with_input(
            BenchmarkId::new("tollgate", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|_| {
                        black_box(ready(tollgate.check(hot, 1)).expect("decides").is_allowed());
                    })
                })
            },
        );
        let governor = RateLimiter::direct(quota(HOT));
        group.bench_with_input(
            BenchmarkId::new("governor_direct", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|_| {
                        black_box(governor.check().is_ok());
                    })
                })
            },
        );
    }
    group.finish();

    let mut group = c.benchmark_group("keyed_10k");
    group.throughput(Throughput::Elements(OPS));
    for threads in [1, 2] {
        let tollgate = limiter(4 * KEYS, KEYED);
        group.bench_with_input(
            BenchmarkId::new("tollgate", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|i| {
                        let ctx = &contexts[i as usize % KEYS];
                        black_box(ready(tollgate.check(ctx, 1)).expect("decides").is_allowed());
                    })
                })
            },
        );
        let governor = RateLimiter::<String, _, _>::keyed(quota(KEYED));
        group.bench_with_input(
            BenchmarkId::new("governor_keyed", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|i| {
                        black_box(governor.check_key(&names[i as usize % KEYS]).is_ok());
                    })
                })
            },
        );
    }
    group.finish();

    let mut group = c.benchmark_group("map_10k");
    group.throughput(Throughput::Elements(OPS));
    for threads in [1, 2] {
        let sharded = ShardedCounter::new(64);
        group.bench_with_input(
            BenchmarkId::new("sharded_mutex_map", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|i| {
                        sharded.bump(&names[i as usize % KEYS])
                    })
                })
            },
        );
        let moka: moka::sync::Cache<String, u64> = moka::sync::Cache::new(4 * KEYS as u64);
        group.bench_with_input(
            BenchmarkId::new("moka_compute", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    timed(threads, iters * OPS, &|i| {
                        let key = &names[i as usize % KEYS];
                        moka.entry_by_ref(key).and_compute_with(|entry| {
                            let next = entry.map_or(1, |e| e.into_value() + 1);
                            moka::ops::compute::Op::Put(next)
                        });
                    })
                })
            },
        );
    }
    group.finish();
}

/// The map update at the heart of the in-process store, without the
/// algorithm: one mutex per shard over a foldhash map.
struct ShardedCounter {
    shards: Vec<
        std::sync::Mutex<std::collections::HashMap<Box<str>, u64, foldhash::fast::RandomState>>,
    >,
    hasher: foldhash::fast::RandomState,
}

impl ShardedCounter {
    fn new(n: usize) -> Self {
        ShardedCounter {
            shards: (0..n).map(|_| Default::default()).collect(),
            hasher: Default::default(),
        }
    }

    fn bump(&self, key: &str) {
        use std::hash::BuildHasher;
        let shard = &self.shards[self.hasher.hash_one(key) as usize % self.shards.len()];
        let mut map = shard.lock().expect("not poisoned");
        match map.get_mut(key) {
            Some(v) => *v += 1,
            None => {
                map.insert(key.into(), 1);
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
