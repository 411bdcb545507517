//! A policy as Envoy expresses a limit: requests per second, minute, hour
//! or day.

use std::time::Duration;

use tollgate_limiter::Limit;

/// Envoy's units, in seconds, with their protobuf numbers
/// (`RateLimitResponse.RateLimit.Unit`).
const UNITS: [(u64, i32, &str); 4] = [
    (1, 1, "SECOND"),
    (60, 2, "MINUTE"),
    (3600, 3, "HOUR"),
    (86_400, 4, "DAY"),
];

/// A limit in Envoy's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyLimit {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit's protobuf number.
    pub unit: i32,
    /// The unit's name (`SECOND`, `MINUTE`, `HOUR`, `DAY`).
    pub unit_name: &'static str,
    /// Whether the figure is exact (a count over exactly one unit, or one
    /// that scales to a whole count of the next unit up); otherwise it is
    /// the whole number of requests the policy allows per that unit,
    /// rounded down (at least 1).
    pub exact: bool,
}

/// What `limit` allows over what time: a window's limit per window; a token
/// bucket's refill per period (its sustained rate); GCRA's burst per the
/// time the burst takes to come back (its rate).
pub fn rate(limit: &Limit) -> Option<(u64, Duration)> {
    Some(match limit {
        Limit::TokenBucket(p) => (p.refill(), Duration::from_micros(p.period_us())),
        Limit::Gcra(p) => (
            p.burst(),
            Duration::from_micros(p.burst() * p.interval_us()),
        ),
        Limit::FixedWindow(p) | Limit::SlidingWindow(p) | Limit::SlidingLog(p) => {
            (p.limit(), Duration::from_micros(p.window_us()))
        }
        _ => return None,
    })
}

/// `limit` as Envoy's `requests_per_unit` and `unit`: the unit equal to
/// the policy's period when there is one; else the smallest unit at least
/// as long, with the count scaled to it (exact when it scales to a whole
/// number); a period longer than a day is sent per day. `None` for a custom
/// algorithm.
pub fn envoy_limit(limit: &Limit) -> Option<EnvoyLimit> {
    let (count, per) = rate(limit)?;
    let per_us = per.as_micros().max(1);
    let (secs, unit, unit_name) = UNITS
        .into_iter()
        .find(|(secs, _, _)| u128::from(*secs) * 1_000_000 >= per_us)
        .unwrap_or(UNITS[3]);
    let scaled = u128::from(count) * u128::from(secs) * 1_000_000;
    let requests = (scaled / per_us).max(1);
    Some(EnvoyLimit {
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit,
        unit_name,
        exact: scaled % per_us == 0 && requests <= u128::from(u32::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(limit: Limit) -> (u32, &'static str, bool) {
        let e = envoy_limit(&limit).unwrap();
        (e.requests_per_unit, e.unit_name, e.exact)
    }

    #[test]
    fn policies_map_to_the_closest_exact_unit() {
        let s = Duration::from_secs;
        assert_eq!(
            of(Limit::fixed_window(100, s(60)).unwrap()),
            (100, "MINUTE", true)
        );
        assert_eq!(
            of(Limit::sliding_log(5, s(1)).unwrap()),
            (5, "SECOND", true)
        );
        assert_eq!(
            of(Limit::sliding_window(10, s(30)).unwrap()),
            (20, "MINUTE", true)
        );
        assert_eq!(
            of(Limit::token_bucket(50, 10, s(1)).unwrap()),
            (10, "SECOND", true)
        );
        assert_eq!(of(Limit::gcra(6, s(60), 3).unwrap()), (6, "MINUTE", true));
        assert_eq!(
            of(Limit::fixed_window(7, s(45)).unwrap()),
            (9, "MINUTE", false)
        );
        assert_eq!(
            of(Limit::fixed_window(10, s(7 * 86_400)).unwrap()),
            (1, "DAY", false)
        );
    }
}
