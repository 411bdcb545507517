//! A limit as a layer's arguments carry it: its algorithm's code and three
//! numbers (the protocol's form of the core's `Limit`, read through the
//! parameters' public accessors and built back with their validating
//! constructors).

use std::time::Duration;

use tollgate_limiter::{Builtin, Calendar, Gcra, Limit, PolicyError, Timestamp, TokenBucket};

const TOKEN_BUCKET: u8 = 1;
const GCRA: u8 = 2;
const FIXED_WINDOW: u8 = 3;
const SLIDING_WINDOW: u8 = 4;
const SLIDING_LOG: u8 = 5;
const CALENDAR: u8 = 6;
const CONCURRENCY: u8 = 7;

/// Each built-in algorithm's code, by its name: the number a layer's first
/// argument names it by. A new algorithm takes the next number; a number
/// is never reused. (The Lua code's `local TOKEN_BUCKET = 1`, … and its
/// tables by code are generated from this list.)
pub const ALGORITHM_CODES: [(&str, u8); 7] = [
    ("token_bucket", TOKEN_BUCKET),
    ("gcra", GCRA),
    ("fixed_window", FIXED_WINDOW),
    ("sliding_window", SLIDING_WINDOW),
    ("sliding_log", SLIDING_LOG),
    ("calendar", CALENDAR),
    ("concurrency", CONCURRENCY),
];

/// Added to an algorithm's code when the layer's state records the rate
/// it was written at ([`Limit::keeping_units`]): a plan's token bucket or
/// GCRA.
pub const KEEPS_UNITS: u8 = 0x80;

/// The code of a built-in algorithm (see [`ALGORITHM_CODES`]).
///
/// ```
/// use tollgate_limiter::Builtin;
/// assert_eq!(tollgate_redis_protocol::algorithm_code(Builtin::named("gcra").unwrap()), 2);
/// ```
pub fn algorithm_code(builtin: &Builtin) -> u8 {
    ALGORITHM_CODES
        .iter()
        .find(|(name, _)| *name == builtin.name)
        .map(|&(_, code)| code)
        .expect("every built-in algorithm has a code (a unit test holds the list to the registry)")
}

/// The built-in algorithm a layer's code names, the [`KEEPS_UNITS`] flag
/// aside; `None` for a code no algorithm has.
///
/// ```
/// let gcra = tollgate_redis_protocol::algorithm_of(2 | 0x80).unwrap();
/// assert_eq!(gcra.name, "gcra");
/// assert!(tollgate_redis_protocol::algorithm_of(99).is_none());
/// ```
pub fn algorithm_of(code: u64) -> Option<&'static Builtin> {
    let code = code & !u64::from(KEEPS_UNITS);
    // The list is in the registry's order (a unit test holds it there):
    // the code's place is the algorithm's.
    let place = ALGORITHM_CODES
        .iter()
        .position(|&(_, c)| u64::from(c) == code)?;
    Builtin::all().get(place)
}

/// `limit`'s code and three parameters for a decision at `now`; `None`
/// for a custom algorithm (the Lua and the module run only the built-ins).
/// The first parameter is what a blocked layer reports as its limit. Only
/// a calendar quota's depend on `now`: they carry the span holding it.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, Timestamp};
/// use tollgate_redis_protocol::{limit_args, limit_from_args};
/// let limit = Limit::fixed_window(10, Duration::from_secs(1))?;
/// let (code, args) = limit_args(&limit, Timestamp::EARLIEST).unwrap();
/// assert_eq!((code, args), (3, [10, 1_000_000, 0]));
/// assert_eq!(limit_from_args(code.into(), args)?, limit);
/// assert!(limit_from_args(99, args).is_err());
/// # Ok::<(), tollgate_limiter::PolicyError>(())
/// ```
#[inline]
pub fn limit_args(limit: &Limit, now: Timestamp) -> Option<(u8, [u64; 3])> {
    let kept = |keeps: bool| if keeps { KEEPS_UNITS } else { 0 };
    Some(match limit {
        Limit::TokenBucket(b) => (
            TOKEN_BUCKET | kept(b.keeps_units()),
            [b.capacity(), b.refill(), b.period_us()],
        ),
        Limit::Gcra(g) => (
            GCRA | kept(g.keeps_units()),
            [g.burst(), g.interval_us(), 0],
        ),
        Limit::FixedWindow(w) => (FIXED_WINDOW, [w.limit(), w.window_us(), 0]),
        Limit::SlidingWindow(w) => (SLIDING_WINDOW, [w.limit(), w.window_us(), 0]),
        Limit::SlidingLog(w) => (SLIDING_LOG, [w.limit(), w.window_us(), 0]),
        Limit::Calendar(c) => {
            let (start, end) = c.span_at(now.as_micros());
            (CALENDAR, [c.limit(), start, end])
        }
        Limit::Concurrency(c) => (CONCURRENCY, [c.limit(), c.lease_us(), 0]),
        Limit::Custom(_) => return None,
    })
}

/// The limit [`limit_args`] gave `code` and `args` for, validated as its
/// constructor validates it (an error names the parameter, or `algorithm`
/// when no built-in algorithm has `code`). The [`KEEPS_UNITS`] flag on an
/// algorithm whose state counts units already (a window, a calendar
/// quota, a concurrency limit) changes nothing.
pub fn limit_from_args(code: u64, [p1, p2, p3]: [u64; 3]) -> Result<Limit, PolicyError> {
    let keeps = code & u64::from(KEEPS_UNITS) != 0;
    let micros = Duration::from_micros;
    // Matched on the number itself: the module decodes every layer of
    // every call here.
    let base = code & !u64::from(KEEPS_UNITS);
    let limit = match u8::try_from(base).unwrap_or(0) {
        TOKEN_BUCKET if keeps => {
            return TokenBucket::from_recorded_rate(p1, p2, micros(p3)).map(Limit::TokenBucket)
        }
        TOKEN_BUCKET => Limit::token_bucket(p1, p2, micros(p3))?,
        GCRA => Limit::Gcra(Gcra::from_interval(p1, micros(p2))?),
        FIXED_WINDOW => Limit::fixed_window(p1, micros(p2))?,
        SLIDING_WINDOW => Limit::sliding_window(p1, micros(p2))?,
        SLIDING_LOG => Limit::sliding_log(p1, micros(p2))?,
        CALENDAR => Limit::Calendar(Calendar::span(p1, p2, p3)?),
        CONCURRENCY => Limit::concurrency(p1, micros(p2))?,
        _ => {
            return Err(PolicyError::new(
                "algorithm",
                format!("no built-in algorithm has the code {code}"),
            ))
        }
    };
    Ok(if keeps { limit.keeping_units() } else { limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_built_in_has_one_code_in_the_registry_order() {
        let names: Vec<&str> = ALGORITHM_CODES.iter().map(|(name, _)| *name).collect();
        let registry: Vec<&str> = Builtin::all().iter().map(|b| b.name).collect();
        assert_eq!(names, registry);
        for (i, &(name, code)) in ALGORITHM_CODES.iter().enumerate() {
            assert!(code > 0 && code < KEEPS_UNITS, "{name}: {code}");
            assert!(ALGORITHM_CODES[i + 1..].iter().all(|&(_, c)| c != code));
            assert_eq!(algorithm_of(code.into()).map(|b| b.name), Some(name));
        }
    }

    /// One limit of every built-in algorithm, and a plan's of each that
    /// records its rate.
    fn samples() -> Vec<Limit> {
        let s = Duration::from_secs;
        let mut limits = vec![
            Limit::token_bucket(10, 10_000, s(1)).unwrap(),
            Limit::gcra(3, s(1), 5).unwrap(),
            Limit::fixed_window(10, s(60)).unwrap(),
            Limit::sliding_window(10, s(60)).unwrap(),
            Limit::sliding_log(10, s(60)).unwrap(),
            Limit::Calendar(Calendar::span(5, 1_000_000, 87_400_000_000).unwrap()),
            Limit::concurrency(4, s(30)).unwrap(),
        ];
        let kept: Vec<Limit> = limits.iter().map(Limit::keeping_units).collect();
        limits.extend(kept);
        limits
    }

    #[test]
    fn every_limit_comes_back_from_its_arguments() {
        let samples = samples();
        for b in Builtin::all() {
            assert!(samples.iter().any(|l| l.builtin() == Some(b)), "{}", b.name);
        }
        for limit in samples {
            let (code, args) = limit_args(&limit, Timestamp::from_micros(2_000_000)).unwrap();
            assert_eq!(code & KEEPS_UNITS != 0, limit.keeps_units(), "{limit:?}");
            assert_eq!(limit_from_args(code.into(), args).unwrap(), limit);
        }
    }

    #[test]
    fn arguments_no_constructor_accepts_are_refused() {
        let tb = u64::from(TOKEN_BUCKET);
        let err = |code: u64, args| limit_from_args(code, args).unwrap_err().field().to_string();
        assert_eq!(err(99, [1, 1, 1]), "algorithm");
        assert_eq!(err(0, [1, 1, 1]), "algorithm");
        assert_eq!(err(256 + tb, [1, 1, 1]), "algorithm");
        assert!(algorithm_of(256 + tb).is_none());
        assert_eq!(err(tb, [0, 1, 1_000_000]), "capacity");
        // A period below a millisecond only in a recorded rate's lowest terms.
        assert_eq!(err(tb, [10, 1, 100]), "period");
        assert!(limit_from_args(tb | u64::from(KEEPS_UNITS), [10, 1, 100]).is_ok());
        assert_eq!(
            err(tb | u64::from(KEEPS_UNITS), [10, 8_192, 1_000_000]),
            "refill"
        );
        assert_eq!(err(u64::from(CALENDAR), [5, 10, 10]), "span");
    }
}
