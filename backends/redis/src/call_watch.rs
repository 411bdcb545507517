//! Counting calls abandoned unanswered on one connection: a server that
//! went silent (a frozen primary, a host gone without closing its
//! sockets) sends no error that would say the connection is dead, so
//! [`UNANSWERED_MAX`] calls in a row dropped at their deadline say it.
//! The Sentinel connection and a URL's managed connection both use it
//! (a pool's connection counts its own, as it comes back to the pool).

use std::sync::atomic::{AtomicU32, Ordering};

/// Calls in a row abandoned unanswered (their deadline passed) after which
/// a connection is taken for dead.
pub(crate) const UNANSWERED_MAX: u32 = 3;

/// What owns a watched connection: its count, and what to do when the
/// connection of a generation is taken for dead.
pub(crate) trait Watched {
    /// Calls abandoned unanswered in a row.
    fn unanswered(&self) -> &AtomicU32;
    /// Give up the connection of `generation` (unless it was already).
    fn dead(&self, generation: u64);
}

/// One call on the connection of `generation`: dropped before it was
/// [`answered`](CallWatch::answered), it counts as unanswered, and
/// [`UNANSWERED_MAX`] of them in a row give up the connection.
pub(crate) struct CallWatch<'a, W: Watched> {
    owner: &'a W,
    generation: u64,
    answered: bool,
}

impl<'a, W: Watched> CallWatch<'a, W> {
    pub(crate) fn new(owner: &'a W, generation: u64) -> Self {
        CallWatch {
            owner,
            generation,
            answered: false,
        }
    }

    /// The server answered (an error included): the count starts again.
    pub(crate) fn answered(mut self) {
        self.answered = true;
        let unanswered = self.owner.unanswered();
        if unanswered.load(Ordering::Relaxed) != 0 {
            unanswered.store(0, Ordering::Relaxed);
        }
    }
}

impl<W: Watched> Drop for CallWatch<'_, W> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let count = self.owner.unanswered();
        if count.fetch_add(1, Ordering::AcqRel) + 1 >= UNANSWERED_MAX {
            count.store(0, Ordering::Relaxed);
            self.owner.dead(self.generation);
        }
    }
}
