//! Concurrency limits through the limiter: a permit holds each admitted
//! request's place while the work lasts, renews it past its lease, and
//! gives it back when the work ends, however it ends.
#![cfg(feature = "concurrency")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    BuildError, Context, Error, Fallback, Limit, Limiter, ManualClock, OnStoreFailure, Permit,
    Policy, Scope, Subject, Timestamp,
};
use tollgate_memory::MemoryStore;

const LEASE: Duration = Duration::from_secs(30);
const START: Timestamp = Timestamp::from_micros(1_780_000_000_000_000);

fn limiter(limit: u64, clock: &ManualClock) -> Limiter {
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let policy = Policy::new("exports", Limit::concurrency(limit, LEASE).unwrap()).unwrap();
    Limiter::builder(Arc::new(store))
        .layer("in-flight", Scope::Subject, policy)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

fn customer() -> Context {
    Context::for_subject(Subject::new("acme").unwrap())
}

/// The permit of the first admitted acquisition within `tries` (a dropped
/// permit is given back by a task, which may not have run yet).
async fn eventually_admitted(limiter: &Limiter, ctx: &Context, tries: usize) -> Option<Permit> {
    for _ in 0..tries {
        let acquired = limiter.acquire(ctx, 1).await.unwrap();
        if let Some(permit) = acquired.permit {
            assert!(acquired.decision.is_allowed());
            return Some(permit);
        }
        assert!(!acquired.decision.is_allowed(), "admitted without a permit");
        tokio::task::yield_now().await;
    }
    None
}

/// 64 tasks against a limit of 5, the work itself counting how many run at
/// once: never more than 5, and 5 are reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_tasks_never_run_more_than_the_limit_at_once() {
    let limiter = limiter(5, &ManualClock::new(START));
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (limiter, running, peak) = (limiter.clone(), running.clone(), peak.clone());
            tokio::spawn(async move {
                let permit = eventually_admitted(&limiter, &customer(), 1_000_000)
                    .await
                    .expect("every task runs in the end");
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                // The work lasts until the limit is reached (or a while).
                for _ in 0..10_000 {
                    if peak.load(Ordering::SeqCst) >= 5 {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                running.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        5,
        "at most 5 at once, and 5 ran"
    );
}

/// A permit's place comes back when its task panics, when its future is
/// cancelled, and when it times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_comes_back_on_panic_cancellation_and_timeout() {
    let limiter = limiter(1, &ManualClock::new(START));
    let ctx = customer();

    let held = limiter.clone();
    let panicked = tokio::spawn(async move {
        let _permit = held.acquire(&customer(), 1).await.unwrap().permit;
        panic!("the handler failed");
    });
    assert!(panicked.await.is_err());
    let permit = eventually_admitted(&limiter, &ctx, 10_000).await;
    assert!(permit.is_some(), "given back after the panic");
    drop(permit);

    let held = limiter.clone();
    let cancelled = tokio::spawn(async move {
        let _permit = held.acquire(&customer(), 1).await.unwrap().permit;
        std::future::pending::<()>().await;
    });
    let permit = loop {
        // Until the spawned task holds the place.
        if !limiter
            .acquire(&ctx, 1)
            .await
            .unwrap()
            .decision
            .is_allowed()
        {
            break None;
        }
        tokio::task::yield_now().await;
    };
    drop::<Option<Permit>>(permit);
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    let permit = eventually_admitted(&limiter, &ctx, 10_000).await;
    assert!(permit.is_some(), "given back after the cancellation");
    drop(permit);

    let slow = async {
        let _permit = limiter.acquire(&ctx, 1).await.unwrap().permit;
        std::future::pending::<()>().await;
    };
    assert!(tokio::time::timeout(Duration::from_millis(5), slow)
        .await
        .is_err());
    let permit = eventually_admitted(&limiter, &ctx, 10_000).await;
    assert!(permit.is_some(), "given back after the timeout");
    // Released explicitly: the store answers.
    permit.unwrap().release().await.unwrap();
    assert!(limiter.acquire(&ctx, 1).await.unwrap().permit.is_some());
}

/// A request that lasts longer than its lease keeps its place: the permit
/// renews it every third of the lease. Once dropped, the place is free.
#[tokio::test(start_paused = true)]
async fn a_long_request_keeps_its_place_by_renewing() {
    let clock = ManualClock::new(START);
    let limiter = limiter(1, &clock);
    let ctx = customer();
    let permit = limiter.acquire(&ctx, 1).await.unwrap().permit.unwrap();
    for _ in 0..5 {
        // The store's clock first: the renewal reads it.
        clock.advance(LEASE / 3);
        tokio::time::advance(LEASE / 3).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    // Fifty seconds on: past the first lease, still held.
    assert!(!limiter
        .acquire(&ctx, 1)
        .await
        .unwrap()
        .decision
        .is_allowed());
    drop(permit);
    assert!(eventually_admitted(&limiter, &ctx, 100).await.is_some());
}

/// A holder that stops renewing (its process died) loses its place one
/// lease after it last renewed.
#[tokio::test]
async fn a_dead_holder_is_forgotten_after_its_lease() {
    let clock = ManualClock::new(START);
    let limiter = limiter(1, &clock);
    let ctx = customer();
    let permit = limiter.acquire(&ctx, 1).await.unwrap().permit.unwrap();
    // Its process dies: nothing renews it, nothing gives it back.
    std::mem::forget(permit);
    let full = limiter.acquire(&ctx, 1).await.unwrap();
    assert_eq!(full.decision.retry_after(), Some(LEASE));
    clock.advance(LEASE - Duration::from_micros(1));
    assert!(!limiter
        .acquire(&ctx, 1)
        .await
        .unwrap()
        .decision
        .is_allowed());
    clock.advance(Duration::from_micros(1));
    assert!(limiter.acquire(&ctx, 1).await.unwrap().permit.is_some());
}

/// `check` would take a place nothing gives back: it refuses, naming the
/// layer; and a concurrency layer cannot fall back to the emergency store.
#[tokio::test]
async fn check_refuses_concurrency_layers_and_fallbacks_are_refused() {
    let limiter = limiter(1, &ManualClock::new(START));
    match limiter.check(&customer(), 1).await {
        Err(Error::NeedsPermit { layer }) => assert_eq!(layer, "in-flight"),
        other => panic!("expected NeedsPermit, got {other:?}"),
    }
    let policy = Policy::new("exports", Limit::concurrency(2, LEASE).unwrap())
        .unwrap()
        .with_on_failure(OnStoreFailure::Fallback(Fallback::Share { instances: 2 }))
        .unwrap();
    let built = Limiter::builder(Arc::new(MemoryStore::default()))
        .fallback_store(Arc::new(MemoryStore::default()))
        .layer("in-flight", Scope::Subject, policy.clone())
        .build();
    assert_eq!(
        built.unwrap_err(),
        BuildError::ConcurrencyFallback("in-flight".into())
    );
    // Behind a rate layer that falls back too: every layer is checked.
    let share = OnStoreFailure::Fallback(Fallback::Share { instances: 2 });
    let rate = Policy::new("rate", Limit::fixed_window(10, LEASE).unwrap())
        .unwrap()
        .with_on_failure(share.clone())
        .unwrap();
    let built = Limiter::builder(Arc::new(MemoryStore::default()))
        .fallback_store(Arc::new(MemoryStore::default()))
        .layer("rate", Scope::Subject, rate)
        .layer("in-flight", Scope::Subject, policy.clone())
        .build();
    assert_eq!(
        built.unwrap_err(),
        BuildError::ConcurrencyFallback("in-flight".into())
    );
}

/// A plan may change how many places a concurrency limit has, not how
/// long they are held: every plan's places share one count, and a shorter
/// lease would read the others' as gone.
#[test]
fn a_plan_cannot_change_a_concurrency_lease() {
    use tollgate_limiter::{Plan, Plans};
    let build = |limit: Limit| {
        let policy = Policy::new("exports", Limit::concurrency(2, LEASE).unwrap()).unwrap();
        let plans = Plans::new(Plan::new("free").unwrap())
            .plan(Plan::new("pro").unwrap().limit("exports", limit));
        Limiter::builder(Arc::new(MemoryStore::default()))
            .layer("in-flight", Scope::Subject, policy)
            .plans(plans)
            .build()
    };
    assert!(build(Limit::concurrency(10, LEASE).unwrap()).is_ok());
    let shorter = build(Limit::concurrency(10, Duration::from_secs(10)).unwrap()).unwrap_err();
    assert!(shorter.to_string().contains("not how long"), "{shorter}");
}

/// Shadow layers never fail an acquisition: one the request cannot be
/// decided by (no tenant for it) is left out, one that denies is counted
/// and passed; the concurrency layer holds its place either way.
#[tokio::test]
async fn shadow_layers_never_fail_an_acquisition() {
    let store = Arc::new(MemoryStore::default());
    let in_flight = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let trial = Policy::new("trial", Limit::concurrency(1, LEASE).unwrap())
        .unwrap()
        .shadow();
    let per_tenant = Policy::new("tenants", Limit::fixed_window(1, LEASE).unwrap())
        .unwrap()
        .shadow();
    let limiter = Limiter::builder(store)
        .layer("in-flight", Scope::Subject, in_flight)
        .layer("trial", Scope::Global, trial)
        .layer("tenant", Scope::Tenant, per_tenant)
        .build()
        .unwrap();
    let (first, second) = (
        customer(),
        Context::for_subject(Subject::new("other").unwrap()),
    );
    let held = limiter.acquire(&first, 1).await.unwrap();
    assert!(held.decision.is_allowed(), "{:?}", held.decision);
    let permit = held.permit.expect("the enforced layer holds its place");
    assert_eq!(
        permit.layers(),
        2,
        "the shadow concurrency layer holds one too"
    );
    // The global trial layer is full: it denies in shadow, the request passes.
    let passed = limiter.acquire(&second, 1).await.unwrap();
    assert!(passed.decision.is_allowed());
    // The trial layer denied; the tenant layer was left out (reported as a
    // would-be denial that no store made).
    let shadow: Vec<&str> = passed.decision.shadow_denied().map(|l| l.layer()).collect();
    assert_eq!(shadow, ["trial", "tenant"]);
    assert_eq!(passed.permit.expect("held").layers(), 1);
    // The customer's own place is taken.
    assert!(!limiter
        .acquire(&first, 1)
        .await
        .unwrap()
        .decision
        .is_allowed());
}

/// As for `check`: a store error about a shadow policy alone (its key
/// budget is full) leaves the request to the enforced layers, which hold
/// their places.
#[tokio::test]
async fn a_shadow_policys_store_error_leaves_acquire_to_the_enforced_layers() {
    let store = MemoryStore::builder()
        .when_full(tollgate_limiter::WhenFull::Refuse)
        .build();
    let trial = Policy::new("trial", Limit::fixed_window(5, LEASE).unwrap())
        .unwrap()
        .with_key_budget(
            tollgate_limiter::KeyBudget::new(1, tollgate_limiter::WhenFull::Refuse).unwrap(),
        )
        .shadow();
    let exports = Policy::new("exports", Limit::concurrency(2, LEASE).unwrap()).unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("in-flight", Scope::Subject, exports)
        .layer("trial", Scope::Subject, trial)
        .build()
        .unwrap();
    let a = Context::for_subject(Subject::new("a").unwrap());
    let b = Context::for_subject(Subject::new("b").unwrap());
    let first = limiter.acquire(&a, 1).await.unwrap();
    assert!(first.decision.is_allowed() && first.permit.is_some());
    // The trial policy's one key is a's: b's cannot be stored.
    let second = limiter.acquire(&b, 1).await.unwrap();
    assert!(second.decision.is_allowed(), "{:?}", second.decision);
    assert_eq!(second.decision.store_error(), None);
    assert!(
        second.permit.is_some(),
        "the enforced layer holds b's place"
    );
}

/// A full key budget of an enforced policy that fails open fails that
/// policy alone: the concurrency layer still holds (or refuses) places in
/// the store, so a request from a new address cannot pass a full
/// concurrency limit.
#[tokio::test]
async fn a_full_budget_leaves_acquire_to_the_other_layers() {
    use tollgate_limiter::{KeyBudget, Source, WhenFull};
    let store = MemoryStore::builder().build();
    let per_address = Policy::new("ip", Limit::fixed_window(100, LEASE).unwrap())
        .unwrap()
        .with_key_budget(KeyBudget::new(1, WhenFull::Refuse).unwrap())
        .with_on_failure(OnStoreFailure::FailOpen)
        .unwrap();
    let exports = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap())
        .unwrap()
        .with_on_failure(OnStoreFailure::FailOpen)
        .unwrap();
    let limiter = Limiter::builder(Arc::new(store))
        .layer("in-flight", Scope::Subject, exports)
        .layer("ip", Scope::Attribute("ip".into()), per_address)
        .build()
        .unwrap();
    let from = |ip: &str| customer().with_attribute("ip", Subject::new(ip).unwrap());
    let first = limiter.acquire(&from("a"), 1).await.unwrap();
    assert!(first.decision.is_allowed() && first.permit.is_some());
    // Address b's key does not fit: the ip layer fails open, the
    // concurrency layer is decided in the store, where its place is taken.
    let second = limiter.acquire(&from("b"), 1).await.unwrap();
    assert!(!second.decision.is_allowed(), "{:?}", second.decision);
    assert!(second.permit.is_none());
    assert_eq!(second.decision.layers()[0].source, Source::Store);
    drop(first);
    let third = eventually_admitted(&limiter, &from("c"), 100).await;
    let third = third.expect("the place given back is taken");
    drop(third);
}

/// A permit taken on a runtime that then shut down, dropped outside any
/// runtime: its release had nowhere to run. The next permit dropped on a
/// live runtime gives back both places (the queue did not stay stuck
/// waiting for a task that never ran).
#[test]
fn places_go_back_after_the_runtime_they_were_taken_on_shut_down() {
    let limiter = limiter(2, &ManualClock::new(START));
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let orphan = first.block_on(async { limiter.acquire(&customer(), 1).await.unwrap() });
    drop(first);
    drop(orphan.permit.expect("admitted"));
    runtime().block_on(async {
        let second = eventually_admitted(&limiter, &customer(), 10).await;
        drop(second.expect("one place of two is free"));
        let a = eventually_admitted(&limiter, &customer(), 100).await;
        let b = eventually_admitted(&limiter, &customer(), 100).await;
        assert!(a.is_some() && b.is_some(), "both places came back");
    });
}

/// A release cancelled while it waits behind the permit's renewal is
/// queued as a dropped permit's is: the place comes back once the renewal
/// ends, not a lease later.
#[tokio::test(start_paused = true)]
async fn a_release_cancelled_behind_a_renewal_still_gives_the_place_back() {
    let store = Arc::new(CountingReleases::default());
    store.stall_renewals.store(true, Ordering::SeqCst);
    let policy = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("in-flight", Scope::Subject, policy)
        .build()
        .unwrap();
    let permit = limiter
        .acquire(&customer(), 1)
        .await
        .unwrap()
        .permit
        .unwrap();
    // The permit's own renewal starts a third of the lease later, and
    // stalls in the store holding the permit's lock.
    tokio::time::sleep(LEASE / 3 + Duration::from_millis(1)).await;
    let cancelled = tokio::time::timeout(Duration::from_millis(10), permit.release()).await;
    assert!(cancelled.is_err(), "the release waited behind the renewal");
    store.renewal_gate.notify_one();
    let again = eventually_admitted(&limiter, &customer(), 100).await;
    assert!(
        again.is_some(),
        "the place came back without waiting a lease"
    );
}

/// An acquisition dropped while the store answers (its client gone, a
/// timeout around `acquire`) gives back the places the store took: before,
/// they stayed taken for a whole lease, with no permit to give them back.
#[tokio::test(start_paused = true)]
async fn an_acquisition_dropped_while_the_store_answers_gives_its_places_back() {
    let store = Arc::new(CountingReleases::default());
    store.stall_acquisitions.store(true, Ordering::SeqCst);
    let policy = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("in-flight", Scope::Subject, policy)
        .build()
        .unwrap();
    let ctx = customer();
    let dropped = tokio::time::timeout(Duration::from_millis(10), limiter.acquire(&ctx, 1));
    assert!(
        dropped.await.is_err(),
        "the acquisition waited for the store"
    );
    store.stall_acquisitions.store(false, Ordering::SeqCst);
    store.acquisition_gate.notify_one();
    let again = eventually_admitted(&limiter, &ctx, 100).await;
    assert!(
        again.is_some(),
        "the place came back without waiting a lease"
    );
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "one release call");
}

/// The second pass of a request only a shadow layer denied takes the
/// places too, and gives them back as well when it is dropped while the
/// store answers (before, it ran in the caller's task, and a drop there
/// left the place taken for a whole lease).
#[tokio::test(start_paused = true)]
async fn a_second_pass_past_a_shadow_layer_dropped_while_the_store_answers_gives_its_places_back() {
    let store = Arc::new(CountingReleases::default());
    let in_flight = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let trial = Policy::new(
        "trial",
        Limit::sliding_log(1, Duration::from_secs(3_600)).unwrap(),
    )
    .unwrap()
    .shadow();
    let limiter = Limiter::builder(store.clone())
        .layer("in-flight", Scope::Subject, in_flight)
        .layer("trial", Scope::Subject, trial)
        .build()
        .unwrap();
    let ctx = customer();
    let first = limiter.acquire(&ctx, 1).await.unwrap();
    drop(first.permit.expect("admitted; the trial is spent"));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(store.calls.load(Ordering::SeqCst), 1, "released");
    // Denied by the trial alone: decided again without it, and that pass
    // stalls after taking the place.
    store.stall_lone_layers.store(true, Ordering::SeqCst);
    let dropped = tokio::time::timeout(Duration::from_millis(10), limiter.acquire(&ctx, 1));
    assert!(
        dropped.await.is_err(),
        "the second pass waited for the store"
    );
    store.stall_lone_layers.store(false, Ordering::SeqCst);
    store.acquisition_gate.notify_one();
    let again = eventually_admitted(&limiter, &ctx, 100).await;
    assert!(
        again.is_some(),
        "the place came back without waiting a lease"
    );
}

/// A store that panics while it takes places panics the acquisition, as
/// a decision's panic does: it is no outage, through which a fail-open
/// layer would admit with no place taken.
#[tokio::test]
async fn a_store_that_panics_while_acquiring_panics_the_caller() {
    let store = Arc::new(CountingReleases::default());
    store.panic_acquisitions.store(true, Ordering::SeqCst);
    let policy = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap())
        .unwrap()
        .with_on_failure(OnStoreFailure::FailOpen)
        .unwrap();
    let limiter = Limiter::builder(store)
        .layer("in-flight", Scope::Subject, policy)
        .build()
        .unwrap();
    let acquiring = tokio::spawn(async move {
        let acquired = limiter.acquire(&customer(), 1).await;
        acquired.map(|a| a.decision.is_allowed())
    });
    let ended = acquiring.await;
    assert!(matches!(&ended, Err(e) if e.is_panic()), "{ended:?}");
}

/// The in-process store, counting release calls and the layers they carry;
/// its renewals wait for `renewal_gate` while `stall_renewals` is set.
#[derive(Debug, Default)]
struct CountingReleases {
    inner: MemoryStore,
    calls: AtomicUsize,
    layers: AtomicUsize,
    stall_renewals: std::sync::atomic::AtomicBool,
    renewal_gate: tokio::sync::Notify,
    /// While set, an acquisition takes its places, then waits for
    /// `acquisition_gate` before it answers (a slow reply).
    stall_acquisitions: std::sync::atomic::AtomicBool,
    acquisition_gate: tokio::sync::Notify,
    /// While set, an acquisition panics (a store's bug).
    panic_acquisitions: std::sync::atomic::AtomicBool,
    /// While set, an acquisition of one layer stalls as
    /// `stall_acquisitions` makes every one stall.
    stall_lone_layers: std::sync::atomic::AtomicBool,
    /// This many renewals fail (the store unavailable), then they pass.
    failing_renewals: AtomicUsize,
}

#[tollgate_limiter::async_trait]
impl tollgate_limiter::Store for CountingReleases {
    fn kind(&self) -> &'static str {
        "counting"
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [tollgate_limiter::LayerRequest<'a>],
        verdicts: &'a mut tollgate_limiter::Verdicts,
    ) -> tollgate_limiter::Decide<'a> {
        self.inner.decide(layers, verdicts)
    }
    async fn acquire(
        &self,
        layers: &[tollgate_limiter::LayerRequest<'_>],
    ) -> Result<(tollgate_limiter::Verdicts, tollgate_limiter::Holds), tollgate_limiter::StoreError>
    {
        assert!(
            !self.panic_acquisitions.load(Ordering::SeqCst),
            "the store's bug"
        );
        let acquired = self.inner.acquire(layers).await;
        let lone = layers.len() == 1 && self.stall_lone_layers.load(Ordering::SeqCst);
        if lone || self.stall_acquisitions.load(Ordering::SeqCst) {
            self.acquisition_gate.notified().await;
        }
        acquired
    }
    async fn release(
        &self,
        layers: &[tollgate_limiter::LayerRequest<'_>],
        holds: &[tollgate_limiter::Hold],
    ) -> Result<(), tollgate_limiter::StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.layers.fetch_add(layers.len(), Ordering::SeqCst);
        self.inner.release(layers, holds).await
    }
    async fn renew(
        &self,
        layers: &[tollgate_limiter::LayerRequest<'_>],
        holds: &[tollgate_limiter::Hold],
    ) -> Result<tollgate_limiter::Holds, tollgate_limiter::StoreError> {
        if self.stall_renewals.load(Ordering::SeqCst) {
            self.renewal_gate.notified().await;
        }
        let failing = &self.failing_renewals;
        if failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(tollgate_limiter::StoreError::Unavailable("a blip".into()));
        }
        self.inner.renew(layers, holds).await
    }
}

/// Permits dropped together go back in one release call (ten customers'
/// places, one call), and every place is free afterwards.
#[tokio::test]
async fn places_dropped_together_go_back_in_one_call() {
    let store = Arc::new(CountingReleases::default());
    let policy = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("in-flight", Scope::Subject, policy)
        .build()
        .unwrap();
    let customers: Vec<Context> = (0..10)
        .map(|i| Context::for_subject(Subject::new(format!("c{i}")).unwrap()))
        .collect();
    let mut permits = Vec::new();
    for ctx in &customers {
        permits.push(limiter.acquire(ctx, 1).await.unwrap().permit.unwrap());
    }
    // Dropped before the release task first runs (one thread).
    drop(permits);
    for ctx in &customers {
        let permit = eventually_admitted(&limiter, ctx, 100).await;
        assert!(permit.is_some(), "every place came back");
        std::mem::forget(permit);
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 1);
    assert_eq!(store.layers.load(Ordering::SeqCst), 10);
}

/// Two renewals in a row that fail (a store blip of more than a third of
/// the lease) do not lose the place: a failed renewal is tried again
/// sooner, and the third try, still within the lease, keeps it. Past the
/// first lease the place is still held.
#[tokio::test(start_paused = true)]
async fn a_place_outlives_two_failed_renewals() {
    let clock = ManualClock::new(START);
    let store = Arc::new(CountingReleases {
        inner: MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
        failing_renewals: AtomicUsize::new(2),
        ..Default::default()
    });
    let policy = Policy::new("exports", Limit::concurrency(1, LEASE).unwrap()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .layer("in-flight", Scope::Subject, policy)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap();
    let ctx = customer();
    let permit = limiter.acquire(&ctx, 1).await.unwrap().permit.unwrap();
    // 43 seconds, in ninths of the lease (the store's clock first).
    for _ in 0..13 {
        clock.advance(LEASE / 9);
        tokio::time::advance(LEASE / 9).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(
        store.failing_renewals.load(Ordering::SeqCst),
        0,
        "both failed"
    );
    let second = limiter.acquire(&ctx, 1).await.unwrap();
    assert!(
        !second.decision.is_allowed(),
        "the first holder kept its place"
    );
    drop(permit);
    assert!(eventually_admitted(&limiter, &ctx, 100).await.is_some());
}
