//! Leased policies in the configuration file: `leased = { … }` on a
//! policy, and the mistakes a file can make reported with their field path.

use std::time::Duration;

use tollgate_config::Config;
use tollgate_limiter::Lease;

fn file(policy: &str) -> String {
    format!(
        "[policies.all]\n{policy}\n\n\
         [routes.api]\nlayers = [{{ name = \"all\", scope = \"global\", policy = \"all\" }}]\n"
    )
}

#[test]
fn a_policy_is_leased_as_written() {
    let config = Config::from_toml_str(&file(
        "algorithm = \"fixed_window\"\nlimit = 10000\nwindow = \"1s\"\n\
         leased = { duration = \"500ms\", max_batch = 200 }",
    ))
    .unwrap();
    let lease = Lease::new(Duration::from_millis(500))
        .unwrap()
        .with_max_batch(200)
        .unwrap();
    assert_eq!(config.policy("all").unwrap().lease(), Some(&lease));
    let defaults = Config::from_toml_str(&file(
        "algorithm = \"gcra\"\nrate = 100\nperiod = \"1s\"\nburst = 100\nleased = {}",
    ))
    .unwrap();
    assert_eq!(
        defaults.policy("all").unwrap().lease(),
        Some(&Lease::default())
    );
}

#[test]
fn a_bad_lease_names_its_field() {
    let window = "algorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1s\"";
    for (policy, field, says) in [
        (
            format!("{window}\nleased = {{ duration = \"5ms\" }}"),
            "policies.all.leased.duration",
            "between 10ms and 60s",
        ),
        (
            format!("{window}\nleased = {{ max_batch = 101 }}"),
            "policies.all.leased.max_batch",
            "at most the capacity 100",
        ),
        (
            format!("{window}\nleased = {{ batch = 1 }}"),
            "policies.all.leased",
            "batch",
        ),
        (
            "algorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1s\"\nleased = {}".to_string(),
            "policies.all.leased",
            "cannot be leased",
        ),
    ] {
        let error = Config::from_toml_str(&file(&policy))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(field) && error.contains(says),
            "{policy}: {error}"
        );
    }
}
