//! The token bucket's parameters (the algorithm: `tollgate_algorithms`'s
//! `token_bucket.rs`).

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::Deserialize;

use super::builtins::{FieldKind, Layout, Parameters};
use super::{
    check_carried, check_count, check_recovery, check_window, share, slower, Limit, MAX_COUNT,
    MAX_EXACT,
};
use crate::error::PolicyError;
#[cfg(feature = "serde")]
use crate::spec::DurationSpec;
use crate::time::duration_micros;

impl Limit {
    /// Token bucket: holds `capacity`, refills `refill` tokens every `period`
    /// (continuously, to the exact fraction).
    pub fn token_bucket(capacity: u64, refill: u64, period: Duration) -> Result<Self, PolicyError> {
        TokenBucket::new(capacity, refill, period).map(Limit::TokenBucket)
    }
}

/// Token bucket parameters. Tokens are kept exactly, scaled by the period in
/// microseconds: `refill` scaled tokens accrue per microsecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    capacity: u64,
    refill: u64,
    period_us: u64,
    /// The state records the rate (see [`Limit::keeping_units`]).
    keeps_units: bool,
}

/// The largest refill, in lowest terms with its period, whose rate a token
/// bucket's state can record ([`TokenBucket::recorded_rate`]): the record
/// is `refill × 2^40 + period_us`, below 2^53 as the Lua code needs.
pub const MAX_RECORDED_REFILL: u64 = (1 << 13) - 1;

/// The bit above a recorded rate's period.
const RECORDED_PERIOD_BITS: u32 = 40;

impl TokenBucket {
    /// Validated token bucket parameters; see [`Limit::token_bucket`].
    pub fn new(capacity: u64, refill: u64, period: Duration) -> Result<Self, PolicyError> {
        Self::checked(capacity, refill, check_window("period", period)?)
    }
    /// Validated parameters, the period any length up to
    /// [`MAX_WINDOW`](crate::MAX_WINDOW): a rate in lowest terms
    /// ([`Limit::keeping_units`]) or shared by processes may have a period
    /// shorter than a policy may state.
    fn checked(capacity: u64, refill: u64, period_us: u64) -> Result<Self, PolicyError> {
        check_count("capacity", capacity, MAX_COUNT)?;
        check_count("refill", refill, MAX_COUNT)?;
        let period = Duration::from_micros(period_us);
        check_carried("period", period)?;
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
            keeps_units: false,
        })
    }
    /// Parameters whose state records their rate (see
    /// [`Limit::keeping_units`]), from the rate as stores carry it: in
    /// lowest terms already, so recorded as it is, and its period any
    /// length from 1 µs (the lowest terms of a rate a policy may state).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate_limiter::{Limit, TokenBucket};
    /// let Limit::TokenBucket(kept) = Limit::token_bucket(10, 10, Duration::from_secs(3600))?.keeping_units() else { unreachable!() };
    /// let carried = Duration::from_micros(kept.period_us());
    /// assert_eq!(TokenBucket::from_recorded_rate(10, kept.refill(), carried)?, kept);
    /// assert!(TokenBucket::from_recorded_rate(10, 8_192, carried).is_err());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn from_recorded_rate(
        capacity: u64,
        refill: u64,
        period: Duration,
    ) -> Result<Self, PolicyError> {
        if refill > MAX_RECORDED_REFILL {
            return Err(PolicyError::new(
                "refill",
                format!("{refill} is more than a recorded rate holds ({MAX_RECORDED_REFILL})"),
            ));
        }
        Ok(TokenBucket {
            keeps_units: true,
            ..Self::checked(capacity, refill, duration_micros(period))?
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
    /// Whether the state records the rate it was written at, so that a
    /// change of plan keeps the units used ([`Limit::keeping_units`]).
    pub fn keeps_units(&self) -> bool {
        self.keeps_units
    }
    /// What a state that keeps units records: `refill × 2^40 + period_us`
    /// (in lowest terms once it keeps units), or 0.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate_limiter::{Limit, TokenBucket};
    /// let Limit::TokenBucket(b) = Limit::token_bucket(10, 10, Duration::from_secs(3600))?.keeping_units() else { unreachable!() };
    /// assert_eq!((b.refill(), b.period_us()), (1, 360_000_000));
    /// assert_eq!(TokenBucket::rate_of_record(b.recorded_rate()), (1, 360_000_000));
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn recorded_rate(&self) -> u64 {
        if self.keeps_units {
            (self.refill << RECORDED_PERIOD_BITS) | self.period_us
        } else {
            0
        }
    }
    /// The refill and period a [`recorded_rate`](Self::recorded_rate) holds.
    pub fn rate_of_record(record: u64) -> (u64, u64) {
        (
            record >> RECORDED_PERIOD_BITS,
            record & ((1 << RECORDED_PERIOD_BITS) - 1),
        )
    }
    /// Whether a state's recorded rate is one a token bucket writes: 0 (no
    /// rate recorded), or a refill of 1 to [`MAX_RECORDED_REFILL`] per a
    /// period of 1 µs to [`MAX_WINDOW`](crate::MAX_WINDOW). Any other is
    /// data Tollgate did not write (a zero period would divide by zero).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tollgate_limiter::{Limit, TokenBucket};
    /// let Limit::TokenBucket(b) = Limit::token_bucket(10, 10, Duration::from_secs(3600))?.keeping_units() else { unreachable!() };
    /// assert!(TokenBucket::is_recorded_rate(b.recorded_rate()));
    /// assert!(TokenBucket::is_recorded_rate(0));
    /// assert!(!TokenBucket::is_recorded_rate(1 << 40)); // a period of 0
    /// assert!(!TokenBucket::is_recorded_rate(5)); // a refill of 0
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn is_recorded_rate(record: u64) -> bool {
        let (refill, period_us) = Self::rate_of_record(record);
        record == 0
            || ((1..=MAX_RECORDED_REFILL).contains(&refill)
                && (1..=duration_micros(crate::MAX_WINDOW)).contains(&period_us))
    }
}

#[cfg(feature = "serde")]
/// A token bucket as written in a configuration file
/// (`algorithm = "token_bucket"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketSpec {
    /// Tokens when full.
    pub capacity: u64,
    /// Tokens added per `period`.
    pub refill: u64,
    /// Refill period, for example `"1s"`.
    pub period: DurationSpec,
}

impl Parameters for TokenBucket {
    const KEY_CODE: &'static str = "tb";
    // [when full again (µs), the remainder rounding up added, the rate it
    // was written at (0: not recorded)]
    const LAYOUT: Layout = Layout::Cells {
        cells: 3,
        time_cell: 0,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = &[
        ("capacity", FieldKind::Count),
        ("refill", FieldKind::Count),
        ("period", FieldKind::Duration),
    ];
    #[cfg(feature = "serde")]
    type Spec = TokenBucketSpec;

    #[cfg(feature = "serde")]
    fn from_spec(s: &TokenBucketSpec) -> Result<Self, PolicyError> {
        Self::new(s.capacity, s.refill, s.period.0)
    }
    #[inline]
    fn capacity_of(&self) -> u64 {
        self.capacity
    }
    /// The time an empty bucket takes to be full.
    fn announced_window_us(&self) -> u64 {
        (self.capacity * self.period_us).div_ceil(self.refill)
    }
    fn rate(&self) -> (u64, u64) {
        (self.refill, self.period_us)
    }
    /// The rate divides exactly by stretching the period. A plan's
    /// emergency limit keeps its units as the plan's own does (the
    /// fallback's keys are shared by every plan too); its rate in lowest
    /// terms refills no more than the plan's, so it can be recorded.
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        let shared = Self::checked(
            share(self.capacity, instances),
            self.refill,
            duration_micros(slower(self.period_us, instances)?),
        )?;
        Ok(if self.keeps_units {
            shared.keeping_units()
        } else {
            shared
        })
    }
    fn keeps_units(&self) -> bool {
        self.keeps_units
    }
    /// The same rate in lowest terms (the bucket decides exactly the same),
    /// so that the record fits; unchanged when it cannot.
    fn keeping_units(self) -> Self {
        let g = gcd(self.refill, self.period_us);
        let (refill, period_us) = (self.refill / g, self.period_us / g);
        if refill > MAX_RECORDED_REFILL {
            return self;
        }
        TokenBucket {
            refill,
            period_us,
            keeps_units: true,
            ..self
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
