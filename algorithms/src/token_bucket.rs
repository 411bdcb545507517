//! Token bucket, kept exactly: tokens scaled by the period in microseconds.

use tollgate_limiter::{State, Stored, TokenBucket, Transition, Verdict, MAX_EXACT};

use crate::builtin::{cells, Reference};
use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// Token bucket over the state `[full at µs, remainder, rate]` (the rate
/// it was written at when the layer keeps units across a change of plan,
/// else 0: see [`rebased`]).
///
/// A new key starts full. Tokens are scaled by the period `P` (in µs), so a
/// refill of `R` per period adds exactly `R` scaled tokens per microsecond
/// and any partial interval refills the exact fraction.
///
/// The state is when the bucket is full again, `A` (rounded up to the
/// microsecond), and what rounding up added, `r` (`0 ≤ r < R`): at `t`
/// before `A` the bucket holds `full + r − (A − t) × R` scaled tokens, from
/// `A` on it is full. Nothing else is kept — no "last seen" time — so the
/// state is as small as GCRA's (one integer when `r` is 0, which it always
/// is when `R` divides `P`). Against a clock that steps back it behaves as
/// GCRA does: every write leaves `A` after the time it was made at, and a
/// charge moves `A` by the same amount whatever the clock read, so it never
/// refills twice; until the clock catches up it admits less, never more.
pub fn token_bucket(p: &TokenBucket, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (period, refill) = (p.period_us(), p.refill());
    let full = p.capacity() * period;
    let read = state.and_then(|s| rebased(p, s, now));
    let level = level_at(full, refill, read, now);
    let need = cost * period;
    if level >= need {
        let left = level - need;
        // left < full (need is at least one period), so the bucket is full
        // again after `until_full` ≥ 1 µs.
        let (until_full, remainder) = refill_time(full - left, refill);
        let full_at = now.saturating_add(until_full);
        Transition {
            verdict: Verdict {
                allowed: true,
                limit: p.capacity(),
                remaining: left / period,
                reset_after: after(full_at, now),
                retry_after: None,
            },
            next: Some(Stored {
                state: State::Cells([full_at, remainder, p.recorded_rate()]),
                ttl: ttl_until(full_at, now),
            }),
        }
    } else {
        let (retry_at, reset_at) = match (state, read) {
            (Some(old), _) if at_another_rate(p, old, now) => old_rate_waits(p, old, cost),
            (_, Some([full_at, remainder, _])) if full_at > now => {
                own_rate_waits(full, refill, need, full_at, remainder)
            }
            _ => (
                now.saturating_add((need - level).div_ceil(refill)),
                now.saturating_add((full - level).div_ceil(refill)),
            ),
        };
        Transition {
            verdict: Verdict {
                allowed: false,
                limit: p.capacity(),
                remaining: level / period,
                reset_after: after(reset_at, now),
                retry_after: Some(after(retry_at, now)),
            },
            next: None,
        }
    }
}

/// A state as a layer with parameters `p` reads it at `now` (`None`:
/// full). A layer that keeps units ([`Limit::keeping_units`]) reads a
/// state written at another rate (its plan changed) as the units it had
/// used (whole units, a partly refilled one counted as used; at most the
/// capacity), and a state that records no rate (written before the policy
/// had plans) at its own rate without the remainder, whose scale it does
/// not know (at most a microsecond's refill less). Any other state is read
/// as it is.
///
/// [`Limit::keeping_units`]: tollgate_limiter::Limit::keeping_units
pub fn rebased(p: &TokenBucket, state: [u64; 3], now: u64) -> Option<[u64; 3]> {
    let [full_at, remainder, rate] = state;
    if !p.keeps_units() || rate == p.recorded_rate() {
        return Some(state);
    }
    if rate == 0 {
        return Some([full_at, 0, 0]);
    }
    if full_at <= now {
        return None;
    }
    let used = units_used(full_at - now, remainder, rate).min(p.capacity());
    let (until_full, remainder) = refill_time(used * p.period_us(), p.refill());
    Some([now + until_full, remainder, p.recorded_rate()])
}

/// Whether [`rebased`] reads `state` as the units used at another rate
/// (a layer that keeps units, another rate recorded, not yet full).
fn at_another_rate(p: &TokenBucket, [full_at, _, rate]: [u64; 3], now: u64) -> bool {
    p.keeps_units() && rate != 0 && rate != p.recorded_rate() && full_at > now
}

/// When a denied request of `cost` is admitted, and when the bucket is
/// full, for a state written at another rate (its plan changed): it
/// refills at that rate until a write moves it to this one, and a denial
/// writes nothing. `u` µs before it is full it has used ⌈(u × R − r) ÷ P⌉
/// units at that rate, so it admits once `u × R ≤ (capacity − cost) × P
/// + r`, and is full once `u × R ≤ r`.
fn old_rate_waits(p: &TokenBucket, [full_at, remainder, rate]: [u64; 3], cost: u64) -> (u64, u64) {
    let (refill, period) = TokenBucket::rate_of_record(rate);
    let room = p
        .capacity()
        .saturating_sub(cost)
        .saturating_mul(period)
        .saturating_add(remainder);
    waits(full_at, remainder, room, refill)
}

/// The same at this layer's own rate, from the state as it is read:
/// `u` µs before full the level is `full + r − u × R`, so the request is
/// admitted once `u × R ≤ full + r − need`. Unlike the level, not capped
/// at empty: a state written under a larger capacity is further below.
fn own_rate_waits(full: u64, refill: u64, need: u64, full_at: u64, remainder: u64) -> (u64, u64) {
    let room = (full + remainder).saturating_sub(need);
    waits(full_at, remainder, room, refill)
}

/// When a bucket full at `full_at` (with `remainder`), refilling `refill`
/// scaled tokens a µs, has `room` scaled tokens to spare, and when it is
/// full: the instants `u` µs before `full_at` where `u × refill` is at most
/// `room`, and at most `remainder`.
fn waits(full_at: u64, remainder: u64, room: u64, refill: u64) -> (u64, u64) {
    (
        full_at.saturating_sub(room / refill),
        full_at.saturating_sub(remainder / refill),
    )
}

/// The units a bucket full again in `until_full` µs (with `remainder`)
/// has used at the rate `rate` records, rounded up: `⌈(until_full × refill
/// − remainder) ÷ period⌉`, computed by whole periods first so that every
/// product stays below 2^53 (the Lua code's exact integers).
fn units_used(until_full: u64, remainder: u64, rate: u64) -> u64 {
    let (refill, period) = TokenBucket::rate_of_record(rate);
    let (whole, part) = (until_full / period, until_full % period * refill);
    let base = whole.saturating_mul(refill);
    if part >= remainder {
        base.saturating_add((part - remainder).div_ceil(period))
    } else {
        base.saturating_sub((remainder - part) / period)
    }
}

/// The scaled level at `now` of a bucket of `full` refilling `refill` per
/// µs, in `state` (`None`: full).
fn level_at(full: u64, refill: u64, state: Option<[u64; 3]>, now: u64) -> u64 {
    let Some([full_at, remainder, _]) = state else {
        return full;
    };
    if now >= full_at {
        return full;
    }
    let until_full = full_at - now;
    // Compared first, so the product cannot overflow: this far from full
    // the bucket is empty (only a state written under other parameters).
    if until_full >= (full + remainder).div_ceil(refill) {
        return 0;
    }
    let deficit = (until_full * refill).saturating_sub(remainder);
    full - deficit.min(full)
}

/// How long a bucket `deficit` scaled tokens short of full takes to refill
/// (whole µs, rounded up), and what the rounding adds.
fn refill_time(deficit: u64, refill: u64) -> (u64, u64) {
    let until_full = deficit.div_ceil(refill);
    (until_full, until_full * refill - deficit)
}

/// Without the charge the bucket would be full `cost × period` scaled
/// tokens sooner. Counted in scaled tokens since the epoch (`A × R − r`,
/// GCRA's TAT in finer units), the charge moved that instant `cost ×
/// period` later, to the mark it wrote (`A = c.mark`, `r = c.at`); without
/// it, the instant could have been raised to now since (the bucket full,
/// wasting refill), so only what is still ahead of now is owed, and the
/// bucket never goes above full. A state recreated since the charge owes
/// nothing without a check: it expires only once full, when the mark is no
/// longer ahead.
pub fn token_bucket_refund(p: &TokenBucket, state: [u64; 3], now: u64, c: Charge) -> Refund {
    let (period, refill) = (p.period_us(), p.refill());
    let full = p.capacity() * period;
    let (mark_at, mark_remainder) = (c.mark, c.at);
    if mark_at <= now {
        return Refund::NOTHING;
    }
    // Ahead of now by (mark_at − now) × R − r scaled tokens; compared first
    // so the product cannot overflow (a charge is at most `full` ahead).
    let ahead_us = mark_at - now;
    let owed_cap = c.cost * period;
    let ahead = if ahead_us > (full + mark_remainder).div_ceil(refill) {
        owed_cap
    } else {
        (ahead_us * refill).saturating_sub(mark_remainder)
    };
    let level = level_at(full, refill, rebased(p, state, now), now);
    let give = owed_cap.min(ahead).min(full - level);
    if give == 0 {
        return Refund::NOTHING;
    }
    let left = level + give;
    let next = if left == full {
        [now, 0, p.recorded_rate()]
    } else {
        let (until_full, remainder) = refill_time(full - left, refill);
        [now + until_full, remainder, p.recorded_rate()]
    };
    Refund::cells(give, next)
}

impl Reference for TokenBucket {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        token_bucket(self, cells(state), now, cost)
    }
    fn refund(&self, state: &State, now: u64, charge: Charge) -> Refund {
        match state {
            State::Cells(c) => token_bucket_refund(self, *c, now, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The remainder and the full-again instant the charge wrote.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        match next {
            State::Cells([full_at, remainder, _]) => Some((*remainder, *full_at)),
            _ => None,
        }
    }
    /// [full at, remainder, rate]: the remainder within exact integers,
    /// the rate one a bucket records (a zero period would divide by zero).
    fn within_reach(&self, [_, remainder, rate]: [u64; 3]) -> bool {
        remainder < MAX_EXACT && TokenBucket::is_recorded_rate(rate)
    }
}
