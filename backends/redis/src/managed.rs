//! The multiplexed connection of a store on one server (a URL's): redis-rs's
//! `ConnectionManager`, replaced by a new one when it stops serving and
//! would not notice on its own.
//!
//! The manager reconnects after an I/O error only. A server that went
//! silent (its host gone without closing its sockets) sends no error:
//! every call would fail at its deadline until the kernel gives up on the
//! socket, many minutes later. And when the address moves to a new
//! primary (a DNS name or a virtual address that follows failovers), the
//! connection still reaches the old server, demoted to a replica, which
//! answers `READONLY` to every write, for good. So, as the pool and
//! Sentinel connections do, [`UNANSWERED_MAX`](crate::call_watch::UNANSWERED_MAX) calls in a row abandoned
//! unanswered replace the manager, and so does a `READONLY`, at most once
//! per [`REPLACE_PAUSE`] (a replica that stays one is not reconnected to
//! on every call).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError};

use crate::call_watch::{CallWatch, Watched};

/// The shortest time between two replacements for an error.
pub(crate) const REPLACE_PAUSE: Duration = Duration::from_secs(1);

/// A store's connection manager, and what replaces it.
pub(crate) struct Managed {
    client: Client,
    config: ConnectionManagerConfig,
    current: RwLock<Current>,
    /// Calls in a row abandoned unanswered on the current manager.
    unanswered: AtomicU32,
}

struct Current {
    /// Counts replacements: a call's check applies to the manager it used.
    generation: u64,
    manager: ConnectionManager,
    since: Instant,
}

impl Managed {
    /// `manager`, made from `client` with `config` (which a replacement
    /// is made with too).
    pub(crate) fn new(
        client: Client,
        config: ConnectionManagerConfig,
        manager: ConnectionManager,
    ) -> Managed {
        Managed {
            client,
            config,
            current: RwLock::new(Current {
                generation: 0,
                manager,
                since: Instant::now(),
            }),
            unanswered: AtomicU32::new(0),
        }
    }

    /// The manager to call on, and its generation.
    pub(crate) fn connection(&self) -> (u64, ConnectionManager) {
        let current = read(&self.current);
        (current.generation, current.manager.clone())
    }

    /// Watch one call on `generation`'s manager: dropped before
    /// [`CallWatch::answered`], it counts as abandoned unanswered.
    pub(crate) fn watch(&self, generation: u64) -> CallWatch<'_, Managed> {
        CallWatch::new(self, generation)
    }

    /// After a call on `generation`'s manager failed with `e`: an error
    /// the manager keeps (a demoted server) replaces it.
    pub(crate) fn check(&self, generation: u64, e: &RedisError) {
        if is_kept(e) {
            self.replace(generation, REPLACE_PAUSE);
        }
    }

    /// A new manager in place of `generation`'s, unless another call
    /// replaced it already, or it is younger than `pause`. The new one
    /// connects on its first call (and retries in the background, as the
    /// first did).
    fn replace(&self, generation: u64, pause: Duration) {
        // A manager spawns its tasks on the runtime: a call dropped
        // outside one (a runtime shutting down) leaves the replacement to
        // the next call.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut current = write(&self.current);
        if current.generation != generation || current.since.elapsed() < pause {
            return;
        }
        let Ok(manager) =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
        else {
            return;
        };
        *current = Current {
            generation: generation + 1,
            manager,
            since: Instant::now(),
        };
        self.unanswered.store(0, Ordering::Relaxed);
    }
}

impl Watched for Managed {
    fn unanswered(&self) -> &AtomicU32 {
        &self.unanswered
    }

    fn dead(&self, generation: u64) {
        self.replace(generation, Duration::ZERO);
    }
}

/// An error the manager answers again to every later call: a server
/// demoted to a replica (`READONLY`).
fn is_kept(e: &RedisError) -> bool {
    crate::error::is_read_only(e)
}

/// The lock's value; a panic elsewhere leaves it usable (every write
/// replaces it whole).
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}
