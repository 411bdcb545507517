//! In-process store specifics: threads, bounded memory, expiry.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use tollgate_core::{
    Context, LayerRequest, Limit, Limiter, ManualClock, Policy, Scope, Store, StoreError, StoreKey,
    Subject,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::conformance::{every_algorithm, START};
use tollgate_testkit::ready;

fn store(clock: &ManualClock, max_keys: usize) -> Arc<MemoryStore> {
    Arc::new(
        MemoryStore::builder()
            .max_keys(max_keys)
            .clock(Arc::new(clock.clone()))
            .build(),
    )
}

fn limiter(store: Arc<MemoryStore>, limit: Limit) -> Limiter {
    let policy = Policy::new(limit.algorithm_name(), limit).unwrap();
    Limiter::builder(store)
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap()
}

fn subject(name: &str) -> Context {
    Context::subject(Subject::new(name).unwrap())
}

#[test]
fn sixty_four_threads_on_one_key_admit_exactly_the_capacity() {
    let clock = ManualClock::new(START);
    for limit in every_algorithm(20) {
        let name = limit.algorithm_name();
        let limiter = limiter(store(&clock, 1000), limit);
        let barrier = Arc::new(Barrier::new(64));
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..64)
                .map(|_| {
                    let (limiter, barrier) = (&limiter, barrier.clone());
                    s.spawn(move || {
                        barrier.wait();
                        (0..4)
                            .filter(|_| {
                                ready(limiter.check(&subject("hot"), 1))
                                    .unwrap()
                                    .is_allowed()
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 20,
            "{name}: 256 requests from 64 threads at one instant"
        );
    }
}

#[test]
fn layered_decisions_stay_atomic_across_threads() {
    // Three layers on different shards; the tenant layer is the tightest.
    let clock = ManualClock::new(START);
    let store = store(&clock, 10_000);
    let second = Duration::from_secs(1);
    let limiter = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new("k", Limit::token_bucket(50, 1, second).unwrap()).unwrap(),
        )
        .layer(
            "tenant",
            Scope::Tenant,
            Policy::new("t", Limit::gcra(1, second, 30).unwrap()).unwrap(),
        )
        .layer(
            "all",
            Scope::Global,
            Policy::new("g", Limit::sliding_log(1000, second).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let admitted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let limiter = &limiter;
                s.spawn(move || {
                    let ctx = subject(&format!("key-{}", i % 2))
                        .with_tenant(Subject::new("acme").unwrap());
                    (0..20)
                        .filter(|_| ready(limiter.check(&ctx, 1)).unwrap().is_allowed())
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(admitted, 30, "the tenant layer admits 30");
    // Denied requests charged nothing: the global log holds exactly 30 entries.
    let global = ready(limiter.check(
        &subject("other").with_tenant(Subject::new("other").unwrap()),
        1,
    ))
    .unwrap();
    assert_eq!(global.layers()[2].remaining, 1000 - 31);
}

#[test]
fn memory_is_bounded_and_a_full_store_refuses_rather_than_evicts() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(64)
        .shards(1)
        .clock(Arc::new(clock.clone()))
        .build();
    let store = Arc::new(store);
    let limiter = limiter(
        store.clone(),
        Limit::fixed_window(1, Duration::from_secs(10)).unwrap(),
    );
    for i in 0..64 {
        assert!(ready(limiter.check(&subject(&format!("u{i}")), 1))
            .unwrap()
            .is_allowed());
    }
    // A full store is a store failure: the policy's failure mode answers
    // (fail closed by default), and the store itself says why.
    let d = ready(limiter.check(&subject("one-too-many"), 1)).unwrap();
    assert!(
        d.failed_closed() && d.store_error() == Some("full"),
        "{d:?}"
    );
    let policy = limiter.layers()[0].policy();
    let key = StoreKey::new("x", policy, "subject", "x");
    let err = ready(store.decide(&[LayerRequest {
        key,
        policy,
        cost: 1,
    }]))
    .unwrap_err();
    assert!(matches!(err, StoreError::Full(64)), "{err}");
    // Existing keys still decide (and stay denied: nothing was evicted).
    assert!(!ready(limiter.check(&subject("u0"), 1))
        .unwrap()
        .is_allowed());
    assert_eq!(store.len(), 64);
}

#[test]
fn expired_entries_are_reclaimed_without_a_cleanup_task() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(100)
        .shards(1)
        .clock(Arc::new(clock.clone()))
        .build();
    let store = Arc::new(store);
    let limiter = limiter(
        store.clone(),
        Limit::gcra(1, Duration::from_secs(1), 5).unwrap(),
    );
    for i in 0..100 {
        ready(limiter.check(&subject(&format!("a{i}")), 1)).unwrap();
    }
    assert_eq!(store.len(), 100);
    // One request leaves 1s of state (one interval): after it, every key is gone.
    clock.advance(Duration::from_secs(1));
    for i in 0..100 {
        assert!(ready(limiter.check(&subject(&format!("b{i}")), 1))
            .unwrap()
            .is_allowed());
    }
    assert_eq!(
        store.len(),
        100,
        "the old keys were reclaimed to make room for the new"
    );
}

#[test]
fn growth_triggers_sweeps_long_before_the_store_is_full() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(1_000_000)
        .shards(1)
        .clock(Arc::new(clock.clone()))
        .build();
    let store = Arc::new(store);
    let limiter = limiter(
        store.clone(),
        Limit::fixed_window(1, Duration::from_millis(1)).unwrap(),
    );
    for i in 0..10_000 {
        ready(limiter.check(&subject(&format!("k{i}")), 1)).unwrap();
        clock.advance(Duration::from_millis(1)); // every key outlives its window
    }
    assert!(
        store.len() <= 128,
        "{} entries kept for 10,000 one-off keys",
        store.len()
    );
}

#[test]
fn state_expires_after_inactivity_and_the_key_starts_full() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 100);
    for limit in every_algorithm(3) {
        let name = limit.algorithm_name();
        let limiter = limiter(store.clone(), limit);
        let ctx = subject(&format!("idle-{name}"));
        ready(limiter.check(&ctx, 1)).unwrap();
        ready(limiter.check(&ctx, 1)).unwrap();
        let last = ready(limiter.check(&ctx, 1)).unwrap();
        clock.advance(last.layers()[0].reset_after);
        store.purge_expired();
        let d = ready(limiter.check(&ctx, 1)).unwrap();
        assert!(
            d.is_allowed() && d.layers()[0].remaining == 2,
            "{name}: key did not start full"
        );
    }
    clock.advance(Duration::from_secs(60));
    store.purge_expired();
    assert!(store.is_empty(), "every entry expires");
}

#[test]
fn invalid_input_fails_before_the_store_is_touched() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 10);
    let limiter = limiter(
        store.clone(),
        Limit::fixed_window(5, Duration::from_secs(1)).unwrap(),
    );
    assert!(
        ready(limiter.check(&subject("a"), 6)).is_err(),
        "cost above capacity"
    );
    assert!(ready(limiter.check(&subject("a"), 0)).is_err(), "zero cost");
    assert!(matches!(
        ready(limiter.check(&Context::new(), 1)),
        Err(tollgate_core::Error::MissingSubject { .. })
    ));
    assert!(store.is_empty());
}
