//! Policies: one limit each, validated when built, never clamped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::algorithm::Algorithm;
use crate::budget::KeyBudget;
use crate::error::PolicyError;
use crate::failure::{Fallback, OnStoreFailure};
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "PolicyDef")]
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
}

impl Policy {
    /// A policy named `name` (1–64 characters of `A-Z a-z 0-9 _ - .`), version 1.
    pub fn new(name: impl AsRef<str>, limit: Limit) -> Result<Self, PolicyError> {
        let name = name.as_ref();
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
            return Err(PolicyError::new(
                "name",
                format!("{name:?} must be 1-64 characters of A-Z a-z 0-9 _ - ."),
            ));
        }
        Ok(Policy {
            name: name.into(),
            version: 1,
            limit,
            on_failure: OnStoreFailure::FailClosed,
            fallback: None,
            key_budget: None,
            shadow: false,
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
            ..self.clone()
        })
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
    pub fn capacity(&self) -> u64 {
        self.limit.capacity()
    }

    /// `Ok` when a request of `cost` can ever be admitted under this policy.
    pub fn check_cost(&self, cost: u64) -> Result<(), PolicyError> {
        if cost == 0 || cost > self.capacity() {
            return Err(PolicyError::new(
                "cost",
                format!(
                    "{cost} must be between 1 and the capacity {} of policy {:?}",
                    self.capacity(),
                    self.name
                ),
            ));
        }
        Ok(())
    }
}

/// The algorithm of a policy with its validated parameters.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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

    /// The most a single request may cost.
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

/// A limit as written in a configuration file, before validation.
///
/// ```
/// use tollgate_limiter::LimitSpec;
/// let spec: LimitSpec = serde_json::from_str(
///     r#"{ "algorithm": "sliding_window", "limit": 100, "window": "1m" }"#,
/// ).unwrap();
/// assert_eq!(spec.build().unwrap().capacity(), 100);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "algorithm", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum LimitSpec {
    /// See [`Limit::token_bucket`].
    TokenBucket {
        /// Tokens when full.
        capacity: u64,
        /// Tokens added per `period`.
        refill: u64,
        /// Refill period, for example `"1s"`.
        period: DurationSpec,
    },
    /// See [`Limit::gcra`].
    Gcra {
        /// Sustained requests per `period`.
        rate: u64,
        /// The period of `rate`.
        period: DurationSpec,
        /// Requests admitted at once from a full state.
        burst: u64,
    },
    /// See [`Limit::fixed_window`].
    FixedWindow {
        /// Units per window.
        limit: u64,
        /// Window length.
        window: DurationSpec,
    },
    /// See [`Limit::sliding_window`].
    SlidingWindow {
        /// Units per window.
        limit: u64,
        /// Window length.
        window: DurationSpec,
    },
    /// See [`Limit::sliding_log`].
    SlidingLog {
        /// Units per window.
        limit: u64,
        /// Window length.
        window: DurationSpec,
    },
}

impl LimitSpec {
    /// Validate the parameters.
    pub fn build(&self) -> Result<Limit, PolicyError> {
        match *self {
            LimitSpec::TokenBucket {
                capacity,
                refill,
                period,
            } => Limit::token_bucket(capacity, refill, period.0),
            LimitSpec::Gcra {
                rate,
                period,
                burst,
            } => Limit::gcra(rate, period.0, burst),
            LimitSpec::FixedWindow { limit, window } => Limit::fixed_window(limit, window.0),
            LimitSpec::SlidingWindow { limit, window } => Limit::sliding_window(limit, window.0),
            LimitSpec::SlidingLog { limit, window } => Limit::sliding_log(limit, window.0),
        }
    }
}

/// A duration as people write it: a number and a unit, or several
/// (`"250ms"`, `"1s"`, `"1.5s"`, `"1m30s"`, `"1min"`, `"2h"`, `"1d"`).
///
/// Units: `us`/`µs`, `ms`, `s`/`sec`/`secs`/`second`/`seconds`,
/// `m`/`min`/`mins`/`minute`/`minutes`, `h`/`hr`/`hour`/`hours`,
/// `d`/`day`/`days`. A fraction must come to whole microseconds.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::DurationSpec;
/// let d: DurationSpec = "1m30s".parse()?;
/// assert_eq!(d.0, Duration::from_secs(90));
/// assert_eq!("1.5s".parse::<DurationSpec>()?.0, Duration::from_millis(1500));
/// assert_eq!("1min".parse::<DurationSpec>()?.0, Duration::from_secs(60));
/// assert!("1.5".parse::<DurationSpec>().is_err());
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct DurationSpec(pub Duration);

impl TryFrom<String> for DurationSpec {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl std::str::FromStr for DurationSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = |why: &str| {
            format!("{text:?} is not a duration ({why}): write numbers with units, like \"500ms\", \"1.5s\", \"1m30s\", \"2h\" or \"1d\"")
        };
        if text.is_empty() {
            return Err(bad("it is empty"));
        }
        let mut rest = text;
        let mut total: u64 = 0;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let (number, tail) = rest.split_at(digits);
            let unit_len = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_len);
            if number.is_empty() {
                return Err(bad("a unit without a number"));
            }
            let per: u64 = match unit.trim() {
                "us" | "µs" => 1,
                "ms" => 1_000,
                "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
                "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
                "h" | "hr" | "hour" | "hours" => 3_600_000_000,
                "d" | "day" | "days" => 86_400_000_000,
                "" => return Err(bad("a number without a unit")),
                _ => return Err(bad("unknown unit")),
            };
            let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
            if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
                return Err(bad("a malformed number"));
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad("a number too large"))?
            };
            let mut micros = whole.checked_mul(per).ok_or_else(|| bad("too long"))?;
            if !fraction.is_empty() {
                if fraction.len() > 12 {
                    return Err(bad("too many decimals"));
                }
                let digits: u128 = fraction.parse().map_err(|_| bad("a malformed number"))?;
                let scale = 10u128.pow(fraction.len() as u32);
                let part = digits * u128::from(per);
                if !part.is_multiple_of(scale) {
                    return Err(bad("not a whole number of microseconds"));
                }
                micros = micros
                    .checked_add(u64::try_from(part / scale).map_err(|_| bad("too long"))?)
                    .ok_or_else(|| bad("too long"))?;
            }
            total = total.checked_add(micros).ok_or_else(|| bad("too long"))?;
            rest = tail;
        }
        Ok(DurationSpec(Duration::from_micros(total)))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyDef {
    name: String,
    #[serde(default = "first_version")]
    version: u32,
    limit: LimitSpec,
    #[serde(default)]
    on_failure: Option<OnFailureSpec>,
    #[serde(default)]
    max_keys: Option<usize>,
    #[serde(default)]
    when_full: Option<WhenFullSpec>,
    #[serde(default)]
    mode: Option<ModeSpec>,
}

/// Whether a policy is enforced or in shadow mode, as written in a
/// configuration file: `"enforce"` (the default) or `"shadow"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSpec {
    /// Denials deny.
    Enforce,
    /// See [`Policy::shadow`].
    Shadow,
}

/// What a full key budget does, as written in a configuration file:
/// `"evict"` or `"refuse"` (see [`WhenFull`](crate::WhenFull)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WhenFullSpec {
    /// [`WhenFull::EvictNearestExpiry`](crate::WhenFull::EvictNearestExpiry).
    Evict,
    /// [`WhenFull::Refuse`](crate::WhenFull::Refuse).
    Refuse,
}

impl From<WhenFullSpec> for crate::WhenFull {
    fn from(spec: WhenFullSpec) -> Self {
        match spec {
            WhenFullSpec::Evict => crate::WhenFull::EvictNearestExpiry,
            WhenFullSpec::Refuse => crate::WhenFull::Refuse,
        }
    }
}

/// A store-failure mode as written in a configuration file:
/// `"fail_open"`, `"fail_closed"`, `{ fallback = { algorithm = … } }` or
/// `{ fallback_share = 4 }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum OnFailureSpec {
    /// [`OnStoreFailure::FailOpen`].
    FailOpen,
    /// [`OnStoreFailure::FailClosed`].
    FailClosed,
    /// [`Fallback::Limit`].
    Fallback(LimitSpec),
    /// [`Fallback::Share`] among this many processes.
    FallbackShare(u32),
}

impl OnFailureSpec {
    /// Validate into an [`OnStoreFailure`].
    pub fn build(&self) -> Result<OnStoreFailure, PolicyError> {
        Ok(match self {
            OnFailureSpec::FailOpen => OnStoreFailure::FailOpen,
            OnFailureSpec::FailClosed => OnStoreFailure::FailClosed,
            OnFailureSpec::Fallback(spec) => OnStoreFailure::Fallback(Fallback::Limit(
                spec.build().map_err(|e| e.within("fallback"))?,
            )),
            OnFailureSpec::FallbackShare(instances) => OnStoreFailure::Fallback(Fallback::Share {
                instances: *instances,
            }),
        })
    }
}

fn first_version() -> u32 {
    1
}

impl TryFrom<PolicyDef> for Policy {
    type Error = PolicyError;
    fn try_from(def: PolicyDef) -> Result<Self, PolicyError> {
        let mut policy = Policy::new(def.name, def.limit.build().map_err(|e| e.within("limit"))?)?
            .with_version(def.version);
        match (def.max_keys, def.when_full) {
            (Some(max_keys), when_full) => {
                let when_full = when_full.map(Into::into).unwrap_or_default();
                policy = policy.with_key_budget(KeyBudget::new(max_keys, when_full)?);
            }
            (None, Some(_)) => {
                return Err(PolicyError::new(
                    "when_full",
                    "applies to a key budget: set max_keys too",
                ))
            }
            (None, None) => {}
        }
        if def.mode == Some(ModeSpec::Shadow) {
            policy = policy.shadow();
        }
        match def.on_failure {
            Some(spec) => policy.with_on_failure(spec.build().map_err(|e| e.within("on_failure"))?),
            None => Ok(policy),
        }
    }
}
