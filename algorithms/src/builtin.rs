//! What each built-in algorithm's file implements ([`Reference`]), and the
//! dispatch from a [`Limit`] to it, generated from core's one list of
//! built-ins (`tollgate_limiter::builtin_algorithms!`).

use tollgate_limiter::{Limit, State, Timestamp, Transition};

use crate::refund::{Charge, Refund};

/// A built-in algorithm's maths, implemented for its parameters in its
/// file (`token_bucket.rs`, …).
pub(crate) trait Reference {
    /// Decide a request of `cost` at `now` (see the crate's semantics). A
    /// state of another shape counts as none (it can only come from
    /// another algorithm under the same key).
    fn decide(&self, state: Option<&State>, now: u64, cost: u64) -> Transition;
    /// What `charge` still owes at `state` (see [`refund`](crate::refund::refund)).
    fn refund(&self, state: &State, now: u64, charge: Charge) -> Refund;
    /// The `(at, mark)` of the charge that wrote `next` (see [`Charge`]).
    fn charge_marks(&self, next: &State) -> Option<(u64, u64)>;
    /// `state` after an operator gives `units` back: the refund of a charge
    /// that never ages; `None` when nothing changes. By default a charge
    /// whose mark is ever ahead (what GCRA and the token bucket need; a
    /// window says which window it gives back from).
    fn reward(&self, state: &State, now: u64, units: u64) -> Option<State> {
        let charge = Charge {
            cost: units,
            at: 0,
            mark: FAR,
        };
        self.refund(state, now, charge).next
    }
    /// Whether counter `cells` read from a store are ones this algorithm
    /// can take without overflowing (see [`within_reach`](crate::within_reach)).
    fn within_reach(&self, _cells: [u64; 3]) -> bool {
        true
    }
}

/// A counter's reward: the refund of a charge made where `state`'s last
/// charge was (the fixed window's current window, the calendar quota's
/// span), never aging.
pub(crate) fn reward_last_charge(
    algorithm: &impl Reference,
    state: &State,
    now: u64,
    units: u64,
) -> Option<State> {
    let (at, _) = algorithm.charge_marks(state)?;
    let charge = Charge {
        cost: units,
        at,
        mark: 0,
    };
    algorithm.refund(state, now, charge).next
}

/// A charge no refund rule can find too old: GCRA and the token bucket owe
/// it whole while their full-again instant is ahead of now.
const FAR: u64 = u64::MAX;

/// The dispatch, one function per [`Reference`] method (`None`: a custom
/// algorithm, which only decides).
macro_rules! dispatch {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident), )*) => {
        /// A custom algorithm decides for itself.
        #[inline]
        pub(crate) fn decide(limit: &Limit, state: Option<&State>, now: Timestamp, cost: u64) -> Transition {
            match limit {
                $( Limit::$variant(p) => p.decide(state, now.as_micros(), cost), )*
                Limit::Custom(c) => c.0.decide(state, now, cost),
            }
        }

        pub(crate) fn refund(limit: &Limit, state: &State, now: u64, charge: Charge) -> Option<Refund> {
            match limit {
                $( Limit::$variant(p) => Some(p.refund(state, now, charge)), )*
                Limit::Custom(_) => None,
            }
        }

        pub(crate) fn charge_marks(limit: &Limit, next: &State) -> Option<(u64, u64)> {
            match limit {
                $( Limit::$variant(p) => p.charge_marks(next), )*
                Limit::Custom(_) => None,
            }
        }

        pub(crate) fn within_reach(limit: &Limit, cells: [u64; 3]) -> bool {
            match limit {
                $( Limit::$variant(p) => p.within_reach(cells), )*
                Limit::Custom(_) => true,
            }
        }

        pub(crate) fn reward(limit: &Limit, state: &State, now: u64, units: u64) -> Option<Option<State>> {
            match limit {
                $( Limit::$variant(p) => Some(p.reward(state, now, units)), )*
                Limit::Custom(_) => None,
            }
        }
    };
}
tollgate_limiter::builtin_algorithms!(dispatch);

/// The cells of a counter state; `None` for no state or one of another
/// shape.
pub(crate) fn cells(state: Option<&State>) -> Option<[u64; 3]> {
    match state {
        Some(State::Cells(c)) => Some(*c),
        _ => None,
    }
}
