//! Calendar spans against hand-computed UTC instants: daylight-saving
//! changes of an hour (Berlin, New York) and of 30 minutes (Lord Howe),
//! an offset of +05:45 (Kathmandu), months of 28 to 31 days, anchors on
//! the 29th to 31st and on 29 February, years; then a calendar quota
//! deciding on the in-process store against a manual clock.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    CalendarUnit, Context, Limit, Limiter, ManualClock, Policy, Recurrence, Scope, Subject,
    Timestamp,
};
use tollgate_memory::MemoryStore;

use CalendarUnit::{Day, Month, Week, Year};

/// An RFC 3339 instant in µs since the epoch.
fn at(rfc3339: &str) -> u64 {
    let t: jiff::Timestamp = rfc3339.parse().expect("an RFC 3339 instant");
    u64::try_from(t.as_microsecond()).expect("after 1970")
}

/// The span holding `now` as two RFC 3339 strings, to compare with.
fn span(every: &Recurrence, now: &str) -> (String, String) {
    let (start, end) = every.span_at(at(now));
    let show = |us: u64| {
        jiff::Timestamp::from_microsecond(us as i64)
            .unwrap()
            .to_string()
    };
    (show(start), show(end))
}

fn every(unit: CalendarUnit, zone: &str, from: &str) -> Recurrence {
    Recurrence::new(unit, zone, from).unwrap()
}

fn expect(every: &Recurrence, now: &str, start: &str, end: &str) {
    assert_eq!(
        span(every, now),
        (start.to_string(), end.to_string()),
        "{every:?} at {now}"
    );
}

#[test]
fn berlin_days_last_23_and_25_hours_across_daylight_saving() {
    let days = every(Day, "Europe/Berlin", "2025-01-01T00:00");
    // 29 March 2026: 02:00 CET becomes 03:00 CEST.
    expect(
        &days,
        "2026-03-29T12:00:00Z",
        "2026-03-28T23:00:00Z",
        "2026-03-29T22:00:00Z",
    );
    // 25 October 2026: 03:00 CEST becomes 02:00 CET.
    expect(
        &days,
        "2026-10-25T12:00:00Z",
        "2026-10-24T22:00:00Z",
        "2026-10-25T23:00:00Z",
    );
    // The instant of the change itself lies inside its day.
    expect(
        &days,
        "2026-03-29T01:00:00Z",
        "2026-03-28T23:00:00Z",
        "2026-03-29T22:00:00Z",
    );
}

#[test]
fn new_york_months_and_days_across_both_changes() {
    let months = every(Month, "America/New_York", "2025-01-01T00:00");
    // March 2026 starts in EST (-05) and ends in EDT (-04): 31 days less an hour.
    expect(
        &months,
        "2026-03-20T12:00:00Z",
        "2026-03-01T05:00:00Z",
        "2026-04-01T04:00:00Z",
    );
    // November 2026 starts in EDT and ends in EST: 30 days and an hour.
    expect(
        &months,
        "2026-11-15T00:00:00Z",
        "2026-11-01T04:00:00Z",
        "2026-12-01T05:00:00Z",
    );
    // Just before midnight New York time on 31 March is still March.
    expect(
        &months,
        "2026-04-01T03:59:59Z",
        "2026-03-01T05:00:00Z",
        "2026-04-01T04:00:00Z",
    );
    let days = every(Day, "America/New_York", "2025-01-01T00:00");
    // 8 March 2026: 23 hours; 1 November 2026: 25 hours.
    expect(
        &days,
        "2026-03-08T12:00:00Z",
        "2026-03-08T05:00:00Z",
        "2026-03-09T04:00:00Z",
    );
    expect(
        &days,
        "2026-11-01T12:00:00Z",
        "2026-11-01T04:00:00Z",
        "2026-11-02T05:00:00Z",
    );
}

#[test]
fn lord_howe_shifts_by_half_an_hour() {
    let days = every(Day, "Australia/Lord_Howe", "2025-01-01T00:00");
    // 5 April 2026: +11 becomes +10:30 at 02:00 (24.5 hours).
    expect(
        &days,
        "2026-04-05T06:00:00Z",
        "2026-04-04T13:00:00Z",
        "2026-04-05T13:30:00Z",
    );
    // 4 October 2026: +10:30 becomes +11 at 02:00 (23.5 hours).
    expect(
        &days,
        "2026-10-04T06:00:00Z",
        "2026-10-03T13:30:00Z",
        "2026-10-04T13:00:00Z",
    );
}

#[test]
fn kathmandu_days_start_at_18_15_utc() {
    let days = every(Day, "Asia/Kathmandu", "2025-01-01T00:00");
    expect(
        &days,
        "2026-06-01T18:14:59Z",
        "2026-05-31T18:15:00Z",
        "2026-06-01T18:15:00Z",
    );
    expect(
        &days,
        "2026-06-01T18:15:00Z",
        "2026-06-01T18:15:00Z",
        "2026-06-02T18:15:00Z",
    );
}

#[test]
fn utc_months_have_28_29_30_and_31_days() {
    let months = every(Month, "UTC", "2025-01-01T00:00");
    expect(
        &months,
        "2026-02-10T00:00:00Z",
        "2026-02-01T00:00:00Z",
        "2026-03-01T00:00:00Z",
    );
    expect(
        &months,
        "2028-02-29T23:59:59Z",
        "2028-02-01T00:00:00Z",
        "2028-03-01T00:00:00Z",
    );
    expect(
        &months,
        "2026-04-30T00:00:00Z",
        "2026-04-01T00:00:00Z",
        "2026-05-01T00:00:00Z",
    );
    expect(
        &months,
        "2026-01-31T00:00:00Z",
        "2026-01-01T00:00:00Z",
        "2026-02-01T00:00:00Z",
    );
    // Before the anchor, spans recur backwards.
    expect(
        &months,
        "2020-07-04T00:00:00Z",
        "2020-07-01T00:00:00Z",
        "2020-08-01T00:00:00Z",
    );
}

#[test]
fn an_anchor_on_the_31st_starts_on_a_short_months_last_day_then_the_31st_again() {
    let billing = every(Month, "UTC", "2026-01-31T00:00");
    expect(
        &billing,
        "2026-02-10T00:00:00Z",
        "2026-01-31T00:00:00Z",
        "2026-02-28T00:00:00Z",
    );
    expect(
        &billing,
        "2026-03-10T00:00:00Z",
        "2026-02-28T00:00:00Z",
        "2026-03-31T00:00:00Z",
    );
    expect(
        &billing,
        "2026-04-10T00:00:00Z",
        "2026-03-31T00:00:00Z",
        "2026-04-30T00:00:00Z",
    );
    expect(
        &billing,
        "2026-05-10T00:00:00Z",
        "2026-04-30T00:00:00Z",
        "2026-05-31T00:00:00Z",
    );
}

/// 29 February, stated: an anchor on the 29th starts a month's span on
/// the 28th of a 28-day February; a yearly anchor on 29 February starts
/// on 28 February in common years and on the 29th in leap years.
#[test]
fn a_29_february_anchor_means_the_28th_in_common_years() {
    let monthly = every(Month, "UTC", "2024-01-29T00:00");
    expect(
        &monthly,
        "2026-02-28T12:00:00Z",
        "2026-02-28T00:00:00Z",
        "2026-03-29T00:00:00Z",
    );
    expect(
        &monthly,
        "2028-02-28T12:00:00Z",
        "2028-01-29T00:00:00Z",
        "2028-02-29T00:00:00Z",
    );
    let yearly = every(Year, "UTC", "2024-02-29T00:00");
    expect(
        &yearly,
        "2025-06-01T00:00:00Z",
        "2025-02-28T00:00:00Z",
        "2026-02-28T00:00:00Z",
    );
    expect(
        &yearly,
        "2027-06-01T00:00:00Z",
        "2027-02-28T00:00:00Z",
        "2028-02-29T00:00:00Z",
    );
    expect(
        &yearly,
        "2028-02-28T23:59:59Z",
        "2027-02-28T00:00:00Z",
        "2028-02-29T00:00:00Z",
    );
}

#[test]
fn years_and_iso_weeks() {
    let years = every(Year, "UTC", "2025-01-01T00:00");
    expect(
        &years,
        "2028-07-01T00:00:00Z",
        "2028-01-01T00:00:00Z",
        "2029-01-01T00:00:00Z",
    );
    let berlin_years = every(Year, "Europe/Berlin", "2025-01-01T00:00");
    expect(
        &berlin_years,
        "2026-12-31T23:30:00Z",
        "2026-12-31T23:00:00Z",
        "2027-12-31T23:00:00Z",
    );
    // 5 January 2026 is a Monday.
    let weeks = every(Week, "UTC", "2026-01-05T00:00");
    expect(
        &weeks,
        "2026-03-04T10:00:00Z",
        "2026-03-02T00:00:00Z",
        "2026-03-09T00:00:00Z",
    );
    expect(
        &weeks,
        "2025-12-31T10:00:00Z",
        "2025-12-29T00:00:00Z",
        "2026-01-05T00:00:00Z",
    );
}

#[test]
fn a_billing_date_in_new_york() {
    let billing = every(Month, "America/New_York", "2025-01-17T00:00");
    expect(
        &billing,
        "2026-03-10T00:00:00Z",
        "2026-02-17T05:00:00Z",
        "2026-03-17T04:00:00Z",
    );
    expect(
        &billing,
        "2026-03-17T04:00:00Z",
        "2026-03-17T04:00:00Z",
        "2026-04-17T04:00:00Z",
    );
}

#[test]
fn a_start_in_a_daylight_saving_gap_moves_forward_by_the_gap() {
    // 02:30 does not exist in Berlin on 29 March 2026: the day starts at
    // 03:30 CEST, the next at 02:30 CEST.
    let days = every(Day, "Europe/Berlin", "2025-01-01T02:30");
    expect(
        &days,
        "2026-03-29T10:00:00Z",
        "2026-03-29T01:30:00Z",
        "2026-03-30T00:30:00Z",
    );
}

#[test]
fn bad_units_zones_and_anchors_name_their_field() {
    let zone = Recurrence::new(Month, "Mars/Olympus", "2025-01-01T00:00").unwrap_err();
    assert_eq!(zone.field(), "time_zone");
    let from = Recurrence::new(Month, "UTC", "the 17th").unwrap_err();
    assert_eq!(from.field(), "from");
    let year = Recurrence::new(Month, "UTC", "1900-01-01T00:00").unwrap_err();
    assert_eq!(year.field(), "from");
    // An offset or a zone, in any form jiff reads, is refused rather than
    // dropped.
    for written in [
        "2025-01-17T00:00-05:00",
        "2025-01-17 00:00-05:00",
        "2025-01-17t00:00+09:00",
        "2025-01-17[Asia/Tokyo]",
        "2025-01-17T00:00Z",
    ] {
        let offset = Recurrence::new(Month, "UTC", written).unwrap_err();
        assert!(
            offset.to_string().contains("the zone is time_zone"),
            "{written}: {offset}"
        );
    }
    for written in ["2025-01-17T00:00", "2025-01-17T00:00:00"] {
        assert!(Recurrence::new(Month, "UTC", written).is_ok(), "{written}");
    }
    let no_day = Recurrence::new(Month, "UTC", "2025-02-30T00:00").unwrap_err();
    assert!(
        no_day.to_string().contains("is not a civil date-time ("),
        "{no_day}"
    );
    let unit = "fortnight".parse::<CalendarUnit>().unwrap_err();
    assert_eq!(unit.field(), "per");
}

fn monthly_quota(limit: u64, clock: &ManualClock) -> Limiter {
    let months = every(Month, "America/New_York", "2025-01-01T00:00");
    let policy = Policy::new("monthly", Limit::calendar(limit, months).unwrap()).unwrap();
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    Limiter::builder(Arc::new(store))
        .layer("key", Scope::Subject, policy)
        .clock(Arc::new(clock.clone()))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_monthly_quota_resets_at_midnight_new_york_time_and_says_so() {
    let clock = ManualClock::new(Timestamp::from_micros(at("2026-03-31T12:00:00Z")));
    let limiter = monthly_quota(3, &clock);
    let ctx = Context::for_subject(Subject::new("customer").unwrap());
    for _ in 0..3 {
        assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    }
    let denied = limiter.check(&ctx, 1).await.unwrap();
    assert!(!denied.is_allowed());
    // Retry exactly at 1 April 00:00 EDT = 04:00 UTC.
    let wait = at("2026-04-01T04:00:00Z") - at("2026-03-31T12:00:00Z");
    assert_eq!(denied.retry_after(), Some(Duration::from_micros(wait)));
    // A microsecond before the end: still March.
    clock.set(Timestamp::from_micros(at("2026-04-01T03:59:59.999999Z")));
    assert!(!limiter.check(&ctx, 1).await.unwrap().is_allowed());
    clock.set(Timestamp::from_micros(at("2026-04-01T04:00:00Z")));
    let april = limiter.check(&ctx, 1).await.unwrap();
    assert!(april.is_allowed());
    let reset = april.layers()[0].verdict().reset_after;
    assert_eq!(
        reset,
        Duration::from_micros(at("2026-05-01T04:00:00Z") - at("2026-04-01T04:00:00Z"))
    );
}

#[tokio::test]
async fn a_clock_stepping_back_over_a_boundary_keeps_the_later_span() {
    let clock = ManualClock::new(Timestamp::from_micros(at("2026-04-01T04:00:01Z")));
    let limiter = monthly_quota(2, &clock);
    let ctx = Context::for_subject(Subject::new("customer").unwrap());
    assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    // Another machine's clock, two seconds behind: March on its face, but
    // April has begun, and its count goes on.
    clock.set(Timestamp::from_micros(at("2026-04-01T03:59:59Z")));
    assert!(limiter.check(&ctx, 1).await.unwrap().is_allowed());
    let denied = limiter.check(&ctx, 1).await.unwrap();
    assert!(!denied.is_allowed(), "April's two are spent");
}

/// A billing date moved from the 17th to the 1st on 20 March: the count
/// of the span [17 March, 17 April) goes on in [1 March, 1 April), the
/// span it overlaps, rather than a fresh allowance (or the old span
/// running on into April beside the new one); April starts full.
#[tokio::test]
async fn a_changed_billing_date_carries_the_count_into_the_overlapping_span() {
    let clock = ManualClock::new(Timestamp::from_micros(at("2026-03-20T12:00:00Z")));
    let store: Arc<MemoryStore> = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let ctx = Context::for_subject(Subject::new("customer").unwrap());
    let quota = |from: &str| {
        let every = every(Month, "UTC", from);
        let policy = Policy::new("monthly", Limit::calendar(5, every).unwrap()).unwrap();
        Limiter::builder(store.clone())
            .layer("key", Scope::Subject, policy)
            .clock(Arc::new(clock.clone()))
            .build()
            .unwrap()
    };
    let on_the_17th = quota("2025-01-17T00:00");
    for _ in 0..3 {
        assert!(on_the_17th.check(&ctx, 1).await.unwrap().is_allowed());
    }
    let on_the_1st = quota("2025-01-01T00:00");
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u64::from(on_the_1st.check(&ctx, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 2, "3 of March's 5 were used");
    clock.set(Timestamp::from_micros(at("2026-04-01T00:00:00Z")));
    let mut admitted = 0;
    for _ in 0..6 {
        admitted += u64::from(on_the_1st.check(&ctx, 1).await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 5, "April is whole");
}
