//! Refunds of reservations: what a charge still owes, per algorithm (each
//! algorithm's refund lives in its own file, beside it). The Rust
//! reference for the Redis store's `refund_<algorithm>` Lua functions.
//!
//! The Redis Cluster store decides the layers of one hash slot in one
//! script call, all-or-nothing. A request whose layers span several slots
//! *reserves* slot group by slot group; when a later group denies, the
//! groups already charged are given back with a refund. Between the charge
//! and the refund other requests may have been decided against the charged
//! state, so a refund cannot simply restore the old state. Each function
//! here gives back what is provably still owed and no more:
//!
//! - **token bucket**: `cost × period` scaled tokens, less any refill the
//!   bucket could have wasted by being full had the charge not happened;
//! - **GCRA**: moves the TAT back by `cost × interval`, less the part the
//!   effective time has already passed, never below the effective time;
//! - **fixed window**: decrements the count while the state is still in the
//!   charge's window;
//! - **sliding window counter**: decrements the current count in the
//!   charge's window, or the previous count in the next window;
//! - **sliding log**: removes up to `cost` entries equal to the charge's
//!   timestamp (those entries are interchangeable and age out together).
//!
//! A refund never restores more than the charge took, and never leaves the
//! state holding more than it would without the charge: it can under-admit
//! briefly (a refund skipped or shortened, a denial seen while the charge
//! was pending), never over-admit. A state whose time is before the
//! charge's was recreated since (the charged one expired): nothing is owed.
//!
//! The Redis script must give identical results for identical inputs; the
//! differential test in `backends/redis/tests/redis/refund.rs` checks it against
//! real Redis.

use tollgate_limiter::{Limit, State};

use crate::builtin;

/// What a reservation charged one layer, as the script reports it in
/// `reserve` mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The units charged.
    pub cost: u64,
    /// The effective time (µs) the charge was made at; token bucket: the
    /// remainder it wrote; GCRA: 0 (unused).
    pub at: u64,
    /// Token bucket: when full again, as the charge wrote it; GCRA: the
    /// TAT it wrote; other algorithms: 0.
    pub mark: u64,
}

impl Charge {
    /// The charge of an admitted decision of `cost` under `limit` that wrote
    /// `next` (the reference for the script's `reserve` reply).
    pub fn of(limit: &Limit, next: &State, cost: u64) -> Option<Charge> {
        let (at, mark) = builtin::charge_marks(limit, next)?;
        Some(Charge { cost, at, mark })
    }
}

/// The result of a refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// What was given back: scaled tokens (token bucket), µs of TAT
    /// (GCRA), counts (windows), log entries (sliding log); 0 for nothing.
    pub given: u64,
    /// The state to store (keeping the stored expiry), or `None` to leave
    /// the state as it is.
    pub next: Option<State>,
}

impl Refund {
    pub(crate) const NOTHING: Refund = Refund {
        given: 0,
        next: None,
    };

    pub(crate) fn cells(given: u64, cells: [u64; 3]) -> Refund {
        Refund {
            given,
            next: Some(State::Cells(cells)),
        }
    }

    /// A counter gives back at most its `count` of `cost`; `cells` is its
    /// state from the count left.
    pub(crate) fn from_count(count: u64, cost: u64, cells: impl FnOnce(u64) -> [u64; 3]) -> Refund {
        let give = cost.min(count);
        if give == 0 {
            return Refund::NOTHING;
        }
        Refund::cells(give, cells(count - give))
    }
}

/// Refund `charge` from `state` at `now` (µs) under `limit`.
///
/// `None` or a state of another shape owes nothing. Custom algorithms have
/// no refund (the Redis stores do not run them).
pub fn refund(limit: &Limit, state: Option<&State>, now: u64, charge: Charge) -> Refund {
    state
        .and_then(|state| builtin::refund(limit, state, now, charge))
        .unwrap_or(Refund::NOTHING)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use tollgate_limiter::Timestamp;

    use super::*;

    const T0: u64 = 1_780_000_000_000_000;

    fn charge(limit: &Limit, state: Option<&State>, now: u64, cost: u64) -> (State, Charge) {
        let t = crate::decide(limit, state, Timestamp::from_micros(now), cost);
        assert!(t.verdict.allowed);
        let next = t.next.expect("admitted").state;
        let c = Charge::of(limit, &next, cost).expect("a built-in algorithm");
        (next, c)
    }

    fn remaining(limit: &Limit, state: Option<&State>, now: u64) -> u64 {
        let t = crate::decide(limit, state, Timestamp::from_micros(now), 1);
        if t.verdict.allowed {
            t.verdict.remaining + 1
        } else {
            t.verdict.remaining
        }
    }

    fn every_algorithm() -> Vec<Limit> {
        let s = Duration::from_secs(1);
        vec![
            Limit::token_bucket(10, 10, s).unwrap(),
            Limit::gcra(10, s, 10).unwrap(),
            Limit::fixed_window(10, s).unwrap(),
            Limit::sliding_window(10, s).unwrap(),
            Limit::sliding_log(10, s).unwrap(),
        ]
    }

    /// Refunded at once, the state is as if the charge never happened.
    #[test]
    fn an_immediate_refund_restores_the_state_before_the_charge() {
        for limit in every_algorithm() {
            let name = limit.algorithm_name();
            let (before, _) = charge(&limit, None, T0, 3);
            let left = remaining(&limit, Some(&before), T0);
            let (after, c) = charge(&limit, Some(&before), T0, 2);
            assert_eq!(remaining(&limit, Some(&after), T0), left - 2, "{name}");
            let r = refund(&limit, Some(&after), T0, c);
            assert!(r.given > 0, "{name}");
            let restored = r.next.expect("a state");
            assert_eq!(remaining(&limit, Some(&restored), T0), left, "{name}");
        }
    }

    /// A bucket that refilled meanwhile is owed nothing: the charge was
    /// covered by refill that would otherwise have been wasted.
    #[test]
    fn a_bucket_full_again_owes_nothing() {
        let limit = Limit::token_bucket(10, 10, Duration::from_secs(1)).unwrap();
        let (charged, c) = charge(&limit, None, T0, 1);
        // 100 ms later the token is back; someone else takes 5.
        let (others, _) = charge(&limit, Some(&charged), T0 + 100_000, 5);
        let r = refund(&limit, Some(&others), T0 + 100_000, c);
        assert_eq!(r, Refund::NOTHING);
        // 50 ms later only half of it could have been wasted.
        let (others, _) = charge(&limit, Some(&charged), T0 + 50_000, 5);
        let r = refund(&limit, Some(&others), T0 + 50_000, c);
        assert_eq!(r.given, 500_000, "half a token, scaled by the period");
        assert!(
            remaining(&limit, r.next.as_ref(), T0 + 50_000) <= 5,
            "never above the uncharged history"
        );
    }

    #[test]
    fn windows_refund_only_in_the_charges_window() {
        let w = Limit::fixed_window(10, Duration::from_secs(1)).unwrap();
        let start = T0 - T0 % 1_000_000;
        let (charged, c) = charge(&w, None, start + 900_000, 2);
        let (later, _) = charge(&w, Some(&charged), start + 1_100_000, 1);
        assert_eq!(
            refund(&w, Some(&later), start + 1_100_000, c),
            Refund::NOTHING
        );

        let sw = Limit::sliding_window(10, Duration::from_secs(1)).unwrap();
        let (charged, c) = charge(&sw, None, start + 900_000, 2);
        let (later, _) = charge(&sw, Some(&charged), start + 1_100_000, 1);
        let r = refund(&sw, Some(&later), start + 1_100_000, c);
        assert_eq!(r.next, Some(State::Cells([1, 0, start + 1_100_000])));
        let (much_later, _) = charge(&sw, Some(&later), start + 2_100_000, 1);
        assert_eq!(
            refund(&sw, Some(&much_later), start + 2_100_000, c),
            Refund::NOTHING
        );
    }

    #[test]
    fn a_log_gives_back_only_the_charges_entries() {
        let log = Limit::sliding_log(10, Duration::from_secs(1)).unwrap();
        let (first, _) = charge(&log, None, T0, 2);
        let (charged, c) = charge(&log, Some(&first), T0 + 10, 3);
        let (others, _) = charge(&log, Some(&charged), T0 + 20, 1);
        let r = refund(&log, Some(&others), T0 + 20, c);
        assert_eq!(r.given, 3);
        assert_eq!(
            r.next,
            Some(State::Log(VecDeque::from(vec![T0, T0, T0 + 20])))
        );
        let none = refund(&log, r.next.as_ref(), T0 + 20, c);
        assert_eq!(none, Refund::NOTHING, "already given back");
    }

    #[test]
    fn gcra_never_goes_below_the_effective_time() {
        let g = Limit::gcra(10, Duration::from_secs(1), 10).unwrap();
        let (charged, c) = charge(&g, None, T0, 4);
        // 300 ms later 3 of the 4 intervals have passed anyway.
        let r = refund(&g, Some(&charged), T0 + 300_000, c);
        assert_eq!(r.given, 100_000);
        assert_eq!(r.next, Some(State::Cells([T0 + 300_000, 0, 0])));
    }

    /// A charged state that expired and was made anew owes nothing: the
    /// state expires only when the algorithm says it is as good as new.
    #[test]
    fn a_state_recreated_after_expiry_owes_nothing() {
        for limit in every_algorithm() {
            let t = crate::decide(&limit, None, Timestamp::from_micros(T0), 2);
            let next = t.next.expect("admitted");
            let c = Charge::of(&limit, &next.state, 2).expect("built-in");
            let expired = T0 + next.ttl.as_micros() as u64;
            let (recreated, _) = charge(&limit, None, expired, 1);
            assert_eq!(
                refund(&limit, Some(&recreated), expired, c),
                Refund::NOTHING,
                "{}",
                limit.algorithm_name()
            );
        }
    }

    /// Algorithms that keep their state's time also refuse a state older
    /// than the charge (GCRA and the token bucket keep no time: see their
    /// refunds).
    #[test]
    fn a_state_older_than_the_charge_owes_nothing() {
        for limit in every_algorithm() {
            if matches!(limit, Limit::Gcra(_) | Limit::TokenBucket(_)) {
                continue;
            }
            let (_, c) = charge(&limit, None, T0 + 1_000, 1);
            let (recreated, _) = charge(&limit, None, T0, 1);
            assert_eq!(
                refund(&limit, Some(&recreated), T0 + 1_000, c),
                Refund::NOTHING,
                "{}",
                limit.algorithm_name()
            );
        }
    }
}
