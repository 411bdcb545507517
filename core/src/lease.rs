//! Leases: how a leased policy's layer holds units it has already charged.

use std::time::Duration;

use crate::error::PolicyError;
use crate::limit::Limit;

/// How a leased layer batches its decisions (see [`Policy::leased`](crate::Policy::leased)).
///
/// When a key of a leased layer is hot in this process, the limiter
/// charges a batch of units in the store in one call (all-or-nothing with
/// the request's other layers, as any decision) and admits the next
/// requests from that batch without a store call, until the batch is used
/// or its lease ends. A unit is charged in the store before it is admitted
/// anywhere, so a lease never over-admits a window, and a bucket keeps
/// its rate; what it costs is under-admission (units other processes hold
/// and do not use, at most their batches) and, for a token bucket or
/// GCRA, bursts above the capacity by at most the units batches hold (the
/// store's bucket refills to full while they are held).
///
/// - **The batch** is a quarter of what this process asked of the key in
///   the last period (the shortest lease among the limiter's leased
///   layers), at most [`max_batch`](Self::max_batch) (default: a sixteenth
///   of the capacity) and never more than the capacity. A key asked less
///   than eight times its cost in a period is not leased: it is decided by
///   one store call per request, as without a lease. When a batch is
///   denied, the request that asked for it is decided again at its own
///   cost, and the key asks for no batch until the store said it would fit,
///   or one lease's duration, whichever comes first.
/// - **A lease ends** after [`duration`](Self::duration) (default 1 s) for
///   a token bucket or GCRA; what it did not use is given back to the
///   store (a reward) when its lease ends, the limiter is dropped or
///   [`Limiter::return_leases`](crate::Limiter::return_leases) is called.
///   A window's units are not given back, since a give-back arriving after
///   its window ended would count in the next one: its lease lasts until
///   the window it was charged in ends (counted from when the call was
///   sent, so never after the store's window), and its units are used
///   until then (unless the table of leased keys is full and nobody took
///   from it for a lease's duration: it then ends to make room).
/// - **A process that dies holding a batch** loses it: a token bucket's or
///   GCRA's batch is at most what the limit refills in one lease's
///   duration, so the store has it back by refill within that time; a
///   window's comes back when its window ends.
/// - **Truthful answers**: a lease never denies; a request its batch cannot
///   cover goes to the store, which decides it, so every denial and
///   retry-after is the store's. An admission from a batch reports the
///   store's remaining when the batch was charged plus what the batch still
///   holds, and the store's reset counted down by the limiter's clock.
///
/// Token buckets, GCRA, fixed and sliding window counters and calendar
/// quotas can be leased. A sliding log cannot: it records each unit at the
/// instant it is charged, and a unit charged early would leave its window
/// early, admitting more than the limit in a later window. A concurrency
/// limit holds places, not units, and a custom algorithm's meaning is
/// unknown to the limiter.
///
/// ```
/// # use std::time::Duration;
/// use tollgate_limiter::{Lease, Limit, Policy};
/// let global = Policy::new("all", Limit::fixed_window(100_000, Duration::from_secs(1))?)?
///     .leased(Lease::new(Duration::from_millis(500))?.with_max_batch(500)?)?;
/// assert_eq!(global.lease().unwrap().max_batch(), Some(500));
/// assert!(Policy::new("log", Limit::sliding_log(5, Duration::from_secs(1))?)?
///     .leased(Lease::default())
///     .is_err());
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    duration: Duration,
    max_batch: Option<u64>,
}

impl Default for Lease {
    /// One second, batches up to a sixteenth of the capacity.
    fn default() -> Self {
        Lease {
            duration: Duration::from_secs(1),
            max_batch: None,
        }
    }
}

impl Lease {
    /// The shortest lease: shorter ones would cost a store call nearly as
    /// often as no lease.
    pub const MIN_DURATION: Duration = Duration::from_millis(10);
    /// The longest lease: units held longer are units other processes
    /// cannot use.
    pub const MAX_DURATION: Duration = Duration::from_secs(60);

    /// Leases of `duration` ([`MIN_DURATION`](Self::MIN_DURATION) to
    /// [`MAX_DURATION`](Self::MAX_DURATION)).
    pub fn new(duration: Duration) -> Result<Lease, PolicyError> {
        if !(Self::MIN_DURATION..=Self::MAX_DURATION).contains(&duration) {
            return Err(PolicyError::new(
                "leased.duration",
                format!("{duration:?} must be between 10ms and 60s"),
            ));
        }
        Ok(Lease {
            duration,
            max_batch: None,
        })
    }

    /// The same leases, each batch at most `units` (at least 1; at most
    /// the policy's capacity, checked by [`Policy::leased`](crate::Policy::leased)).
    pub fn with_max_batch(mut self, units: u64) -> Result<Lease, PolicyError> {
        if units == 0 {
            return Err(PolicyError::new("leased.max_batch", "0 must be at least 1"));
        }
        self.max_batch = Some(units);
        Ok(self)
    }

    /// How long a batch may be held.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The largest batch, when set (`None`: a sixteenth of the capacity).
    pub fn max_batch(&self) -> Option<u64> {
        self.max_batch
    }

    /// `Ok` when `limit` can be leased with these leases.
    pub(crate) fn check(&self, limit: &Limit) -> Result<(), PolicyError> {
        if LeaseKind::of(limit).is_none() {
            return Err(PolicyError::new(
                "leased",
                format!(
                    "a {} limit cannot be leased (token buckets, GCRA, fixed and sliding window \
                     counters and calendar quotas can)",
                    limit.algorithm_name()
                ),
            ));
        }
        match self.max_batch {
            Some(units) if units > limit.capacity() => Err(PolicyError::new(
                "leased.max_batch",
                format!("{units} must be at most the capacity {}", limit.capacity()),
            )),
            _ => Ok(()),
        }
    }

    /// The largest batch of `limit` under these leases: the configured
    /// maximum (or a sixteenth of the capacity), at most the capacity, and,
    /// for a limit that refills, at most what it refills in one lease.
    pub(crate) fn batch_ceiling(&self, limit: &Limit) -> u64 {
        let capacity = limit.capacity();
        let mut ceiling = self.max_batch.unwrap_or(capacity / 16).min(capacity);
        if LeaseKind::of(limit) == Some(LeaseKind::Refills) {
            ceiling = ceiling.min(refilled_in(limit, self.duration));
        }
        ceiling.max(1)
    }
}

/// How a leasable limit's lease ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseKind {
    /// A token bucket or GCRA: any time; what it did not use goes back.
    Refills,
    /// A window counter: no later than its window's end, which is the
    /// verdict's reset less `before_reset`; nothing goes back.
    Window {
        /// How much earlier than the reported reset the window ends (a
        /// sliding window reports the end of the next one).
        before_reset: Duration,
    },
}

impl LeaseKind {
    /// How `limit`'s lease ends, `None` when it cannot be leased.
    pub(crate) fn of(limit: &Limit) -> Option<LeaseKind> {
        match limit {
            Limit::TokenBucket(_) | Limit::Gcra(_) => Some(LeaseKind::Refills),
            Limit::FixedWindow(_) => Some(LeaseKind::Window {
                before_reset: Duration::ZERO,
            }),
            Limit::Calendar(_) => Some(LeaseKind::Window {
                before_reset: Duration::ZERO,
            }),
            Limit::SlidingWindow(w) => Some(LeaseKind::Window {
                before_reset: Duration::from_micros(w.window_us()),
            }),
            _ => None,
        }
    }
}

/// Whole units `limit` refills in `duration` at its sustained rate.
fn refilled_in(limit: &Limit, duration: Duration) -> u64 {
    let Some((units, per)) = limit.rate() else {
        return 0;
    };
    let refilled = u128::from(units) * duration.as_micros() / per.as_micros().max(1);
    u64::try_from(refilled).unwrap_or(u64::MAX)
}
