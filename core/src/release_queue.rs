//! The releases of dropped permits, batched: while one release call is in
//! flight, the places of permits dropped meanwhile wait for it and go
//! together in the next call. An idle limiter's release goes at once; a
//! busy one's cost a fraction of a store call each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::hold::Hold;
use crate::permit::Held;
use crate::store::{LayerRequest, Store};

/// Most layers one release call carries.
const MAX_BATCH: usize = 64;

/// One release call: its layers (distinct keys) and their holds.
type ReleaseCall<'a> = (SmallVec<[LayerRequest<'a>; 4]>, SmallVec<[Hold; 4]>);

/// A limiter's queue of places to give back to its store.
#[derive(Debug)]
pub(crate) struct ReleaseQueue {
    store: Arc<dyn Store>,
    pending: Mutex<Vec<Arc<Held>>>,
    /// Whether a task is giving back what is pending.
    flushing: AtomicBool,
}

impl ReleaseQueue {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        ReleaseQueue {
            store,
            pending: Mutex::new(Vec::new()),
            flushing: AtomicBool::new(false),
        }
    }

    /// The store the places live in.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Held>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Give `held`'s places back soon, with whatever else is pending, on
    /// `runtime`.
    pub(crate) fn push(self: &Arc<Self>, held: Arc<Held>, runtime: &tokio::runtime::Handle) {
        self.pending().push(held);
        if !self.flushing.swap(true, Ordering::AcqRel) {
            runtime.spawn(Arc::clone(self).flush());
        }
    }

    /// Give back what is pending, batch after batch, until nothing is.
    async fn flush(self: Arc<Self>) {
        loop {
            let batch = std::mem::take(&mut *self.pending());
            if !batch.is_empty() {
                self.release_all(batch).await;
                continue;
            }
            self.flushing.store(false, Ordering::Release);
            // A push between the take and the store above found a task
            // flushing and left its place to it: take it, unless another
            // push started a task since.
            if self.pending().is_empty() || self.flushing.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }

    /// Give back every place of `batch`: as few calls as distinct keys
    /// allow (a call's layers have distinct keys), each of at most
    /// [`MAX_BATCH`] layers. A failed call leaves its places to their lease.
    async fn release_all(&self, batch: Vec<Arc<Held>>) {
        // Each permit's lock, so that no renewal moves a hold being named.
        let mut guards = Vec::with_capacity(batch.len());
        for held in &batch {
            guards.push(held.holds.lock().await);
        }
        let mut calls: Vec<ReleaseCall<'_>> = Vec::new();
        for (held, guard) in batch.iter().zip(&guards) {
            let (requests, holds) = held.held(guard);
            for (request, hold) in requests.into_iter().zip(holds) {
                add_to_calls(&mut calls, request, hold);
            }
        }
        for (requests, holds) in &calls {
            // Nobody waits for the answer: a failed release leaves the
            // places to their lease.
            let _ = self.store.release(requests, holds).await;
        }
        for (held, mut guard) in batch.iter().zip(guards) {
            held.forget(&mut guard);
        }
    }
}

/// Add one layer's release to the first call it fits: one naming the same
/// key and time takes its units (entries of one time are interchangeable),
/// else one without its key and with room; else a new call.
fn add_to_calls<'a>(calls: &mut Vec<ReleaseCall<'a>>, request: LayerRequest<'a>, hold: Hold) {
    for (requests, holds) in calls.iter_mut() {
        match requests.iter().position(|r| r.key == request.key) {
            Some(i) if holds[i].at == hold.at => {
                requests[i].cost += request.cost;
                holds[i].cost += hold.cost;
                return;
            }
            Some(_) => continue,
            None if requests.len() < MAX_BATCH => {
                requests.push(request);
                holds.push(hold);
                return;
            }
            None => continue,
        }
    }
    calls.push((
        SmallVec::from_elem(request, 1),
        SmallVec::from_elem(hold, 1),
    ));
}
