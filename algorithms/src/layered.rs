//! Several layers judged together, all or nothing: what a store answers
//! and what it writes.

use std::ops::{Deref, DerefMut};

use smallvec::SmallVec;
use tollgate_limiter::{LayerRequest, Limit, State, Stored, Timestamp, Transition, Verdicts};

use crate::decide;

/// One layer as the deciding needs it: its limit and its cost. A store's
/// [`LayerRequest`] is one; so is a `(&Limit, cost)` pair, what the native
/// Redis module reads from a call.
pub trait LayerLimit {
    /// The layer's limit.
    fn limit(&self) -> &Limit;
    /// What the request costs it (for an adjustment: its units).
    fn cost(&self) -> u64;
}

impl LayerLimit for LayerRequest<'_> {
    fn limit(&self) -> &Limit {
        self.policy.limit()
    }
    fn cost(&self) -> u64 {
        self.cost
    }
}

impl LayerLimit for (&Limit, u64) {
    fn limit(&self) -> &Limit {
        self.0
    }
    fn cost(&self) -> u64 {
        self.1
    }
}

/// One request's layers judged together: what a store answers and writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Layered {
    /// One verdict per layer, in order. When the request is denied, the
    /// admitting layers report what they still have (nothing was charged).
    pub verdicts: Verdicts,
    /// When every layer admits: each layer's state to store (with its TTL),
    /// in order. Empty when the request is denied: nothing is written.
    pub writes: Writes,
}

impl Layered {
    /// Whether every layer admitted (so every write must be made).
    pub fn admitted(&self) -> bool {
        !self.writes.is_empty()
    }
}

/// Judge every layer of one request against its state (`states[i]` for
/// `layers[i]`, `None` for a key with no live state) at `now`, all or
/// nothing: the [`Store`](tollgate_limiter::Store) contract's decision,
/// for any store that reads states, locks them, and writes what this
/// returns. The in-process store and the PostgreSQL example use it.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{LayerRequest, Limit, Policy, StoreKey, Timestamp};
///
/// let tight = Policy::new("tight", Limit::fixed_window(1, Duration::from_secs(1))?)?;
/// let loose = Policy::new("loose", Limit::fixed_window(9, Duration::from_secs(1))?)?;
/// let layers = [
///     LayerRequest { key: StoreKey::new("k", &loose, "subject", "k"), policy: &loose, cost: 1 },
///     LayerRequest { key: StoreKey::new("k", &tight, "subject", "k"), policy: &tight, cost: 1 },
/// ];
/// let now = Timestamp::from_micros(1_800_000_000_000_000);
/// let first = tollgate_algorithms::decide_layers(&layers, &[None, None], now);
/// assert!(first.admitted());
/// let tight_state = first.writes[1].as_ref().unwrap().state.clone();
/// let second = tollgate_algorithms::decide_layers(&layers, &[None, Some(&tight_state)], now);
/// assert!(!second.admitted());
/// assert_eq!(second.verdicts[0].remaining, 9, "the loose layer was not charged");
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
pub fn decide_layers<L: LayerLimit>(
    layers: &[L],
    states: &[Option<&State>],
    now: Timestamp,
) -> Layered {
    // Each transition goes straight into the answer's two lists (no list
    // of transitions to copy from: this runs on every layered decision);
    // a denial then takes the writes back and uncharges the verdicts.
    let mut layered = Layered {
        verdicts: Verdicts::new(),
        writes: Writes::default(),
    };
    let mut admitted = true;
    for (l, state) in layers.iter().zip(states) {
        let Transition { verdict, next } = decide(l.limit(), *state, now, l.cost());
        admitted &= verdict.allowed;
        layered.verdicts.push(verdict);
        layered.writes.0.push(next);
    }
    if !admitted {
        layered.writes.0.clear();
        for (verdict, l) in layered.verdicts.iter_mut().zip(layers) {
            *verdict = verdict.uncharged(l.cost());
        }
    }
    layered
}

/// Each layer's state to store, in order (`None`: that layer writes
/// nothing). Up to four live inline: no allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Writes(pub(crate) SmallVec<[Option<Stored>; 4]>);

impl Deref for Writes {
    type Target = [Option<Stored>];
    fn deref(&self) -> &[Option<Stored>] {
        &self.0
    }
}

/// Each write can be taken out (`writes[i].take()`), leaving `None`: a
/// store that makes them one by one moves each state once.
impl DerefMut for Writes {
    fn deref_mut(&mut self) -> &mut [Option<Stored>] {
        &mut self.0
    }
}

impl IntoIterator for Writes {
    type Item = Option<Stored>;
    type IntoIter = WritesIntoIter;
    fn into_iter(self) -> WritesIntoIter {
        WritesIntoIter(self.0.into_iter())
    }
}

/// The states of a [`Writes`], by value.
#[derive(Debug)]
pub struct WritesIntoIter(smallvec::IntoIter<[Option<Stored>; 4]>);

impl Iterator for WritesIntoIter {
    type Item = Option<Stored>;
    fn next(&mut self) -> Option<Option<Stored>> {
        self.0.next()
    }
}
