//! A policy as Envoy expresses a limit: requests per second, minute, hour,
//! day, week, month or year.

use tollgate_limiter::{Limit, Schedule};

/// Envoy's units, in seconds, with their protobuf numbers
/// (`RateLimitResponse.RateLimit.Unit`); a month and a year as
/// envoyproxy/ratelimit counts them (30 and 365 days).
const UNITS: [(u64, i32, &str); 7] = [
    (1, 1, "SECOND"),
    (60, 2, "MINUTE"),
    (3600, 3, "HOUR"),
    (86_400, 4, "DAY"),
    (7 * 86_400, 7, "WEEK"),
    (30 * 86_400, 5, "MONTH"),
    (365 * 86_400, 6, "YEAR"),
];

/// A limit in Envoy's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit's protobuf number.
    pub unit: i32,
    /// The unit's name (`SECOND`, `MINUTE`, `HOUR`, `DAY`, `WEEK`,
    /// `MONTH`, `YEAR`).
    pub unit_name: &'static str,
    /// Whether the figure is exact (a count over exactly one unit, or one
    /// that scales to a whole count of a longer unit; a calendar quota's
    /// limit per its unit); otherwise it is the whole number of requests
    /// the policy allows per that unit, rounded down (at least 1).
    pub exact: bool,
}

/// `limit` as Envoy's `requests_per_unit` and `unit`: the first unit, from
/// the smallest at least as long as the policy's period up to a year, in
/// which its rate is a whole number of requests (exact); when there is
/// none, the smallest such unit with the count rounded down (at least 1).
/// A calendar quota is its limit per its calendar unit, exact. `None` for
/// a custom algorithm.
pub fn envoy_limit(limit: &Limit) -> Option<EnvoyLimit> {
    if let Some(calendar) = calendar_limit(limit) {
        return Some(calendar);
    }
    let (count, per) = limit.rate()?;
    let per_us = per.as_micros().max(1);
    let mut candidates: Vec<(u64, i32, &'static str)> = UNITS
        .into_iter()
        .filter(|(secs, _, _)| u128::from(*secs) * 1_000_000 >= per_us)
        .collect();
    if candidates.is_empty() {
        candidates.push(UNITS[UNITS.len() - 1]);
    }
    let in_unit = |secs: u64| u128::from(count) * u128::from(secs) * 1_000_000;
    let fits =
        |scaled: u128| scaled.is_multiple_of(per_us) && scaled / per_us <= u128::from(u32::MAX);
    let (secs, unit, unit_name) = candidates
        .iter()
        .copied()
        .find(|(secs, _, _)| fits(in_unit(*secs)))
        .unwrap_or(candidates[0]);
    let scaled = in_unit(secs);
    let requests = (scaled / per_us).max(1);
    Some(EnvoyLimit {
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit,
        unit_name,
        exact: fits(scaled),
    })
}

/// Envoy's unit numbered `number` (`RateLimitUnit`): its name and length
/// in seconds; `None` for `UNKNOWN` and numbers Envoy does not define.
pub(crate) fn unit_numbered(number: i32) -> Option<(&'static str, u64)> {
    UNITS
        .iter()
        .find(|(_, n, _)| *n == number)
        .map(|(secs, _, name)| (*name, *secs))
}

/// Envoy's unit named `name` (any case, as envoyproxy/ratelimit's files
/// write it): its length in seconds, protobuf number and name.
pub(crate) fn unit_named(name: &str) -> Option<(u64, i32, &'static str)> {
    UNITS
        .iter()
        .copied()
        .find(|(_, _, n)| n.eq_ignore_ascii_case(name))
}

/// A calendar quota per its unit: a day, week, month or year of the
/// calendar (in its time zone) is what the unit says.
fn calendar_limit(limit: &Limit) -> Option<EnvoyLimit> {
    let Limit::Calendar(calendar) = limit else {
        return None;
    };
    let Schedule::Every(every) = calendar.schedule() else {
        return None;
    };
    // Envoy's day, week, month and year are the calendar units' names.
    let (_, unit, unit_name) = unit_named(every.unit().name())?;
    Some(EnvoyLimit {
        requests_per_unit: u32::try_from(calendar.limit()).unwrap_or(u32::MAX),
        unit,
        unit_name,
        exact: true,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn of(limit: Limit) -> (u32, &'static str, bool) {
        let e = envoy_limit(&limit).unwrap();
        (e.requests_per_unit, e.unit_name, e.exact)
    }

    #[test]
    fn policies_map_to_the_closest_exact_unit() {
        let s = Duration::from_secs;
        let cases = [
            (Limit::fixed_window(100, s(60)), (100, "MINUTE", true)),
            (Limit::sliding_log(5, s(1)), (5, "SECOND", true)),
            (Limit::sliding_window(10, s(30)), (20, "MINUTE", true)),
            (Limit::token_bucket(50, 10, s(1)), (10, "SECOND", true)),
            (Limit::gcra(6, s(60), 3), (6, "MINUTE", true)),
            (Limit::gcra(100, s(60), 1), (100, "MINUTE", true)),
            (Limit::fixed_window(7, s(45)), (560, "HOUR", true)),
            (Limit::fixed_window(7, s(49)), (86_400, "WEEK", true)),
            (Limit::fixed_window(7, s(47)), (8, "MINUTE", false)),
            (Limit::fixed_window(10, s(7 * 86_400)), (10, "WEEK", true)),
            (Limit::fixed_window(10, s(3 * 86_400)), (100, "MONTH", true)),
            (Limit::fixed_window(10, s(30 * 86_400)), (10, "MONTH", true)),
            (Limit::fixed_window(7, s(366 * 86_400)), (6, "YEAR", false)),
        ];
        for (limit, expected) in cases {
            let limit = limit.unwrap();
            assert_eq!(of(limit.clone()), expected, "{limit:?}");
        }
    }

    #[test]
    fn calendar_quotas_are_their_limit_per_their_unit() {
        use tollgate_limiter::{CalendarUnit, Recurrence};
        for (unit, name) in [
            (CalendarUnit::Day, "DAY"),
            (CalendarUnit::Week, "WEEK"),
            (CalendarUnit::Month, "MONTH"),
            (CalendarUnit::Year, "YEAR"),
        ] {
            let every = Recurrence::new(unit, "Europe/Berlin", "2025-01-01T00:00").unwrap();
            let limit = Limit::calendar(10_000, every).unwrap();
            assert_eq!(of(limit), (10_000, name, true));
        }
    }
}
