//! Calendar quota: a counter per calendar span.

use tollgate_limiter::{Calendar, State, Transition, MAX_CALENDAR_SPAN_US, MAX_EXACT};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};

/// Calendar quota over the state `[count, span start µs, span end µs]`.
///
/// The span is the one holding `now` (for a store: the one the caller
/// sent), unless the state holds a later one: then the count goes on in
/// the stored span, so a caller whose clock lags at a boundary never
/// restarts a span another caller has begun (the lag is bounded by the
/// callers' clock skew). A state of an earlier span counts as none.
pub fn calendar(p: &Calendar, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (start, end) = p.span_at(now);
    let (count, start, end) = match state {
        Some([count, stored_start, stored_end]) if stored_start > start => {
            (count, stored_start, stored_end)
        }
        Some([count, stored_start, _]) if stored_start == start => (count, start, end),
        _ => (0, start, end),
    };
    crate::counter::count(p.limit(), count, cost, now, (now, end), |count_after| {
        State::Cells([count_after, start, end])
    })
}

/// The count goes down only while it still counts the charge's span.
pub fn calendar_refund([count, start, end]: [u64; 3], c: Charge) -> Refund {
    if start != c.at {
        return Refund::NOTHING;
    }
    Refund::from_count(count, c.cost, |left| [left, start, end])
}

impl Reference for Calendar {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        calendar(self, cells(state), now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Cells(c) => calendar_refund(*c, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The start of the charge's span.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        match next {
            State::Cells([_, start, _]) => Some((*start, 0)),
            _ => None,
        }
    }
    /// From the stored span's count.
    fn reward(&self, state: &State, now: u64, units: u64) -> Option<State> {
        crate::builtin::reward_last_charge(self, state, now, units)
    }
    /// [count, start, end]: the count within exact integers, a span of
    /// 1 µs to [`MAX_CALENDAR_SPAN_US`].
    fn within_reach(&self, [count, start, end]: [u64; 3]) -> bool {
        count <= MAX_EXACT && start < end && end - start <= MAX_CALENDAR_SPAN_US
    }
}
