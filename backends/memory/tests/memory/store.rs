//! In-process store specifics: threads, bounded memory, expiry.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use tollgate_limiter::{
    Clock, Context, KeyBudget, LayerRequest, Limit, Limiter, ManualClock, Policy, Scope, Store,
    StoreError, StoreKey, Subject, Timestamp, WhenFull,
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
    Context::for_subject(Subject::new(name).unwrap())
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

/// A GCRA decision on an existing key is made under the shard's shared
/// lock, with a compare-and-swap: many threads at once still admit
/// exactly what the bucket holds, and refill exactly.
#[test]
fn an_existing_gcra_key_admits_exactly_under_contention() {
    let clock = ManualClock::new(START);
    let limit = Limit::gcra(10, Duration::from_secs(1), 1_000).unwrap();
    let limiter = limiter(store(&clock, 1000), limit);
    let hot = subject("hot");
    assert!(
        ready(limiter.check(&hot, 1)).unwrap().is_allowed(),
        "the key exists"
    );
    let admit_at_once = || -> usize {
        let barrier = Arc::new(Barrier::new(64));
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..64)
                .map(|_| {
                    let (limiter, barrier, hot) = (&limiter, barrier.clone(), &hot);
                    s.spawn(move || {
                        barrier.wait();
                        (0..40)
                            .filter(|_| ready(limiter.check(hot, 1)).unwrap().is_allowed())
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        })
    };
    assert_eq!(admit_at_once(), 999, "2,560 requests from 64 threads");
    clock.advance(Duration::from_millis(1_000));
    assert_eq!(admit_at_once(), 10, "one second refills ten");
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
    assert_eq!(global.layers()[2].verdict().remaining, 1000 - 31);
}

#[test]
fn layered_writes_of_new_and_existing_keys_in_one_shard_are_exact() {
    // One shard: every decision overwrites the global key where it was
    // found and inserts its subject's key beside it, while the table grows.
    let clock = ManualClock::new(START);
    for limit in every_algorithm(3) {
        let name = limit.algorithm_name();
        let store = Arc::new(
            MemoryStore::builder()
                .shards(1)
                .clock(Arc::new(clock.clone()))
                .build(),
        );
        let global = Limit::fixed_window(1000, Duration::from_secs(3600)).unwrap();
        let limiter = Limiter::builder(store.clone())
            .layer("key", Scope::Subject, Policy::new("k", limit).unwrap())
            .layer("all", Scope::Global, Policy::new("g", global).unwrap())
            .build()
            .unwrap();
        for i in 0..200 {
            let ctx = subject(&format!("key-{i}"));
            let admitted = (0..5)
                .filter(|_| ready(limiter.check(&ctx, 1)).unwrap().is_allowed())
                .count();
            assert_eq!(admitted, 3, "{name}: key-{i}");
        }
        assert_eq!(store.len(), 201, "{name}: one entry per key");
        let last = ready(limiter.check(&subject("last"), 1)).unwrap();
        assert_eq!(
            last.layers()[1].verdict().remaining,
            1000 - 601,
            "{name}: the global layer was charged once per admission"
        );
    }
}

#[test]
fn memory_is_bounded_and_a_full_store_refuses_rather_than_evicts() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(64)
        .shards(1)
        .when_full(WhenFull::Refuse)
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
    let err = ready(tollgate_limiter::ask(
        &*store,
        &[LayerRequest {
            key,
            policy,
            cost: 1,
        }],
    ))
    .unwrap_err();
    assert!(
        matches!(err, StoreError::Full { max_keys: 64, .. }),
        "{err}"
    );
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
        clock.advance(last.layers()[0].verdict().reset_after);
        store.purge_expired();
        let d = ready(limiter.check(&ctx, 1)).unwrap();
        assert!(
            d.is_allowed() && d.layers()[0].verdict().remaining == 2,
            "{name}: key did not start full"
        );
    }
    // A minute empties every one-second state; the calendar quota's
    // (a UTC day) lives until its day ends.
    clock.advance(Duration::from_secs(86_400 + 60));
    store.purge_expired();
    assert!(store.is_empty(), "every entry expires");
}

#[test]
fn a_gcra_entry_decided_under_the_shared_lock_lives_as_long_as_its_state_and_a_grain_at_most() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 100);
    let limiter = limiter(
        store.clone(),
        Limit::gcra(10, Duration::from_secs(1), 5).unwrap(),
    );
    let ctx = subject("busy");
    // The first decision inserts the key; the next four move its TAT on
    // under the shard's shared lock, which must keep the entry alive.
    let mut reset = Duration::ZERO;
    for _ in 0..5 {
        let d = ready(limiter.check(&ctx, 1)).unwrap();
        assert!(d.is_allowed());
        reset = d.layers()[0].verdict().reset_after;
    }
    clock.advance(reset - Duration::from_micros(1));
    store.purge_expired();
    assert_eq!(store.len(), 1, "the entry is kept while its state lives");
    // Expiries are whole milliseconds, raised to the end of a 16.384 ms grain.
    clock.advance(Duration::from_millis(18));
    store.purge_expired();
    assert!(
        store.is_empty(),
        "the entry is reclaimed a grain after its state at most"
    );
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
        Err(tollgate_limiter::Error::MissingSubject { .. })
    ));
    assert!(store.is_empty());
}

/// `max_keys(N)` holds exactly N keys, however unevenly the shards fill:
/// no refusal before N, a refusal at N + 1.
#[test]
fn max_keys_is_an_exact_bound() {
    let clock = ManualClock::new(START);
    let store = Arc::new(
        MemoryStore::builder()
            .max_keys(10_000)
            .when_full(WhenFull::Refuse)
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let limiter = limiter(
        store.clone(),
        Limit::fixed_window(1, Duration::from_secs(10)).unwrap(),
    );
    for i in 0..10_000 {
        let d = ready(limiter.check(&subject(&format!("u{i}")), 1)).unwrap();
        assert!(d.is_allowed(), "key {i}: {d:?}");
    }
    let d = ready(limiter.check(&subject("u10000"), 1)).unwrap();
    assert_eq!(d.store_error(), Some("full"), "{d:?}");
    assert_eq!(store.len(), 10_000);
    assert_eq!(store.max_keys(), 10_000);
}

/// The demo's outage: one `max_keys` for every route, anonymous traffic on
/// `/login` filled it and new customers' `/search` requests failed. With a
/// budget of its own, `/login` cannot take `/search`'s room.
#[test]
fn one_policy_cannot_take_another_policys_room() {
    let clock = ManualClock::new(START);
    let store: Arc<dyn Store> = Arc::new(
        MemoryStore::builder()
            .max_keys(1_000)
            .when_full(WhenFull::Refuse)
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let login = Policy::new(
        "login",
        Limit::sliding_log(5, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
    .with_key_budget(KeyBudget::new(800, WhenFull::EvictNearestExpiry).unwrap());
    let login = Limiter::builder(store.clone())
        .layer("ip", Scope::Subject, login)
        .build()
        .unwrap();
    let search = Limiter::builder(store.clone())
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "search",
                Limit::gcra(10, Duration::from_secs(1), 20).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    for i in 0..1_250 {
        let d = ready(login.check(&subject(&format!("10.0.{}.{}", i / 250, i % 250)), 1)).unwrap();
        assert!(
            d.is_allowed(),
            "login {i}: the evicting budget keeps admitting"
        );
    }
    for i in 0..200 {
        let d = ready(search.check(&subject(&format!("customer-{i}")), 1)).unwrap();
        assert!(d.is_allowed(), "search {i}: {d:?}");
    }
}

/// A policy's refusing budget, full, and a reload that swaps its
/// algorithm or bumps its version: the new keys have a budget of their own
/// (the old keys are never read again), so clients are decided, not
/// refused until the old keys expire. The old algorithm, still in use
/// elsewhere (a plan, a process not yet reloaded), keeps its own.
#[test]
fn a_swapped_algorithm_is_not_refused_by_its_old_keys_budget() {
    let clock = ManualClock::new(START);
    let store: Arc<dyn Store> = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let budget = KeyBudget::new(2, WhenFull::Refuse).unwrap();
    let hour = Duration::from_secs(3_600);
    let login = |limit: Limit, version: u32| {
        let policy = Policy::new("login", limit).unwrap().with_key_budget(budget);
        Limiter::builder(store.clone())
            .layer("ip", Scope::Subject, policy.with_version(version))
            .build()
            .unwrap()
    };
    let decide = |limiter: &Limiter, who: &str| {
        let d = ready(limiter.check(&subject(who), 1)).unwrap();
        (d.is_allowed(), d.store_error())
    };
    let before = login(Limit::sliding_log(5, hour).unwrap(), 1);
    assert_eq!(decide(&before, "a"), (true, None));
    assert_eq!(decide(&before, "b"), (true, None));
    assert_eq!(
        decide(&before, "c"),
        (false, Some("full")),
        "the budget is full"
    );
    let swapped = login(Limit::fixed_window(5, hour).unwrap(), 1);
    assert_eq!(decide(&swapped, "a"), (true, None), "another algorithm");
    let bumped = login(Limit::sliding_log(5, hour).unwrap(), 2);
    assert_eq!(decide(&bumped, "a"), (true, None), "another version");
    assert_eq!(
        decide(&before, "c"),
        (false, Some("full")),
        "the old one's own"
    );
}

/// Clocks at the extremes: the store refuses to decide before 2020 or after
/// 2100 (never over-admits, never panics), for every algorithm, and a
/// manual clock saturates instead of wrapping.
#[test]
fn implausible_times_are_refused() {
    let clock = ManualClock::new(START);
    clock.advance(Duration::MAX);
    assert_eq!(clock.now().as_micros(), u64::MAX, "advance saturates");
    for at in [
        0,
        1_577_836_799_999_999,
        4_102_444_800_000_001,
        u64::MAX - 1,
        u64::MAX,
    ] {
        clock.set(Timestamp::from_micros(at));
        let store = Arc::new(
            MemoryStore::builder()
                .clock(Arc::new(clock.clone()))
                .build(),
        );
        for limit in every_algorithm(5) {
            let name = limit.algorithm_name();
            let limiter = limiter(store.clone(), limit);
            for _ in 0..20 {
                let d = ready(limiter.check(&subject("s"), 1)).unwrap();
                assert!(!d.is_allowed(), "{name} at {at}: {d:?}");
                assert_eq!(d.store_error(), Some("implausible_time"), "{name} at {at}");
            }
        }
        assert!(store.is_empty(), "nothing written at {at}");
    }
}

/// A store that evicts when full never evicts a concurrency limit's key:
/// its holders are running. The new key is refused instead.
#[test]
fn a_concurrency_key_is_never_evicted() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(1)
        .when_full(WhenFull::EvictNearestExpiry)
        .clock(Arc::new(clock))
        .build();
    let policy = Policy::new(
        "exports",
        Limit::concurrency(1, Duration::from_secs(30)).unwrap(),
    )
    .unwrap();
    let request = |subject: &'static str| {
        [LayerRequest {
            key: StoreKey::new(subject, &policy, "s", subject),
            policy: &policy,
            cost: 1,
        }]
    };
    let (held, _) = ready(store.acquire(&request("a"))).unwrap();
    assert!(held[0].allowed);
    let refused = ready(store.acquire(&request("b")));
    assert!(
        matches!(refused, Err(StoreError::Full { .. })),
        "{refused:?}"
    );
    let (again, _) = ready(store.acquire(&request("a"))).unwrap();
    assert!(!again[0].allowed, "a's place is still held");
}

/// `purge_expired` under a clock far off (a decision refuses such a time)
/// removes nothing: before, every entry looked expired, and the places of
/// running holders came free.
#[test]
fn purging_under_an_implausible_clock_removes_nothing() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let policy = Policy::new(
        "exports",
        Limit::concurrency(1, Duration::from_secs(30)).unwrap(),
    )
    .unwrap();
    let request = [LayerRequest {
        key: StoreKey::new("a", &policy, "s", "a"),
        policy: &policy,
        cost: 1,
    }];
    assert!(ready(store.acquire(&request)).unwrap().0[0].allowed);
    clock.set(Timestamp::from_micros(u64::MAX));
    store.purge_expired();
    clock.set(START);
    assert_eq!(store.len(), 1);
    let (again, _) = ready(store.acquire(&request)).unwrap();
    assert!(!again[0].allowed, "a's place is still held");
}

/// A request, decided on `store` through its layers' keys.
fn ask_store(store: &MemoryStore, layers: &[(&Policy, &str)]) -> Result<Vec<bool>, StoreError> {
    let requests: Vec<LayerRequest<'_>> = layers
        .iter()
        .map(|&(policy, who)| LayerRequest {
            key: StoreKey::new(who, policy, "subject", who),
            policy,
            cost: 1,
        })
        .collect();
    let verdicts = ready(tollgate_limiter::ask(store, &requests))?;
    Ok(verdicts.iter().map(|v| v.allowed).collect())
}

/// A store of three keys that evicts when full, each key in a shard of
/// its own (so room cannot be made where a new key goes).
fn three_keys_spread(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .max_keys(3)
        .shards(1 << 16)
        .clock(Arc::new(clock.clone()))
        .build()
}

/// A store that evicts when full makes room for every new key a layered
/// decision needs, wherever the keys it evicts are (before, room was made
/// for one key only, each pass, and a request needing two new keys in a
/// store one short of room was refused `Full` with keys to evict).
#[test]
fn a_full_store_makes_room_for_each_new_key_of_a_decision() {
    let clock = ManualClock::new(START);
    let store = three_keys_spread(&clock);
    let minute = Duration::from_secs(60);
    let a = Policy::new("a", Limit::fixed_window(10, minute).unwrap()).unwrap();
    let b = Policy::new("b", Limit::fixed_window(10, 2 * minute).unwrap()).unwrap();
    for who in ["x1", "x2"] {
        assert_eq!(ask_store(&store, &[(&a, who)]).unwrap(), [true]);
    }
    clock.advance(Duration::from_secs(1));
    let both = ask_store(&store, &[(&a, "y"), (&b, "y")]);
    assert_eq!(both.expect("room made by evicting x1"), [true, true]);
    assert_eq!(store.len(), 3);
}

/// Making room never evicts a key of the decision that needs it: its
/// charge would be lost (before, the global key, nearest to expiry, was
/// evicted for bob's new key, its two charges with it, and the request
/// then needed two new keys and was refused `Full`).
#[test]
fn making_room_keeps_the_deciding_requests_own_keys() {
    let clock = ManualClock::new(START);
    let store = three_keys_spread(&clock);
    let global = Policy::new(
        "global",
        Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let user = Policy::new(
        "user",
        Limit::sliding_log(100, Duration::from_secs(3_600)).unwrap(),
    )
    .unwrap();
    let everyone = "everyone";
    assert_eq!(
        ask_store(&store, &[(&global, everyone), (&user, "alice")]).unwrap(),
        [true, true]
    );
    let other = Policy::new(
        "other",
        Limit::sliding_log(100, Duration::from_secs(7_200)).unwrap(),
    )
    .unwrap();
    assert_eq!(ask_store(&store, &[(&other, "carol")]).unwrap(), [true]);
    // Full: bob's key needs room; the global key is nearest to expiry,
    // but it is this decision's.
    let bob = ask_store(&store, &[(&global, everyone), (&user, "bob")]);
    assert_eq!(bob.expect("room made elsewhere"), [true, true]);
    let alice = ask_store(&store, &[(&global, everyone), (&user, "alice")]);
    assert_eq!(
        alice.ok().map(|v| v[0]),
        Some(false),
        "the global layer kept both charges: {}",
        store.len()
    );
}

/// A cost no state can admit (0, or above the burst) is answered as the
/// reference answers it, whether the key exists or not: denied, never to
/// be admitted (before, an existing GCRA key's lock-free path admitted a
/// cost of 0 and gave a cost above the burst a time to retry).
#[test]
fn an_inadmissible_cost_is_answered_alike_on_an_existing_key() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let policy = Policy::new("g", Limit::gcra(1, Duration::from_secs(1), 5).unwrap()).unwrap();
    let ask = |cost: u64| {
        let request = [LayerRequest {
            key: StoreKey::new("k", &policy, "s", "k"),
            policy: &policy,
            cost,
        }];
        ready(tollgate_limiter::ask(&store, &request)).unwrap()[0]
    };
    assert!(ask(1).allowed, "the key exists");
    for cost in [0, 6] {
        let verdict = ask(cost);
        assert!(!verdict.allowed, "cost {cost}: {verdict:?}");
        assert_eq!(verdict.retry_after, None, "cost {cost}: never admitted");
    }
}

/// A policy's budget that shrank far below the keys it holds (a reload)
/// makes room for a new key: every key over the budget is evicted (a
/// reviewed change refused `Full` once a pass fell short, the next one
/// after four passes of one key each).
#[test]
fn a_shrunk_policy_budget_makes_room_over_several_passes() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .shards(1 << 16)
        .clock(Arc::new(clock.clone()))
        .build();
    let minute = Duration::from_secs(60);
    let policy = |keys| {
        Policy::new("p", Limit::fixed_window(10, minute).unwrap())
            .unwrap()
            .with_key_budget(KeyBudget::new(keys, WhenFull::EvictNearestExpiry).unwrap())
    };
    let (wide, narrow) = (policy(10), policy(2));
    for who in ["a", "b", "c", "d", "f", "g", "h", "i", "j", "k"] {
        assert_eq!(ask_store(&store, &[(&wide, who)]).unwrap(), [true]);
    }
    assert_eq!(ask_store(&store, &[(&narrow, "e")]).unwrap(), [true]);
    assert_eq!(store.len(), 2);
}

/// Keys short enough to live inside their entry and keys too long for it
/// (their text on the heap) are told apart exactly, however long the
/// prefix they share: each subject has its own state, and finds it again.
#[test]
fn short_and_long_keys_each_keep_their_own_state() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 100);
    let limiter = limiter(
        store.clone(),
        Limit::fixed_window(2, Duration::from_secs(60)).unwrap(),
    );
    // Keys of 24 to 223 bytes (`{name}:fixed_window:v1:fw:s`), the
    // inline bound of 46 between names of 23 and 24 bytes; alike but for
    // their last byte or their length.
    let names: Vec<String> = [1, 20, 23, 24, 25, 26, 27, 40, 200]
        .into_iter()
        .flat_map(|n| ["a".repeat(n), format!("{}b", "a".repeat(n - 1))])
        .collect();
    for round in 0..3 {
        for name in &names {
            let d = ready(limiter.check(&subject(name), 1)).unwrap();
            assert_eq!(d.is_allowed(), round < 2, "{name:?} in round {round}");
            assert_eq!(
                d.layers()[0].verdict().remaining,
                1 - round.min(1),
                "{name:?}"
            );
        }
    }
    assert_eq!(store.len(), names.len());
}

/// A full store's refusal says when its first key expires, also after a
/// key's expiry was brought forward (a reward): the instant it found when
/// last full was kept until room was freed, and told clients to wait an
/// hour for a key that expired within minutes.
#[test]
fn a_full_stores_wait_follows_an_expiry_brought_forward() {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .max_keys(1)
        .shards(1)
        .when_full(WhenFull::Refuse)
        .clock(Arc::new(clock.clone()))
        .build();
    let policy = Policy::new(
        "gcra",
        Limit::gcra(60, Duration::from_secs(3_600), 60).unwrap(),
    )
    .unwrap();
    let request = |name: &'static str| LayerRequest {
        key: StoreKey::new(name, &policy, "subject", name),
        policy: &policy,
        cost: 60,
    };
    let wait = |name: &'static str| match ready(tollgate_limiter::ask(&store, &[request(name)])) {
        Err(StoreError::Full { retry_after, .. }) => retry_after,
        other => panic!("{other:?}"),
    };
    ready(tollgate_limiter::ask(&store, &[request("a")])).expect("the first key fits");
    assert!(wait("b") > Duration::from_secs(3_000), "a's hour");
    let reward = LayerRequest {
        cost: 58,
        ..request("a")
    };
    ready(store.adjust(&[reward], tollgate_limiter::Adjustment::Reward)).unwrap();
    let after = wait("c");
    assert!(
        after <= Duration::from_secs(300),
        "waits {after:?} for a key that expires within minutes"
    );
}
