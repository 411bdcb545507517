//! Leased layers through the limiter, over the in-process store behind a
//! wrapper that makes it look remote (it counts calls and can be switched
//! off), with a manual clock and tokio's paused timer driving the task
//! that ends leases. The same cases against real Redis are the conformance
//! suite's (`leased_layers_never_over_admit`, `leases_come_back`) and the
//! Redis store's `tests/redis/lease.rs`.
#![cfg(feature = "lease")]

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BreakerConfig, BreakerState, Context, Lease, Limit, Limiter, ManualClock, OnStoreFailure, Plan,
    PlanName, Plans, Policy, Scope, Store, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;
use tollgate_testkit::RemoteStore;

const START: Timestamp = Timestamp::from_micros(1_780_000_000_000_000);

fn remote(clock: &ManualClock) -> Arc<RemoteStore> {
    Arc::new(RemoteStore::new(Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    )))
}

fn leased_bucket(max_batch: u64) -> Policy {
    // 100 a second: a one-second lease refills 100, more than any batch here.
    let bucket = Limit::token_bucket(1_000, 100, Duration::from_secs(1)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(max_batch)
        .unwrap();
    Policy::new("hot", bucket).unwrap().leased(lease).unwrap()
}

fn limiter(store: Arc<dyn Store>, clock: &ManualClock, policy: Policy) -> Limiter {
    Limiter::builder(store)
        .clock(Arc::new(clock.clone()))
        .layer("all", Scope::Global, policy)
        .build()
        .unwrap()
}

async fn admitted(limiter: &Limiter, ctx: &Context, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += usize::from(limiter.check(ctx, 1).await.unwrap().is_allowed());
    }
    admitted
}

/// What the store itself holds of the leased bucket's key for `ctx`
/// (`scope`), without this process's batches: peeked by a limiter without
/// the lease, over the same counter.
async fn in_store(store: &Arc<RemoteStore>, scope: Scope, ctx: &Context) -> u64 {
    let bucket = Limit::token_bucket(1_000, 100, Duration::from_secs(1)).unwrap();
    let plain = Limiter::builder(store.clone())
        .layer("plain", scope, Policy::new("hot", bucket).unwrap())
        .build()
        .unwrap();
    plain.peek(ctx, 1).await.unwrap().layers()[0]
        .verdict()
        .remaining
}

async fn remaining(limiter: &Limiter) -> u64 {
    limiter.peek(&Context::new(), 1).await.unwrap().layers()[0]
        .verdict()
        .remaining
}

/// A cold key is decided by one store call per request; a hot one by
/// batches, the largest the lease allows, each admission reporting the
/// store's remaining plus what its batch still holds.
#[tokio::test]
async fn hot_keys_are_decided_from_batches() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = limiter(store.clone(), &clock, leased_bucket(50));
    let ctx = Context::new();
    assert_eq!(admitted(&limiter, &ctx, 7).await, 7);
    assert_eq!(store.decides(), 7, "cold: a call each");
    assert_eq!(admitted(&limiter, &ctx, 993).await, 993);
    let calls = store.decides();
    assert!(calls < 7 + 993 / 10, "{calls} calls for 1,000 decisions");
    let decision = limiter.check(&ctx, 1).await.unwrap();
    assert!(
        !decision.is_allowed(),
        "1,000 admitted: the bucket is empty"
    );
    assert_eq!(remaining(&limiter).await, 0);
    // The store's answer: admitted again at its refill, at most the
    // lease's batch held.
    clock.advance(Duration::from_millis(100));
    let d = limiter.check(&ctx, 1).await.unwrap();
    assert!(d.is_allowed());
    assert!(
        d.layers()[0].verdict().remaining <= 9,
        "{:?}",
        d.layers()[0].verdict()
    );
}

/// What a token bucket's lease did not use goes back to the store when
/// the lease ends (the background task, on tokio's paused timer), and
/// nothing is held after.
#[tokio::test(start_paused = true)]
async fn ended_leases_give_back_their_units() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = limiter(store.clone(), &clock, leased_bucket(50));
    let ctx = Context::new();
    assert_eq!(admitted(&limiter, &ctx, 300).await, 300);
    let held = 700 - in_store(&store, Scope::Global, &ctx).await;
    assert!(held > 0, "a batch is held");
    assert_eq!(remaining(&limiter).await, 700, "its units are no one's yet");
    clock.advance(Duration::from_millis(1_001));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(store.rewards(), 1, "one give-back");
    // 100.1 refilled, up to the capacity; the held units given back.
    assert_eq!(remaining(&limiter).await, 800);
}

/// A block stops this process's batches of a hot client at once (they no
/// longer stand); a reset forgets them.
#[tokio::test]
async fn blocks_stop_the_batches() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("client", Scope::Subject, leased_bucket(50))
        .build()
        .unwrap();
    let ctx = Context::for_subject(Subject::new("hot-client").unwrap());
    assert_eq!(admitted(&limiter, &ctx, 100).await, 100);
    limiter.block(&ctx, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        admitted(&limiter, &ctx, 10).await,
        0,
        "blocked: no batch admits"
    );
    limiter.reset(&ctx).await.unwrap();
    assert_eq!(admitted(&limiter, &ctx, 10).await, 10);
}

/// Two limiters of one process on one store (two routes with the same
/// leased policy), each holding a batch for the same client: a block
/// through one stops the other's batch too, and a reset through one
/// forgets both (the other's would be spent on top of a full limit).
#[tokio::test]
async fn a_block_through_one_limiter_stops_every_limiters_batch() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let route = || {
        Limiter::builder(store.clone())
            .clock(Arc::new(clock.clone()))
            .layer("client", Scope::Subject, leased_bucket(50))
            .build()
            .unwrap()
    };
    let (a, b) = (route(), route());
    let ctx = Context::for_subject(Subject::new("hot-client").unwrap());
    assert_eq!(admitted(&a, &ctx, 100).await, 100);
    assert_eq!(admitted(&b, &ctx, 100).await, 100);
    let held = b.peek(&ctx, 1).await.unwrap().layers()[0]
        .verdict()
        .remaining;
    assert!(
        held > in_store(&store, Scope::Subject, &ctx).await,
        "b holds a batch"
    );
    a.block(&ctx, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        admitted(&b, &ctx, 10).await,
        0,
        "blocked: b's batch admits nothing"
    );
    a.reset(&ctx).await.unwrap();
    let after = b.peek(&ctx, 1).await.unwrap().layers()[0]
        .verdict()
        .remaining;
    assert_eq!(
        after,
        in_store(&store, Scope::Subject, &ctx).await,
        "b holds no batch"
    );
}

/// The store failing mid-lease: what the batch holds is admitted (it was
/// charged), then the failure mode answers (here: closed).
#[tokio::test]
async fn a_failing_store_admits_only_what_was_charged() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let policy = leased_bucket(50)
        .with_on_failure(OnStoreFailure::FailClosed)
        .unwrap();
    let limiter = limiter(store.clone(), &clock, policy);
    let ctx = Context::new();
    assert_eq!(admitted(&limiter, &ctx, 200).await, 200);
    let held = 800 - in_store(&store, Scope::Global, &ctx).await;
    assert!(held > 0, "a batch is held");
    store.set_down(true);
    let mut admitted_after = 0;
    for _ in 0..100 {
        let d = limiter.check(&ctx, 1).await.unwrap();
        if d.is_allowed() {
            admitted_after += 1;
        } else {
            assert!(d.failed_closed(), "{d:?}");
        }
    }
    assert_eq!(admitted_after, held, "exactly the batch held");
}

/// Admissions from a batch are no store calls: they neither close the
/// circuit breaker nor reset its count of failures, so a failing store is
/// cut off after its threshold however many requests batches admit
/// meanwhile.
#[tokio::test]
async fn batches_do_not_hide_a_failing_store_from_the_breaker() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("client", Scope::Subject, leased_bucket(50))
        .breaker(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_secs(1),
        })
        .build()
        .unwrap();
    let hot = Context::for_subject(Subject::new("hot").unwrap());
    let cold = Context::for_subject(Subject::new("cold").unwrap());
    assert_eq!(admitted(&limiter, &hot, 200).await, 200);
    let held = 800 - in_store(&store, Scope::Subject, &hot).await;
    store.set_down(true);
    let calls = store.decides();
    let mut hot_admitted = 0;
    for _ in 0..6 {
        assert!(limiter.check(&cold, 1).await.unwrap().failed_closed());
        // The hot client's batch still admits (it was charged), the
        // breaker open or not.
        hot_admitted += u64::from(limiter.check(&hot, 1).await.unwrap().is_allowed());
    }
    assert_eq!(hot_admitted, held.min(6), "{held} held");
    assert_eq!(
        store.decides() - calls,
        3,
        "the breaker opened after three failures"
    );
    assert_eq!(limiter.breaker().state(), BreakerState::Open);
}

/// A request another layer denies takes nothing from the batch: its take
/// is given back (and reported uncharged), so every unit charged is
/// admitted or returned.
#[tokio::test]
async fn a_take_another_layer_denies_is_given_back() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let once = Limit::fixed_window(1, Duration::from_secs(3600)).unwrap();
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("all", Scope::Global, leased_bucket(50))
        .layer("client", Scope::Subject, Policy::new("once", once).unwrap())
        .build()
        .unwrap();
    let client = |i: usize| Context::for_subject(Subject::new(format!("c-{i}")).unwrap());
    for i in 0..300 {
        assert!(
            limiter.check(&client(i), 1).await.unwrap().is_allowed(),
            "client {i}"
        );
    }
    for i in 0..100 {
        let again = limiter.check(&client(i), 1).await.unwrap();
        assert!(!again.is_allowed(), "client {i} twice");
        let all = again.layers()[0].verdict();
        assert!(all.allowed, "the global layer admits: {all:?}");
    }
    limiter.return_leases().await;
    let peeked = limiter.peek(&client(1_000), 1).await.unwrap();
    assert_eq!(
        peeked.layers()[0].verdict().remaining,
        700,
        "300 admitted, nothing lost"
    );
}

/// The last units of a leased bucket: a batch the limit has no room for
/// is denied, and the request is decided again at its own cost, so
/// exactly the capacity is admitted.
#[tokio::test]
async fn the_last_units_go_one_request_at_a_time() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = limiter(store.clone(), &clock, leased_bucket(50));
    let ctx = Context::new();
    assert_eq!(admitted(&limiter, &ctx, 1_500).await, 1_000);
    assert_eq!(remaining(&limiter).await, 0);
}

/// A customer moved to a smaller plan is not admitted from the batch its
/// bigger plan charged: the batch ends, and the next is charged (and
/// reported) under the new plan's limit.
#[tokio::test]
async fn a_plan_change_ends_the_batch() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let small = Limit::token_bucket(500, 50, Duration::from_secs(1)).unwrap();
    let plans =
        Plans::new(Plan::new("pro").unwrap()).plan(Plan::new("small").unwrap().limit("hot", small));
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("client", Scope::Subject, leased_bucket(50))
        .plans(plans)
        .build()
        .unwrap();
    let customer = Context::for_subject(Subject::new("acme").unwrap());
    assert_eq!(admitted(&limiter, &customer, 200).await, 200);
    let pro_calls = store.decides();
    assert!(
        pro_calls < 100,
        "batches under the pro plan: {pro_calls} calls"
    );
    let small_plan = customer.clone().with_plan(PlanName::new("small").unwrap());
    for i in 0..100 {
        let d = limiter.check(&small_plan, 1).await.unwrap();
        assert_eq!(d.layers()[0].verdict().limit, 500, "request {i}: {d:?}");
    }
}

/// A leased bucket's burst exceeds its capacity by at most what its batch
/// holds (docs/leases.md): the store's bucket refills to full while the
/// batch still holds units charged before.
#[tokio::test]
async fn a_buckets_burst_exceeds_its_capacity_by_at_most_its_batch() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let bucket = || Limit::token_bucket(100, 1_000, Duration::from_secs(1)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(25)
        .unwrap();
    let policy = Policy::new("burst", bucket())
        .unwrap()
        .leased(lease)
        .unwrap();
    let limiter = limiter(store.clone(), &clock, policy);
    let ctx = Context::new();
    assert_eq!(admitted(&limiter, &ctx, 80).await, 80);
    let plain = limiter_of(store, Policy::new("burst", bucket()).unwrap());
    let in_store = plain.peek(&ctx, 1).await.unwrap().layers()[0]
        .verdict()
        .remaining;
    let held = 100 - in_store - 80;
    assert!(
        held > 0,
        "the batch holds units ({in_store} left in the store)"
    );
    clock.advance(Duration::from_millis(200));
    let burst = admitted(&limiter, &ctx, 300).await as u64;
    assert!(
        (100..=100 + held).contains(&burst),
        "a burst of {burst} from a full bucket of 100 and a batch of {held}"
    );
}

/// A limiter with `policy` on one global layer, without a lease: it reads
/// what the store holds.
fn limiter_of(store: Arc<RemoteStore>, policy: Policy) -> Limiter {
    Limiter::builder(store)
        .layer("all", Scope::Global, policy)
        .build()
        .unwrap()
}

/// Two plans taking turns on a key they share (a global layer whose
/// limit depends on the customer's plan): each plan's batch serves its own
/// requests, and the other plan's go to the store. Before, each switch
/// ended the other plan's batch, and a window's units, which cannot be
/// given back, were lost: after a few hundred switches the window was
/// spent on units nobody admitted.
#[tokio::test]
async fn plans_sharing_a_key_keep_each_others_batches() {
    let clock = ManualClock::new(Timestamp::from_micros(
        START.as_micros() - START.as_micros() % 3_600_000_000,
    ));
    let store = remote(&clock);
    let hourly = |limit| Limit::fixed_window(limit, Duration::from_secs(3_600)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(50)
        .unwrap();
    let policy = Policy::new("hourly", hourly(4_000))
        .unwrap()
        .leased(lease)
        .unwrap();
    let plans = Plans::new(Plan::new("pro").unwrap())
        .plan(Plan::new("free").unwrap().limit("hourly", hourly(3_000)));
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("all", Scope::Global, policy)
        .plans(plans)
        .build()
        .unwrap();
    let as_plan = |name: &str| Context::new().with_plan(PlanName::new(name).unwrap());
    let (pro, free) = (as_plan("pro"), as_plan("free"));
    let mut admitted_in_all = 0;
    for _ in 0..1_000 {
        admitted_in_all += admitted(&limiter, &pro, 1).await;
        admitted_in_all += admitted(&limiter, &free, 1).await;
    }
    assert_eq!(
        admitted_in_all, 2_000,
        "every request, far below both limits"
    );
    let plain = limiter_of(store, Policy::new("hourly", hourly(4_000)).unwrap());
    let used = 4_000
        - plain.peek(&Context::new(), 1).await.unwrap().layers()[0]
            .verdict()
            .remaining;
    assert!(
        used <= 2_000 + 2 * 50,
        "charged {used} for 2,000 admitted: at most a batch held by each plan"
    );
}

/// The task that ends quiet leases ran on a runtime that shut down: the
/// next decision, on another runtime, starts it again, and the quiet
/// lease's units come back.
#[test]
fn sweeping_starts_again_on_a_new_runtime() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("each", Scope::Subject, leased_bucket(50))
        .build()
        .unwrap();
    let (hot, cold) = (
        Context::for_subject(Subject::new("hot").unwrap()),
        Context::for_subject(Subject::new("cold").unwrap()),
    );
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let first = runtime();
    assert_eq!(first.block_on(admitted(&limiter, &hot, 300)), 300);
    drop(first);
    runtime().block_on(async {
        // Another subject's decision (the hot one's lease stays untouched).
        assert_eq!(admitted(&limiter, &cold, 1).await, 1);
        clock.advance(Duration::from_millis(1_001));
        tokio::time::sleep(Duration::from_millis(600)).await;
    });
    assert_eq!(store.rewards(), 1, "the quiet lease's units came back");
}

/// On an in-process store a lease changes nothing: no batches, the same
/// answers as without it.
#[tokio::test]
async fn leases_on_an_in_process_store_change_nothing() {
    let clock = ManualClock::new(START);
    let memory = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let leased = limiter(memory.clone(), &clock, leased_bucket(50));
    let ctx = Context::for_subject(Subject::new("k").unwrap());
    for i in 0..1_100 {
        let d = leased.check(&ctx, 1).await.unwrap();
        assert_eq!(d.is_allowed(), i < 1_000, "request {i}");
        assert_eq!(d.layers()[0].verdict().remaining, 999u64.saturating_sub(i));
    }
}

/// Leases are for algorithms that can keep their promise.
#[test]
fn only_leasable_limits_are_leased() {
    let lease = Lease::default();
    let log = Limit::sliding_log(10, Duration::from_secs(1)).unwrap();
    let err = Policy::new("log", log).unwrap().leased(lease).unwrap_err();
    assert!(
        err.to_string()
            .contains("sliding_log limit cannot be leased"),
        "{err}"
    );
    let small = Limit::fixed_window(10, Duration::from_secs(1)).unwrap();
    let too_big = lease.with_max_batch(11).unwrap();
    let err = Policy::new("w", small)
        .unwrap()
        .leased(too_big)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "leased.max_batch: 11 must be at most the capacity 10"
    );
    assert!(Lease::new(Duration::from_millis(5)).is_err());
    assert!(Lease::default().with_max_batch(0).is_err());
}

/// A window's lease holds its units until the window ends: none is lost
/// when traffic pauses longer than the lease's duration (before, each
/// pause dropped what the batch still held, and the window denied before
/// its limit).
#[tokio::test]
async fn a_window_lease_keeps_its_units_until_its_window_ends() {
    let clock = ManualClock::new(Timestamp::from_micros(
        START.as_micros() - START.as_micros() % 3_600_000_000,
    ));
    let store = remote(&clock);
    let window = Limit::fixed_window(100, Duration::from_secs(3_600)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(10)
        .unwrap();
    let policy = Policy::new("hourly", window)
        .unwrap()
        .leased(lease)
        .unwrap();
    let limiter = limiter(store.clone(), &clock, policy);
    let ctx = Context::new();
    let mut admitted_in_all = 0;
    for _ in 0..10 {
        admitted_in_all += admitted(&limiter, &ctx, 18).await;
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(admitted_in_all, 100, "the window's whole limit");
    assert_eq!(remaining(&limiter).await, 0);
}

/// A leased per-key window of 1,000 an hour (leases of 1 s, batches of
/// at most 50), on `store`.
fn hourly_per_key(store: Arc<RemoteStore>, clock: &ManualClock) -> Limiter {
    let window = Limit::fixed_window(1_000, Duration::from_secs(3_600)).unwrap();
    let lease = Lease::new(Duration::from_secs(1))
        .unwrap()
        .with_max_batch(50)
        .unwrap();
    let policy = Policy::new("hourly", window)
        .unwrap()
        .leased(lease)
        .unwrap();
    Limiter::builder(store)
        .clock(Arc::new(clock.clone()))
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap()
}

fn customer(n: usize) -> Context {
    Context::for_subject(Subject::new(format!("c-{n}")).unwrap())
}

/// Two seconds on (past every lease), the store calls 200 decisions of a
/// new hot key take: far fewer than 200 when it gets batches.
async fn calls_of_a_new_hot_key(
    limiter: &Limiter,
    store: &RemoteStore,
    clock: &ManualClock,
) -> usize {
    clock.advance(Duration::from_secs(2));
    let before = store.decides();
    assert_eq!(admitted(limiter, &customer(5_000), 200).await, 200);
    store.decides() - before
}

/// A key whose batch was denied (its window near its limit) waits at
/// most one lease before asking again, so keys near the end of their
/// quota do not fill the table of leased keys until their windows end and
/// leave hot keys without batches.
#[tokio::test]
async fn keys_denied_a_batch_do_not_crowd_out_hot_ones() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = hourly_per_key(store.clone(), &clock);
    // As many keys as the table holds, each one unit from its limit: hot,
    // and denied the batch it asks for.
    for n in 0..4_096 {
        let ctx = customer(n);
        limiter.penalize(&ctx, 999).await.unwrap();
        admitted(&limiter, &ctx, 8).await;
    }
    let calls = calls_of_a_new_hot_key(&limiter, &store, &clock).await;
    assert!(
        calls < 100,
        "a hot key is decided from batches: {calls} calls"
    );
}

/// Window leases hold their units until their window ends, but when the
/// table of leased keys is full, those nobody took from for a lease's
/// duration make room: keys that were hot once do not keep hot ones from
/// batches for the rest of their window.
#[tokio::test]
async fn idle_window_leases_make_room_for_hot_keys() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = hourly_per_key(store.clone(), &clock);
    // More keys than the table holds, each hot once: a batch each, most
    // with units left.
    for n in 0..4_400 {
        assert_eq!(admitted(&limiter, &customer(n), 10).await, 10);
    }
    let calls = calls_of_a_new_hot_key(&limiter, &store, &clock).await;
    assert!(
        calls < 100,
        "a hot key is decided from batches: {calls} calls"
    );
}

/// What a customer's usage reads agrees with what its decisions report:
/// the units of a batch this process holds and has not admitted are not
/// used (the store counts them as used when the batch is charged).
#[tokio::test]
async fn usage_does_not_count_a_held_batch_as_used() {
    let clock = ManualClock::new(START);
    let store = remote(&clock);
    let limiter = hourly_per_key(store, &clock);
    let ctx = customer(1);
    assert_eq!(admitted(&limiter, &ctx, 300).await, 300);
    let decision = limiter.check(&ctx, 1).await.unwrap();
    assert!(decision.is_allowed());
    let usage = limiter.usage(&ctx).await.unwrap();
    let (used, remaining) = (usage.layers[0].used, usage.layers[0].remaining);
    assert_eq!(used, 301, "301 admitted");
    assert_eq!(remaining, decision.layers()[0].verdict().remaining);
}
