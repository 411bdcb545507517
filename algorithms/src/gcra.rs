//! GCRA: the token bucket as one theoretical arrival time.

use tollgate_limiter::{Gcra, State, Stored, Transition, Verdict};

use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// GCRA over the state `[TAT µs, last µs, 0]`.
///
/// The theoretical arrival time (TAT) is when the key is back to full. A
/// request of `cost` moves it `cost × interval` later; it is admitted when the
/// new TAT is at most `burst × interval` ahead of the effective time. `last`
/// keeps the effective time monotonic, so a backward clock cannot make the
/// bucket look emptier.
pub fn gcra(p: &Gcra, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let interval = p.interval_us();
    let tolerance = p.burst() * interval;
    let (tat, last) = match state {
        Some([tat, last, _]) => (tat, last),
        None => (now, now),
    };
    let t = now.max(last);
    let base = tat.max(t);
    let new_tat = base.saturating_add(cost * interval);
    if new_tat - t <= tolerance {
        Transition {
            verdict: Verdict {
                allowed: true,
                limit: p.burst(),
                remaining: (tolerance - (new_tat - t)) / interval,
                reset_after: after(new_tat, now),
                retry_after: None,
            },
            next: Some(Stored {
                state: State::Cells([new_tat, t, 0]),
                ttl: ttl_until(new_tat, now),
            }),
        }
    } else {
        // Admitted once the effective time reaches new_tat - tolerance; that
        // instant is not after `base`, so `base` is unchanged by then.
        let retry_at = new_tat - tolerance;
        Transition {
            verdict: Verdict {
                allowed: false,
                limit: p.burst(),
                remaining: tolerance.saturating_sub(base - t) / interval,
                reset_after: after(base, now),
                retry_after: Some(after(retry_at, now)),
            },
            next: None,
        }
    }
}

/// The charge moved the TAT `cost × interval` later, to `mark`. Without it,
/// the TAT could have been raised to the effective time since; only what is
/// still ahead of the effective time is owed, and the TAT never goes below
/// the effective time.
pub fn gcra_refund(p: &Gcra, [tat, last, _]: [u64; 3], now: u64, c: Charge) -> Refund {
    if last < c.at {
        return Refund::NOTHING;
    }
    let t = now.max(last);
    let give = (c.cost * p.interval_us()).min(c.mark.saturating_sub(t));
    if give == 0 {
        return Refund::NOTHING;
    }
    let lowered = tat.saturating_sub(give).max(t);
    if lowered >= tat {
        return Refund::NOTHING;
    }
    Refund::cells(tat - lowered, [lowered, last, 0])
}
