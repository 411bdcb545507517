//! An entry's state: counter cells kept as atomics, so a decision the
//! algorithm can make in place (GCRA's, see `tollgate_algorithms::InPlace`)
//! on an existing key is made under the shard's shared lock with one
//! compare-and-swap (as governor does) and threads deciding the same key do
//! not queue behind one another; any other state (the sliding log) as is.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_algorithms::InPlace;
use tollgate_limiter::{State, Transition};

/// See the [module docs](self).
pub(crate) enum Slot {
    /// A counter state's three cells.
    Cells([AtomicU64; 3]),
    /// Any other state.
    Other(State),
}

/// A state read under the shard's exclusive lock.
pub(crate) enum Snapshot<'a> {
    /// Counter cells, copied out.
    Cells(State),
    /// Any other state, borrowed.
    Other(&'a State),
}

impl Snapshot<'_> {
    pub(crate) fn get(&self) -> &State {
        match self {
            Snapshot::Cells(state) => state,
            Snapshot::Other(state) => state,
        }
    }
}

impl Slot {
    pub(crate) fn new(state: State) -> Self {
        match state {
            State::Cells(cells) => Slot::Cells(cells.map(AtomicU64::new)),
            other => Slot::Other(other),
        }
    }

    /// The state. Called under the shard's exclusive lock, which orders it
    /// after every write (relaxed loads are enough).
    pub(crate) fn read(&self) -> Snapshot<'_> {
        match self {
            Slot::Cells(cells) => Snapshot::Cells(State::Cells(
                cells.each_ref().map(|c| c.load(Ordering::Relaxed)),
            )),
            Slot::Other(state) => Snapshot::Other(state),
        }
    }

    /// Replace the state (under the shard's exclusive lock).
    pub(crate) fn set(&mut self, state: State) {
        match (&mut *self, state) {
            (Slot::Cells(cells), State::Cells(new)) => {
                for (cell, value) in cells.iter_mut().zip(new) {
                    *cell.get_mut() = value;
                }
            }
            (slot, state) => *slot = Slot::new(state),
        }
    }

    /// Decide a request in place under the shard's shared lock, as `how`
    /// says ([`InPlace`]): `None` when the state is not counter cells that
    /// fit it (the caller decides under the exclusive lock instead).
    ///
    /// The decision is the reference algorithm's on the cells read; it
    /// commits with a compare-and-swap of the one cell it moves, and is
    /// made again when another thread moved that cell first, so admissions
    /// are exact: each moves the cell on from the one before. Under the
    /// shared lock only this path writes, and it only ever raises the
    /// cell, so a value read is never a recycled one; and an expired state
    /// decides as no state would, so expiry needs no check here (both
    /// promised by [`InPlace`]).
    pub(crate) fn decide_in_place(
        &self,
        how: InPlace<'_>,
        now: u64,
        cost: u64,
    ) -> Option<Transition> {
        let Slot::Cells(cells) = self else {
            return None;
        };
        let moved = &cells[InPlace::MOVED];
        loop {
            let seen = cells.each_ref().map(|c| c.load(Ordering::Acquire));
            if !how.fits(seen) {
                return None;
            }
            let t = how.decide(seen, now, cost);
            let Some(next) = &t.next else {
                return Some(t);
            };
            let State::Cells(new) = next.state else {
                return None;
            };
            let (from, to) = (seen[InPlace::MOVED], new[InPlace::MOVED]);
            if moved
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(t);
            }
        }
    }
}
