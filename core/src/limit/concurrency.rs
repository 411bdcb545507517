//! The concurrency limit's parameters (the algorithm: `tollgate_algorithms`'s
//! `concurrency.rs`).
//!
//! A concurrency limit counts requests in flight, not requests per time:
//! each admitted request holds its units until it releases them. Its state
//! is a sliding log of the holders' last renewals: a holder's units count
//! while its renewal is younger than the lease, so a holder that dies
//! without releasing is forgotten one lease after it last renewed. The
//! decision is the sliding log's over a window of one lease; a release
//! removes the holder's entries, a renewal moves them to now.

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::Deserialize;

use super::builtins::{FieldKind, Layout, Parameters};
use super::window::Window;
use super::{share, Limit, MAX_LOG_LIMIT};
use crate::error::PolicyError;
#[cfg(feature = "serde")]
use crate::spec::DurationSpec;

/// Shortest lease: renewals run every third of it, so a lease far shorter
/// would spend the store on renewals.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// Longest lease: a holder that dies keeps its place at most this long.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

impl Limit {
    /// Concurrency limit: at most `limit` units in flight at once. An
    /// admitted request holds its units until it releases them
    /// ([`Limiter::acquire`](crate::Limiter) answers a permit that does,
    /// when dropped); a holder that stops renewing (its process died) is
    /// forgotten `lease` after its last renewal.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::Limit;
    /// let exports = Limit::concurrency(5, Duration::from_secs(30))?;
    /// assert_eq!(exports.capacity(), 5);
    /// assert!(Limit::concurrency(5, Duration::from_millis(10)).is_err());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn concurrency(limit: u64, lease: Duration) -> Result<Self, PolicyError> {
        Concurrency::new(limit, lease).map(Limit::Concurrency)
    }

    /// The leases of `self` and `next`, when both are concurrency limits
    /// whose places last differently. Places of one count must be read
    /// with one lease: a shorter one would count the places held under the
    /// longer as gone, and admit past the limit. So a plan may not change a
    /// lease, and a reload only with the policy's version (new keys).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use tollgate_limiter::Limit;
    /// let (s30, s60) = (Duration::from_secs(30), Duration::from_secs(60));
    /// let half_minute = Limit::concurrency(5, s30)?;
    /// assert_eq!(half_minute.lease_change(&Limit::concurrency(9, s60)?), Some((s30, s60)));
    /// assert_eq!(half_minute.lease_change(&Limit::concurrency(9, s30)?), None);
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn lease_change(&self, next: &Limit) -> Option<(Duration, Duration)> {
        match (self, next) {
            (Limit::Concurrency(was), Limit::Concurrency(now)) if was.lease() != now.lease() => {
                Some((was.lease(), now.lease()))
            }
            _ => None,
        }
    }
}

/// Concurrency limit parameters: units in flight, and the lease after
/// which a holder that stopped renewing is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency(Window);

impl Concurrency {
    /// Validated concurrency parameters; see [`Limit::concurrency`].
    pub fn new(limit: u64, lease: Duration) -> Result<Self, PolicyError> {
        if !(MIN_LEASE..=MAX_LEASE).contains(&lease) {
            return Err(PolicyError::new(
                "lease",
                format!("{lease:?} must be between {MIN_LEASE:?} and {MAX_LEASE:?} (1 day)"),
            ));
        }
        Window::new(limit, lease, MAX_LOG_LIMIT, MAX_LEASE).map(Concurrency)
    }
    /// Units in flight at once.
    pub fn limit(&self) -> u64 {
        self.0.limit()
    }
    /// The lease in microseconds.
    pub fn lease_us(&self) -> u64 {
        self.0.window_us()
    }
    /// The lease: a holder is forgotten this long after its last renewal.
    pub fn lease(&self) -> Duration {
        self.0.window()
    }
    /// The parameters as a sliding log's, whose maths the limit shares
    /// (the window is the lease).
    pub fn as_window(&self) -> &Window {
        &self.0
    }
}

#[cfg(feature = "serde")]
/// A concurrency limit as written in a configuration file
/// (`algorithm = "concurrency"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencySpec {
    /// Units in flight at once.
    pub limit: u64,
    /// How long a holder that stopped renewing keeps its place.
    pub lease: DurationSpec,
}

impl Parameters for Concurrency {
    const KEY_CODE: &'static str = "cc";
    // one entry per unit held: the time its holder last renewed (µs);
    // one string, as holders leave in any order (a list would take a
    // command per release)
    const LAYOUT: Layout = Layout::LogText;
    const FIELDS: &'static [(&'static str, FieldKind)] = &[
        ("limit", FieldKind::Count),
        ("lease", FieldKind::Duration),
    ];
    #[cfg(feature = "serde")]
    type Spec = ConcurrencySpec;

    #[cfg(feature = "serde")]
    fn from_spec(s: &ConcurrencySpec) -> Result<Self, PolicyError> {
        Self::new(s.limit, s.lease.0)
    }
    #[inline]
    fn capacity_of(&self) -> u64 {
        self.limit()
    }
    /// The lease: the longest a place stays taken without its holder.
    fn announced_window_us(&self) -> u64 {
        self.lease_us()
    }
    fn rate(&self) -> (u64, u64) {
        (self.limit(), self.lease_us())
    }
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        Self::new(share(self.limit(), instances), self.lease())
    }
}
