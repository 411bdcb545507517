//! Calendar quota: a counter per calendar span.

use std::time::Duration;

use tollgate_limiter::{
    Calendar, State, Transition, Verdict, CALENDAR_ENDED_RETRY, MAX_EXACT,
};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};

/// Calendar quota over the state `[count, span start µs, span end µs]`.
///
/// The span is the one holding `now` (for a store: the one the caller
/// sent). A state of that span, or of one overlapping it that has not
/// ended (a schedule changed under the same key), goes on counting in it;
/// a state of a later span (a caller whose clock runs ahead began it) goes
/// on counting in that one, so a caller whose clock lags at a boundary
/// never restarts a span another has begun; a state of an earlier span
/// counts as none.
///
/// A count carried from another span stays in that span's state until an
/// admission moves it (a denial writes nothing): each new span overlapping
/// the stored one carries it again, until the stored span ends. A denial
/// then says to wait until that end, the instant the count is gone.
///
/// A span that has ended at `now` — the store's clock (Redis `TIME`) ahead
/// of the caller's that chose it — admits nothing and writes nothing: its
/// count would expire at once and start again. The caller's next call, a
/// millisecond later as `retry_after` says, sends the next span once its
/// clock reaches it.
pub fn calendar(p: &Calendar, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (span_start, span_end) = p.span_at(now);
    let (count, start, end, carried_until) = match state {
        Some([count, start, end]) if start >= span_end => (count, start, end, None),
        Some([count, start, end]) if end > span_start && end > now => {
            let carried = (start, end) != (span_start, span_end) && count > 0;
            (count, span_start, span_end, carried.then_some(end))
        }
        _ => (0, span_start, span_end, None),
    };
    if end <= now {
        return ended(p.limit());
    }
    let mut t = crate::counter::count(p.limit(), count, cost, now, (now, end), |count_after| {
        State::Cells([count_after, start, end])
    });
    if let (false, Some(gone_at)) = (t.verdict.allowed, carried_until) {
        t.verdict.reset_after = crate::after(gone_at, now);
        t.verdict.retry_after = Some(t.verdict.reset_after);
    }
    t
}

/// The verdict in a span that has ended at the store's clock: denied,
/// nothing left, retry in a millisecond.
fn ended(limit: u64) -> Transition {
    Transition {
        verdict: Verdict {
            allowed: false,
            limit,
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(CALENDAR_ENDED_RETRY),
        },
        next: None,
    }
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
    /// [count, start, end]: the count within exact integers, a span
    /// [`Calendar::is_span`] accepts.
    fn within_reach(&self, [count, start, end]: [u64; 3]) -> bool {
        count < MAX_EXACT && Calendar::is_span(start, end)
    }
}
