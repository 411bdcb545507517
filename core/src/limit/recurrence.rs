//! Calendar spans in a time zone: the day, week, month or year a calendar
//! quota counts in (feature `calendar`).
//!
//! Span `k` starts at the civil date-time `anchor + k units` in the zone
//! (k may be negative), so a month anchored on the 31st starts on the last
//! day of a shorter month and on the 31st again after it — never drifting
//! to the 28th. A start that falls in a daylight-saving gap moves forward
//! by the gap; one that falls in a repeated hour takes its first
//! occurrence (jiff's "compatible" rule, as RFC 5545 calendars do).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::Span;

use crate::error::PolicyError;

/// The calendar unit a span lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// A civil day: 23, 24 or 25 hours across daylight-saving changes.
    Day,
    /// Seven civil days, from the anchor's weekday (an ISO week from a
    /// Monday anchor: `"2024-12-30T00:00"`).
    Week,
    /// A calendar month: 28 to 31 days.
    Month,
    /// A calendar year: 365 or 366 days.
    Year,
}

impl CalendarUnit {
    /// Its name in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }

    /// Its usual length in µs (a month: 30 days), what headers announce
    /// as the window.
    pub(crate) fn nominal_us(self) -> u64 {
        const DAY: u64 = 86_400_000_000;
        match self {
            CalendarUnit::Day => DAY,
            CalendarUnit::Week => 7 * DAY,
            CalendarUnit::Month => 30 * DAY,
            CalendarUnit::Year => 365 * DAY,
        }
    }

    fn times(self, k: i64) -> Option<Span> {
        match self {
            CalendarUnit::Day => Span::new().try_days(k),
            CalendarUnit::Week => Span::new().try_weeks(k),
            CalendarUnit::Month => Span::new().try_months(k),
            CalendarUnit::Year => Span::new().try_years(k),
        }
        .ok()
    }

    /// Whole units from `from` to `to` by their dates, give or take one:
    /// a first guess that [`Recurrence::span_at`] corrects.
    fn guess(self, from: Date, to: Date) -> i64 {
        let months = |d: Date| i64::from(d.year()) * 12 + i64::from(d.month());
        match self {
            CalendarUnit::Day => epoch_days(to) - epoch_days(from),
            CalendarUnit::Week => (epoch_days(to) - epoch_days(from)).div_euclid(7),
            CalendarUnit::Month => months(to) - months(from),
            CalendarUnit::Year => i64::from(to.year()) - i64::from(from.year()),
        }
    }
}

impl FromStr for CalendarUnit {
    type Err = PolicyError;
    fn from_str(text: &str) -> Result<Self, PolicyError> {
        match text {
            "day" => Ok(CalendarUnit::Day),
            "week" => Ok(CalendarUnit::Week),
            "month" => Ok(CalendarUnit::Month),
            "year" => Ok(CalendarUnit::Year),
            other => Err(PolicyError::new(
                "per",
                format!("{other:?} is not a calendar unit: write \"day\", \"week\", \"month\" or \"year\""),
            )),
        }
    }
}

/// Days from 1970-01-01 to `date` (proleptic Gregorian).
fn epoch_days(date: Date) -> i64 {
    let (y, m, d) = (
        i64::from(date.year()),
        i64::from(date.month()),
        i64::from(date.day()),
    );
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Spans of one [`CalendarUnit`] in an IANA time zone, recurring from an
/// anchor: calendar months from the 1st at 00:00, or billing months from
/// the 17th at 00:00 in America/New_York.
///
/// ```
/// use tollgate_limiter::{CalendarUnit, Recurrence, Timestamp};
/// // Billing months from the 17th, New York time.
/// let billing = Recurrence::new(CalendarUnit::Month, "America/New_York", "2025-01-17T00:00")?;
/// // 2026-03-20 12:00 UTC lies in the span from 17 March (EDT, UTC-4)
/// // to 17 April.
/// let (start, end) = billing.span_at(1_774_008_000_000_000);
/// assert_eq!(start, 1_773_720_000_000_000); // 2026-03-17T04:00:00Z
/// assert_eq!(end, 1_776_398_400_000_000); // 2026-04-17T04:00:00Z
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
pub struct Recurrence {
    unit: CalendarUnit,
    zone_name: Box<str>,
    zone: TimeZone,
    anchor: DateTime,
    /// The span last found, as whole seconds `start << 32 | end` (0:
    /// none): spans start on whole seconds before 2106, so one atomic
    /// holds both ends, never torn. Most decisions fall in it and skip the
    /// time zone arithmetic (about 0.3 µs).
    last_span: AtomicU64,
}

impl Clone for Recurrence {
    fn clone(&self) -> Self {
        Recurrence {
            unit: self.unit,
            zone_name: self.zone_name.clone(),
            zone: self.zone.clone(),
            anchor: self.anchor,
            last_span: AtomicU64::new(self.last_span.load(Ordering::Relaxed)),
        }
    }
}

impl Recurrence {
    /// Spans of `unit` in `time_zone` (an IANA name: `"Europe/Berlin"`,
    /// `"UTC"`), the first starting at the civil date-time `from`
    /// (`"2025-01-01T00:00"`; its year between 1970 and 2100).
    pub fn new(unit: CalendarUnit, time_zone: &str, from: &str) -> Result<Self, PolicyError> {
        let zone = TimeZone::get(time_zone).map_err(|_| {
            PolicyError::new(
                "time_zone",
                format!("{time_zone:?} is not an IANA time zone name (such as \"UTC\" or \"Europe/Berlin\")"),
            )
        })?;
        Ok(Recurrence {
            unit,
            // As the database spells it (the lookup ignores case).
            zone_name: zone.iana_name().unwrap_or(time_zone).into(),
            zone,
            anchor: anchor(from)?,
            last_span: AtomicU64::new(0),
        })
    }

    /// Its unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// Its time zone's name.
    pub fn time_zone(&self) -> &str {
        &self.zone_name
    }

    /// The span holding `now` (µs since the Unix epoch): its start
    /// (inclusive) and end (exclusive), in µs. Within 1970–2100 there is
    /// always one; were the calendar ever to fail, the answer is an empty
    /// span, which admits nothing.
    pub fn span_at(&self, now: u64) -> (u64, u64) {
        let last = self.last_span.load(Ordering::Relaxed);
        let (start, end) = ((last >> 32) * 1_000_000, (last & 0xffff_ffff) * 1_000_000);
        if start <= now && now < end {
            return (start, end);
        }
        let Some((start, end)) = self.find_span(now) else {
            return (0, 0);
        };
        let whole = |us: u64| us.is_multiple_of(1_000_000).then_some(us / 1_000_000);
        if let (Some(s), Some(e)) = (whole(start), whole(end)) {
            if e <= u64::from(u32::MAX) {
                self.last_span.store(s << 32 | e, Ordering::Relaxed);
            }
        }
        (start, end)
    }

    /// [`span_at`](Self::span_at) by the calendar.
    fn find_span(&self, now: u64) -> Option<(u64, u64)> {
        let now = i64::try_from(now).ok()?;
        let civil = self
            .zone
            .to_datetime(jiff::Timestamp::from_microsecond(now).ok()?);
        let mut k = self.unit.guess(self.anchor.date(), civil.date());
        // The guess is off by at most one unit (the time of day, a
        // daylight-saving shift); a few steps settle it.
        for _ in 0..8 {
            let (start, end) = (self.start_of(k)?, self.start_of(k + 1)?);
            if start > now {
                k -= 1;
            } else if end <= now {
                k += 1;
            } else {
                return Some((micros(start), micros(end)));
            }
        }
        None
    }

    /// Span `k`'s start, µs since the epoch (`None` outside jiff's range,
    /// which anchors of 1970–2100 and times up to 2100 never reach).
    fn start_of(&self, k: i64) -> Option<i64> {
        let civil = self.anchor.checked_add(self.unit.times(k)?).ok()?;
        let start = self.zone.to_timestamp(civil).ok()?;
        Some(start.as_microsecond())
    }
}

/// The civil date-time `from`: no offset or zone (the zone is the
/// recurrence's), a year from 1970 to 2100, a whole second.
fn anchor(from: &str) -> Result<DateTime, PolicyError> {
    let bad = |why: String| PolicyError::new("from", format!("{from:?} {why}"));
    // The date, then nothing or `T` and the time's digits: any other form
    // jiff reads (a space or a `t` before the time, an offset, a `[zone]`)
    // could carry an offset or a zone that parsing would drop unsaid.
    let rest = from.get(10..).unwrap_or("");
    let plain_time = |t: &str| {
        t.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, ':' | '.'))
    };
    let shaped = match rest.strip_prefix('T') {
        Some(time) => plain_time(time),
        None => rest.is_empty(),
    };
    if !shaped {
        return Err(bad(
            "has an offset, a zone or another form: write the civil date-time alone (\"2025-01-17T00:00\"); the zone is time_zone".into(),
        ));
    }
    let anchor: DateTime = from.parse().map_err(|e| {
        bad(format!(
            "is not a civil date-time ({e}): write it as \"2025-01-17T00:00\""
        ))
    })?;
    if !(1970..=2100).contains(&anchor.year()) {
        return Err(bad("must lie between the years 1970 and 2100".into()));
    }
    if anchor.subsec_nanosecond() != 0 {
        return Err(bad("must fall on a whole second".into()));
    }
    Ok(anchor)
}

/// A start or end in µs; one before the epoch is the epoch.
fn micros(us: i64) -> u64 {
    u64::try_from(us).unwrap_or(0)
}

impl PartialEq for Recurrence {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone_name == other.zone_name && self.anchor == other.anchor
    }
}

impl fmt::Debug for Recurrence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Recurrence({} from {} {})",
            self.unit.name(),
            self.anchor,
            self.zone_name
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The remembered span answers only for times inside it: times back
    /// and forth across many spans read what the calendar says.
    #[test]
    fn the_remembered_span_is_the_calendars() {
        for unit in [CalendarUnit::Day, CalendarUnit::Month] {
            let every = Recurrence::new(unit, "Europe/Berlin", "2025-01-31T02:30").unwrap();
            let mut t: u64 = 1_770_000_000_000_000;
            for i in 0..2_000u64 {
                // Forward by odd hours, back now and then.
                t = if i % 7 == 0 {
                    t - 50_000_000_000
                } else {
                    t + 37_000_000_000
                };
                assert_eq!(
                    Some(every.span_at(t)),
                    every.find_span(t),
                    "{unit:?} at {t}"
                );
            }
        }
    }

    #[test]
    fn an_anchor_falls_on_a_whole_second() {
        let e = Recurrence::new(CalendarUnit::Day, "UTC", "2025-01-01T00:00:00.5").unwrap_err();
        assert_eq!(e.field(), "from");
    }

    #[test]
    fn epoch_days_counts_from_1970() {
        for (y, m, d) in [(1970, 1, 1), (2000, 2, 29), (2024, 12, 31), (2100, 3, 1)] {
            let date = jiff::civil::date(y, m, d);
            let expected = date
                .since(jiff::civil::date(1970, 1, 1))
                .unwrap()
                .get_days();
            assert_eq!(epoch_days(date), i64::from(expected), "{date}");
        }
    }
}
