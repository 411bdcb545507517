//! The calendar quota's parameters (the algorithm: `tollgate_algorithms`'s
//! `calendar.rs`).

#[cfg(feature = "serde")]
use serde::Deserialize;

use super::builtins::{FieldKind, Layout, Parameters};
use super::{check_count, share, Limit, MAX_COUNT};
use crate::error::PolicyError;
#[cfg(feature = "calendar")]
use crate::Recurrence;
#[cfg(all(feature = "calendar", feature = "serde"))]
use crate::CalendarUnit;

/// The longest span a calendar quota counts in: a leap year and a day
/// (a time zone's offset may change within the year).
pub const MAX_CALENDAR_SPAN_US: u64 = 367 * 86_400_000_000;

/// What a calendar quota tells a call whose span has ended at the store's
/// clock (Redis `TIME` ahead of the clock that chose the span) to wait:
/// the call admits nothing, and the caller's clock reaches the next span
/// within its skew.
pub const CALENDAR_ENDED_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

impl Limit {
    /// A calendar quota: `limit` per span of `every` (a day, a week, a
    /// month, a year in a time zone, from an anchor). The span's end is the
    /// exact reset clients are told.
    ///
    /// ```
    /// use tollgate_limiter::{CalendarUnit, Limit, Recurrence};
    /// let monthly = Recurrence::new(CalendarUnit::Month, "Europe/Berlin", "2025-01-01T00:00")?;
    /// let quota = Limit::calendar(10_000, monthly)?;
    /// assert_eq!(quota.capacity(), 10_000);
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    #[cfg(feature = "calendar")]
    #[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
    pub fn calendar(limit: u64, every: Recurrence) -> Result<Self, PolicyError> {
        Calendar::every(limit, every).map(Limit::Calendar)
    }
}

/// Calendar quota parameters: a limit per span of a [`Schedule`].
///
/// Stores receive one span, the schedule resolved at the instant of the
/// decision ([`Schedule::Span`]); the state holds the span it counts
/// (`[count, start, end]`), and a state holding a later span than the one
/// asked about wins, so a caller whose clock lags at a boundary counts in
/// the span another caller already began.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    limit: u64,
    schedule: Schedule,
}

/// The spans a calendar quota counts in.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Schedule {
    /// One span, `[start, end)` in µs since the Unix epoch: a schedule
    /// resolved at one instant, as the Redis script and the native module
    /// receive it.
    Span {
        /// Its first µs.
        start: u64,
        /// The µs after its last.
        end: u64,
    },
    /// Calendar spans in a time zone (shared: every copy of the limit
    /// remembers the span last found).
    #[cfg(feature = "calendar")]
    #[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
    Every(std::sync::Arc<Recurrence>),
}

impl Calendar {
    /// One span's quota: `limit` over `[start, end)` (µs since the
    /// epoch), at most [`MAX_CALENDAR_SPAN_US`] long.
    ///
    /// ```
    /// use tollgate_limiter::Calendar;
    /// let day = Calendar::span(5, 1_800_000_000_000_000, 1_800_086_400_000_000)?;
    /// assert_eq!(day.span_at(1_800_000_000_000_001), (1_800_000_000_000_000, 1_800_086_400_000_000));
    /// assert!(Calendar::span(5, 10, 10).is_err());
    /// # Ok::<(), tollgate_limiter::PolicyError>(())
    /// ```
    pub fn span(limit: u64, start: u64, end: u64) -> Result<Self, PolicyError> {
        check_count("limit", limit, MAX_COUNT)?;
        if !Self::is_span(start, end) {
            return Err(PolicyError::new(
                "span",
                format!("[{start}, {end}) µs must be a span of 1 µs to 367 days"),
            ));
        }
        Ok(Calendar {
            limit,
            schedule: Schedule::Span { start, end },
        })
    }

    /// `limit` per span of `every`; see [`Limit::calendar`].
    #[cfg(feature = "calendar")]
    #[cfg_attr(docsrs, doc(cfg(feature = "calendar")))]
    pub fn every(limit: u64, every: Recurrence) -> Result<Self, PolicyError> {
        check_count("limit", limit, MAX_COUNT)?;
        Ok(Calendar {
            limit,
            schedule: Schedule::Every(std::sync::Arc::new(every)),
        })
    }

    /// Whether `[start, end)` (µs) is a span a calendar quota can count
    /// in: 1 µs to [`MAX_CALENDAR_SPAN_US`] long.
    pub fn is_span(start: u64, end: u64) -> bool {
        start < end && end - start <= MAX_CALENDAR_SPAN_US
    }

    /// Units admitted per span.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Its spans.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The span holding `now` (µs): `[start, end)` in µs. A single
    /// [`Schedule::Span`] is its own answer at any time.
    #[inline]
    #[cfg_attr(not(feature = "calendar"), expect(unused_variables))]
    pub fn span_at(&self, now: u64) -> (u64, u64) {
        match &self.schedule {
            Schedule::Span { start, end } => (*start, *end),
            #[cfg(feature = "calendar")]
            Schedule::Every(every) => every.span_at(now),
        }
    }

    fn nominal_us(&self) -> u64 {
        match &self.schedule {
            Schedule::Span { start, end } => end - start,
            #[cfg(feature = "calendar")]
            Schedule::Every(every) => every.unit().nominal_us(),
        }
    }
}

#[cfg(feature = "serde")]
/// A calendar quota as written in a configuration file
/// (`algorithm = "calendar"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarSpec {
    /// Units per span.
    pub limit: u64,
    /// `"day"`, `"week"`, `"month"` or `"year"`.
    pub per: String,
    /// An IANA time zone name (`"UTC"`, `"America/New_York"`).
    pub time_zone: String,
    /// The civil date-time the spans recur from, in `time_zone`
    /// (`"2025-01-01T00:00"`: calendar months; `"2025-01-17T00:00"`:
    /// billing months from the 17th).
    pub from: String,
}

impl Parameters for Calendar {
    const KEY_CODE: &'static str = "cal";
    // [count, its span's start (µs), its span's end (µs)]
    const LAYOUT: Layout = Layout::Cells {
        cells: 3,
        time_cell: 1,
    };
    const FIELDS: &'static [(&'static str, FieldKind)] = &[
        ("limit", FieldKind::Count),
        ("per", FieldKind::Text),
        ("time_zone", FieldKind::Text),
        ("from", FieldKind::Text),
    ];
    #[cfg(feature = "serde")]
    type Spec = CalendarSpec;

    #[cfg(feature = "serde")]
    #[cfg(feature = "calendar")]
    fn from_spec(s: &CalendarSpec) -> Result<Self, PolicyError> {
        let unit: CalendarUnit = s.per.parse()?;
        Self::every(s.limit, Recurrence::new(unit, &s.time_zone, &s.from)?)
    }
    #[cfg(feature = "serde")]
    #[cfg(not(feature = "calendar"))]
    fn from_spec(_: &CalendarSpec) -> Result<Self, PolicyError> {
        Err(PolicyError::new(
            "algorithm",
            "calendar quotas need Tollgate's `calendar` cargo feature",
        ))
    }
    #[inline]
    fn capacity_of(&self) -> u64 {
        self.limit
    }
    /// The unit's usual length (a month: 30 days); the exact end of the
    /// current span is each verdict's reset.
    fn announced_window_us(&self) -> u64 {
        self.nominal_us()
    }
    fn rate(&self) -> (u64, u64) {
        (self.limit, self.nominal_us())
    }
    fn shared(&self, instances: u64) -> Result<Self, PolicyError> {
        Ok(Calendar {
            limit: share(self.limit, instances),
            schedule: self.schedule.clone(),
        })
    }
}
