//! Policies: a named, versioned limit with its failure mode, key budget
//! and mode (enforced or shadow).

use std::sync::Arc;

use crate::budget::KeyBudget;
use crate::error::PolicyError;
use crate::failure::OnStoreFailure;
use crate::limit::Limit;

/// The rule for the names the limiter writes into store keys and metric
/// labels — policy names and attribute names: 1–64 characters of
/// `A-Z a-z 0-9 _ - .`. `field` is what the error names (`name`,
/// `scope.attribute`).
///
/// ```
/// use tollgate_limiter::check_name;
/// assert!(check_name("name", "search.v2").is_ok());
/// let err = check_name("name", "has space").unwrap_err();
/// assert_eq!(err.to_string(), "name: \"has space\" must be 1-64 characters of A-Z a-z 0-9 _ - .");
/// ```
pub fn check_name(field: &str, name: &str) -> Result<(), PolicyError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(PolicyError::new(
            field,
            format!("{name:?} must be 1-64 characters of A-Z a-z 0-9 _ - ."),
        ));
    }
    Ok(())
}

/// A validated limit: one algorithm and its parameters, under a name and a
/// version (bump the version to start every subject from a fresh state).
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, Policy};
///
/// let policy = Policy::new("search", Limit::token_bucket(10, 5, Duration::from_secs(1))?)?;
/// assert_eq!(policy.capacity(), 10);
///
/// // Invalid numbers fail here, before any store is involved.
/// assert!(Limit::fixed_window(0, Duration::from_secs(1)).is_err());
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    name: Arc<str>,
    version: u32,
    limit: Limit,
    on_failure: OnStoreFailure,
    /// The emergency limit, resolved when `on_failure` is a fallback.
    fallback: Option<Limit>,
    /// Its own share of a bounded (in-process) store, if any.
    key_budget: Option<KeyBudget>,
    /// Decided and counted, but never denying (see [`Policy::shadow`]).
    shadow: bool,
    /// How its hot keys are leased, if they are (see [`Policy::leased`]).
    #[cfg(feature = "lease")]
    lease: Option<crate::lease::Lease>,
}

impl Policy {
    /// A policy named `name` (1–64 characters of `A-Z a-z 0-9 _ - .`), version 1.
    pub fn new(name: impl AsRef<str>, limit: Limit) -> Result<Self, PolicyError> {
        let name = name.as_ref();
        check_name("name", name)?;
        Ok(Policy {
            name: name.into(),
            version: 1,
            limit,
            on_failure: OnStoreFailure::FailClosed,
            fallback: None,
            key_budget: None,
            shadow: false,
            #[cfg(feature = "lease")]
            lease: None,
        })
    }

    /// The same policy in shadow mode: its layers are decided and their
    /// state evolves exactly as if enforced (an admitted request charges
    /// them, a request they would deny charges them nothing), but their
    /// denial never denies the request; enforced layers decide as usual and
    /// are charged as if the shadow layer had admitted. Every would-be
    /// denial is counted (`tollgate_decisions_total{outcome="shadow_denied"}`)
    /// and logged at debug level. The way to try a limit before enforcing
    /// it; flipping it back is [`enforced`](Self::enforced).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::{Limit, Policy};
    /// let trial = Policy::new("search-v2", Limit::gcra(5, Duration::from_secs(1), 5)?)?.shadow();
    /// assert!(trial.is_shadow());
    /// assert!(!trial.enforced().is_shadow());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// The same policy, enforced (the default).
    pub fn enforced(mut self) -> Self {
        self.shadow = false;
        self
    }

    /// Whether the policy is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The same policy with a key budget of its own in bounded stores (the
    /// in-process store): at most `budget.max_keys()` live keys, so this
    /// policy's traffic cannot take the room of other policies. Stores
    /// without a bound (Redis) ignore it.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::{KeyBudget, Limit, Policy, WhenFull};
    /// let login = Policy::new("login", Limit::sliding_log(5, Duration::from_secs(60))?)?
    ///     .with_key_budget(KeyBudget::new(10_000, WhenFull::EvictNearestExpiry)?);
    /// assert_eq!(login.key_budget().unwrap().max_keys(), 10_000);
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn with_key_budget(mut self, budget: KeyBudget) -> Self {
        self.key_budget = Some(budget);
        self
    }

    /// The policy's own key budget, if it has one.
    pub fn key_budget(&self) -> Option<&KeyBudget> {
        self.key_budget.as_ref()
    }

    /// The same policy with another answer for store failures (the default
    /// is [`OnStoreFailure::FailClosed`]). A fallback's limit is validated here.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::{Fallback, Limit, OnStoreFailure, Policy};
    /// let shared = Limit::fixed_window(1_000, Duration::from_secs(60))?;
    /// let policy = Policy::new("api", shared)?
    ///     .with_on_failure(OnStoreFailure::Fallback(Fallback::Share { instances: 4 }))?;
    /// assert_eq!(policy.fallback_limit().unwrap().capacity(), 250);
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn with_on_failure(mut self, on_failure: OnStoreFailure) -> Result<Self, PolicyError> {
        self.fallback = match &on_failure {
            OnStoreFailure::Fallback(f) => {
                Some(f.limit_for(&self.limit).map_err(|e| e.within("fallback"))?)
            }
            _ => None,
        };
        self.on_failure = on_failure;
        Ok(self)
    }

    /// What this policy does when its store fails.
    pub fn on_failure(&self) -> &OnStoreFailure {
        &self.on_failure
    }

    /// The emergency bucket's limit, when the policy falls back.
    pub fn fallback_limit(&self) -> Option<&Limit> {
        self.fallback.as_ref()
    }

    /// The policy the emergency store runs: same name and version, the
    /// fallback limit.
    pub fn fallback_policy(&self) -> Option<Policy> {
        let limit = self.fallback.clone()?;
        Some(Policy {
            limit,
            on_failure: OnStoreFailure::FailClosed,
            fallback: None,
            key_budget: None,
            shadow: self.shadow,
            // The emergency store is in-process: nothing to lease.
            #[cfg(feature = "lease")]
            lease: None,
            ..self.clone()
        })
    }

    /// The same policy with `limit` instead of its own (a plan's limit):
    /// the same name, version, failure mode (its emergency limit
    /// recomputed from `limit`), key budget and mode.
    /// A plan's limit that cannot be leased (a sliding log) is not.
    pub(crate) fn with_limit(&self, limit: Limit) -> Result<Policy, PolicyError> {
        #[cfg(feature = "lease")]
        let lease = self.lease.filter(|l| l.check(&limit).is_ok());
        Policy {
            limit,
            fallback: None,
            #[cfg(feature = "lease")]
            lease,
            ..self.clone()
        }
        .with_on_failure(self.on_failure.clone())
    }

    /// The same policy with its hot keys leased (see [`Lease`](crate::Lease)): a
    /// process admits them from batches it charged in the store, a call
    /// per batch rather than per request, never over-admitting. Refused
    /// for a limit that cannot be leased (a sliding log, a concurrency
    /// limit, a custom algorithm) and for a batch above the capacity. On
    /// an in-process store it changes nothing.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::{Lease, Limit, Policy};
    /// let global = Policy::new("all", Limit::gcra(1_000, Duration::from_secs(1), 1_000)?)?
    ///     .leased(Lease::default())?;
    /// assert_eq!(global.lease(), Some(&Lease::default()));
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    #[cfg(feature = "lease")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
    pub fn leased(mut self, lease: crate::lease::Lease) -> Result<Self, PolicyError> {
        lease.check(&self.limit)?;
        self.lease = Some(lease);
        Ok(self)
    }

    /// How the policy's hot keys are leased, when they are.
    #[cfg(feature = "lease")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
    pub fn lease(&self) -> Option<&crate::lease::Lease> {
        self.lease.as_ref()
    }

    /// The same policy under another version; stored state of other versions
    /// is ignored (and expires on its own).
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The algorithm and its parameters.
    pub fn limit(&self) -> &Limit {
        &self.limit
    }

    /// The most a single request may cost: the bucket capacity or window limit.
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// `Ok` when a request of `cost` can ever be admitted under this policy.
    #[inline]
    pub fn check_cost(&self, cost: u64) -> Result<(), PolicyError> {
        if cost == 0 || cost > self.capacity() {
            return Err(self.cost_error(cost));
        }
        Ok(())
    }

    /// Why `cost` is refused (kept off the path of every decision).
    #[cold]
    fn cost_error(&self, cost: u64) -> PolicyError {
        PolicyError::new(
            "cost",
            format!(
                "{cost} must be between 1 and the capacity {} of policy {:?}",
                self.capacity(),
                self.name
            ),
        )
    }
}
