//! Calendar quotas in the configuration file: a monthly quota per plan in
//! New York time, decided against a manual clock, and every mistake
//! reported with its field path.

use std::sync::Arc;
use std::time::Duration;

use tollgate_config::{Config, LiveConfig};
use tollgate_limiter::{Context, ManualClock, PlanName, ReloadableRoute as _, Subject, Timestamp};

/// 2026-03-31T12:00:00Z and 2026-04-01T04:00:00Z (00:00 in New York).
const MARCH_31: u64 = 1_774_958_400_000_000;
const APRIL: u64 = 1_775_016_000_000_000;

const FILE: &str = r#"
[policies.per_minute]
algorithm = "fixed_window"
limit = 60
window = "1m"

[policies.monthly]
algorithm = "calendar"
limit = 3
per = "month"
time_zone = "America/New_York"
from = "2025-01-01T00:00"

[plans]
default = "free"

[plans.limits.pro.monthly]
algorithm = "calendar"
limit = 5
per = "month"
time_zone = "America/New_York"
from = "2025-01-01T00:00"

[routes.api]
layers = [
    { name = "minute", scope = "subject", policy = "per_minute" },
    { name = "month", scope = "subject", policy = "monthly" },
]
"#;

async fn admitted(live: &LiveConfig, ctx: &Context, n: u64) -> u64 {
    let route = live.route("api").unwrap().current();
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(route.limiter().check(ctx, 1).await.unwrap().is_allowed());
    }
    admitted
}

#[tokio::test]
async fn a_monthly_quota_per_plan_resets_at_midnight_new_york_time() {
    let clock = ManualClock::new(Timestamp::from_micros(MARCH_31));
    let live = LiveConfig::new(
        Config::from_toml_str(FILE).unwrap(),
        Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    let free = Context::for_subject(Subject::new("key-1").unwrap());
    let pro = Context::for_subject(Subject::new("key-2").unwrap())
        .with_plan(PlanName::new("pro").unwrap());
    assert_eq!(admitted(&live, &free, 10).await, 3);
    assert_eq!(admitted(&live, &pro, 10).await, 5);
    let route = live.route("api").unwrap().current();
    let denied = route.limiter().check(&free, 1).await.unwrap();
    assert_eq!(
        denied.retry_after(),
        Some(Duration::from_micros(APRIL - MARCH_31))
    );
    clock.set(Timestamp::from_micros(APRIL));
    assert_eq!(admitted(&live, &free, 10).await, 3, "April's quota");
}

#[test]
fn every_calendar_mistake_names_its_field() {
    for (from, to, expected) in [
        (
            "per = \"month\"",
            "per = \"fortnight\"",
            "policies.monthly.per: \"fortnight\" is not a calendar unit",
        ),
        (
            "time_zone = \"America/New_York\"\nfrom",
            "time_zone = \"Mars/Olympus\"\nfrom",
            "policies.monthly.time_zone: \"Mars/Olympus\" is not an IANA time zone name",
        ),
        (
            "from = \"2025-01-01T00:00\"\n\n[plans]",
            "from = 17\n\n[plans]",
            "policies.monthly.from: 17 must be a string",
        ),
        (
            "from = \"2025-01-01T00:00\"\n\n[plans]",
            "from = \"the 17th\"\n\n[plans]",
            "policies.monthly.from: \"the 17th\" is not a civil date-time",
        ),
    ] {
        let text = FILE.replacen(from, to, 1);
        assert_ne!(text, FILE, "{from:?} is in the file");
        let err = Config::from_toml_str(&text).unwrap_err().to_string();
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
}
