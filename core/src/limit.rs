//! Limits: one algorithm and its validated parameters, never clamped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::error::PolicyError;
use crate::time::duration_micros;

/// Largest integer every store computes exactly (Lua numbers are doubles).
pub const MAX_EXACT: u64 = 1 << 53;
/// Largest capacity, limit or refill amount a policy accepts.
pub const MAX_COUNT: u64 = 1_000_000_000;
/// Largest sliding-log limit: the log keeps one entry per admitted unit.
pub const MAX_LOG_LIMIT: u64 = 10_000;
/// Shortest period or window a policy accepts.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);
/// Longest period or window a policy accepts.
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest time any policy may take to return from empty to full. Stored
/// state lives at most this long after its last write (plus clock skew), so
/// this is also the longest TTL Tollgate ever sets.
pub const MAX_RECOVERY: Duration = Duration::from_secs(14 * 24 * 3600);

/// The algorithm of a policy with its validated parameters.
///
/// Not `#[non_exhaustive]`: every store and the reference must handle
/// every algorithm, so a new variant is meant to break their matches (a
/// store that cannot run one answers `StoreError::Unsupported`).
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// A bucket of `capacity` tokens refilled continuously.
    TokenBucket(TokenBucket),
    /// The generic cell rate algorithm: a token bucket kept as one arrival time.
    Gcra(Gcra),
    /// At most `limit` per aligned window.
    FixedWindow(Window),
    /// The previous window's count weighted by how much of it still overlaps.
    SlidingWindow(Window),
    /// Every admitted unit's timestamp, kept for one window.
    SlidingLog(Window),
    /// An algorithm supplied by the user; stores without a generic path
    /// (for example Redis, which runs Lua) reject it.
    Custom(CustomAlgorithm),
}

impl Limit {
    /// Token bucket: holds `capacity`, refills `refill` tokens every `period`
    /// (continuously, to the exact fraction).
    pub fn token_bucket(capacity: u64, refill: u64, period: Duration) -> Result<Self, PolicyError> {
        TokenBucket::new(capacity, refill, period).map(Limit::TokenBucket)
    }

    /// GCRA: `rate` per `period` on average, bursts of up to `burst`.
    pub fn gcra(rate: u64, period: Duration, burst: u64) -> Result<Self, PolicyError> {
        Gcra::new(rate, period, burst).map(Limit::Gcra)
    }

    /// Fixed window: `limit` per window aligned on multiples of `window`.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_COUNT).map(Limit::FixedWindow)
    }

    /// Sliding window counter: `limit` per `window`, estimated from two counters.
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        let w = Window::new(limit, window, MAX_COUNT)?;
        if w.limit.saturating_mul(w.window_us) > MAX_EXACT {
            return Err(PolicyError::new(
                "limit",
                format!("limit x window in microseconds must stay below 2^53 (limit {limit}, window {window:?})"),
            ));
        }
        Ok(Limit::SlidingWindow(w))
    }

    /// Sliding log: exactly `limit` per any `window`-long interval.
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self, PolicyError> {
        Window::new(limit, window, MAX_LOG_LIMIT).map(Limit::SlidingLog)
    }

    /// A user-supplied algorithm.
    pub fn custom(algorithm: Arc<dyn Algorithm>) -> Self {
        Limit::Custom(CustomAlgorithm(algorithm))
    }

    /// Short, stable name of the algorithm (`token_bucket`, `gcra`, …).
    pub fn algorithm_name(&self) -> &'static str {
        match self {
            Limit::TokenBucket(_) => "token_bucket",
            Limit::Gcra(_) => "gcra",
            Limit::FixedWindow(_) => "fixed_window",
            Limit::SlidingWindow(_) => "sliding_window",
            Limit::SlidingLog(_) => "sliding_log",
            Limit::Custom(c) => c.0.name(),
        }
    }

    /// The algorithm's code in store keys (see [`StoreKey`](crate::StoreKey)):
    /// `tb`, `gcra`, `fw`, `sw`, `log`, or a custom algorithm's name (keys
    /// render it as `x-<name>`, so it never collides with a built-in one).
    pub fn key_code(&self) -> &'static str {
        match self {
            Limit::TokenBucket(_) => "tb",
            Limit::Gcra(_) => "gcra",
            Limit::FixedWindow(_) => "fw",
            Limit::SlidingWindow(_) => "sw",
            Limit::SlidingLog(_) => "log",
            Limit::Custom(c) => c.0.name(),
        }
    }

    /// This limit shared by `instances` processes: each gets the limit
    /// divided by `instances` (rounded down, at least 1) at the same pace.
    pub fn divided_by(&self, instances: u32) -> Result<Limit, PolicyError> {
        let n = u64::from(instances);
        if n == 0 {
            return Err(PolicyError::new("instances", "must be at least 1"));
        }
        let share = |v: u64| (v / n).max(1);
        let slower = |us: u64| {
            us.checked_mul(n).map(Duration::from_micros).ok_or_else(|| {
                PolicyError::new(
                    "instances",
                    format!("{instances} is too many to share this limit"),
                )
            })
        };
        match self {
            // The rate divides exactly by stretching the period.
            Limit::TokenBucket(p) => {
                Limit::token_bucket(share(p.capacity), p.refill, slower(p.period_us)?)
            }
            Limit::Gcra(p) => {
                let limit = Gcra {
                    burst: share(p.burst),
                    interval_us: p.interval_us.checked_mul(n).ok_or_else(|| {
                        PolicyError::new(
                            "instances",
                            format!("{instances} is too many to share this limit"),
                        )
                    })?,
                };
                check_recovery(limit.burst.saturating_mul(limit.interval_us))?;
                Ok(Limit::Gcra(limit))
            }
            Limit::FixedWindow(p) => {
                Limit::fixed_window(share(p.limit), Duration::from_micros(p.window_us))
            }
            Limit::SlidingWindow(p) => {
                Limit::sliding_window(share(p.limit), Duration::from_micros(p.window_us))
            }
            Limit::SlidingLog(p) => {
                Limit::sliding_log(share(p.limit), Duration::from_micros(p.window_us))
            }
            Limit::Custom(_) => Err(PolicyError::new(
                "fallback",
                "a custom algorithm cannot be shared; give the fallback its own limit",
            )),
        }
    }

    /// The window a policy announces to clients (the `w` of the
    /// `RateLimit-Policy` header): the window, or the time an empty bucket
    /// takes to be full again. `None` for a custom algorithm, whose window
    /// Tollgate cannot know.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate_limiter::Limit;
    /// let bucket = Limit::token_bucket(10, 5, Duration::from_secs(1))?;
    /// assert_eq!(bucket.window(), Some(Duration::from_secs(2)));
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn window(&self) -> Option<Duration> {
        let micros = match self {
            Limit::TokenBucket(p) => (p.capacity * p.period_us).div_ceil(p.refill),
            Limit::Gcra(p) => p.burst * p.interval_us,
            Limit::FixedWindow(p) | Limit::SlidingWindow(p) | Limit::SlidingLog(p) => p.window_us,
            Limit::Custom(_) => return None,
        };
        Some(Duration::from_micros(micros))
    }

    /// The most a single request may cost.
    #[inline]
    pub fn capacity(&self) -> u64 {
        match self {
            Limit::TokenBucket(p) => p.capacity,
            Limit::Gcra(p) => p.burst,
            Limit::FixedWindow(p) | Limit::SlidingWindow(p) | Limit::SlidingLog(p) => p.limit,
            Limit::Custom(c) => c.0.capacity(),
        }
    }
}

fn check_count(field: &'static str, value: u64, max: u64) -> Result<(), PolicyError> {
    if value == 0 || value > max {
        return Err(PolicyError::new(
            field,
            format!("{value} must be between 1 and {max}"),
        ));
    }
    Ok(())
}

fn check_window(field: &'static str, value: Duration) -> Result<u64, PolicyError> {
    if value < MIN_WINDOW || value > MAX_WINDOW {
        return Err(PolicyError::new(
            field,
            format!("{value:?} must be between {MIN_WINDOW:?} and {MAX_WINDOW:?} (7 days)"),
        ));
    }
    Ok(duration_micros(value))
}

fn check_recovery(micros: u64) -> Result<(), PolicyError> {
    if micros > duration_micros(MAX_RECOVERY) {
        return Err(PolicyError::new(
            "capacity",
            format!(
                "an empty bucket would take {:?} to refill; at most {MAX_RECOVERY:?} (14 days) is supported, raise the refill rate or lower the capacity",
                Duration::from_micros(micros)
            ),
        ));
    }
    Ok(())
}

/// Token bucket parameters. Tokens are kept exactly, scaled by the period in
/// microseconds: `refill` scaled tokens accrue per microsecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill: u64,
    period_us: u64,
}

impl TokenBucket {
    /// Validated token bucket parameters; see [`Limit::token_bucket`].
    pub fn new(capacity: u64, refill: u64, period: Duration) -> Result<Self, PolicyError> {
        check_count("capacity", capacity, MAX_COUNT)?;
        check_count("refill", refill, MAX_COUNT)?;
        let period_us = check_window("period", period)?;
        if capacity.saturating_mul(period_us) > MAX_EXACT {
            return Err(PolicyError::new(
                "capacity",
                format!("capacity x period in microseconds must stay below 2^53 (capacity {capacity}, period {period:?})"),
            ));
        }
        check_recovery((capacity * period_us).div_ceil(refill))?;
        Ok(TokenBucket {
            capacity,
            refill,
            period_us,
        })
    }
    /// Tokens the bucket holds when full.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Tokens added per period.
    pub fn refill(&self) -> u64 {
        self.refill
    }
    /// The refill period in microseconds.
    pub fn period_us(&self) -> u64 {
        self.period_us
    }
}

/// GCRA parameters: an emission interval (rounded up to the microsecond, so
/// the rate is never exceeded) and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: u64,
    interval_us: u64,
}

impl Gcra {
    /// Validated GCRA parameters; see [`Limit::gcra`].
    pub fn new(rate: u64, period: Duration, burst: u64) -> Result<Self, PolicyError> {
        check_count("rate", rate, MAX_COUNT)?;
        check_count("burst", burst, MAX_COUNT)?;
        let period_us = check_window("period", period)?;
        if rate > period_us {
            return Err(PolicyError::new(
                "rate",
                format!("{rate} per {period:?} is more than one per microsecond"),
            ));
        }
        let interval_us = period_us.div_ceil(rate);
        check_recovery(burst.saturating_mul(interval_us))?;
        Ok(Gcra { burst, interval_us })
    }
    /// The parameters from their emission interval directly, as stores
    /// carry them ([`interval_us`](Self::interval_us)): what
    /// [`new`](Self::new) makes of a rate is the interval rounded up to
    /// the microsecond, and this rebuilds exactly that.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate_limiter::Gcra;
    /// let made = Gcra::new(3, Duration::from_secs(1), 5)?;
    /// assert_eq!(Gcra::from_interval(made.burst(), Duration::from_micros(made.interval_us()))?, made);
    /// assert!(Gcra::from_interval(5, Duration::ZERO).is_err());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn from_interval(burst: u64, interval: Duration) -> Result<Self, PolicyError> {
        check_count("burst", burst, MAX_COUNT)?;
        let interval_us = duration_micros(interval);
        if interval_us == 0 || interval > MAX_WINDOW {
            return Err(PolicyError::new(
                "interval",
                format!("{interval:?} must be between 1µs and {MAX_WINDOW:?} (7 days)"),
            ));
        }
        check_recovery(burst.saturating_mul(interval_us))?;
        Ok(Gcra { burst, interval_us })
    }
    /// Requests admitted at once from a full state.
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// Microseconds between two requests at the sustained rate.
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }
}

/// Parameters of the window algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    limit: u64,
    window_us: u64,
}

impl Window {
    fn new(limit: u64, window: Duration, max_limit: u64) -> Result<Self, PolicyError> {
        check_count("limit", limit, max_limit)?;
        let window_us = check_window("window", window)?;
        Ok(Window { limit, window_us })
    }
    /// Units admitted per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The window length in microseconds.
    pub fn window_us(&self) -> u64 {
        self.window_us
    }
}

/// A user algorithm inside a [`Limit`]; equal only to itself.
#[derive(Clone)]
pub struct CustomAlgorithm(pub Arc<dyn Algorithm>);

impl fmt::Debug for CustomAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CustomAlgorithm")
            .field(&self.0.name())
            .finish()
    }
}

impl PartialEq for CustomAlgorithm {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
