//! Token bucket, kept exactly: tokens scaled by the period in microseconds.

use tollgate_limiter::{State, Stored, TokenBucket, Transition, Verdict};

use crate::refund::{Charge, Refund};
use crate::{after, ttl_until};

/// Token bucket over the state `[scaled tokens, last µs, 0]`.
///
/// A new key starts full. Tokens are scaled by the period `P` (in µs), so a
/// refill of `R` per period adds exactly `R` scaled tokens per microsecond
/// and any partial interval refills the exact fraction.
pub fn token_bucket(p: &TokenBucket, state: Option<[u64; 3]>, now: u64, cost: u64) -> Transition {
    let now = crate::bounded(now);
    let (period, refill) = (p.period_us(), p.refill());
    let full = p.capacity() * period;
    let (stored, last) = match state {
        Some([level, last, _]) => (level.min(full), last),
        None => (full, now),
    };
    let t = now.max(last);
    // Refill since `last`, capped at full; the elapsed time is capped first so
    // the product cannot overflow after a long idle.
    let to_full = (full - stored).div_ceil(refill);
    let elapsed = t - last;
    let level = if elapsed >= to_full {
        full
    } else {
        stored + elapsed * refill
    };
    let need = cost * period;
    if level >= need {
        let left = level - need;
        let reset_at = t.saturating_add((full - left).div_ceil(refill));
        Transition {
            verdict: Verdict {
                allowed: true,
                limit: p.capacity(),
                remaining: left / period,
                reset_after: after(reset_at, now),
                retry_after: None,
            },
            next: Some(Stored {
                state: State::Cells([left, t, 0]),
                ttl: ttl_until(reset_at, now),
            }),
        }
    } else {
        let retry_at = t.saturating_add((need - level).div_ceil(refill));
        let reset_at = t.saturating_add((full - level).div_ceil(refill));
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

/// Without the charge the bucket held `cost × period` more at `at`. It can
/// only have wasted refill (by being full) once
/// `(full − left − cost × period) / refill` had passed, so after `elapsed`
/// it still holds at least `min(cost × period, full − left − elapsed ×
/// refill)` more than the charged state.
pub fn token_bucket_refund(
    p: &TokenBucket,
    [level, last, _]: [u64; 3],
    now: u64,
    c: Charge,
) -> Refund {
    let (period, refill) = (p.period_us(), p.refill());
    let full = p.capacity() * period;
    let stored = level.min(full);
    if last < c.at || c.mark >= full {
        return Refund::NOTHING;
    }
    let elapsed = now.max(last) - c.at;
    let room = full - c.mark;
    // Compared first, so the product cannot overflow.
    if elapsed >= room.div_ceil(refill) {
        return Refund::NOTHING;
    }
    let give = (c.cost * period)
        .min(room - elapsed * refill)
        .min(full - stored);
    if give == 0 {
        return Refund::NOTHING;
    }
    Refund::cells(give, [stored + give, last, 0])
}
