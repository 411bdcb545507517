//! Decisions a store may commit in place: one compare-and-swap of one
//! counter cell, without an exclusive lock (as governor does for GCRA).
//! The in-process store asks [`in_place`] instead of naming an algorithm.

use tollgate_limiter::{Limit, Transition};

use crate::gcra::gcra;

/// The in-place form of a limit's decisions ([`in_place`]). Its contract,
/// which makes a compare-and-swap of the [`MOVED`](Self::MOVED) cell a
/// complete commit:
///
/// - a decision on cells that [`fit`](Self::fits) writes cells that differ
///   from them in the moved cell alone, and only ever raises it, so a
///   value read there is never a recycled one;
/// - an expired state decides exactly as no state would, so a store need
///   not check expiry on this path.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, State};
/// let limit = Limit::gcra(10, Duration::from_secs(1), 5)?;
/// let how = tollgate_algorithms::in_place(&limit).expect("GCRA decides in place");
/// let first = tollgate_algorithms::decide(&limit, None, tollgate_limiter::Timestamp::from_micros(1_000_000), 1);
/// let Some(State::Cells(cells)) = first.next.map(|n| n.state) else { unreachable!() };
/// assert!(how.fits(cells));
/// let next = how.decide(cells, 1_000_000, 1);
/// assert!(next.verdict.allowed);
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct InPlace<'a> {
    gcra: &'a tollgate_limiter::Gcra,
}

/// `limit`'s in-place form, when its decisions have one: GCRA's (its
/// state is the theoretical arrival time, cell 0, which an admission only
/// moves later, and the rate it was written at, cell 1). `None` for every
/// other algorithm.
#[inline]
pub fn in_place(limit: &Limit) -> Option<InPlace<'_>> {
    match limit {
        Limit::Gcra(gcra) => Some(InPlace { gcra }),
        _ => None,
    }
}

impl InPlace<'_> {
    /// The cell a decision moves.
    pub const MOVED: usize = 0;

    /// Whether a decision on `cells` may be made in place: they were
    /// written at this limit's rate. Cells written at another (a plan
    /// changed) are rewritten whole, under an exclusive lock.
    #[inline]
    pub fn fits(&self, cells: [u64; 3]) -> bool {
        cells[1] == self.gcra.recorded_rate()
    }

    /// The reference's decision on `cells` that [`fit`](Self::fits).
    #[inline]
    pub fn decide(&self, cells: [u64; 3], now: u64, cost: u64) -> Transition {
        let t = gcra(self.gcra, Some(cells), now, cost);
        debug_assert!(match t.next.as_ref().map(|n| &n.state) {
            Some(tollgate_limiter::State::Cells(next)) =>
                next[Self::MOVED] >= cells[Self::MOVED] && next[1..] == cells[1..],
            _ => t.next.is_none(),
        });
        t
    }
}
