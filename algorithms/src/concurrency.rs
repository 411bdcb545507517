//! Concurrency limit: a sliding log of holders, one lease long.

use std::collections::VecDeque;

use tollgate_limiter::{Concurrency, Limit, State, Stored, Transition};

use crate::builtin::Reference;
use crate::refund::{Charge, Refund};
use crate::sliding_log::{log_charge_marks, log_reward, sliding_log, sliding_log_refund};
use crate::ttl_until;

/// A concurrency limit decides as a sliding log whose window is the lease:
/// each unit held is an entry at its holder's last renewal, counted while
/// younger than the lease. A request of `cost` passes when the units held
/// plus `cost` stay within the limit, and then adds `cost` entries at
/// `t = max(now, newest)` (the log stays sorted). When full, `retry_after`
/// is when enough of the current holders' leases run out: when places
/// come free if those holders neither renew nor release (a release frees
/// one sooner, a renewal keeps one longer).
pub fn concurrency(p: &Concurrency, state: Option<&VecDeque<u64>>, now: u64, cost: u64) -> Transition {
    sliding_log(p.as_window(), state, now, cost)
}

/// A release gives the holder's `cost` entries at `at` back, as a sliding
/// log's refund does: entries at one time are interchangeable and age out
/// together, so removing up to `cost` of them removes exactly the
/// holder's, or nothing once they aged out.
pub fn concurrency_refund(entries: &VecDeque<u64>, c: Charge) -> Refund {
    sliding_log_refund(entries, c)
}

/// What a renewal made of a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    /// The time the hold's entries were moved to; 0 when the hold was
    /// lost (its entries aged out, were released, or the key was reset or
    /// blocked): the holder no longer counts.
    pub at: u64,
    /// The state to store, with its TTL; `None` to write nothing.
    pub next: Option<Stored>,
}

impl Renewal {
    const LOST: Renewal = Renewal { at: 0, next: None };
}

/// Renew the hold of `cost` units charged at `at` under `limit` at `now`:
/// when all of its entries are still live, they move to
/// `t = max(now, newest)` and count for another lease; otherwise the hold
/// is lost and nothing is written (what is left of it ages out). A limit
/// that is not a concurrency limit holds nothing: every renewal is lost.
///
/// ```
/// use std::time::Duration;
/// use tollgate_algorithms::{decide, renew};
/// use tollgate_algorithms::refund::Charge;
/// use tollgate_limiter::{Limit, Timestamp};
///
/// let limit = Limit::concurrency(1, Duration::from_secs(10)).unwrap();
/// let t0 = 1_780_000_000_000_000;
/// let held = decide(&limit, None, Timestamp::from_micros(t0), 1).next.unwrap().state;
/// let hold = Charge { cost: 1, at: t0, mark: 0 };
/// // Renewed within the lease: moved to now.
/// let renewed = renew(&limit, Some(&held), t0 + 9_000_000, hold);
/// assert_eq!(renewed.at, t0 + 9_000_000);
/// // After the lease, the place was forgotten.
/// assert_eq!(renew(&limit, Some(&held), t0 + 10_000_000, hold).at, 0);
/// ```
pub fn renew(limit: &Limit, state: Option<&State>, now: u64, hold: Charge) -> Renewal {
    let (Limit::Concurrency(p), Some(State::Log(entries))) = (limit, state) else {
        return Renewal::LOST;
    };
    let now = crate::bounded(now);
    let Some(&newest) = entries.back() else {
        return Renewal::LOST;
    };
    let t = now.max(newest);
    let held = entries.iter().filter(|&&e| e == hold.at).count() as u64;
    if hold.at.saturating_add(p.lease_us()) <= t || held < hold.cost || hold.cost == 0 {
        return Renewal::LOST;
    }
    let mut next = sliding_log_refund(entries, hold)
        .next
        .and_then(|s| match s {
            State::Log(rest) => Some(rest),
            _ => None,
        })
        .unwrap_or_default();
    next.extend(std::iter::repeat_n(t, hold.cost as usize));
    Renewal {
        at: t,
        next: Some(Stored {
            state: State::Log(next),
            ttl: ttl_until(t.saturating_add(p.lease_us()), now),
        }),
    }
}

impl Reference for Concurrency {
    #[inline]
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition {
        let log = match state {
            Some(State::Log(entries)) => Some(entries),
            _ => None,
        };
        concurrency(self, log, now, cost)
    }
    fn refund(&self, state: &State, _now: u64, charge: Charge) -> Refund {
        match state {
            State::Log(entries) => concurrency_refund(entries, charge),
            _ => Refund::NOTHING,
        }
    }
    /// The time of the charge's entries: the hold a release or renewal
    /// names.
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)> {
        log_charge_marks(next)
    }
    /// The newest `units` entries go (an operator's reward frees places).
    fn reward(&self, state: &State, _now: u64, units: u64) -> Option<State> {
        log_reward(state, units)
    }
}
