//! A permit: the places an admitted request holds in its concurrency
//! layers, renewed while it lives and released when it is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::{Mutex, Notify};

use crate::error::StoreError;
use crate::hold::{Hold, Holds};
use crate::release_queue::ReleaseQueue;
use crate::store::{LayerRequest, OwnedLayer};

/// The places an admitted request holds in its concurrency layers
/// ([`Limit::concurrency`](crate::Limit::concurrency)), from
/// [`Limiter::acquire`](crate::Limiter::acquire).
///
/// Hold it while the work lasts. While it lives, a task renews its places
/// every third of the shortest lease, so a long request keeps them; when
/// it is dropped — the work finished, panicked, was cancelled or timed
/// out — a task gives them back at once. A process that dies holding one
/// loses its places one lease after the last renewal. [`release`](Self::release)
/// gives them back and waits for the store's answer.
///
/// Renewals run on the Tokio runtime that was current when the permit was
/// made; a dropped permit's release runs on the runtime it is dropped on,
/// else on that one. Without any, nothing is renewed and a dropped
/// permit's places come back when their lease runs out. The places of
/// permits dropped while a release call is in flight go back together in
/// the next call.
///
/// ```
/// # use std::sync::Arc;
/// # use std::time::Duration;
/// # use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let exports = Policy::new("exports", Limit::concurrency(2, Duration::from_secs(30))?)?;
/// let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
///     .layer("in-flight", Scope::Subject, exports)
///     .build()?;
/// let ctx = Context::for_subject(Subject::new("acme")?);
/// let first = limiter.acquire(&ctx, 1).await?;
/// let second = limiter.acquire(&ctx, 1).await?;
/// assert!(first.decision.is_allowed() && second.decision.is_allowed());
/// // Two in flight: a third waits for one of them.
/// assert!(!limiter.acquire(&ctx, 1).await?.decision.is_allowed());
/// first.permit.expect("admitted").release().await?;
/// assert!(limiter.acquire(&ctx, 1).await?.decision.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping a permit releases its places at once"]
pub struct Permit {
    /// `None` once released.
    held: Option<Arc<Held>>,
}

/// What a permit holds, shared with its renewing task.
#[derive(Debug)]
pub(crate) struct Held {
    /// Where its places go back to (its store's).
    queue: Arc<ReleaseQueue>,
    /// The runtime current when it was made: renewals and the release run
    /// there, wherever the permit is dropped.
    runtime: Option<tokio::runtime::Handle>,
    layers: SmallVec<[OwnedLayer; 2]>,
    /// The current holds, one per layer. Renewals and the release take
    /// the lock for their whole store call: a release never names a hold
    /// a renewal is moving.
    pub(crate) holds: Mutex<SmallVec<[Option<Hold>; 2]>>,
    /// Woken when the permit is released: the renewing task stops.
    released: Notify,
}

impl Permit {
    /// A permit over the concurrency layers of `requests` that `holds`
    /// name (other layers hold nothing); `None` when none holds anything.
    pub(crate) fn new(
        queue: &Arc<ReleaseQueue>,
        requests: &[LayerRequest<'_>],
        holds: &Holds,
    ) -> Option<Permit> {
        let mut layers: SmallVec<[OwnedLayer; 2]> = SmallVec::new();
        let mut held_holds = SmallVec::new();
        for (request, hold) in requests.iter().zip(holds) {
            let Some(hold) = hold else { continue };
            layers.push(OwnedLayer::of(request));
            held_holds.push(Some(*hold));
        }
        if layers.is_empty() {
            return None;
        }
        for layer in &layers {
            crate::observe::permits_in_flight(layer.policy().name(), 1.0);
        }
        let every = renewal_interval(&layers);
        let held = Arc::new(Held {
            queue: Arc::clone(queue),
            runtime: tokio::runtime::Handle::try_current().ok(),
            layers,
            holds: Mutex::new(held_holds),
            released: Notify::new(),
        });
        if let Some(runtime) = &held.runtime {
            runtime.spawn(renew_while_held(Arc::downgrade(&held), every));
        }
        Some(Permit { held: Some(held) })
    }

    /// Give the places back now, and wait for the store's answer (a
    /// failure is returned: the places then come back when their lease
    /// runs out).
    ///
    /// A release cancelled while it waits for a renewal in flight is
    /// queued as a dropped permit's is; once its call is under way, a
    /// cancelled one leaves the places to their lease.
    pub async fn release(mut self) -> Result<(), StoreError> {
        let Some(held) = self.held.clone() else {
            return Ok(());
        };
        held.released.notify_one();
        let mut holds = held.holds.lock().await;
        // The release is this call's from here: the permit's drop queues
        // nothing.
        self.held = None;
        let (requests, named) = held.held(&holds);
        held.forget(&mut holds);
        if requests.is_empty() {
            return Ok(());
        }
        held.queue.store().release(&requests, &named).await
    }

    /// How many concurrency layers this permit holds a place in.
    pub fn layers(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.layers.len())
    }

    /// The shortest lease of its layers: a holder that stops renewing
    /// loses its places this long after its last renewal.
    pub fn lease(&self) -> Duration {
        self.held
            .as_ref()
            .map_or(crate::MIN_LEASE, |h| lease_of(&h.layers))
    }

    /// Renew the places now, as the permit's own task does every third of
    /// the lease (for a holder whose work is driven from elsewhere: a
    /// remote client renewing through an API). `Ok(false)` once no place
    /// is held any more (each lost one was forgotten: its lease ran out).
    pub async fn renew(&self) -> Result<bool, StoreError> {
        match &self.held {
            Some(held) => held.renew().await,
            None => Ok(false),
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        // The renewing task stops at once, whether or not a runtime is
        // left to release on.
        held.released.notify_one();
        // The runtime it is dropped on, if any: the one it was made on may
        // have shut down since (a task spawned there would never run).
        let runtime = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| held.runtime.clone());
        if let Some(runtime) = runtime {
            let queue = Arc::clone(&held.queue);
            queue.push(held, &runtime);
        }
    }
}

impl Held {
    /// The request and hold of each layer still held.
    pub(crate) fn held<'a>(
        &'a self,
        holds: &[Option<Hold>],
    ) -> (SmallVec<[LayerRequest<'a>; 2]>, SmallVec<[Hold; 2]>) {
        self.layers
            .iter()
            .zip(holds)
            .filter_map(|(l, hold)| {
                let hold = (*hold)?;
                Some((l.request(hold.cost), hold))
            })
            .unzip()
    }

    /// Given back, or left to their lease: this process holds its places
    /// no more.
    pub(crate) fn forget(&self, holds: &mut [Option<Hold>]) {
        for (layer, hold) in self.layers.iter().zip(holds.iter_mut()) {
            if hold.take().is_some() {
                crate::observe::permits_in_flight(layer.policy().name(), -1.0);
            }
        }
    }

    /// Renew every place still held; `false` once none is (a lost one is
    /// forgotten: its holder no longer counts there).
    async fn renew(&self) -> Result<bool, StoreError> {
        let mut holds = self.holds.lock().await;
        let (requests, held) = self.held(&holds);
        if requests.is_empty() {
            return Ok(false);
        }
        let mut renewed = self
            .queue
            .store()
            .renew(&requests, &held)
            .await?
            .into_iter();
        for (layer, hold) in self.layers.iter().zip(holds.iter_mut()) {
            if hold.is_none() {
                continue;
            }
            *hold = renewed.next().flatten();
            if hold.is_none() {
                crate::observe::permit_lost(layer.policy().name());
                crate::observe::permits_in_flight(layer.policy().name(), -1.0);
            }
        }
        Ok(holds.iter().any(Option::is_some))
    }
}

/// A third of the shortest lease between renewals. A renewal that fails
/// (a store blip) is tried again after a third of that (see
/// [`renew_while_held`]).
fn renewal_interval(layers: &[OwnedLayer]) -> Duration {
    lease_of(layers) / 3
}

/// The shortest lease of `layers`.
fn lease_of(layers: &[OwnedLayer]) -> Duration {
    layers
        .iter()
        .filter_map(|l| match l.policy().limit() {
            crate::Limit::Concurrency(c) => Some(c.lease()),
            _ => None,
        })
        .min()
        .unwrap_or(crate::MIN_LEASE)
}

/// Renew `held` every `every` until it is released (or dropped, or holds
/// nothing more). After a renewal that failed, the next comes a third of
/// `every` later: a place lives a lease (three times `every`) from its
/// last renewal, so a failure at a third of the lease is followed by five
/// more tries before it runs out (every `every` would leave one, and a
/// place would be lost to two failures in a row).
async fn renew_while_held(held: Weak<Held>, every: Duration) {
    let mut pause = every;
    loop {
        {
            let Some(held) = held.upgrade() else { return };
            let released = held.released.notified();
            if tokio::time::timeout(pause, released).await.is_ok() {
                return;
            }
        }
        let Some(held) = held.upgrade() else { return };
        pause = match held.renew().await {
            Ok(false) => return,
            Ok(true) => every,
            Err(_) => every / 3,
        };
    }
}
