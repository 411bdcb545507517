//! Concurrency limits through the HTTP API: a client acquires a place on a
//! route, keeps it by renewing within its lease, and gives it back. The
//! server holds each place's permit under an unguessable id; a client that
//! stops renewing (it died) loses its place one lease after its last call.
//!
//! A permit stays in the table while its renewal waits for the store: a
//! release or another renewal of the same id meanwhile waits for that
//! renewal to end, then goes on with the permit it left (a release that
//! answered 404 then would leave the place held, and the client, acquiring
//! again, would hold two).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limiter::{Clock, Permit, Timestamp};

/// The permits held for clients, by id.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    held: Mutex<HashMap<String, Arc<Held>>>,
    /// No client's lease ends before this (µs): a sweep before it has
    /// nothing to look for (a renewal only moves a lease's end later).
    next_end: AtomicU64,
    /// Two keyed hashers (random keys per process) and a counter: ids
    /// nobody can guess from the ones they were given.
    ids: (RandomState, RandomState, AtomicU64),
}

/// One client's permit.
#[derive(Debug)]
pub(crate) struct Held {
    /// `None` once given back or lost. Locked for a whole renewal.
    permit: tokio::sync::Mutex<Option<Permit>>,
    /// The client's last call plus the lease, by the server's clock (µs).
    until: AtomicU64,
}

impl Held {
    /// Give the permit back, once any renewal in flight has ended; `None`
    /// when there is none left to give (lost, or given back already).
    pub(crate) async fn take(&self) -> Option<Permit> {
        self.permit.lock().await.take()
    }
}

/// What a renewal found.
pub(crate) enum Renewed {
    /// Still held, for another lease.
    Held(Duration),
    /// Unknown (never given, released, or expired), or lost in the store.
    Gone,
    /// The store did not answer: the place is still held until its lease
    /// runs out; renew again.
    Unavailable,
}

impl Permits {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Held>>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `permit` for a client until one lease from `now`: its id.
    pub(crate) fn insert(&self, permit: Permit, now: Timestamp) -> String {
        let n = self.ids.2.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{:016x}{:016x}",
            self.ids.0.hash_one(n),
            self.ids.1.hash_one(n)
        );
        let until = now.saturating_add(permit.lease()).as_micros();
        let held = Arc::new(Held {
            permit: tokio::sync::Mutex::new(Some(permit)),
            until: AtomicU64::new(until),
        });
        let mut table = self.table();
        if table.is_empty() {
            self.next_end.store(until, Ordering::Relaxed);
        } else {
            self.next_end.fetch_min(until, Ordering::Relaxed);
        }
        table.insert(id.clone(), held);
        id
    }

    /// The permit `id`, out of the table, to be given back ([`Held::take`]).
    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Held>> {
        self.table().remove(id)
    }

    /// Renew permit `id` at `now`: its places in the store, and the
    /// client's lease.
    pub(crate) async fn renew(&self, id: &str, clock: &dyn Clock) -> Renewed {
        // (No table lock across the store's call: the permit's own.)
        let Some(held) = self.table().get(id).cloned() else {
            return Renewed::Gone;
        };
        let mut permit = held.permit.lock().await;
        let Some(renewing) = permit.as_ref() else {
            return Renewed::Gone;
        };
        match renewing.renew().await {
            Ok(true) => {
                let lease = renewing.lease();
                let until = clock.now().saturating_add(lease).as_micros();
                held.until.fetch_max(until, Ordering::Relaxed);
                // The client's lease may have ended while the store
                // renewed: a sweep took the permit out then, and gives
                // its place back once this renewal lets go. (A sweep
                // after this look reads the new end, under the table's
                // lock, and keeps it.)
                if !self.table().get(id).is_some_and(|h| Arc::ptr_eq(h, &held)) {
                    return Renewed::Gone;
                }
                Renewed::Held(lease)
            }
            // Lost in the store: the client acquires again.
            Ok(false) => {
                *permit = None;
                let mut table = self.table();
                if table.get(id).is_some_and(|h| Arc::ptr_eq(h, &held)) {
                    table.remove(id);
                }
                Renewed::Gone
            }
            // Kept, under the lease it had.
            Err(_) => Renewed::Unavailable,
        }
    }

    /// Take out every permit whose client's lease ended by `now`, to be
    /// given back. The table is looked through only once a lease may have
    /// ended.
    pub(crate) fn expired(&self, now: Timestamp) -> Vec<Arc<Held>> {
        let now = now.as_micros();
        if now < self.next_end.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mut table = self.table();
        let mut ended = Vec::new();
        let mut next_end = u64::MAX;
        table.retain(|_, held| {
            let until = held.until.load(Ordering::Relaxed);
            if until <= now {
                ended.push(Arc::clone(held));
                return false;
            }
            next_end = next_end.min(until);
            true
        });
        self.next_end.store(next_end, Ordering::Relaxed);
        ended
    }

    /// Give back every permit whose client's lease ended by `now`, on a
    /// task of its own, so whoever noticed does not wait for the store
    /// (after an outage every lease may end at once, and each release may
    /// take the store's deadline); the task, when there was any to give.
    pub(crate) fn give_back_expired(&self, now: Timestamp) -> Option<tokio::task::JoinHandle<()>> {
        let ended = self.expired(now);
        (!ended.is_empty()).then(|| tokio::spawn(give_back(ended)))
    }
}

/// Give each of `ended` back to its store, in turn.
async fn give_back(ended: Vec<Arc<Held>>) {
    for held in ended {
        if let Some(permit) = held.take().await {
            // A failed release leaves the place to its lease in the store.
            let _ = permit.release().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_limiter::{
        async_trait, Context, Decide, Hold, Holds, LayerRequest, Limit, Limiter, ManualClock,
        Policy, Scope, Store, StoreError, Subject, Verdicts,
    };
    use tollgate_memory::MemoryStore;

    use super::*;

    /// The in-process store, whose renewals (and releases, when told)
    /// wait for `gate`.
    #[derive(Debug, Default)]
    struct Stalling {
        inner: MemoryStore,
        gate: tokio::sync::Notify,
        stall_releases: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl Store for Stalling {
        fn kind(&self) -> &'static str {
            "stalling"
        }
        fn decide<'a>(
            &'a self,
            layers: &'a [LayerRequest<'a>],
            verdicts: &'a mut Verdicts,
        ) -> Decide<'a> {
            self.inner.decide(layers, verdicts)
        }
        async fn acquire(
            &self,
            layers: &[LayerRequest<'_>],
        ) -> Result<(Verdicts, Holds), StoreError> {
            self.inner.acquire(layers).await
        }
        async fn release(
            &self,
            layers: &[LayerRequest<'_>],
            holds: &[Hold],
        ) -> Result<(), StoreError> {
            if self.stall_releases.load(Ordering::SeqCst) {
                self.gate.notified().await;
            }
            self.inner.release(layers, holds).await
        }
        async fn renew(
            &self,
            layers: &[LayerRequest<'_>],
            holds: &[Hold],
        ) -> Result<Holds, StoreError> {
            self.gate.notified().await;
            self.inner.renew(layers, holds).await
        }
    }

    /// One client's permit of a limit of one place, in the table, and its
    /// renewal started: the store holds it until `store.gate` opens.
    struct Renewing {
        store: Arc<Stalling>,
        limiter: Limiter,
        ctx: Context,
        clock: Arc<ManualClock>,
        permits: Arc<Permits>,
        id: String,
        renewing: tokio::task::JoinHandle<Renewed>,
    }

    async fn renewing() -> Renewing {
        let store = Arc::new(Stalling::default());
        let policy = Policy::new(
            "jobs",
            Limit::concurrency(1, Duration::from_secs(30)).unwrap(),
        )
        .unwrap();
        let limiter = Limiter::builder(store.clone())
            .layer("in-flight", Scope::Subject, policy)
            .build()
            .unwrap();
        let ctx = Context::for_subject(Subject::new("acme").unwrap());
        let clock = Arc::new(ManualClock::new(Timestamp::from_micros(
            1_780_000_000_000_000,
        )));
        let permits = Arc::new(Permits::default());
        let permit = limiter.acquire(&ctx, 1).await.unwrap().permit.unwrap();
        let id = permits.insert(permit, clock.now());
        let renewing = {
            let (permits, id, clock) = (permits.clone(), id.clone(), clock.clone());
            tokio::spawn(async move { permits.renew(&id, &*clock).await })
        };
        Renewing {
            store,
            limiter,
            ctx,
            clock,
            permits,
            id,
            renewing,
        }
    }

    /// Expired permits are given back on a task of their own: whoever
    /// noticed them (a request) does not wait for the store (before, an
    /// acquisition or renewal waited for each release in turn, each up to
    /// the store's deadline).
    #[tokio::test]
    async fn expired_permits_are_given_back_without_waiting() {
        let store = Arc::new(Stalling::default());
        store.stall_releases.store(true, Ordering::SeqCst);
        let limit = Limit::concurrency(1, Duration::from_secs(30)).unwrap();
        let limiter = Limiter::builder(store.clone())
            .layer(
                "in-flight",
                Scope::Subject,
                Policy::new("jobs", limit).unwrap(),
            )
            .build()
            .unwrap();
        let ctx = Context::for_subject(Subject::new("acme").unwrap());
        let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
        let permits = Permits::default();
        let permit = limiter.acquire(&ctx, 1).await.unwrap().permit.unwrap();
        permits.insert(permit, clock.now());
        assert!(permits.give_back_expired(clock.now()).is_none(), "not yet");
        clock.advance(Duration::from_secs(30));
        let giving = permits.give_back_expired(clock.now()).expect("one ended");
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!giving.is_finished(), "the release waits for the store");
        store.gate.notify_one();
        giving.await.expect("given back");
        assert!(permits.give_back_expired(clock.now()).is_none(), "once");
        let again = limiter.acquire(&ctx, 1).await.unwrap();
        assert!(again.decision.is_allowed(), "the place came back");
    }

    /// A release that comes while the same permit's renewal waits for the
    /// store gives the place back once the renewal ends (it used to find
    /// no such permit, and the renewal put it back for another lease).
    #[tokio::test]
    async fn a_release_during_a_renewal_gives_the_place_back() {
        let Renewing {
            store,
            limiter,
            ctx,
            clock,
            permits,
            id,
            renewing,
        } = renewing().await;
        let releasing = {
            let (permits, id) = (permits.clone(), id.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    tokio::task::yield_now().await; // the renewal first
                }
                let held = permits.remove(&id).expect("still in the table");
                held.take()
                    .await
                    .expect("left by the renewal")
                    .release()
                    .await
            })
        };
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        store.gate.notify_one();
        // The release took the permit out first: the renewal says so.
        assert!(matches!(renewing.await.unwrap(), Renewed::Gone));
        releasing.await.unwrap().expect("released");
        let again = limiter.acquire(&ctx, 1).await.unwrap();
        assert!(again.decision.is_allowed(), "the place came back");
        assert!(matches!(permits.renew(&id, &*clock).await, Renewed::Gone));
    }

    /// A renewal whose store call outlasts the client's lease, while a
    /// sweep takes the permit out and gives its place back, answers that
    /// the permit is gone: it used to answer "held" for a place another
    /// client could then take.
    #[tokio::test]
    async fn a_renewal_outlasted_by_its_lease_is_not_held() {
        let Renewing {
            store,
            limiter,
            ctx,
            clock,
            permits,
            renewing,
            ..
        } = renewing().await;
        for _ in 0..10 {
            tokio::task::yield_now().await; // the renewal waits for the store
        }
        clock.advance(Duration::from_secs(31));
        let sweeping = {
            let (permits, now) = (permits.clone(), clock.now());
            tokio::spawn(async move {
                for held in permits.expired(now) {
                    if let Some(permit) = held.take().await {
                        permit.release().await.expect("released");
                    }
                }
            })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        store.gate.notify_one();
        let renewed = renewing.await.unwrap();
        sweeping.await.unwrap();
        let other = limiter.acquire(&ctx, 1).await.unwrap();
        assert!(
            !(matches!(renewed, Renewed::Held(_)) && other.decision.is_allowed()),
            "the renewal answered held, and the place went to another client"
        );
        assert!(matches!(renewed, Renewed::Gone));
    }
}
