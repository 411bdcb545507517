//! Sliding window counter: two aligned windows, the previous one weighted.

use tollgate_limiter::{SlidingWindow, State, Stored, Transition, Verdict, Window, MAX_EXACT};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// Sliding window counter over the state `[current count, previous count, last µs]`.
///
/// With `e` the elapsed part of the current window `W`, a request of `cost`
/// passes when `prev × (W − e) + (cur + cost) × W ≤ limit × W` — the usual
/// `prev × (1 − e/W) + cur + cost ≤ limit`, multiplied out so it stays exact.
pub fn sliding_window(p: &Window, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (w, limit) = (p.window_us(), p.limit());
    let (stored_cur, stored_prev, last) = match state {
        Some([cur, prev, last]) => (cur, prev, last),
        None => (0, 0, now),
    };
    let t = now.max(last);
    let start = t - t % w;
    let last_start = last - last % w;
    let (prev, cur) = if last_start == start {
        (stored_prev, stored_cur)
    } else if last_start.saturating_add(w) == start {
        (stored_cur, 0)
    } else {
        (0, 0)
    };
    let e = t - start;
    let budget = limit * w;
    // In u128: a count written under another policy (a plan, a reload: a
    // larger limit, a shorter window) times this window can pass 2^64,
    // and must read as far over the budget, not wrap below it.
    let weighed = |prev: u64, cur: u64| {
        u128::from(prev) * u128::from(w - e) + u128::from(cur) * u128::from(w)
    };
    let used = weighed(prev, cur);
    let allowed = used + u128::from(cost * w) <= u128::from(budget);
    let cur_after = if allowed { cur + cost } else { cur };
    let used_after = weighed(prev, cur_after);
    let reset_at = if cur_after > 0 {
        start.saturating_add(2 * w)
    } else if prev > 0 {
        start.saturating_add(w)
    } else {
        t
    };
    let retry_after = (!allowed).then(|| after(retry_at(limit, w, prev, cur, cost, start, e), now));
    Transition {
        verdict: Verdict {
            allowed,
            limit,
            // (Below the budget when anything remains: it fits a u64.)
            remaining: (u128::from(budget).saturating_sub(used_after) / u128::from(w)) as u64,
            reset_after: after(reset_at, now),
            retry_after,
        },
        next: allowed.then(|| Stored {
            state: State::Cells([cur_after, prev, t]),
            ttl: ttl_until(reset_at, now),
        }),
    }
}

/// The earliest instant a denied request of `cost` passes.
fn retry_at(limit: u64, w: u64, prev: u64, cur: u64, cost: u64, start: u64, e: u64) -> u64 {
    // Later in this window, as the previous window's weight fades:
    // prev × (W − e') ≤ (limit − cur − cost) × W.
    if limit >= cur + cost && prev > 0 {
        let spare = (limit - cur - cost) * w;
        let e_min = w - (spare / prev).min(w);
        if e_min < w {
            debug_assert!(e_min > e);
            return start.saturating_add(e_min);
        }
    }
    // In the next window, where this window's count becomes the weighted one:
    // cur × (W − e') ≤ (limit − cost) × W.
    // With no current count, the next window admits at its start.
    let e_next = ((limit - cost) * w)
        .checked_div(cur)
        .map_or(0, |spare| w - spare.min(w));
    start.saturating_add(w).saturating_add(e_next)
}

/// The charge is in the current count while the state is in the charge's
/// window, in the previous count once it moved to the next window, and
/// counts no more after that.
pub fn sliding_window_refund(p: &Window, [cur, prev, last]: [u64; 3], c: Charge) -> Refund {
    let w = p.window_us();
    if last < c.at {
        return Refund::NOTHING;
    }
    let (start, charged) = (last - last % w, c.at - c.at % w);
    if start == charged {
        let give = c.cost.min(cur);
        if give == 0 {
            return Refund::NOTHING;
        }
        Refund::cells(give, [cur - give, prev, last])
    } else if start == charged + w {
        let give = c.cost.min(prev);
        if give == 0 {
            return Refund::NOTHING;
        }
        Refund::cells(give, [cur, prev - give, last])
    } else {
        Refund::NOTHING
    }
}

impl Reference for SlidingWindow {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        sliding_window(self, cells(state), now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Cells(c) => sliding_window_refund(self, *c, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The time of the charge.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        match next {
            State::Cells([_, _, at]) => Some((*at, 0)),
            _ => None,
        }
    }
    /// The current window's count first, then the previous one's.
    fn reward(&self, state: &State, now: u64, units: u64) -> Option<State> {
        let (last, _) = self.charge_marks(state)?;
        let charge = |cost, at| Charge { cost, at, mark: 0 };
        let current = self.refund(state, now, charge(units, last));
        let rest = units - current.given;
        let after_current = current.next.unwrap_or_else(|| state.clone());
        if rest == 0 {
            return Some(after_current);
        }
        let previous = self.refund(
            &after_current,
            now,
            charge(rest, last.saturating_sub(self.window_us())),
        );
        previous
            .next
            .or((current.given > 0).then_some(after_current))
    }
    /// [current, previous, last]: counts below 2^53, as the Lua reads
    /// them exactly (weighed by the window in u128, any such count is
    /// decided: one written under another window or limit included).
    fn within_reach(&self, [cur, prev, _]: [u64; 3]) -> bool {
        cur < MAX_EXACT && prev < MAX_EXACT
    }
}
