//! The algorithm contract: a pure state transition.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use crate::time::Timestamp;

/// What a store keeps for one key between decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// Up to three integers (counters and timestamps); unused cells are 0.
    Cells([u64; 3]),
    /// A non-decreasing list of timestamps in microseconds (sliding log).
    Log(VecDeque<u64>),
    /// Denied until this instant (µs since the Unix epoch), whatever the
    /// algorithm: an operator's block ([`Adjustment::Block`](crate::Adjustment::Block)).
    /// It replaces the layer's state under the layer's own key, so it is
    /// never read as data of another kind; from the instant on the layer
    /// starts as new. Stores decide it before an algorithm sees a state, so
    /// a custom [`Algorithm`] never receives one.
    Blocked(u64),
}

/// One layer's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether this layer admits the request.
    pub allowed: bool,
    /// The policy's capacity or window limit.
    pub limit: u64,
    /// Units still available right after this decision.
    pub remaining: u64,
    /// Time until this layer is back to its full, untouched state.
    pub reset_after: Duration,
    /// When denied: the earliest time a retry of the same cost can be admitted.
    pub retry_after: Option<Duration>,
}

impl Verdict {
    /// This admitting verdict as reported when another layer denies the
    /// request: nothing was charged, so `cost` is added back to `remaining`
    /// (capped at the limit). `reset_after` stays that of the charged state,
    /// an upper bound. Every store reports layered denials this way.
    pub fn uncharged(self, cost: u64) -> Verdict {
        if !self.allowed {
            return self;
        }
        Verdict {
            remaining: (self.remaining + cost).min(self.limit),
            ..self
        }
    }
}

/// The outcome of running an algorithm on a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The answer for this layer.
    pub verdict: Verdict,
    /// The state to store when the request is admitted (with all other
    /// layers); `None` when nothing needs writing (a denial consumes nothing).
    pub next: Option<Stored>,
}

/// A state to store and how long it must live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The new state.
    pub state: State,
    /// Time until the state is equivalent to no state at all (full bucket,
    /// empty window). Always positive and at most
    /// [`MAX_RECOVERY`](crate::MAX_RECOVERY) plus clock skew. A store may
    /// add its own clock granularity (Redis adds 1 ms: it counts relative
    /// TTLs from a millisecond-truncated clock), never subtract.
    pub ttl: Duration,
}

/// A rate-limiting algorithm: `(state, now, cost) -> (verdict, next state, ttl)`.
///
/// Implementations are pure: no I/O, no clock reads; the store supplies `now`
/// and keeps the state. The built-ins do not implement it: they are
/// [`Limit`](crate::Limit) variants whose reference code is in
/// `tollgate-algorithms`. A user algorithm is wrapped with [`Limit::custom`](crate::Limit::custom) and runs
/// on every store with a generic path (the in-process store, custom stores).
pub trait Algorithm: Send + Sync + Debug {
    /// A short, stable name for logs and metrics.
    fn name(&self) -> &'static str;

    /// The most one request may cost.
    fn capacity(&self) -> u64;

    /// Decide one request of `cost` (1 ≤ cost ≤ capacity) at `now` against
    /// `state` (`None`: the key has no stored state).
    fn decide(&self, state: Option<&State>, now: Timestamp, cost: u64) -> Transition;
}
