//! An entry's state: counter cells kept as atomics, so a GCRA decision on
//! an existing key is made under the shard's shared lock with one
//! compare-and-swap (as governor does) and threads deciding the same key do
//! not queue behind one another; any other state (the sliding log) as is.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_limiter::{Gcra, State, Transition};

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

    /// Decide a GCRA request under the shard's shared lock: `None` when
    /// the state is not GCRA's cells (the caller decides under the
    /// exclusive lock instead).
    ///
    /// The decision is the reference algorithm's on the TAT read; it
    /// commits with a compare-and-swap of the theoretical arrival time
    /// (TAT), and is made again when another thread moved it first, so
    /// admissions are exact: each moves the TAT on from the one before.
    /// Under the shared lock only this path writes, and it only ever raises
    /// the TAT, so a TAT read is never a recycled one. An expired GCRA
    /// state decides exactly as no state would (its TAT is in the past), so
    /// expiry needs no check here.
    pub(crate) fn gcra(&self, p: &Gcra, now: u64, cost: u64) -> Option<Transition> {
        let Slot::Cells([tat, rate, _]) = self else {
            return None;
        };
        // A rate other than the one this layer records is rewritten only
        // under the exclusive lock (a plan changed: see
        // `tollgate_algorithms::rebased_tat`).
        let rate = rate.load(Ordering::Relaxed);
        if rate != p.recorded_rate() {
            return None;
        }
        loop {
            let seen = tat.load(Ordering::Acquire);
            let t = tollgate_algorithms::gcra(p, Some([seen, rate, 0]), now, cost);
            let Some(next) = &t.next else {
                return Some(t);
            };
            let State::Cells([new_tat, _, _]) = next.state else {
                return None;
            };
            if tat
                .compare_exchange(seen, new_tat, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(t);
            }
        }
    }
}
