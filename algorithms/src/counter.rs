//! What the fixed window and the calendar quota share: a count of units
//! against a limit until a known end.

use tollgate_limiter::{State, Stored, Transition, Verdict};

use crate::{after, ttl_until};

/// A request of `cost` at `now` against `count` of `limit` units used,
/// counted until `end` (an empty count reports its reset at `empty_at`):
/// admitted when the count after fits, and then stored as `next` makes it
/// from the count after, until `end`.
pub(crate) fn count(
    limit: u64,
    count: u64,
    cost: u64,
    now: u64,
    (empty_at, end): (u64, u64),
    next: impl FnOnce(u64) -> State,
) -> Transition {
    let allowed = count.saturating_add(cost) <= limit;
    let count_after = if allowed {
        count.saturating_add(cost)
    } else {
        count
    };
    Transition {
        verdict: Verdict {
            allowed,
            limit,
            remaining: limit.saturating_sub(count_after),
            reset_after: if count_after == 0 {
                after(empty_at, now)
            } else {
                after(end, now)
            },
            retry_after: (!allowed).then(|| after(end, now)),
        },
        next: allowed.then(|| Stored {
            state: next(count_after),
            ttl: ttl_until(end, now),
        }),
    }
}
