//! Key budgets: how many keys a policy may hold in a bounded store, and
//! what a full budget does.

use crate::error::PolicyError;

/// What a store does when a key budget is full of live keys and a request
/// needs a new key.
///
/// The default is [`WhenFull::EvictNearestExpiry`]: a full budget keeps
/// deciding, at a bounded cost in accuracy, instead of failing requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum WhenFull {
    /// Make room by dropping the live key closest to expiry (among those
    /// of the budget in the new key's shard; across the store when that
    /// shard holds none). Its state is the closest to "no state": the
    /// subject it counted starts over, so each eviction can admit at most
    /// what that state still withheld — never more than the policy's
    /// capacity, and never more than the subject would have regained by
    /// the key's expiry anyway.
    #[default]
    EvictNearestExpiry,
    /// Refuse the request with [`StoreError::Full`](crate::StoreError::Full)
    /// (the policy's failure mode decides it), announcing when the budget's
    /// first key expires. Exact, but a flood of new subjects can make the
    /// policy fail for new subjects until then.
    Refuse,
}

impl WhenFull {
    /// The name used in configuration files: `evict` or `refuse`.
    pub fn name(self) -> &'static str {
        match self {
            WhenFull::EvictNearestExpiry => "evict",
            WhenFull::Refuse => "refuse",
        }
    }
}

/// A policy's own share of a bounded store: at most `max_keys` live keys,
/// so one route's traffic cannot take another route's room.
///
/// ```
/// use tollgate_limiter::{KeyBudget, WhenFull};
/// let budget = KeyBudget::new(10_000, WhenFull::Refuse)?;
/// assert_eq!(budget.max_keys(), 10_000);
/// assert!(KeyBudget::new(0, WhenFull::Refuse).is_err());
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyBudget {
    max_keys: usize,
    when_full: WhenFull,
}

impl KeyBudget {
    /// A budget of `max_keys` (at least 1) live keys.
    pub fn new(max_keys: usize, when_full: WhenFull) -> Result<Self, PolicyError> {
        if max_keys == 0 {
            return Err(PolicyError::new(
                "max_keys",
                "0 must be at least 1 (leave it out for no budget of the policy's own)",
            ));
        }
        Ok(KeyBudget {
            max_keys,
            when_full,
        })
    }

    /// Most live keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// What a full budget does.
    pub fn when_full(&self) -> WhenFull {
        self.when_full
    }
}
