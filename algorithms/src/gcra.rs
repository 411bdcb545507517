//! GCRA: the token bucket as one theoretical arrival time.

use tollgate_limiter::{Gcra, State, Stored, Transition, Verdict};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// GCRA over the state `[TAT µs, interval, 0]`: one integer (stored in
/// Redis as one, which Redis keeps without a separate allocation), and the
/// interval it was written at when the layer keeps units across a change
/// of plan (else 0: see [`rebased_tat`]).
///
/// The theoretical arrival time (TAT) is when the key is back to full. A
/// request of `cost` moves it `cost × interval` later; it is admitted when the
/// new TAT is at most `burst × interval` ahead of now.
///
/// No other time is kept, and none is needed against a clock that steps
/// back: every write leaves the TAT after the time it was made at, so a
/// clock read earlier than a past decision finds the TAT ahead of it and
/// starts from the TAT, exactly as from that decision's time: it never
/// refills twice. Until the clock catches up it measures the TAT from an
/// earlier instant, so it admits less (never more) than a bucket that
/// keeps its latest time would.
pub fn gcra(p: &Gcra, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let interval = p.interval_us();
    let tolerance = p.burst() * interval;
    let tat = match state {
        Some([tat, rate, _]) => rebased_tat(p, tat, rate, now),
        None => now,
    };
    // A state of another interval (its plan changed) recovers at that
    // interval until a write moves it to this one, and a denial writes
    // nothing: its waits are counted at that interval.
    let another_interval = state.filter(|&[tat, rate, _]| rebases(p, tat, rate, now));
    let t = now;
    let base = tat.max(t);
    let new_tat = base.saturating_add(cost.saturating_mul(interval));
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
                state: State::Cells([new_tat, p.recorded_rate(), 0]),
                ttl: ttl_until(new_tat, now),
            }),
        }
    } else {
        // Admitted once the effective time reaches new_tat - tolerance; that
        // instant is not after `base`, so `base` is unchanged by then. At
        // another interval: once the units used, ⌈(TAT − t) ÷ interval⌉ at
        // that interval, leave room for the cost; full at its TAT.
        let (retry_at, reset_at) = match another_interval {
            Some([old_tat, old, _]) => {
                let room = p.burst().saturating_sub(cost).saturating_mul(old);
                (old_tat.saturating_sub(room), old_tat)
            }
            None => (new_tat - tolerance, base),
        };
        Transition {
            verdict: Verdict {
                allowed: false,
                limit: p.burst(),
                remaining: tolerance.saturating_sub(base - t) / interval,
                reset_after: after(reset_at, now),
                retry_after: Some(after(retry_at, now)),
            },
            next: None,
        }
    }
}

/// The TAT of a state written at the interval `rate` records, read by a
/// layer that keeps units ([`Limit::keeping_units`]) at another interval
/// (its plan changed): the units the TAT stands for at the old interval
/// (whole units, a partly recovered one counted as used; at most the
/// burst), at the new one. Otherwise the TAT as it is: a state that
/// records no rate (written before the policy had plans) is read as time.
///
/// [`Limit::keeping_units`]: tollgate_limiter::Limit::keeping_units
pub fn rebased_tat(p: &Gcra, tat: u64, rate: u64, now: u64) -> u64 {
    if !rebases(p, tat, rate, now) {
        return tat;
    }
    let used = (tat - now).div_ceil(rate).min(p.burst());
    now + used * p.interval_us()
}

/// Whether [`rebased_tat`] reads a TAT written at the interval `rate` as
/// units used (a layer that keeps units, another interval, not yet full).
fn rebases(p: &Gcra, tat: u64, rate: u64, now: u64) -> bool {
    p.keeps_units() && rate != 0 && rate != p.interval_us() && tat > now
}

/// The charge moved the TAT `cost × interval` later, to `mark`. Without it,
/// the TAT could have been raised to now since; only what is still ahead of
/// now is owed, and the TAT never goes below now.
///
/// A state recreated since the charge (the charged one expired) needs no
/// check of its own: a GCRA state expires only once its TAT has passed, so
/// by then `mark` is not ahead of now and nothing is owed. (That holds on
/// the clock that expires keys; with a caller's clock, within its skew.)
pub fn gcra_refund(p: &Gcra, [tat, rate, _]: [u64; 3], now: u64, c: Charge) -> Refund {
    let tat = rebased_tat(p, tat, rate, now);
    let t = now;
    let give = (c.cost * p.interval_us()).min(c.mark.saturating_sub(t));
    if give == 0 {
        return Refund::NOTHING;
    }
    let lowered = tat.saturating_sub(give).max(t);
    if lowered >= tat {
        return Refund::NOTHING;
    }
    Refund::cells(tat - lowered, [lowered, p.recorded_rate(), 0])
}

impl Reference for Gcra {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        gcra(self, cells(state), now, cost)
    }
    fn refund(&self, state: &State, now: u64, charge: Charge) -> Refund {
        match state {
            State::Cells(c) => gcra_refund(self, *c, now, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The TAT the charge wrote. A GCRA refund needs no time: its state
    /// expires only after the TAT it wrote.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        match next {
            State::Cells([tat, _, _]) => Some((0, *tat)),
            _ => None,
        }
    }
    /// [TAT, interval]: the interval one GCRA records (a longer one would
    /// read a used-up state as nearly full).
    fn within_reach(&self, [_, rate, _]: [u64; 3]) -> bool {
        Gcra::is_recorded_rate(rate)
    }
}
