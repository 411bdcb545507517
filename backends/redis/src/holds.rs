//! Reservations in flight: units this process has charged on Cluster keys
//! while the rest of their decision is still pending.
//!
//! A request whose layers span several slots charges slot group by slot
//! group and refunds them when a later group denies. Meanwhile other
//! requests see those units taken: a request denied only because of them
//! would have passed once they are refunded. The Cluster store records
//! its holds here, so such a request can wait for them to settle and be
//! decided again (once, within its deadline). Holds of other processes are
//! not visible: across processes the under-admission stays (see
//! docs/cluster.md).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Units held per Redis key by this process's decisions in flight.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    held: Mutex<HashMap<String, u64>>,
    released: Notify,
}

impl Holds {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record `units` held on each key.
    pub(crate) fn hold(&self, keys: &[(String, u64)]) {
        let mut map = self.map();
        for (key, units) in keys {
            *map.entry(key.clone()).or_default() += units;
        }
    }

    /// Drop holds recorded by [`hold`](Self::hold), and wake the waiters.
    pub(crate) fn release(&self, keys: &[(String, u64)]) {
        if keys.is_empty() {
            return;
        }
        {
            let mut map = self.map();
            for (key, units) in keys {
                if let Some(held) = map.get_mut(key) {
                    *held = held.saturating_sub(*units);
                    if *held == 0 {
                        map.remove(key);
                    }
                }
            }
        }
        self.released.notify_waiters();
    }

    /// Units held on `key`.
    pub(crate) fn held(&self, key: &str) -> u64 {
        self.map().get(key).copied().unwrap_or(0)
    }

    /// Wait until every key of `seen` holds less than it did (some of those
    /// reservations settled: charged for good or refunded): true, or false
    /// when `until` came first.
    pub(crate) async fn settled(&self, seen: &[(String, u64)], until: Instant) -> bool {
        loop {
            let notified = self.released.notified();
            if seen.iter().all(|(key, then)| self.held(key) < *then) {
                return true;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return false;
            }
        }
    }
}

/// This decision's holds, released when it ends, however it ends.
pub(crate) struct Held<'a> {
    holds: &'a Holds,
    keys: Vec<(String, u64)>,
}

impl<'a> Held<'a> {
    pub(crate) fn new(holds: &'a Holds) -> Self {
        Held {
            holds,
            keys: Vec::new(),
        }
    }

    /// Record a charged group's keys and costs.
    pub(crate) fn add(&mut self, keys: Vec<(String, u64)>) {
        self.holds.hold(&keys);
        self.keys.extend(keys);
    }

    /// Units held on `key` by this decision.
    pub(crate) fn mine(&self, key: &str) -> u64 {
        self.keys
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, u)| u)
            .sum()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.holds.release(&self.keys);
    }
}
