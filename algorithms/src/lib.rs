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
mod fixed_window;
mod gcra;
mod layered;
pub mod refund;
mod sliding_log;
mod sliding_window;
mod token_bucket;

use std::time::Duration;

use tollgate_limiter::{Limit, State, Timestamp, Transition};

pub use adjust::{adjust, adjust_layers, blocked, Adjusted};
pub use fixed_window::{fixed_window, fixed_window_refund};
pub use gcra::{gcra, gcra_refund};
pub use layered::{decide_layers, Layered, Writes, WritesIntoIter};
pub use sliding_log::{sliding_log, sliding_log_refund};
pub use sliding_window::{sliding_window, sliding_window_refund};
pub use token_bucket::{token_bucket, token_bucket_refund};

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
pub fn decide(limit: &Limit, state: Option<&State>, now: Timestamp, cost: u64) -> Transition {
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
    match limit {
        Limit::TokenBucket(p) => token_bucket(p, cells(state), now.as_micros(), cost),
        Limit::Gcra(p) => gcra(p, cells(state), now.as_micros(), cost),
        Limit::FixedWindow(p) => fixed_window(p, cells(state), now.as_micros(), cost),
        Limit::SlidingWindow(p) => sliding_window(p, cells(state), now.as_micros(), cost),
        Limit::SlidingLog(p) => sliding_log(p, log(state), now.as_micros(), cost),
        Limit::Custom(c) => c.0.decide(state, now, cost),
    }
}

/// The cells of a counter state; a state of the wrong shape counts as none
/// (it can only come from another algorithm under the same key).
fn cells(state: Option<&State>) -> Option<[u64; 3]> {
    match state {
        Some(State::Cells(c)) => Some(*c),
        _ => None,
    }
}

fn log(state: Option<&State>) -> Option<&std::collections::VecDeque<u64>> {
    match state {
        Some(State::Log(entries)) => Some(entries),
        _ => None,
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
