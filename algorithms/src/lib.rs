//! The reference implementations of Tollgate's built-in algorithms.
//!
//! Each is a pure function of `(parameters, state, now, cost)` in exact
//! integer arithmetic (microseconds, scaled counts below 2^53), so the Lua
//! scripts of the Redis store reproduce them bit for bit. The semantics, for
//! every algorithm:
//!
//! - the effective time is `max(now, last stored time)`: a clock that steps
//!   back never refills twice and never takes anything away;
//! - a denied request consumes nothing and writes nothing;
//! - a sequential run against a limit of N admits exactly N;
//! - `retry_after` is the exact earliest instant a retry of the same cost
//!   passes, `reset_after` the instant the state is back to full, both
//!   measured from the caller's `now`;
//! - every write carries a TTL: the time until the state equals no state.
//!
//! [`decide`] dispatches a [`Limit`] to its algorithm.

mod adjust;
mod builtin;
mod counter;
mod holds;
mod in_place;
mod layered;
pub mod refund;

/// Each built-in algorithm's file (`<name>.rs`: its `<name>` and
/// `<name>_refund`), from core's list of built-ins.
macro_rules! algorithm_modules {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident), )*) => {
        $(
            mod $module;
            pub use $module::*;
        )*
    };
}
tollgate_limiter::builtin_algorithms!(algorithm_modules);

use std::time::Duration;

use tollgate_limiter::{Limit, State, Timestamp, Transition};

pub use adjust::{adjust, adjust_layers, blocked, Adjusted};
pub use holds::{hold_of, holds_of, release, release_layers, renew_layers};
pub use in_place::{in_place, InPlace};
pub use layered::{decide_layers, LayerLimit, Layered, Writes, WritesIntoIter};

/// Decide one request under `limit`: dispatch to the built-in algorithm, or
/// to the user's [`Algorithm`](tollgate_limiter::Algorithm) for custom limits.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, Timestamp};
///
/// let limit = Limit::fixed_window(1, Duration::from_secs(1)).unwrap();
/// let now = Timestamp::from_micros(10_000_000);
/// let first = tollgate_algorithms::decide(&limit, None, now, 1);
/// assert!(first.verdict.allowed);
/// let state = first.next.unwrap().state;
/// let second = tollgate_algorithms::decide(&limit, Some(&state), now, 1);
/// assert!(!second.verdict.allowed);
/// assert_eq!(second.verdict.retry_after, Some(Duration::from_secs(1)));
/// ```
///
/// A cost of 0 or above the limit's capacity (which
/// [`Policy::check_cost`](tollgate_limiter::Policy::check_cost) refuses
/// before any store) is denied, never to be admitted (`retry_after:
/// None`), and writes nothing.
pub fn decide(limit: &Limit, state: Option<&State>, now: Timestamp, cost: u64) -> Transition {
    if cost == 0 || cost > limit.capacity() {
        return never_admitted(limit);
    }
    // A block denies until its end; from then on the layer starts new.
    let state = match state {
        Some(State::Blocked(until)) if *until > now.as_micros() => {
            return Transition {
                verdict: blocked(limit, *until, now.as_micros()),
                next: None,
            }
        }
        Some(State::Blocked(_)) => None,
        other => other,
    };
    builtin::decide(limit, state, now, cost)
}

/// How long a store keeps the state a denying layer read, at least: until
/// the verdict's reset, when the state is as good as new under the policy
/// that denied (`None` for an admitting verdict, which writes its state
/// with its own TTL).
///
/// Why: a denial writes nothing, so the state keeps the TTL of its last
/// write, which the policy of that write set. A policy changed since (a
/// reload, a plan: a longer window) may count the state for longer: a
/// sliding log of 2 a second moved to 2 a minute denies for 59 seconds,
/// and its key, left to expire after one, would have admitted two more.
/// Under an unchanged policy the state already lives that long: nothing
/// to write.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, Timestamp};
/// let second = Limit::sliding_log(2, Duration::from_secs(1)).unwrap();
/// let minute = Limit::sliding_log(2, Duration::from_secs(60)).unwrap();
/// let now = Timestamp::from_micros(1_780_000_000_000_000);
/// let state = tollgate_algorithms::decide(&second, None, now, 2).next.unwrap().state;
/// let denied = tollgate_algorithms::decide(&minute, Some(&state), now, 1).verdict;
/// assert_eq!(tollgate_algorithms::kept_by_denial(&denied), Some(Duration::from_secs(60)));
/// ```
pub fn kept_by_denial(verdict: &tollgate_limiter::Verdict) -> Option<std::time::Duration> {
    (!verdict.allowed).then_some(verdict.reset_after)
}

/// The answer to a cost no state can ever admit.
#[cold]
fn never_admitted(limit: &Limit) -> Transition {
    Transition {
        verdict: tollgate_limiter::Verdict {
            allowed: false,
            limit: limit.capacity(),
            remaining: 0,
            reset_after: std::time::Duration::ZERO,
            retry_after: None,
        },
        next: None,
    }
}

/// Whether the reference can take the counter `state` read from a store
/// under `limit` without overflowing. Tollgate's own states stay far
/// inside these bounds (a count below 2^53): a number beyond came from
/// someone else, who put
/// a plausible time beside it, and a store treats it as data Tollgate did
/// not write. Any other state is within reach.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, State};
/// let limit = Limit::fixed_window(10, Duration::from_secs(1)).unwrap();
/// let t = 1_780_000_000_000_000;
/// assert!(tollgate_algorithms::within_reach(&limit, &State::Cells([3, t, 0])));
/// assert!(!tollgate_algorithms::within_reach(&limit, &State::Cells([u64::MAX, t, 0])));
/// ```
pub fn within_reach(limit: &Limit, state: &State) -> bool {
    match state {
        State::Cells(cells) => builtin::within_reach(limit, *cells),
        _ => true,
    }
}

/// `now`, held at [`Timestamp::LATEST`] (2100): stores refuse later times,
/// and below it no sum of a time and a window or interval comes near
/// `u64::MAX`, so a wrong clock cannot wrap a state into a fresh one. Every
/// other sum saturates.
fn bounded(now: u64) -> u64 {
    now.min(Timestamp::LATEST.as_micros())
}

/// `at - now` as a duration (0 when `at` is not after `now`).
fn after(at: u64, now: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(now))
}

/// A state's TTL: until `reset_at`, at least one millisecond (stores keep
/// TTLs in milliseconds, so the TTL is also rounded up to one).
fn ttl_until(reset_at: u64, now: u64) -> Duration {
    Duration::from_millis(reset_at.saturating_sub(now).div_ceil(1000).max(1))
}
