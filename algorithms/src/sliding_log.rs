//! Sliding log: one timestamp per admitted unit, kept for one window.

use std::collections::VecDeque;

use tollgate_limiter::{SlidingLog, State, Stored, Transition, Verdict, Window};

use crate::builtin::Reference;
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// Sliding log over a non-decreasing list of timestamps.
///
/// An entry counts while it lies in `(t − W, t]`, `t = max(now, newest)`. A
/// request of `cost` passes when `entries + cost ≤ limit` and then adds `cost`
/// entries at `t`. Because `t` never decreases, the list stays sorted and a
/// store can keep it as a plain list.
pub fn sliding_log(p: &Window, state: Option<&VecDeque<u64>>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (w, limit) = (p.window_us(), p.limit());
    let empty = VecDeque::new();
    let entries = state.unwrap_or(&empty);
    let t = entries.back().map_or(now, |&newest| now.max(newest));
    // Entries at or before t - W have aged out.
    let live = entries.len() - entries.partition_point(|&ts| ts.saturating_add(w) <= t);
    let first_live = entries.len() - live;
    let allowed = live as u64 + cost <= limit;
    if allowed {
        let mut next: VecDeque<u64> = entries.range(first_live..).copied().collect();
        next.extend(std::iter::repeat_n(t, cost as usize));
        let reset_at = t.saturating_add(w);
        Transition {
            verdict: Verdict {
                allowed,
                limit,
                remaining: limit - next.len() as u64,
                reset_after: after(reset_at, now),
                retry_after: None,
            },
            next: Some(Stored {
                state: State::Log(next),
                ttl: ttl_until(reset_at, now),
            }),
        }
    } else {
        // The k-th oldest live entry must age out, k = live + cost - limit.
        let k = live as u64 + cost - limit;
        let retry_at = entries[first_live + k as usize - 1].saturating_add(w);
        let reset_at = entries.back().map_or(t, |&newest| newest.saturating_add(w));
        Transition {
            verdict: Verdict {
                allowed,
                limit,
                remaining: limit.saturating_sub(live as u64),
                reset_after: after(reset_at, now),
                retry_after: Some(after(retry_at, now)),
            },
            next: None,
        }
    }
}

/// Up to `cost` entries equal to `at`, newest first (`LREM key -cost at`).
pub fn sliding_log_refund(entries: &VecDeque<u64>, c: Charge) -> Refund {
    let mut next = entries.clone();
    let mut given = 0;
    let mut i = next.len();
    while i > 0 && given < c.cost {
        i -= 1;
        if next[i] == c.at {
            next.remove(i);
            given += 1;
        }
    }
    if given == 0 {
        return Refund::NOTHING;
    }
    Refund {
        given,
        next: Some(State::Log(next)),
    }
}

impl Reference for SlidingLog {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        let log = match state {
            Some(State::Log(entries)) => Some(entries),
            _ => None,
        };
        sliding_log(self, log, now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Log(entries) => sliding_log_refund(entries, charge),
            _ => Refund::NOTHING,
        }
    }
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        log_charge_marks(next)
    }
    fn reward(&self, state: &State, _now: u64, units: u64) -> Option<State> {
        log_reward(state, units)
    }
}

/// A log's charge: the time of its newest entries (those it appended).
pub(crate) fn log_charge_marks(next: &State) -> Option<(u64, u64)> {
    match next {
        State::Log(entries) => Some((*entries.back()?, 0)),
        _ => None,
    }
}

/// A log's reward: its newest `units` entries go.
pub(crate) fn log_reward(state: &State, units: u64) -> Option<State> {
    let State::Log(entries) = state else {
        return None;
    };
    let keep = entries.len().saturating_sub(units as usize);
    (keep < entries.len())
        .then(|| State::Log(entries.range(..keep).copied().collect::<VecDeque<u64>>()))
}
