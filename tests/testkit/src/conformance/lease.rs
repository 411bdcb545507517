//! Conformance of leased layers ([`Lease`]): a process admits a hot key from
//! batches it charged in the store, never more than the limit in all, and
//! what it holds comes back when it gives it back or dies.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    async_trait, Adjustment, Context, Decide, Hold, Holds, LayerRequest, Lease, Limit, Limiter,
    ManualClock, Policy, Scope, Store, StoreError, Verdicts,
};

use super::{unique, StoreFactory, START};

/// Limiters sharing one store, as processes would.
const PROCESSES: usize = 4;

/// A store that counts the decisions reaching the store it wraps (each
/// limiter of a case has its own leases over it, as a process would).
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

#[async_trait]
impl Store for Counted {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn is_in_process(&self) -> bool {
        self.inner.is_in_process()
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        match self.inner.decide(layers, verdicts) {
            Decide::Now(answer) => {
                self.calls.fetch_add(1, Ordering::Relaxed);
                Decide::Now(answer)
            }
            Decide::Later(call) => Decide::Later(Box::pin(async move {
                self.calls.fetch_add(1, Ordering::Relaxed);
                call.await
            })),
        }
    }
    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.inner.peek(layers).await
    }
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        self.inner.adjust(layers, adjustment).await
    }
    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        self.inner.acquire(layers).await
    }
    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        self.inner.release(layers, holds).await
    }
}

fn limiter(store: &Arc<Counted>, clock: &ManualClock, policy: &Policy) -> Limiter {
    Limiter::builder(store.clone())
        .clock(Arc::new(clock.clone()))
        .layer("all", Scope::Global, policy.clone())
        .build()
        .expect("valid limiter")
}

/// How many of `requests` decisions of `limiter` are admitted.
async fn admitted(limiter: Limiter, requests: usize) -> u64 {
    let ctx = Context::new();
    let mut admitted = 0;
    for _ in 0..requests {
        admitted += u64::from(limiter.check(&ctx, 1).await.expect("decided").is_allowed());
    }
    admitted
}

/// Four processes hammer one leased global window of 400 per second
/// (batches of at most 20), asking twice the limit each window: never more
/// than 400 admitted in a window, never fewer than 400 less what the four
/// can hold (4 × 20). Asking half the limit, every request is admitted,
/// and once the key is hot, on a store that is not in-process, with under
/// a quarter as many store calls as decisions (a denial is always the
/// store's call).
pub async fn leased_layers_never_over_admit(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = Arc::new(Counted {
        inner: factory.make(clock.clone()).await,
        calls: AtomicU64::new(0),
    });
    let (limit, batch) = (400, 20);
    // Leases outlast the window: its end must end them.
    let lease = Lease::new(Duration::from_secs(2))
        .and_then(|l| l.with_max_batch(batch))
        .expect("valid lease");
    let window = Limit::fixed_window(limit, Duration::from_secs(1)).expect("valid");
    let policy = (Policy::new(unique("hot"), window).and_then(|p| p.leased(lease))).expect("valid");
    let processes: Vec<Limiter> = (0..PROCESSES)
        .map(|_| limiter(&store, &clock, &policy))
        .collect();
    for round in 0..6 {
        // Rounds of twice the limit, and of half of it, which leave
        // batches held at the window's end for the next round.
        let asked = if round % 4 == 0 { limit / 2 } else { 2 * limit };
        let calls_before = store.calls.load(Ordering::Relaxed);
        let tasks: Vec<_> = (processes.iter().cloned())
            .map(|l| tokio::spawn(admitted(l, asked as usize / PROCESSES)))
            .collect();
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("task");
        }
        assert!(
            total <= limit,
            "round {round}: {total} admitted, limit {limit}"
        );
        let bound = asked.min(limit - PROCESSES as u64 * batch);
        assert!(
            total >= bound,
            "round {round}: {total} admitted, at least {bound} expected"
        );
        let calls = store.calls.load(Ordering::Relaxed) - calls_before;
        if round == 4 && !store.is_in_process() {
            assert!(
                calls * 4 < asked,
                "{calls} store calls for {asked} decisions"
            );
        }
        clock.advance(Duration::from_secs(1));
    }
}

/// A leased token bucket's unused units come back: given back when the
/// process returns its leases, and by refill within one lease when the
/// process dies holding them (its batch is at most what one lease refills).
pub async fn leases_come_back(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = Arc::new(Counted {
        inner: factory.make(clock.clone()).await,
        calls: AtomicU64::new(0),
    });
    let one_lease = Duration::from_secs(1);
    // 10 a second: one lease refills 10, the largest batch.
    let bucket = Limit::token_bucket(100, 10, one_lease).expect("valid");
    let lease = (Lease::new(one_lease).and_then(|l| l.with_max_batch(10))).expect("valid lease");
    let name = unique("bucket");
    let leased = (Policy::new(&name, bucket.clone()).and_then(|p| p.leased(lease))).expect("valid");
    let plain = Policy::new(&name, bucket).expect("valid");
    let observer = limiter(&store, &clock, &plain);
    let remaining = || async {
        let peeked = observer.peek(&Context::new(), 1).await.expect("peeked");
        peeked.layers()[0].verdict().remaining
    };

    let process = limiter(&store, &clock, &leased);
    assert_eq!(admitted(process.clone(), 45).await, 45);
    let left = remaining().await;
    let held = 55u64
        .checked_sub(left)
        .unwrap_or_else(|| panic!("{left} units left of the 55 not admitted"));
    assert!(held < 10, "a batch holds at most 10: {held}");
    assert!(held > 0 || store.is_in_process(), "a batch is held");
    process.return_leases().await;
    assert_eq!(remaining().await, 55, "given back: {held} units");

    // A process dies holding its batch: its own runtime (and with it the
    // task that would give the batch back) stops first, then the limiter
    // is dropped where no runtime could give anything back.
    let (dies_store, dies_clock, dies_policy) = (store.clone(), clock.clone(), leased.clone());
    let dead = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dies = limiter(&dies_store, &dies_clock, &dies_policy);
        let admitted = runtime.block_on(admitted(dies.clone(), 45));
        drop(runtime);
        drop(dies);
        admitted
    });
    assert_eq!(dead.join().expect("the dying process"), 45);
    let left = remaining().await;
    let held = 10u64
        .checked_sub(left)
        .unwrap_or_else(|| panic!("{left} units left of the 10 not admitted"));
    assert!(held > 0 || store.is_in_process(), "it died holding a batch");
    assert!(held < 10, "a batch holds at most 10: {held}");
    // One lease refills 10, at least the batch: the held units come back
    // by refill within it (nothing gave them back), so every unit not
    // admitted is there again.
    clock.advance(one_lease);
    assert_eq!(
        remaining().await,
        20 - held,
        "{held} units held by the dead process, refilled 10"
    );
}
