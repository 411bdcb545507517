//! The semantics every built-in algorithm shares, checked one algorithm at a
//! time against explicit numbers (time moves by hand, in microseconds).

use std::time::Duration;

use tollgate_limiter::{Limit, State, Timestamp, Verdict};

const T0: u64 = 1_780_000_000_000_000;
const MS: u64 = 1_000;
const S: u64 = 1_000_000;

/// One key's state, driven through `tollgate_algorithms::decide`.
struct Key {
    limit: Limit,
    state: Option<State>,
    /// Microsecond instant the stored state stops existing.
    expires_at: u64,
}

impl Key {
    fn new(limit: Limit) -> Self {
        Key {
            limit,
            state: None,
            expires_at: 0,
        }
    }

    fn at(&mut self, now: u64, cost: u64) -> Verdict {
        if now >= self.expires_at {
            self.state = None;
        }
        let t = tollgate_algorithms::decide(
            &self.limit,
            self.state.as_ref(),
            Timestamp::from_micros(now),
            cost,
        );
        if let Some(next) = t.next {
            assert!(next.ttl > Duration::ZERO, "every write has a TTL");
            self.expires_at = now + next.ttl.as_micros() as u64;
            self.state = Some(next.state);
        }
        t.verdict
    }

    fn admitted(&mut self, now: u64, n: u64) -> u64 {
        (0..n).filter(|_| self.at(now, 1).allowed).count() as u64
    }
}

/// One limit per algorithm: capacity `capacity`, refilling `capacity` per second.
fn all(capacity: u64) -> Vec<Limit> {
    let s = Duration::from_secs(1);
    vec![
        Limit::token_bucket(capacity, capacity, s).unwrap(),
        Limit::gcra(capacity, s, capacity).unwrap(),
        Limit::fixed_window(capacity, s).unwrap(),
        Limit::sliding_window(capacity, s).unwrap(),
        Limit::sliding_log(capacity, s).unwrap(),
    ]
}

#[test]
fn new_key_starts_full_then_denies() {
    for limit in all(10) {
        let name = limit.algorithm_name();
        let mut key = Key::new(limit);
        let first = key.at(T0, 1);
        assert!(first.allowed, "{name}");
        assert_eq!((first.limit, first.remaining), (10, 9), "{name}");
        assert_eq!(key.admitted(T0, 9), 9, "{name}");
        let denied = key.at(T0, 1);
        assert!(!denied.allowed && denied.remaining == 0, "{name}");
    }
}

#[test]
fn five_against_three_admit_exactly_three() {
    for limit in all(3) {
        let name = limit.algorithm_name();
        assert_eq!(Key::new(limit).admitted(T0 + 5 * MS, 5), 3, "{name}");
    }
}

#[test]
fn continuous_algorithms_refill_the_exact_fraction() {
    for limit in [all(10).remove(0), all(10).remove(1)] {
        let name = limit.algorithm_name();
        let mut key = Key::new(limit);
        assert_eq!(key.admitted(T0, 10), 10, "{name}");
        // 10 per second: 299.999ms refills 2 whole tokens, 300ms exactly 3.
        assert_eq!(key.admitted(T0 + 300 * MS - 1, 10), 2, "{name}");
        assert_eq!(key.admitted(T0 + 300 * MS, 10), 1, "{name}");
    }
}

#[test]
fn token_bucket_refills_fractions_of_a_token_exactly() {
    // 3 tokens per 7 seconds: one token every 2.333…s, kept exactly.
    let mut key = Key::new(Limit::token_bucket(3, 3, Duration::from_secs(7)).unwrap());
    assert_eq!(key.admitted(T0, 3), 3);
    let denied = key.at(T0, 1);
    // ceil(7e6 / 3) µs.
    assert_eq!(denied.retry_after, Some(Duration::from_micros(2_333_334)));
    assert!(!key.at(T0 + 2_333_333, 1).allowed);
    assert!(key.at(T0 + 2_333_334, 1).allowed);
}

#[test]
fn fixed_window_refills_only_at_the_window_end() {
    let mut key = Key::new(Limit::fixed_window(10, Duration::from_secs(1)).unwrap());
    let start = T0 - T0 % S;
    assert_eq!(key.admitted(start + 100 * MS, 10), 10);
    let denied = key.at(start + 400 * MS, 1);
    assert_eq!(denied.retry_after, Some(Duration::from_millis(600)));
    assert_eq!(key.admitted(start + S - 1, 10), 0);
    assert_eq!(key.admitted(start + S, 20), 10);
}

#[test]
fn sliding_window_weights_the_previous_window_exactly() {
    let mut key = Key::new(Limit::sliding_window(10, Duration::from_secs(1)).unwrap());
    let start = T0 - T0 % S;
    assert_eq!(key.admitted(start, 10), 10);
    // 300ms into the next window, the previous 10 weigh 0.7: 7 used, 3 free.
    assert_eq!(key.admitted(start + S + 300 * MS, 10), 3);
    // Now 3 in this window: prev × (1 - e) + 3 + 1 ≤ 10 needs e ≥ 400ms.
    let denied = key.at(start + S + 300 * MS, 1);
    assert_eq!(denied.retry_after, Some(Duration::from_millis(100)));
    assert!(!key.at(start + S + 400 * MS - 1, 1).allowed);
    assert!(key.at(start + S + 400 * MS, 1).allowed);
}

#[test]
fn sliding_log_frees_entries_exactly_one_window_later() {
    let mut key = Key::new(Limit::sliding_log(3, Duration::from_secs(1)).unwrap());
    assert!(key.at(T0, 1).allowed);
    assert!(key.at(T0 + 100 * MS, 1).allowed);
    assert!(key.at(T0 + 200 * MS, 1).allowed);
    // Cost 2 needs the two oldest to age out: the second leaves at T0 + 1.1s.
    let denied = key.at(T0 + 500 * MS, 2);
    assert_eq!(denied.retry_after, Some(Duration::from_millis(600)));
    assert!(!key.at(T0 + 1_100 * MS - 1, 2).allowed);
    assert!(key.at(T0 + 1_100 * MS, 2).allowed);
}

#[test]
fn a_long_idle_never_overfills() {
    for limit in all(10) {
        let name = limit.algorithm_name();
        let mut key = Key::new(limit);
        assert_eq!(key.admitted(T0, 4), 4, "{name}");
        assert_eq!(
            key.admitted(T0 + 3600 * S, 30),
            10,
            "{name}: after an hour idle"
        );
        assert_eq!(
            key.admitted(T0 + 365 * 24 * 3600 * S, 30),
            10,
            "{name}: after a year idle"
        );
    }
}

#[test]
fn a_cost_larger_than_what_is_left_gets_the_exact_retry_after() {
    // Capacity 10, 10 per second; 8 used at T0 (window starts aligned).
    let start = T0 - T0 % S;
    let expected = [
        ("token_bucket", Duration::from_millis(300)), // need 5, have 2: 3 tokens at 100ms each
        ("gcra", Duration::from_millis(300)),
        ("fixed_window", Duration::from_secs(1)), // the window ends
        ("sliding_window", Duration::from_millis(1_375)), // next window: 8 × (1 − e) ≤ 5 at e = 375ms
        ("sliding_log", Duration::from_secs(1)), // the 8 entries at `start` age out together
    ];
    for (limit, (name, wait)) in all(10).into_iter().zip(expected) {
        assert_eq!(limit.algorithm_name(), name);
        let mut key = Key::new(limit);
        assert!(key.at(start, 8).allowed, "{name}");
        let denied = key.at(start, 5);
        assert!(!denied.allowed, "{name}");
        assert_eq!(denied.retry_after, Some(wait), "{name}");
        let micros = wait.as_micros() as u64;
        assert!(!key.at(start + micros - 1, 5).allowed, "{name}: 1µs early");
        assert!(key.at(start + micros, 5).allowed, "{name}: on time");
    }
}

#[test]
fn a_backward_clock_never_refills_twice() {
    for limit in all(10) {
        let name = limit.algorithm_name();
        let mut key = Key::new(limit.clone());
        let start = T0 - T0 % S;
        assert_eq!(key.admitted(start + 100 * MS, 10), 10, "{name}");
        let at_500 = key.at(start + 500 * MS, 1);
        // Clock jumps back 400ms, then forward again: compare with a key that
        // saw the same requests on a clock that never went back.
        let back = key.at(start + 100 * MS, 1);
        let keeps_no_time = matches!(limit, Limit::Gcra(_) | Limit::TokenBucket(_));
        let mut steady = Key::new(limit);
        steady.admitted(start + 100 * MS, 10);
        steady.at(start + 500 * MS, 1);
        let same = steady.at(start + 500 * MS, 1);
        if keeps_no_time {
            // GCRA and the token bucket keep no time besides when they are
            // full again: until the clock catches up they measure from the
            // earlier reading, so they may admit less, never more.
            assert!(!back.allowed || same.allowed, "{name}: admitted more");
            assert!(back.remaining <= same.remaining, "{name}: more remaining");
        } else {
            assert_eq!(
                back.allowed, same.allowed,
                "{name}: the step back changed the answer"
            );
            assert_eq!(
                back.remaining, same.remaining,
                "{name}: the step back changed the remaining"
            );
        }
        // Counting the request at the step back too: what one key denied
        // then, it admits now, never more.
        let total = key.admitted(start + 500 * MS, 20) + u64::from(back.allowed);
        let steady_total = steady.admitted(start + 500 * MS, 20) + u64::from(same.allowed);
        assert_eq!(
            total, steady_total,
            "{name}: refilled twice after the clock came back"
        );
        let _ = at_500;
    }
}

#[test]
fn state_expires_exactly_when_it_equals_no_state() {
    for limit in all(10) {
        let name = limit.algorithm_name();
        let t = tollgate_algorithms::decide(&limit, None, Timestamp::from_micros(T0), 3);
        let next = t.next.expect("admitted");
        let ttl = next.ttl.as_micros() as u64;
        assert!(ttl <= 2 * S + MS, "{name}: TTL {ttl}µs longer than needed");
        // At expiry the stored state decides like no state at all…
        let at = Timestamp::from_micros(T0 + ttl);
        let stored = tollgate_algorithms::decide(&limit, Some(&next.state), at, 10);
        let fresh = tollgate_algorithms::decide(&limit, None, at, 10);
        assert_eq!(stored.verdict.allowed, fresh.verdict.allowed, "{name}");
        assert_eq!(stored.verdict.remaining, fresh.verdict.remaining, "{name}");
        // …and one millisecond before, it still holds something.
        let before = Timestamp::from_micros(T0 + ttl - MS - 1);
        let early = tollgate_algorithms::decide(&limit, Some(&next.state), before, 10);
        assert!(
            !early.verdict.allowed,
            "{name}: state was no longer needed before its TTL"
        );
    }
}

#[test]
fn invalid_policies_fail_at_construction() {
    let s = Duration::from_secs(1);
    let cases = [
        Limit::token_bucket(0, 1, s),
        Limit::token_bucket(1, 0, s),
        Limit::token_bucket(10, 1, Duration::ZERO),
        Limit::token_bucket(10, 1, Duration::from_secs(8 * 24 * 3600)),
        Limit::token_bucket(1_000_000_000, 1, s), // 31 years to refill
        Limit::gcra(0, s, 1),
        Limit::gcra(1, s, 0),
        Limit::gcra(2_000_000, s, 1), // more than one per microsecond
        Limit::fixed_window(0, s),
        Limit::fixed_window(1, Duration::from_micros(999)),
        Limit::sliding_window(1_000_000_000, Duration::from_secs(3600)), // not exact below 2^53
        Limit::sliding_log(10_001, s), // the log would be too large
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let err = case.expect_err(&format!("case {i} must be rejected"));
        assert!(!err.to_string().is_empty());
    }
    let policy = tollgate_limiter::Policy::new("p", Limit::fixed_window(5, s).unwrap()).unwrap();
    assert!(policy.check_cost(0).is_err());
    assert!(policy.check_cost(6).is_err());
    assert!(policy.check_cost(5).is_ok());
    assert!(tollgate_limiter::Policy::new("bad name", Limit::fixed_window(5, s).unwrap()).is_err());
    assert!(tollgate_limiter::Policy::new("", Limit::fixed_window(5, s).unwrap()).is_err());
}

#[test]
fn state_written_under_a_larger_limit_never_underflows() {
    // A policy lowered without a version bump (a configuration reload) meets
    // state its larger predecessor wrote: the answer stays within the new
    // limit (buckets holding more than the new capacity are capped to it;
    // counts above the new limit deny, with nothing remaining).
    let s = Duration::from_secs(1);
    let pairs = [
        (
            Limit::token_bucket(100, 100, s).unwrap(),
            Limit::token_bucket(5, 5, s).unwrap(),
        ),
        (
            Limit::gcra(100, s, 100).unwrap(),
            Limit::gcra(5, s, 5).unwrap(),
        ),
        (
            Limit::fixed_window(100, s).unwrap(),
            Limit::fixed_window(5, s).unwrap(),
        ),
        (
            Limit::sliding_window(100, s).unwrap(),
            Limit::sliding_window(5, s).unwrap(),
        ),
        (
            Limit::sliding_log(100, s).unwrap(),
            Limit::sliding_log(5, s).unwrap(),
        ),
    ];
    for (large, small) in pairs {
        let name = large.algorithm_name();
        let mut key = Key::new(large);
        assert_eq!(key.admitted(T0, 50), 50, "{name}");
        key.limit = small;
        let v = key.at(T0, 1);
        assert!(
            v.remaining < 5,
            "{name}: remaining {} above the new limit",
            v.remaining
        );
        if !v.allowed {
            assert_eq!(v.remaining, 0, "{name}");
        }
    }
}

/// A clock at the end of time (a misconfigured one, or a test's mistake):
/// no algorithm panics (debug builds check every addition) or wraps into a
/// fresh state; a run of 20 requests admits exactly the limit of 5, and the
/// entry's expiry does not wrap around.
#[test]
fn clocks_at_the_extremes_neither_panic_nor_over_admit() {
    let second = Duration::from_secs(1);
    let limits = [
        Limit::token_bucket(5, 5, second).unwrap(),
        Limit::gcra(5, second, 5).unwrap(),
        Limit::fixed_window(5, second).unwrap(),
        Limit::sliding_window(5, second).unwrap(),
        Limit::sliding_log(5, second).unwrap(),
    ];
    for now in [u64::MAX, u64::MAX - 1, u64::MAX - 10 * S, 0] {
        for limit in &limits {
            let mut state: Option<State> = None;
            let mut admitted = 0;
            for _ in 0..20 {
                let t = tollgate_algorithms::decide(
                    limit,
                    state.as_ref(),
                    Timestamp::from_micros(now),
                    1,
                );
                if let Some(next) = t.next {
                    assert!(next.ttl > Duration::ZERO && next.ttl <= Duration::from_secs(2));
                    state = Some(next.state);
                }
                admitted += u32::from(t.verdict.allowed);
            }
            assert_eq!(admitted, 5, "{} at {now}", limit.algorithm_name());
        }
    }
}

/// A cost no state can admit (0, or above the capacity) is denied for
/// good and writes nothing, on every algorithm: never a panic, never a
/// wrapped number (the sliding log indexed an empty log; the sliding
/// window's `limit − cost` underflowed).
#[test]
fn a_cost_no_state_can_admit_is_denied_for_good() {
    let s = Duration::from_secs(1);
    let limits = [
        Limit::fixed_window(3, s).unwrap(),
        Limit::sliding_window(3, s).unwrap(),
        Limit::sliding_log(3, s).unwrap(),
        Limit::token_bucket(3, 1, s).unwrap(),
        Limit::gcra(3, s, 3).unwrap(),
    ];
    for limit in limits {
        for cost in [0, 4, u64::MAX] {
            let t = tollgate_algorithms::decide(&limit, None, Timestamp::from_micros(T0), cost);
            assert!(!t.verdict.allowed, "{limit:?} cost {cost}");
            assert_eq!(t.verdict.retry_after, None, "{limit:?} cost {cost}");
            assert!(t.next.is_none(), "{limit:?} cost {cost}");
        }
    }
}

/// A capacity cut under the same rate (a reload without a version bump):
/// a bucket that used more than the new capacity is that far below empty,
/// and a denial says when it is back above the cost, exactly (it said one
/// unit's refill: the level is shown capped at empty).
#[test]
fn a_cut_capacitys_wait_counts_what_was_used_beyond_it() {
    let hour = Duration::from_secs(3600);
    let limits = [
        Limit::token_bucket(20, 10, hour).unwrap(),
        Limit::gcra(10, hour, 20).unwrap(),
    ];
    let cut = [
        Limit::token_bucket(5, 10, hour).unwrap(),
        Limit::gcra(10, hour, 5).unwrap(),
    ];
    for (large, small) in limits.into_iter().zip(cut) {
        let name = large.algorithm_name();
        let mut key = Key::new(large);
        assert_eq!(key.admitted(T0, 15), 15, "{name}");
        key.limit = small;
        let v = key.at(T0, 1);
        assert!(!v.allowed, "{name}");
        // 15 used of 5: 11 units back (4 used) before one more fits.
        let wait = Duration::from_secs(11 * 360);
        assert_eq!(v.retry_after, Some(wait), "{name}");
        let at = T0 + wait.as_micros() as u64;
        assert!(!key.at(at - 1, 1).allowed, "{name}: a µs early");
        assert!(key.at(at, 1).allowed, "{name}: when the denial said");
    }
}

/// A sliding window's count written under a large limit and a short
/// window (a plan or a reload changed both) meets a week-long window: the
/// count times the window passes 2^64, and the request is denied with
/// nothing remaining (u64 arithmetic wrapped it to a tenth of one window
/// and admitted it with 8 remaining), as the Lua decides.
#[test]
fn a_count_times_a_longer_window_past_u64_is_denied() {
    let old = Limit::sliding_window(40_000_000, Duration::from_secs(60)).unwrap();
    let week = Limit::sliding_window(10, Duration::from_secs(7 * 86_400)).unwrap();
    let mut key = Key::new(old);
    assert!(key.at(T0, 30_500_569).allowed);
    key.limit = week;
    let v = key.at(T0 + 1, 1);
    assert!(!v.allowed, "a count 3 million times the limit admitted");
    assert_eq!(v.remaining, 0);
    assert!(tollgate_algorithms::within_reach(
        &key.limit,
        key.state.as_ref().unwrap()
    ));
}
