//! The token bucket's parameters (the algorithm: `tollgate_algorithms`'s
//! `token_bucket.rs`).

use std::time::Duration;

use serde::Deserialize;

use super::builtins::{Layout, Parameters};
use super::{
    check_count, check_recovery, check_window, share, slower, Limit, MAX_COUNT, MAX_EXACT,
};
use crate::error::PolicyError;
use crate::spec::{DurationSpec, FieldKind};

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
    // [when full again (µs), the remainder rounding up added]
    const LAYOUT: Layout = Layout::Cells {
        cells: 2,
        time_cell: 0,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = &[
        ("capacity", FieldKind::Count),
        ("refill", FieldKind::Count),
        ("period", FieldKind::Duration),
    ];
    type Spec = TokenBucketSpec;

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
    /// The rate divides exactly by stretching the period.
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        Self::new(
            share(self.capacity, instances),
            self.refill,
            slower(self.period_us, instances)?,
        )
    }
    fn args(&self, _now: u64) -> [u64; 3] {
        [self.capacity, self.refill, self.period_us]
    }
    fn from_args([capacity, refill, period_us]: [u64; 3]) -> Result<Self, PolicyError> {
        Self::new(capacity, refill, Duration::from_micros(period_us))
    }
}
