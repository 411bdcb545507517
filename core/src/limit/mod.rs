//! Limits: one algorithm and its validated parameters, never clamped.
//!
//! The built-in algorithms are listed once, in `builtins.rs`; each one's
//! parameters live in their own file here.

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
/// Longest period or window a policy accepts (but a fixed window's:
/// [`MAX_QUOTA_WINDOW`]).
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest fixed window: a quota over up to a year (366 days), aligned to
/// the Unix epoch like every fixed window. Its state lives until its
/// window ends, so this is the longest TTL Tollgate ever sets.
pub const MAX_QUOTA_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);
/// Longest time any other policy may take to return from empty to full,
/// and the longest block. Stored state of any algorithm but the fixed
/// window lives at most this long after its last write (plus clock skew).
pub const MAX_RECOVERY: Duration = Duration::from_secs(14 * 24 * 3600);

mod builtins;
#[cfg(feature = "calendar")]
mod recurrence;
mod window;

pub(crate) use builtins::Parameters;
pub use builtins::{Builtin, FieldKind, Layout};
pub use calendar::{Schedule, CALENDAR_ENDED_RETRY, MAX_CALENDAR_SPAN_US};
pub use concurrency::{MAX_LEASE, MIN_LEASE};
#[cfg(feature = "calendar")]
#[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
pub use recurrence::{CalendarUnit, Recurrence};
pub use window::Window;

/// Each built-in's module (`limit/<name>.rs`) and types, `Limit`, its
/// per-algorithm methods and the registry's table, from the list of
/// built-ins.
macro_rules! define_limit {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident), )*) => {
        $(
            mod $module;
            pub use $module::$variant;
            #[cfg(feature = "serde")]
            #[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
            pub use $module::$spec;
        )*

        /// The algorithm of a policy with its validated parameters.
        ///
        /// Not `#[non_exhaustive]`: every store and the reference must
        /// handle every algorithm, so a new variant is meant to break their
        /// matches (a store that cannot run one answers
        /// `StoreError::Unsupported`).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Limit {
            $( $(#[$doc])* $variant($variant), )*
            /// An algorithm supplied by the user; stores without a generic path
            /// (for example Redis, which runs Lua) reject it.
            Custom(CustomAlgorithm),
        }

        /// Each built-in's place in the registry.
        enum Position { $( $variant, )* }

        /// Every built-in, in the registry's order.
        const BUILTINS: &[Builtin] = &[$(
            Builtin {
                name: stringify!($module),
                key_code: <$variant as Parameters>::KEY_CODE,
                layout: <$variant as Parameters>::LAYOUT,
                fields: <$variant as Parameters>::FIELDS,
            },
        )*];

        impl Limit {
            /// Short, stable name of the algorithm (`token_bucket`, `gcra`, …).
            pub fn algorithm_name(&self) -> &'static str {
                match self {
                    $( Limit::$variant(_) => stringify!($module), )*
                    Limit::Custom(c) => c.0.name(),
                }
            }

            /// The algorithm's code in store keys (see
            /// [`StoreKey`](crate::StoreKey)): `tb`, `gcra`, `fw`, `sw`,
            /// `log`, or a custom algorithm's name (keys render it as
            /// `x-<name>`, so it never collides with a built-in one).
            #[inline]
            pub fn key_code(&self) -> &'static str {
                match self {
                    $( Limit::$variant(_) => <$variant as Parameters>::KEY_CODE, )*
                    Limit::Custom(c) => c.0.name(),
                }
            }

            /// The built-in algorithm this limit runs; `None` for a custom one.
            pub fn builtin(&self) -> Option<&'static Builtin> {
                match self {
                    $( Limit::$variant(_) => Some(&BUILTINS[Position::$variant as usize]), )*
                    Limit::Custom(_) => None,
                }
            }

            /// How stores keep this limit's state; `None` for a custom
            /// algorithm.
            #[inline]
            pub fn layout(&self) -> Option<Layout> {
                match self {
                    $( Limit::$variant(_) => Some(<$variant as Parameters>::LAYOUT), )*
                    Limit::Custom(_) => None,
                }
            }

            /// This limit shared by `instances` processes: each gets the limit
            /// divided by `instances` (rounded down, at least 1) at the same pace.
            pub fn divided_by(&self, instances: u32) -> Result<Limit, PolicyError> {
                let n = u64::from(instances);
                if n == 0 {
                    return Err(PolicyError::new("instances", "must be at least 1"));
                }
                match self {
                    $( Limit::$variant(p) => p.shared(n).map(Limit::$variant), )*
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
                match self {
                    $( Limit::$variant(p) => Some(Duration::from_micros(p.announced_window_us())), )*
                    Limit::Custom(_) => None,
                }
            }

            /// The most a single request may cost.
            #[inline]
            pub fn capacity(&self) -> u64 {
                match self {
                    $( Limit::$variant(p) => p.capacity_of(), )*
                    Limit::Custom(c) => c.0.capacity(),
                }
            }

            /// What the limit allows over what time at its sustained rate: a
            /// window's limit per window, a token bucket's refill per
            /// period, one request per GCRA emission interval. `None` for a
            /// custom algorithm.
            ///
            /// ```
            /// # use std::time::Duration;
            /// # use tollgate_limiter::Limit;
            /// let gcra = Limit::gcra(4, Duration::from_secs(1), 10)?;
            /// assert_eq!(gcra.rate(), Some((1, Duration::from_millis(250))));
            /// # Ok::<(), tollgate_limiter::PolicyError>(())
            /// ```
            pub fn rate(&self) -> Option<(u64, Duration)> {
                let (units, micros) = match self {
                    $( Limit::$variant(p) => p.rate(), )*
                    Limit::Custom(_) => return None,
                };
                Some((units, Duration::from_micros(micros)))
            }

            /// This limit as a plan's layer uses it: its state keeps the
            /// units used when the plan, and with it the rate, changes. A
            /// token bucket or GCRA then records its rate in its state, and
            /// a state written at another rate is read as the units it
            /// holds (whole units, a partly refilled one counted as used;
            /// at most the new capacity). A window counts units already and
            /// is unchanged. A token bucket whose refill per period, in
            /// lowest terms, is 8,192 or more cannot record its rate and
            /// is unchanged too.
            ///
            /// ```
            /// # use std::time::Duration;
            /// # use tollgate_limiter::Limit;
            /// let hourly = Limit::gcra(10, Duration::from_secs(3600), 10)?;
            /// assert!(!hourly.keeps_units() && hourly.keeping_units().keeps_units());
            /// # Ok::<(), tollgate_limiter::PolicyError>(())
            /// ```
            pub fn keeping_units(&self) -> Limit {
                match self {
                    $( Limit::$variant(p) => Limit::$variant(p.clone().keeping_units()), )*
                    Limit::Custom(c) => Limit::Custom(c.clone()),
                }
            }

            /// Whether this limit's state records its rate
            /// ([`keeping_units`](Self::keeping_units)).
            pub fn keeps_units(&self) -> bool {
                match self {
                    $( Limit::$variant(p) => p.keeps_units(), )*
                    Limit::Custom(_) => false,
                }
            }
        }
    };
}
crate::builtin_algorithms!(define_limit);
pub use token_bucket::MAX_RECORDED_REFILL;

impl Limit {
    /// A user-supplied algorithm.
    pub fn custom(algorithm: Arc<dyn Algorithm>) -> Self {
        Limit::Custom(CustomAlgorithm(algorithm))
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
    check_window_up_to(field, value, MAX_WINDOW)
}

/// `value` in µs, when between 1 µs and [`MAX_WINDOW`]: an interval or
/// period as stores carry it, which may be shorter than a policy may
/// state ([`MIN_WINDOW`]): a GCRA's interval, a token bucket's period in
/// lowest terms or shared by processes.
fn check_carried(field: &'static str, value: Duration) -> Result<u64, PolicyError> {
    let micros = duration_micros(value);
    if micros == 0 || value > MAX_WINDOW {
        return Err(PolicyError::new(
            field,
            format!("{value:?} must be between 1µs and {MAX_WINDOW:?} (7 days)"),
        ));
    }
    Ok(micros)
}

/// `value` in µs, when between [`MIN_WINDOW`] and `max` (a whole number of
/// days).
fn check_window_up_to(
    field: &'static str,
    value: Duration,
    max: Duration,
) -> Result<u64, PolicyError> {
    if value < MIN_WINDOW || value > max {
        let days = max.as_secs() / (24 * 3600);
        return Err(PolicyError::new(
            field,
            format!("{value:?} must be between {MIN_WINDOW:?} and {max:?} ({days} days)"),
        ));
    }
    Ok(duration_micros(value))
}

/// A count shared by `instances`: rounded down, at least 1.
fn share(value: u64, instances: u64) -> u64 {
    (value / instances).max(1)
}

/// A period or interval `instances` times as long.
fn slower(micros: u64, instances: u64) -> Result<Duration, PolicyError> {
    micros
        .checked_mul(instances)
        .map(Duration::from_micros)
        .ok_or_else(|| too_many(instances))
}

fn too_many(instances: u64) -> PolicyError {
    PolicyError::new(
        "instances",
        format!("{instances} is too many to share this limit"),
    )
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
