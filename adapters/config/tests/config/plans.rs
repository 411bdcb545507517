//! The `[plans]` section: plans per customer from the file, every error
//! with its field path, and a reload that changes a plan keeps what each
//! customer used.

use std::sync::Arc;

use tollgate_config::{Config, LiveConfig};
use tollgate_limiter::{Context, ManualClock, PlanName, ReloadableRoute as _, Subject, Timestamp};

const START: Timestamp = Timestamp::from_micros(1_780_000_020_000_000);

/// `api` 1,000 an hour per subject; `pro` gives it `pro_limit`; key-9 is
/// an enterprise customer.
fn file(pro_limit: u64) -> String {
    format!(
        r#"
[policies.api]
algorithm = "fixed_window"
limit = 1000
window = "1h"

[policies.login]
algorithm = "sliding_log"
limit = 5
window = "1m"

[plans]
default = "free"

[plans.assign]
key-9 = "enterprise"

[plans.limits.pro.api]
algorithm = "fixed_window"
limit = {pro_limit}
window = "1h"

[plans.limits.enterprise.api]
algorithm = "gcra"
rate = 5000
period = "1m"
burst = 5000

[plans.limits.enterprise.login]
algorithm = "sliding_log"
limit = 50
window = "1m"

[routes.api]
layers = [{{ scope = "subject", policy = "api" }}]
"#
    )
}

fn customer(name: &str) -> Context {
    Context::for_subject(Subject::new(name).unwrap())
}

async fn limit_of(live: &LiveConfig, ctx: &Context) -> (u64, Option<&'static str>) {
    let route = live.route("api").unwrap().current();
    let decision = route.limiter().check(ctx, 1).await.unwrap();
    let layer = decision.layers()[0];
    (layer.verdict().limit, layer.plan())
}

#[tokio::test]
async fn each_customer_is_decided_under_the_plan_the_file_gives() {
    let clock = ManualClock::new(START);
    let config = Config::from_toml_str(&file(5_000)).unwrap();
    assert_eq!(config.plans().unwrap().default_plan().as_str(), "free");
    let live = LiveConfig::new(config, Arc::new(clock)).await.unwrap();
    assert_eq!(
        limit_of(&live, &customer("key-1")).await,
        (1_000, Some("free"))
    );
    assert_eq!(
        limit_of(&live, &customer("key-9")).await,
        (5_000, Some("enterprise"))
    );
    let pro = customer("key-1").with_plan(PlanName::new("pro").unwrap());
    assert_eq!(limit_of(&live, &pro).await, (5_000, Some("pro")));
}

/// A reload that changes the pro plan's limit keeps the customer's count:
/// 800 used, the plan cut to 500: denied.
#[tokio::test]
async fn a_reload_that_changes_a_plan_keeps_what_was_used() {
    let clock = ManualClock::new(START);
    let live = LiveConfig::new(
        Config::from_toml_str(&file(5_000)).unwrap(),
        Arc::new(clock),
    )
    .await
    .unwrap();
    let pro = customer("key-1").with_plan(PlanName::new("pro").unwrap());
    let route = live.route("api").unwrap();
    let admits = || async {
        route
            .current()
            .limiter()
            .check(&pro, 1)
            .await
            .unwrap()
            .is_allowed()
    };
    for _ in 0..800 {
        assert!(admits().await);
    }
    // The pro plan's limit now `limit`: what the customer used and has left.
    let reload_to = |limit: u64| {
        let (live, route, pro) = (&live, &route, &pro);
        async move {
            live.reload_with(Config::from_toml_str(&file(limit)).unwrap())
                .await
                .unwrap();
            let usage = route.current().limiter().usage(pro).await.unwrap().layers[0];
            (usage.used, usage.remaining)
        }
    };
    assert_eq!(reload_to(500).await, (500, 0));
    assert!(!admits().await);
    assert_eq!(reload_to(1_000).await, (800, 200));
}

#[test]
fn every_error_names_its_field() {
    let text = file(5_000)
        .replace("[plans.limits.pro.api]", "[plans.limits.pro.aip]")
        .replace(
            "key-9 = \"enterprise\"",
            "key-9 = \"gold\"\n\"bad key\" = \"free\"\n\
             \"h.9F811E4CF32DC31E6F422DAAE9C8C27A\" = \"free\"\n\
             \"ip:198.51.100.7\" = \"free\"\n\" key-9\" = \"free\"",
        )
        .replace("rate = 5000", "rate = 0");
    let err = Config::from_toml_str(&text).unwrap_err().to_string();
    for expected in [
        "plans.limits.pro.aip: no policy named \"aip\"; the policies are api, login",
        "plans.assign.\"key-9\": no plan named \"gold\"",
        "plans.assign.\"bad key\": ",
        "plans.assign.\"h.9F811E4CF32DC31E6F422DAAE9C8C27A\": ",
        "plans.assign.\"ip:198.51.100.7\": ",
        "plans.assign.\"key-9\": key-9 is assigned twice",
        "plans.limits.enterprise.api.rate: 0 must be",
    ] {
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
    let err =
        Config::from_toml_str(&file(5_000).replace("default = \"free\"", "default = \"no good\""))
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("plans.default: \"no good\" must be 1-64 characters"),
        "{err}"
    );
    let err = Config::from_toml_str(
        &file(5_000).replace("default = \"free\"", "default = \"free\"\ncolour = 1"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("plans.colour: unknown field `colour`"),
        "{err}"
    );
}

/// A plan whose limit is below a route's cost is refused where the plan
/// gives it: no request of the route could pass under that plan.
#[test]
fn a_plan_limit_below_a_routes_cost_is_refused() {
    let text = file(5_000)
        .replace("[routes.api]\n", "[routes.api]\ncost = 1500\n")
        .replace(
            "limit = 1000\nwindow = \"1h\"",
            "limit = 10000\nwindow = \"1h\"",
        );
    // pro (5,000) and enterprise (burst 5,000) take it; the policy's 10,000 too.
    Config::from_toml_str(&text).unwrap();
    let err = Config::from_toml_str(&text.replace("cost = 1500", "cost = 6000"))
        .unwrap_err()
        .to_string();
    for expected in [
        "plans.limits.pro.api: its capacity 5000 is less than the cost 6000 of route \"api\"",
        "plans.limits.enterprise.api: its capacity 5000 is less than the cost 6000",
    ] {
        assert!(err.contains(expected), "{expected:?} in {err}");
    }
    assert!(
        !err.contains("routes.api"),
        "the route itself is fine: {err}"
    );
}
