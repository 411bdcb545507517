//! Fixed window: a counter per aligned window.

use tollgate_limiter::{FixedWindow, State, Transition, Window, MAX_EXACT};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};

/// Fixed window over the state `[count, last µs, 0]`.
///
/// The window is the one holding the effective time `max(now, last)`; the
/// stored count belongs to the window holding `last`. A clock stepping back
/// into an earlier window keeps the later window and its count.
pub fn fixed_window(p: &Window, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let w = p.window_us();
    let (stored, last) = match state {
        Some([count, last, _]) => (count, last),
        None => (0, now),
    };
    let t = now.max(last);
    let start = t - t % w;
    let count = if last >= start { stored } else { 0 };
    let end = start.saturating_add(w);
    crate::counter::count(p.limit(), count, cost, now, (t, end), |count_after| {
        State::Cells([count_after, t, 0])
    })
}

/// The count goes down only while it still counts the charge's window.
pub fn fixed_window_refund(p: &Window, [count, last, _]: [u64; 3], c: Charge) -> Refund {
    let w = p.window_us();
    if last < c.at || last - last % w != c.at - c.at % w {
        return Refund::NOTHING;
    }
    Refund::from_count(count, c.cost, |left| [left, last, 0])
}

impl Reference for FixedWindow {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        fixed_window(self, cells(state), now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Cells(c) => fixed_window_refund(self, *c, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The time of the charge.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        match next {
            State::Cells([_, at, _]) => Some((*at, 0)),
            _ => None,
        }
    }
    /// From the current window's count.
    fn reward(&self, state: &State, now: u64, units: u64) -> Option<State> {
        crate::builtin::reward_last_charge(self, state, now, units)
    }
    /// [count, last]: the count within exact integers.
    fn within_reach(&self, [count, _, _]: [u64; 3]) -> bool {
        count < MAX_EXACT
    }
}
