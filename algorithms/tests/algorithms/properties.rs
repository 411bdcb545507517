//! Property tests: random request sequences against brute-force models.

use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::{CalendarUnit, Limit, Recurrence, State, Timestamp};

const T0: u64 = 1_780_000_000_000_000;

/// A step: advance the clock by `dt` µs (sometimes backwards), then request `cost`.
#[derive(Debug, Clone, Copy)]
struct Step {
    dt: i64,
    cost: u64,
}

fn steps(max_cost: u64, max_dt: i64) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        prop_oneof![
            4 => 0..max_dt,
            2 => Just(0i64),
            1 => -max_dt..0, // the clock steps back
        ],
        1..=max_cost,
    )
        .prop_map(|(dt, cost)| Step { dt, cost });
    prop::collection::vec(step, 1..300)
}

/// Run `steps`; returns (effective time, cost) of each admitted request.
/// The effective time is `max(now, effective time of the last admitted
/// request)`: denials write nothing, so only admitted requests move the
/// stored time, and that stored time never goes back.
fn run(limit: &Limit, steps: &[Step]) -> Vec<(u64, u64)> {
    let (mut now, mut latest) = (T0, 0);
    let mut state: Option<State> = None;
    let mut expires_at = 0;
    let mut admitted = Vec::new();
    for step in steps {
        now = now.saturating_add_signed(step.dt);
        if now >= expires_at {
            state = None;
        }
        let t = tollgate_algorithms::decide(
            limit,
            state.as_ref(),
            Timestamp::from_micros(now),
            step.cost,
        );
        if let Some(next) = t.next {
            expires_at = now + next.ttl.as_micros() as u64;
            state = Some(next.state);
        }
        if t.verdict.allowed {
            latest = latest.max(now);
            admitted.push((latest, step.cost));
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// Fixed window: no aligned window ever holds more than the limit.
    #[test]
    fn fixed_window_never_exceeds_the_limit_in_a_window(limit in 1u64..20, window_ms in 1u64..500, s in steps(5, 300_000)) {
        let policy = Limit::fixed_window(limit, Duration::from_millis(window_ms)).unwrap();
        let w = window_ms * 1000;
        let admitted = run(&policy, &s.into_iter().map(|st| Step { cost: st.cost.min(limit), ..st }).collect::<Vec<_>>());
        let mut per_window = std::collections::HashMap::new();
        for (t, cost) in admitted {
            *per_window.entry(t / w).or_insert(0) += cost;
        }
        for (window, total) in per_window {
            prop_assert!(total <= limit, "window {window} admitted {total} > {limit}");
        }
    }

    /// Calendar quota: no day of the calendar ever holds more than the
    /// limit, the clock stepping back across midnight included (the
    /// daylight-saving days themselves: `core/tests/limiter/calendar.rs` and the
    /// Redis differential).
    #[test]
    fn calendar_never_exceeds_the_limit_in_a_span(
        limit in 1u64..20,
        zone in prop_oneof![Just("Europe/Berlin"), Just("Australia/Lord_Howe")],
        s in steps(5, 4 * 3_600_000_000),
    ) {
        let days = Recurrence::new(CalendarUnit::Day, zone, "2025-01-01T00:00").unwrap();
        let policy = Limit::calendar(limit, days.clone()).unwrap();
        let admitted = run(&policy, &s.into_iter().map(|st| Step { cost: st.cost.min(limit), ..st }).collect::<Vec<_>>());
        let mut per_span = std::collections::HashMap::new();
        for (t, cost) in admitted {
            *per_span.entry(days.span_at(t).0).or_insert(0) += cost;
        }
        for (span, total) in per_span {
            prop_assert!(total <= limit, "the day from {span} admitted {total} > {limit}");
        }
    }

    /// Sliding log: no interval of one window length holds more than the limit.
    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_window(limit in 1u64..20, window_ms in 1u64..500, s in steps(5, 300_000)) {
        let policy = Limit::sliding_log(limit, Duration::from_millis(window_ms)).unwrap();
        let w = window_ms * 1000;
        let admitted = run(&policy, &s.into_iter().map(|st| Step { cost: st.cost.min(limit), ..st }).collect::<Vec<_>>());
        for (i, &(end, _)) in admitted.iter().enumerate() {
            let in_window: u64 = admitted[..=i].iter().filter(|(t, _)| t + w > end).map(|(_, c)| c).sum();
            prop_assert!(in_window <= limit, "{in_window} admitted in the window ending {end}");
        }
    }

    /// Sliding window counter: no aligned window holds more than the limit.
    #[test]
    fn sliding_window_never_exceeds_the_limit_in_a_window(limit in 1u64..20, window_ms in 1u64..500, s in steps(5, 300_000)) {
        let policy = Limit::sliding_window(limit, Duration::from_millis(window_ms)).unwrap();
        let w = window_ms * 1000;
        let admitted = run(&policy, &s.into_iter().map(|st| Step { cost: st.cost.min(limit), ..st }).collect::<Vec<_>>());
        let mut per_window = std::collections::HashMap::new();
        for (t, cost) in admitted {
            *per_window.entry(t / w).or_insert(0) += cost;
        }
        prop_assert!(per_window.values().all(|&total| total <= limit));
    }

    /// Token bucket and GCRA: over any interval [a, b], at most
    /// `capacity + rate × (b − a)` units pass.
    #[test]
    fn buckets_never_exceed_capacity_plus_rate_times_interval(
        capacity in 1u64..20, rate in 1u64..50, period_ms in 1u64..2_000, gcra in any::<bool>(), s in steps(5, 200_000),
    ) {
        let period = Duration::from_millis(period_ms);
        let policy = if gcra { Limit::gcra(rate, period, capacity) } else { Limit::token_bucket(capacity, rate, period) };
        let Ok(policy) = policy else { return Ok(()) };
        let p = period_ms * 1000;
        let admitted = run(&policy, &s.into_iter().map(|st| Step { cost: st.cost.min(capacity), ..st }).collect::<Vec<_>>());
        for i in 0..admitted.len() {
            let mut total = 0u64;
            for &(t, cost) in &admitted[i..] {
                total += cost;
                let span = t - admitted[i].0;
                // total ≤ capacity + rate × span / p, multiplied out by p.
                prop_assert!(total * p <= capacity * p + rate * span,
                    "{total} admitted within {span}µs (capacity {capacity}, {rate} per {p}µs)");
            }
        }
    }

    /// With an emission interval of whole microseconds, GCRA is the token
    /// bucket: both admit exactly the same requests, the clock stepping
    /// back included (neither keeps a time besides when it is full again).
    #[test]
    fn gcra_and_token_bucket_agree(capacity in 1u64..20, rate in 1u64..50, interval_ms in 1u64..100, s in steps(5, 200_000)) {
        let period = Duration::from_millis(interval_ms * rate);
        let tb = Limit::token_bucket(capacity, rate, period).unwrap();
        let g = Limit::gcra(rate, period, capacity).unwrap();
        let s: Vec<Step> = s.into_iter().map(|st| Step { cost: st.cost.min(capacity), ..st }).collect();
        prop_assert_eq!(run(&tb, &s), run(&g, &s));
    }

    /// Retry-after is exact for every algorithm: waiting exactly that long
    /// admits the same request, one microsecond less does not.
    #[test]
    fn retry_after_is_exact(which in 0usize..6, capacity in 1u64..10, period_ms in 1u64..1_000, s in steps(4, 100_000)) {
        let period = Duration::from_millis(period_ms);
        let limit = match which {
            0 => Limit::token_bucket(capacity, capacity, period),
            1 => Limit::gcra(capacity, period, capacity),
            2 => Limit::fixed_window(capacity, period),
            3 => Limit::sliding_window(capacity, period),
            4 => Limit::sliding_log(capacity, period),
            _ => Limit::calendar(capacity, Recurrence::new(CalendarUnit::Day, "UTC", "2025-01-01T00:00").unwrap()),
        };
        let Ok(limit) = limit else { return Ok(()) };
        let mut now = T0;
        let mut state: Option<State> = None;
        for step in s {
            now = now.saturating_add_signed(step.dt.max(0));
            let cost = step.cost.min(capacity);
            let t = tollgate_algorithms::decide(&limit, state.as_ref(), Timestamp::from_micros(now), cost);
            if let Some(wait) = t.verdict.retry_after {
                let wait = wait.as_micros() as u64;
                let at = |dt: u64| tollgate_algorithms::decide(&limit, state.as_ref(), Timestamp::from_micros(now + dt), cost).verdict.allowed;
                prop_assert!(at(wait), "{}: not admitted after retry-after {wait}µs", limit.algorithm_name());
                prop_assert!(wait == 0 || !at(wait - 1), "{}: admitted before retry-after {wait}µs", limit.algorithm_name());
            }
            if let Some(next) = t.next {
                state = Some(next.state);
            }
        }
    }
}

/// The verdicts of `run` on every step (admitted or not, remaining).
fn verdicts(limit: &Limit, steps: &[Step]) -> Vec<(bool, u64)> {
    let mut now = T0;
    let mut state: Option<State> = None;
    steps
        .iter()
        .map(|step| {
            now = now.saturating_add_signed(step.dt);
            let at = Timestamp::from_micros(now);
            let t = tollgate_algorithms::decide(limit, state.as_ref(), at, step.cost);
            if let Some(next) = t.next {
                state = Some(next.state);
            }
            (t.verdict.allowed, t.verdict.remaining)
        })
        .collect()
}

proptest! {
    /// A bucket that keeps units (a plan's layer) decides exactly as one
    /// that does not while its rate does not change: the token bucket's
    /// rate in lowest terms and the record change nothing.
    #[test]
    fn keeping_units_changes_nothing_at_one_rate(
        capacity in 1u64..20, refill in 1u64..200, period_ms in 1u64..2_000, gcra in any::<bool>(),
        s in steps(5, 300_000),
    ) {
        let period = Duration::from_millis(period_ms);
        let limit = if gcra {
            Limit::gcra(refill.min(period_ms * 1_000), period, capacity)
        } else {
            Limit::token_bucket(capacity, refill, period)
        };
        let Ok(limit) = limit else { return Ok(()) };
        let s: Vec<Step> = s.into_iter().map(|st| Step { cost: st.cost.min(capacity), ..st }).collect();
        prop_assert!(limit.keeping_units().keeps_units());
        prop_assert_eq!(verdicts(&limit, &s), verdicts(&limit.keeping_units(), &s));
    }

    /// Read at another rate, a token bucket's state holds the units it had
    /// used, rounded up: `⌈(until full × refill − remainder) ÷ period⌉` at
    /// the rate it was written at, checked against 128-bit arithmetic
    /// through what a one-unit peek at the new rate reports.
    #[test]
    fn a_rate_change_keeps_the_units_used(
        used in 0u64..=40, capacity in 40u64..=60, refill in 1u64..=300, period_ms in 1u64..=5_000, dt in 0u64..10_000_000,
    ) {
        let old = Limit::token_bucket(capacity, refill, Duration::from_millis(period_ms)).unwrap().keeping_units();
        let new = Limit::token_bucket(100, 7, Duration::from_secs(1)).unwrap().keeping_units();
        let Limit::TokenBucket(b) = &old else { unreachable!() };
        let (r, p) = (u128::from(b.refill()), u128::from(b.period_us()));
        let mut state = None;
        if used > 0 {
            let t = tollgate_algorithms::decide(&old, None, Timestamp::from_micros(T0), used);
            state = t.next.map(|n| n.state);
        }
        let now = T0 + dt;
        let Some(State::Cells([full_at, remainder, _])) = state.clone() else {
            let peek = tollgate_algorithms::decide(&new, None, Timestamp::from_micros(now), 1);
            prop_assert_eq!(peek.verdict.remaining, 99);
            return Ok(());
        };
        let until_full = u128::from(full_at.saturating_sub(now));
        let expected = (until_full * r).saturating_sub(u128::from(remainder)).div_ceil(p);
        let peek = tollgate_algorithms::decide(&new, state.as_ref(), Timestamp::from_micros(now), 1);
        prop_assert!(peek.verdict.allowed);
        prop_assert_eq!(u128::from(peek.verdict.remaining), 100 - 1 - expected);
    }
}

/// The units read at another rate when the time until full is a whole
/// number of the old periods and the remainder is not 0 (the one case
/// where the remainder takes a unit off): 4 used of 3 per 10 ms are
/// full again in 13,334 µs with 2 over; 3,334 µs later, 10,000 µs (one
/// period) and the remainder stand for 2.9998 units: 3 used.
#[test]
fn a_whole_period_less_the_remainder_rounds_up() {
    let old = Limit::token_bucket(10, 3, Duration::from_millis(10))
        .unwrap()
        .keeping_units();
    let new = Limit::token_bucket(10, 1, Duration::from_secs(1))
        .unwrap()
        .keeping_units();
    let t = tollgate_algorithms::decide(&old, None, Timestamp::from_micros(T0), 4);
    let state = t.next.map(|n| n.state);
    assert_eq!(
        state,
        Some(State::Cells([T0 + 13_334, 2, (3 << 40) + 10_000]))
    );
    let later = Timestamp::from_micros(T0 + 3_334);
    let peek = tollgate_algorithms::decide(&new, state.as_ref(), later, 1);
    assert_eq!(peek.verdict.remaining, 10 - 3 - 1);
}
