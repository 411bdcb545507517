//! Concurrency limits through the HTTP API: a client acquires a place on a
//! route, keeps it by renewing within its lease, and gives it back. The
//! server holds each place's permit under an unguessable id; a client that
//! stops renewing (it died) loses its place one lease after its last call.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tollgate_limiter::{Clock, Permit, Timestamp};

/// The permits held for clients, by id.
#[derive(Debug, Default)]
pub(crate) struct Permits {
    held: Mutex<HashMap<String, Held>>,
    /// Two keyed hashers (random keys per process) and a counter: ids
    /// nobody can guess from the ones they were given.
    ids: (RandomState, RandomState, AtomicU64),
}

#[derive(Debug)]
struct Held {
    permit: Permit,
    /// The client's last call plus the lease, by the server's clock.
    until: Timestamp,
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
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
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
        let until = now.saturating_add(permit.lease());
        self.table().insert(id.clone(), Held { permit, until });
        id
    }

    /// The permit `id`, taken out to be given back.
    pub(crate) fn remove(&self, id: &str) -> Option<Permit> {
        self.table().remove(id).map(|h| h.permit)
    }

    /// Renew permit `id` at `now`: its places in the store, and the
    /// client's lease.
    pub(crate) async fn renew(&self, id: &str, clock: &dyn Clock) -> Renewed {
        // Out of the table while the store answers (no lock held across
        // the call); put back when still held.
        let Some(held) = self.table().remove(id) else {
            return Renewed::Gone;
        };
        match held.permit.renew().await {
            Ok(true) => {
                let lease = held.permit.lease();
                let until = clock.now().saturating_add(lease);
                let permit = held.permit;
                self.table().insert(id.to_string(), Held { permit, until });
                Renewed::Held(lease)
            }
            // Lost in the store: the client acquires again.
            Ok(false) => Renewed::Gone,
            // Kept, under the lease it had.
            Err(_) => {
                self.table().insert(id.to_string(), held);
                Renewed::Unavailable
            }
        }
    }

    /// Take out every permit whose client's lease ended by `now`, to be
    /// given back.
    pub(crate) fn expired(&self, now: Timestamp) -> Vec<Permit> {
        let mut table = self.table();
        let ended: Vec<String> = table
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        ended
            .into_iter()
            .filter_map(|id| table.remove(&id).map(|h| h.permit))
            .collect()
    }
}
