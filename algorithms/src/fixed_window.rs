//! Fixed window: a counter per aligned window.

use tollgate_limiter::{FixedWindow, State, Stored, Transition, Verdict, Window, MAX_EXACT};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

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
    let allowed = count.saturating_add(cost) <= p.limit();
    let count_after = if allowed {
        count.saturating_add(cost)
    } else {
        count
    };
    Transition {
        verdict: Verdict {
            allowed,
            limit: p.limit(),
            remaining: p.limit().saturating_sub(count_after),
            reset_after: if count_after == 0 {
                after(t, now)
            } else {
                after(end, now)
            },
            retry_after: (!allowed).then(|| after(end, now)),
        },
        next: allowed.then(|| Stored {
            state: State::Cells([count_after, t, 0]),
            ttl: ttl_until(end, now),
        }),
    }
}

/// The count goes down only while it still counts the charge's window.
pub fn fixed_window_refund(p: &Window, [count, last, _]: [u64; 3], c: Charge) -> Refund {
    let w = p.window_us();
    if last < c.at || last - last % w != c.at - c.at % w {
        return Refund::NOTHING;
    }
    let give = c.cost.min(count);
    if give == 0 {
        return Refund::NOTHING;
    }
    Refund::cells(give, [count - give, last, 0])
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
        let (at, _) = self.charge_marks(state)?;
        let charge = Charge {
            cost: units,
            at,
            mark: 0,
        };
        self.refund(state, now, charge).next
    }
    /// [count, last]: the count within exact integers.
    fn within_reach(&self, [count, _, _]: [u64; 3]) -> bool {
        count <= MAX_EXACT
    }
}
