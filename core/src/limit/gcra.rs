//! GCRA's parameters (the algorithm: `tollgate_algorithms`'s `gcra.rs`).

use std::time::Duration;

#[cfg(feature = "serde")]
use serde::Deserialize;

use super::builtins::{FieldKind, Layout, Parameters};
use super::{
    check_carried, check_count, check_recovery, check_window, share, too_many, Limit, MAX_COUNT,
};
use crate::error::PolicyError;
#[cfg(feature = "serde")]
use crate::spec::DurationSpec;

impl Limit {
    /// GCRA: `rate` per `period` on average, bursts of up to `burst`.
    pub fn gcra(rate: u64, period: Duration, burst: u64) -> Result<Self, PolicyError> {
        Gcra::new(rate, period, burst).map(Limit::Gcra)
    }
}

/// GCRA parameters: an emission interval (rounded up to the microsecond, so
/// the rate is never exceeded) and a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: u64,
    interval_us: u64,
    /// The state records the interval (see [`Limit::keeping_units`]).
    keeps_units: bool,
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
        Ok(Gcra {
            burst,
            interval_us,
            keeps_units: false,
        })
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
        let interval_us = check_carried("interval", interval)?;
        check_recovery(burst.saturating_mul(interval_us))?;
        Ok(Gcra {
            burst,
            interval_us,
            keeps_units: false,
        })
    }
    /// Requests admitted at once from a full state.
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// Microseconds between two requests at the sustained rate.
    pub fn interval_us(&self) -> u64 {
        self.interval_us
    }
    /// Whether the state records the interval it was written at, so that
    /// a change of plan keeps the units used ([`Limit::keeping_units`]).
    pub fn keeps_units(&self) -> bool {
        self.keeps_units
    }
    /// What a state that keeps units records: the interval, or 0.
    pub fn recorded_rate(&self) -> u64 {
        if self.keeps_units {
            self.interval_us
        } else {
            0
        }
    }
    /// Whether a state's recorded interval is one GCRA writes: 0 (none
    /// recorded) or 1 µs to [`MAX_WINDOW`](crate::MAX_WINDOW). Any other
    /// is data Tollgate did not write.
    ///
    /// ```
    /// # use tollgate_limiter::Gcra;
    /// assert!(Gcra::is_recorded_rate(0) && Gcra::is_recorded_rate(1_000_000));
    /// assert!(!Gcra::is_recorded_rate(u64::MAX));
    /// ```
    pub fn is_recorded_rate(record: u64) -> bool {
        record <= crate::time::duration_micros(crate::MAX_WINDOW)
    }
}

#[cfg(feature = "serde")]
/// GCRA as written in a configuration file (`algorithm = "gcra"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcraSpec {
    /// Sustained requests per `period`.
    pub rate: u64,
    /// The period of `rate`.
    pub period: DurationSpec,
    /// Requests admitted at once from a full state.
    pub burst: u64,
}

impl Parameters for Gcra {
    const KEY_CODE: &'static str = "gcra";
    // [the theoretical arrival time (µs), the interval it was written at
    // (0: not recorded)]
    const LAYOUT: Layout = Layout::Cells {
        cells: 2,
        time_cell: 0,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = &[
        ("rate", FieldKind::Count),
        ("period", FieldKind::Duration),
        ("burst", FieldKind::Count),
    ];
    #[cfg(feature = "serde")]
    type Spec = GcraSpec;

    #[cfg(feature = "serde")]
    fn from_spec(s: &GcraSpec) -> Result<Self, PolicyError> {
        Self::new(s.rate, s.period.0, s.burst)
    }
    #[inline]
    fn capacity_of(&self) -> u64 {
        self.burst
    }
    /// The time a full burst takes to be available again.
    fn announced_window_us(&self) -> u64 {
        self.burst * self.interval_us
    }
    fn rate(&self) -> (u64, u64) {
        (1, self.interval_us)
    }
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        let interval_us = self
            .interval_us
            .checked_mul(instances)
            .ok_or_else(|| too_many(instances))?;
        let burst = share(self.burst, instances);
        check_recovery(burst.saturating_mul(interval_us))?;
        // A plan's emergency limit keeps its units as the plan's own does
        // (the fallback's keys are shared by every plan too).
        Ok(Gcra {
            burst,
            interval_us,
            keeps_units: self.keeps_units,
        })
    }
    fn keeps_units(&self) -> bool {
        self.keeps_units
    }
    fn keeping_units(self) -> Self {
        Gcra {
            keeps_units: true,
            ..self
        }
    }
}
