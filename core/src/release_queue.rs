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
            let flusher = Flusher {
                queue: Arc::clone(self),
                owns_flag: true,
            };
            runtime.spawn(flusher.flush());
        }
    }

    /// Give back every place of `batch`: as few calls as distinct keys
    /// allow (a call's layers have distinct keys), each of at most
    /// [`MAX_BATCH`] layers. A failed call leaves its places to their lease.
    async fn release_all(&self, batch: Vec<Arc<Held>>) {
        let mut calls: Vec<ReleaseCall<'_>> = Vec::new();
        for held in &batch {
            // Under the permit's lock, so that no renewal moves a hold
            // being named; forgotten before any call, so a renewal after
            // finds nothing, and the gauge is right however the calls end.
            let mut guard = held.holds.lock().await;
            let (requests, holds) = held.held(&guard);
            held.forget(&mut guard);
            for (request, hold) in requests.into_iter().zip(holds) {
                add_to_calls(&mut calls, request, hold);
            }
        }
        for (requests, holds) in &calls {
            // Nobody waits for the answer: a failed release leaves the
            // places to their lease.
            let _ = self.store.release(requests, holds).await;
        }
    }
}

/// The one task giving back what is pending. However it ends — done,
/// never run (its runtime had shut down), dropped with its runtime, or
/// unwound by a store's panic — it gives the flag up, so the next push
/// starts another instead of leaving every later place to its lease.
struct Flusher {
    queue: Arc<ReleaseQueue>,
    /// Whether this task holds `flushing` (it gives it up, then may take
    /// it again).
    owns_flag: bool,
}

impl Flusher {
    /// Give back what is pending, batch after batch, until nothing is.
    async fn flush(mut self) {
        let queue = Arc::clone(&self.queue);
        loop {
            let batch = std::mem::take(&mut *queue.pending());
            if !batch.is_empty() {
                queue.release_all(batch).await;
                continue;
            }
            self.owns_flag = false;
            queue.flushing.store(false, Ordering::Release);
            // A push between the take and the store above found a task
            // flushing and left its place to it: take it, unless another
            // push started a task since.
            if queue.pending().is_empty() || queue.flushing.swap(true, Ordering::AcqRel) {
                return;
            }
            self.owns_flag = true;
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        if self.owns_flag {
            self.queue.flushing.store(false, Ordering::Release);
        }
    }
}

/// Add one layer's release to the first call it fits: one naming the same
/// key and time takes its units (entries of one time are interchangeable),
/// else one without its key and with room; else a new call.
fn add_to_calls<'a>(calls: &mut Vec<ReleaseCall<'a>>, request: LayerRequest<'a>, hold: Hold) {
    for (requests, holds) in calls.iter_mut() {
        match requests.iter().position(|r| r.key == request.key) {
            // (Under one policy: two plans share a key with other limits,
            // and a call names each layer's.)
            Some(i) if holds[i].at == hold.at && requests[i].policy == request.policy => {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::StoreKey;
    use crate::{Limit, Policy};

    fn policy(capacity: u64) -> Policy {
        let limit = Limit::concurrency(capacity, Duration::from_secs(30)).unwrap();
        Policy::new("exports", limit).unwrap()
    }

    /// Holds of one key and time merge into one layer of a call, unless
    /// their policies differ (two plans' limits on one key): a call names
    /// each layer's own limit, so those go apart.
    #[test]
    fn one_key_and_time_merge_only_under_one_policy() {
        let (free, pro) = (policy(1), policy(10));
        let request = |policy| LayerRequest {
            key: StoreKey::new("acme", policy, "s", "acme"),
            policy,
            cost: 1,
        };
        let hold = Hold { cost: 1, at: 7 };
        let mut calls = Vec::new();
        add_to_calls(&mut calls, request(&pro), hold);
        add_to_calls(&mut calls, request(&pro), hold);
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].0[0].cost, calls[0].1[0].cost), (2, 2), "merged");
        add_to_calls(&mut calls, request(&free), hold);
        assert_eq!(
            calls.len(),
            2,
            "the other plan's hold goes in a call of its own"
        );
        assert_eq!(calls[1].0[0].policy, &free);
        assert_eq!(calls[0].0[0].cost, 2, "the merged one is untouched");
    }
}
