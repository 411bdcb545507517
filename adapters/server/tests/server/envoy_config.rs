//! envoyproxy/ratelimit's configuration, read as is: the examples of the
//! reference's documentation (nested descriptors, defaults and
//! value-specific limits, wildcards, unlimited, shadow mode, replaces,
//! detailed metrics) and each of its error cases, against the server
//! through a real gRPC client, on the in-process store with a manual
//! clock.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{client, descriptor, TempDir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_limiter::{ManualClock, Timestamp};
use tollgate_ratelimit_server::{Server, ServerError};

/// On a minute's boundary, so windows of a second and a minute start here.
const START: Timestamp = Timestamp::from_micros(1_780_000_020_000_000);

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// The server's own file: a store, where it listens, and the directory.
fn server_toml(extra: &str) -> String {
    format!(
        r#"
[store]
kind = "memory"

[policies.smooth]
algorithm = "gcra"
rate = 3
period = "1m"
burst = 3

[policies.in_flight]
algorithm = "concurrency"
limit = 2
lease = "30s"

[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
envoy_config_dir = "config"
{extra}
"#
    )
}

/// A directory with `server.toml` (`extra` in its `[server]`) and the
/// YAML `files` under `config/`.
fn directory(files: &[(&str, &str)], extra: &str) -> TempDir {
    let dir = TempDir::new("envoy-config");
    std::fs::create_dir_all(dir.0.join("config")).expect("config/");
    dir.write("server.toml", &server_toml(extra));
    for (name, text) in files {
        dir.write(&format!("config/{name}"), text);
    }
    dir
}

/// A directory with `server.toml` on the Redis at `url` (`store` and
/// `server`: more lines of its `[store]` and `[server]`) and an empty
/// `config/`.
fn redis_directory(url: &str, store: &str, server: &str) -> TempDir {
    let dir = TempDir::new("envoy-config");
    std::fs::create_dir_all(dir.0.join("config")).expect("config/");
    let toml = format!(
        "[store]\nkind = \"redis\"\nurl = \"{url}\"\n{store}\n\n[server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nenvoy_config_dir = \"config\"\n{server}\n"
    );
    dir.write("server.toml", &toml);
    dir
}

async fn start(dir: &TempDir, clock: Arc<ManualClock>) -> Result<Server, ServerError> {
    Server::start(dir.path("server.toml"), clock).await
}

/// A server on `files`, at [`START`].
async fn serve(files: &[(&str, &str)]) -> (TempDir, Server, Arc<ManualClock>) {
    let dir = directory(files, "");
    let clock = Arc::new(ManualClock::new(START));
    let server = start(&dir, clock.clone()).await.expect("starts");
    (dir, server, clock)
}

async fn ask(server: &Server, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
    client(server.grpc_addr())
        .await
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors.iter().map(|d| descriptor(d, None)).collect(),
            hits_addend: 0,
        })
        .await
        .expect("answered")
        .into_inner()
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

/// How many of `n` requests of one descriptor are admitted.
async fn admitted(server: &Server, domain: &str, d: &[(&str, &str)], n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        if ask(server, domain, &[d]).await.overall_code == OK {
            admitted += 1;
        }
    }
    admitted
}

const MESSAGING: &str = r#"
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"#;

const PER_IP: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
"#;

const EXAMPLE4: &str = r#"
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 3
      unit: second
"#;

/// Examples 2, 3 and 4: nested descriptors, a default for any value and a
/// value-specific limit, the most specific match, the depth that must
/// match; each descriptor of a request decided on its own.
#[tokio::test]
async fn nested_descriptors_defaults_and_specific_values() {
    let (_dir, server, clock) = serve(&[
        ("messaging.yaml", MESSAGING),
        ("per_ip.yaml", PER_IP),
        ("example4.yml", EXAMPLE4),
    ])
    .await;
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: &[(&str, &str)] = &[("to_number", "2061111111")];
    for _ in 0..5 {
        let r = ask(&server, "messaging", &[marketing, number]).await;
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
    }
    let r = ask(&server, "messaging", &[marketing, number]).await;
    assert_eq!(
        codes(&r),
        (OVER, vec![OVER, OK]),
        "5 marketing messages a day"
    );
    let limit = r.statuses[0].current_limit.as_ref().expect("its limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (5, 4), "5 per DAY");
    assert_eq!(
        r.statuses[1].limit_remaining, 94,
        "the other descriptor was charged all the same, as the reference charges it"
    );
    // Each number has its own counters.
    let other: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(codes(&ask(&server, "messaging", &[other]).await).0, OK);

    let ip = |a: &'static str| [("remote_address", a)];
    assert_eq!(
        admitted(&server, "edge_proxy_per_ip", &ip("50.0.0.1"), 12).await,
        10
    );
    assert_eq!(
        admitted(&server, "edge_proxy_per_ip", &ip("50.0.0.2"), 3).await,
        3
    );
    assert_eq!(
        admitted(&server, "edge_proxy_per_ip", &ip("50.0.0.5"), 2).await,
        0,
        "a limit of 0 denies"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        admitted(&server, "edge_proxy_per_ip", &ip("50.0.0.1"), 1).await,
        1,
        "the next second's window"
    );

    // A descriptor deeper than the tree matches nothing: no limit, OK.
    let deeper: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    for _ in 0..5 {
        let r = ask(&server, "example4", &[deeper]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(r.statuses[0].current_limit, None);
    }
    assert_eq!(
        admitted(&server, "example4", &[("key", "value")], 5).await,
        3
    );
    server.shutdown().await;
}

const WILDCARDS: &str = r#"
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: path
    rate_limit:
      unit: minute
      requests_per_unit: 4
"#;

const UNLIMITED: &str = r#"
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 2
"#;

const SHADOW: &str = r#"
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 2
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 3
          unit: second
"#;

/// Example 9 (wildcards, each matching value with counters of its own),
/// example 5 (unlimited) and example 6 (shadow mode).
#[tokio::test]
async fn wildcards_unlimited_and_shadow_mode() {
    let (_dir, server, _clock) = serve(&[
        ("example9.yaml", WILDCARDS),
        ("internal.yaml", UNLIMITED),
        ("example6.yaml", SHADOW),
    ])
    .await;
    assert_eq!(
        admitted(&server, "example9", &[("key1", "value1")], 4).await,
        2
    );
    assert_eq!(
        admitted(&server, "example9", &[("key1", "valueXYZ")], 4).await,
        2
    );
    assert_eq!(
        admitted(&server, "example9", &[("path", "/api/123/action")], 3).await,
        1
    );
    assert_eq!(
        admitted(&server, "example9", &[("path", "/api/123/other")], 6).await,
        4,
        "not the wildcard: the default"
    );

    for _ in 0..20 {
        let r = ask(&server, "internal", &[&[("ldap", "any")]]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(
            r.statuses[0].limit_remaining,
            u32::MAX,
            "as the reference answers"
        );
    }
    assert_eq!(admitted(&server, "internal", &[("azure", "x")], 3).await, 2);

    let user_a: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-a")];
    for _ in 0..5 {
        let r = ask(&server, "example6", &[user_a]).await;
        assert_eq!(codes(&r), (OK, vec![OK]), "shadow mode never denies");
        assert!(
            r.statuses[0].current_limit.is_some(),
            "and reports its limit"
        );
    }
    let user_b: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-b")];
    assert_eq!(admitted(&server, "example6", user_b, 5).await, 3);
    let metrics = get_metrics(&server).await;
    let shadowed = metric(
        &metrics,
        "tollgate_rule_shadow_mode_total{domain=\"example6\",rule=\"service.user_user-a\"}",
    );
    assert_eq!(shadowed, 3.0, "the 3 hits it would have denied");
    server.shutdown().await;
}

const REPLACES: &str = r#"
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
"#;

/// A status's `current_limit.name` is the limit's `name` in the file, empty
/// when it has none, as the reference answers it (Envoy appends it to
/// `X-RateLimit-Limit`; it carried the server's internal name, `h.` and
/// hex, before).
#[tokio::test]
async fn a_limits_name_is_the_files() {
    let (_dir, server, _clock) = serve(&[("example7.yaml", REPLACES)]).await;
    let named: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let unnamed: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    let r = ask(&server, "example7", &[named]).await;
    let limit = r.statuses[0].current_limit.as_ref().expect("its limit");
    assert_eq!(limit.name, "specific_limit");
    let r = ask(&server, "example7", &[unnamed]).await;
    let limit = r.statuses[0].current_limit.as_ref().expect("its limit");
    assert_eq!(limit.name, "");
    // Envoy's own `limit` in a descriptor has no name either.
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let mut overridden = descriptor(named, None);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 2,
    });
    let r = client(server.grpc_addr())
        .await
        .should_rate_limit(RateLimitRequest {
            domain: "example7".into(),
            descriptors: vec![overridden],
            hits_addend: 0,
        })
        .await
        .expect("answered")
        .into_inner();
    let limit = r.statuses[0].current_limit.as_ref().expect("its limit");
    assert_eq!((limit.name.as_str(), limit.requests_per_unit), ("", 3));
    server.shutdown().await;
}

/// Example 7: a limit another descriptor of the request replaces is not
/// applied, and not charged.
#[tokio::test]
async fn a_replaced_limit_is_neither_applied_nor_charged() {
    let (_dir, server, _clock) = serve(&[("example7.yaml", REPLACES)]).await;
    let first: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let second: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    for _ in 0..10 {
        let r = ask(&server, "example7", &[first, second]).await;
        assert_eq!(
            codes(&r),
            (OK, vec![OK, OK]),
            "10 / sec: the 5 / sec rule is replaced"
        );
        assert_eq!(r.statuses[0].current_limit, None);
    }
    assert_eq!(
        codes(&ask(&server, "example7", &[first, second]).await).0,
        OVER
    );
    assert_eq!(
        admitted(&server, "example7", first, 6).await,
        5,
        "alone, its own 5 / sec, untouched by the requests that replaced it"
    );
    server.shutdown().await;
}

async fn get_metrics(server: &Server) -> String {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<hyper::body::Bytes>>();
    let url = format!("http://{}/metrics", server.http_addr());
    let response = client
        .get(url.parse().unwrap())
        .await
        .expect("GET /metrics");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    String::from_utf8(body.to_vec()).expect("text")
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

const DETAILED: &str = r#"
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#;

/// Example 8: counters carry the request's value only where
/// `detailed_metric` asks.
#[tokio::test]
async fn detailed_metrics_label_values_only_where_asked() {
    let (_dir, server, _clock) = serve(&[("example8.yaml", DETAILED)]).await;
    let long = "v".repeat(65);
    for value in ["unspecified_value", "unspecified_value2", "value1", &long] {
        ask(&server, "example8", &[&[("key1", value)]]).await;
    }
    for value in ["a", "b"] {
        ask(&server, "example8", &[&[("key2", value)]]).await;
    }
    let text = get_metrics(&server).await;
    let hits = |rule: &str| {
        metric(
            &text,
            &format!("tollgate_rule_total_hits_total{{domain=\"example8\",rule=\"{rule}\"}}"),
        )
    };
    assert_eq!(hits("key1_unspecified_value"), 1.0);
    assert_eq!(hits("key1_unspecified_value2"), 1.0);
    assert_eq!(hits("key1_value1"), 1.0);
    // A value longer than 64 bytes is labelled by its hash.
    assert_eq!(hits(&format!("key1_{long}")), 0.0);
    let hashed = text
        .lines()
        .filter(|l| {
            l.starts_with("tollgate_rule_total_hits_total{domain=\"example8\",rule=\"key1_h.")
        })
        .count();
    assert_eq!(hashed, 1, "one hashed label");
    assert_eq!(hits("key2"), 2.0, "rolled up into the base entry");
    assert_eq!(hits("key2_a"), 0.0);
    server.shutdown().await;
}

/// Values written as numbers or booleans are their text, and merge keys
/// apply, as the reference's YAML reader reads them.
#[tokio::test]
async fn numbers_booleans_and_merge_keys_read_as_the_reference_reads_them() {
    let yaml = r#"
domain: scalars
descriptors:
  - &status
    key: status
    value: 429
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - <<: *status
    value: 500
  - key: beta
    value: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
"#;
    let (_dir, server, _clock) = serve(&[("scalars.yaml", yaml)]).await;
    for (key, value) in [("status", "429"), ("status", "500"), ("beta", "true")] {
        let r = ask(&server, "scalars", &[&[(key, value)]]).await;
        assert_eq!(codes(&r), (OK, vec![OK]), "{key} {value}: counted");
        assert!(
            r.statuses[0].current_limit.is_some(),
            "{key} {value}: its limit"
        );
        let r = ask(&server, "scalars", &[&[(key, value)]]).await;
        assert_eq!(codes(&r), (OVER, vec![OVER]), "{key} {value}: one a minute");
    }
    server.shutdown().await;
}

/// Every error case of the reference refuses the start, with its reason;
/// and a reload to any of them keeps the running rules.
#[tokio::test]
async fn invalid_files_are_refused_with_the_references_reasons() {
    let limit = "rate_limit: { unit: second, requests_per_unit: 1 }";
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (
            vec![
                ("a.yaml", "domain: d\ndescriptors: []\n".into()),
                ("b.yaml", "domain: d\ndescriptors: []\n".into()),
            ],
            "duplicate domain 'd' in config file",
        ),
        (
            vec![("a.yaml", format!("domain: d\ndescriptors:\n  - key: k\n    {limit}\n  - key: k\n    {limit}\n"))],
            "duplicate descriptor composite key 'd.k'",
        ),
        (
            vec![("a.yaml", format!("domain: d\ndescriptors:\n  - value: v\n    {limit}\n"))],
            "descriptor has empty key",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n".into())],
            "should not specify rate limit unit when unlimited",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: n, unit: second, requests_per_unit: 1, replaces: [{ name: n }] }\n".into())],
            "replaces should not contain name of same descriptor",
        ),
        (
            vec![("a.yaml", format!("domain: d\ndescriptors:\n  - key: k\n    colour: red\n    {limit}\n"))],
            "config error, unknown key 'colour'",
        ),
        // Tollgate's extension's fields outside `tollgate:` would mean
        // nothing (a descriptor left without its policy): unknown there.
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    policy: smooth\n".into())],
            "config error, unknown key 'policy'",
        ),
        // `tollgate:` where it is not read would be dropped with its policy.
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 10, tollgate: { policy: strict } }\n".into())],
            "config error, 'tollgate' is read at the top of a file and on a descriptor only",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 10, descriptors: [{ key: j, tollgate: { policy: strict } }] }\n".into())],
            "config error, 'tollgate' is read at the top of a file and on a descriptor only",
        ),
        // Files the reference would read, named neither *.yaml nor *.yml:
        // refused rather than skipped (their limits would be gone), alone
        // or beside YAML files.
        (
            vec![("ratelimit", format!("domain: d\ndescriptors:\n  - key: k\n    {limit}\n"))],
            "files without a *.yaml or *.yml name in the directory: ratelimit",
        ),
        (
            vec![
                ("a.yaml", format!("domain: d\ndescriptors:\n  - key: k\n    {limit}\n")),
                ("b.YAML", format!("domain: e\ndescriptors:\n  - key: k\n    {limit}\n")),
            ],
            "files without a *.yaml or *.yml name in the directory: b.YAML",
        ),
        // A YAML tag hides none of a mapping's keys.
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: !r { unit: minute, requests_per_unit: 5, colour: red }\n".into())],
            "config error, unknown key 'colour'",
        ),
        (
            vec![("a.yaml", "domain: d\nall_or_nothing: true\ndescriptors: []\n".into())],
            "config error, unknown key 'all_or_nothing'",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n".into())],
            "invalid rate limit unit 'fortnight'",
        ),
        (
            vec![("a.yaml", "descriptors: []\n".into())],
            "config file cannot have empty domain",
        ),
        (
            vec![("a.yaml", format!("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    {limit}\n"))],
            "quota_mode is not supported by Tollgate",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    tollgate: { policy: nowhere }\n".into())],
            "tollgate.policy \"nowhere\" is not a [policies.<name>]",
        ),
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    tollgate: { policy: in_flight }\n".into())],
            "tollgate.policy \"in_flight\" is a concurrency limit",
        ),
        // Above what Tollgate counts (the reference takes any u32): said
        // with the descriptor and the field.
        (
            vec![("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 2000000000 }\n".into())],
            "descriptor \"d.k\": requests_per_unit 2000000000 must be between 1 and 1000000000",
        ),
    ];
    for (files, reason) in &cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (*n, t.as_str())).collect();
        let dir = directory(&files, "");
        let clock = Arc::new(ManualClock::new(START));
        let refused = start(&dir, clock).await.expect_err(reason);
        assert!(
            refused.to_string().contains(reason),
            "{refused} should say {reason:?}"
        );
    }

    // A reload to an invalid directory keeps the running rules.
    let (dir, server, _clock) = serve(&[("per_ip.yaml", PER_IP)]).await;
    let ip: &[(&str, &str)] = &[("remote_address", "50.0.0.1")];
    assert_eq!(admitted(&server, "edge_proxy_per_ip", ip, 4).await, 4);
    dir.write(
        "config/broken.yaml",
        "domain: edge_proxy_per_ip\ndescriptors: []\n",
    );
    let refused = server.reload().await.expect_err("a duplicate domain");
    assert!(
        refused.to_string().contains("duplicate domain"),
        "{refused}"
    );
    assert_eq!(
        admitted(&server, "edge_proxy_per_ip", ip, 8).await,
        6,
        "the same counters, the same limit"
    );
    server.shutdown().await;
}

/// Files in subdirectories are read, as the reference reads its whole
/// runtime tree (before, they were skipped: a directory holding only
/// `team-a/per-ip.yaml` started with no limits), links to directories
/// followed, hidden directories (Kubernetes' `..data`) aside.
#[tokio::test]
async fn files_in_subdirectories_are_read() {
    let dir = directory(&[], "");
    std::fs::create_dir_all(dir.0.join("config/team-a")).expect("team-a/");
    dir.write("config/team-a/per-ip.yaml", PER_IP);
    std::fs::create_dir_all(dir.0.join("config/..data")).expect("..data/");
    dir.write("config/..data/messaging.yaml", MESSAGING);
    // A link to a directory is followed (a ConfigMap's nested paths are).
    std::fs::create_dir_all(dir.0.join("shared")).expect("shared/");
    let linked = PER_IP.replace("edge_proxy_per_ip", "linked_per_ip");
    dir.write("shared/per-ip.yaml", &linked);
    std::os::unix::fs::symlink("../shared", dir.0.join("config/team-b")).expect("a link");
    let clock = Arc::new(ManualClock::new(START));
    let server = start(&dir, clock).await.expect("starts");
    let blocked = [("remote_address", "50.0.0.5")];
    assert_eq!(admitted(&server, "edge_proxy_per_ip", &blocked, 2).await, 0);
    assert_eq!(admitted(&server, "linked_per_ip", &blocked, 2).await, 0);
    let r = ask(&server, "messaging", &[&[("to_number", "123")]]).await;
    assert!(
        r.statuses[0].current_limit.is_none(),
        "a hidden directory is not read"
    );
    server.shutdown().await;
}

/// A changed directory is applied by the watch once it stands still; a
/// file still being written is not (see `settled.rs`).
#[tokio::test]
async fn a_changed_directory_is_applied() {
    let (dir, server, _clock) = serve(&[("example4.yaml", EXAMPLE4)]).await;
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let _watch = server.watch(Duration::from_millis(50), move |r| {
        let _ = sender.send(r.map_err(|e| e.to_string()));
    });
    dir.write(
        "config/example4.yaml",
        &EXAMPLE4.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    );
    let outcome = tokio::time::timeout(Duration::from_secs(10), outcomes.recv())
        .await
        .expect("the watch saw the change");
    assert_eq!(outcome, Some(Ok(())));
    assert_eq!(
        admitted(&server, "example4", &[("key", "value")], 9).await,
        7
    );
    dir.write("config/more.yaml", "domain: more\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n");
    let outcome = tokio::time::timeout(Duration::from_secs(10), outcomes.recv())
        .await
        .expect("a new file is a change");
    assert_eq!(outcome, Some(Ok(())));
    assert_eq!(admitted(&server, "more", &[("k", "v")], 2).await, 1);
    server.shutdown().await;
}

/// A tree the watch cannot apply is a change too: a stray file is
/// refused by the reload the watch attempts, naming it, and a later good
/// edit is applied (before, a stray file made the watch see nothing at
/// all, and every edit, of the YAML or of the server's file, was ignored
/// without a word while it stayed).
#[tokio::test]
async fn a_stray_file_is_reported_by_the_watch_and_its_removal_applied() {
    let (dir, server, _clock) = serve(&[("example4.yaml", EXAMPLE4)]).await;
    let (sender, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    let _watch = server.watch(Duration::from_millis(50), move |r| {
        let _ = sender.send(r.map_err(|e| e.to_string()));
    });
    dir.write("config/README", "limits live in the YAML files\n");
    match next_outcome(&mut outcomes).await {
        Some(Err(e)) => assert!(e.contains("README"), "{e}"),
        other => panic!("the stray file was reported: {other:?}"),
    }
    std::fs::remove_file(dir.0.join("config/README")).expect("removed");
    dir.write(
        "config/example4.yaml",
        &EXAMPLE4.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    );
    assert_eq!(next_outcome(&mut outcomes).await, Some(Ok(())));
    assert_eq!(
        admitted(&server, "example4", &[("key", "value")], 9).await,
        7
    );
    server.shutdown().await;
}

/// The watch's next outcome, within ten seconds.
async fn next_outcome(
    outcomes: &mut tokio::sync::mpsc::UnboundedReceiver<Result<(), String>>,
) -> Option<Result<(), String>> {
    tokio::time::timeout(Duration::from_secs(10), outcomes.recv())
        .await
        .expect("the watch saw the change")
}

/// A `*.yaml` entry that cannot be read (a link to nothing, a volume not
/// mounted) refuses the tree, naming it: skipped, its domain's limits
/// were gone, and with unknown descriptors allowed every request of it
/// was admitted.
#[tokio::test]
async fn a_yaml_link_to_nothing_is_refused() {
    let dir = directory(&[("per_ip.yaml", PER_IP)], "");
    std::os::unix::fs::symlink(
        dir.0.join("nowhere/messaging.yaml"),
        dir.0.join("config/messaging.yaml"),
    )
    .expect("a link");
    let clock = Arc::new(ManualClock::new(START));
    let refused = start(&dir, clock).await.expect_err("an unreadable file");
    assert!(refused.to_string().contains("messaging.yaml"), "{refused}");
}

const EXTENDED: &str = r#"
domain: extended
tollgate:
  all_or_nothing: true
descriptors:
  - key: user
    tollgate: { policy: smooth }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 4 }
"#;

/// Tollgate's extension: a policy of the server's file (any algorithm)
/// instead of a fixed window, and a domain's descriptors decided
/// together, all-or-nothing.
#[tokio::test]
async fn the_extension_brings_policies_and_all_or_nothing() {
    let (_dir, server, clock) = serve(&[("extended.yaml", EXTENDED)]).await;
    let user = |u: &'static str| [("user", u)];
    let tenant: &[(&str, &str)] = &[("tenant", "t")];
    // GCRA, 3 per minute, burst 3: three at once, then one every 20 s.
    for _ in 0..3 {
        assert_eq!(
            codes(&ask(&server, "extended", &[&user("u1"), tenant]).await).0,
            OK
        );
    }
    let r = ask(&server, "extended", &[&user("u1"), tenant]).await;
    assert_eq!(codes(&r), (OVER, vec![OVER, OK]));
    clock.advance(Duration::from_secs(20));
    assert_eq!(
        codes(&ask(&server, "extended", &[&user("u1"), tenant]).await).0,
        OK
    );
    // The tenant was charged 4 times: the denied request charged nothing.
    let r = ask(&server, "extended", &[&user("u2"), tenant]).await;
    assert_eq!(
        codes(&r),
        (OVER, vec![OK, OVER]),
        "the tenant's 4 per minute are used"
    );
    let r = ask(&server, "extended", &[&user("u2")]).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "u2 was not charged by the denied request"
    );
    server.shutdown().await;
}

const EDGES: &str = r#"
domain: d
descriptors:
  # A dry run of a block: answered OK.
  - key: dry
    rate_limit: { unit: second, requests_per_unit: 0 }
    shadow_mode: true
  # A block another limit replaces.
  - key: blocked
    rate_limit: { name: block, unit: second, requests_per_unit: 0 }
  - key: unblock
    rate_limit:
      unit: second
      requests_per_unit: 5
      shadow_mode: true          # misplaced: ignored, as the reference ignores it
      replaces: [{ name: block }]
  # Two full keys that read alike: d.p_x.p
  - key: p
    value: x.p
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: p_x
    descriptors:
      - key: p
        rate_limit: { unit: second, requests_per_unit: 3 }
  - key: w
    value: "a**b"
    rate_limit: { unit: second, requests_per_unit: 2 }
"#;

/// Edges of the format: a shadow limit of 0, a replaced limit of 0, a
/// known key in the wrong place, two leaves whose full keys read alike
/// (their counters stay apart), a wildcard with two stars in a row.
#[tokio::test]
async fn the_formats_edges_are_the_references() {
    let (_dir, server, _clock) = serve(&[("d.yaml", EDGES)]).await;
    assert_eq!(admitted(&server, "d", &[("dry", "x")], 3).await, 3);
    let blocked: &[(&str, &str)] = &[("blocked", "x")];
    assert_eq!(admitted(&server, "d", blocked, 1).await, 0);
    let r = ask(&server, "d", &[blocked, &[("unblock", "x")]]).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]), "the block is replaced");
    assert_eq!(admitted(&server, "d", &[("p", "x.p")], 3).await, 1);
    let nested: &[(&str, &str)] = &[("p_x", "any"), ("p", "p")];
    assert_eq!(
        admitted(&server, "d", nested, 5).await,
        3,
        "counted on its own"
    );
    assert_eq!(admitted(&server, "d", &[("w", "axyb")], 3).await, 2);
    assert_eq!(admitted(&server, "d", &[("w", "ab")], 3).await, 2);
    server.shutdown().await;
}

/// `unit: month` counts 30 days from the epoch, as the reference does; a
/// calendar month is a `calendar` policy a descriptor names. Both state
/// `MONTH` and the exact time to their end.
#[tokio::test]
async fn months_count_as_the_reference_counts_them_and_calendar_months_by_policy() {
    let yaml = "domain: quota\ndescriptors:\n  - key: fixed\n    rate_limit: { unit: month, requests_per_unit: 2 }\n  - key: calendar\n    tollgate: { policy: monthly }\n";
    let monthly = "\n[policies.monthly]\nalgorithm = \"calendar\"\nlimit = 2\nper = \"month\"\ntime_zone = \"UTC\"\nfrom = \"2025-01-01T00:00\"\n";
    let dir = directory(&[("quota.yaml", yaml)], monthly);
    let server = start(&dir, Arc::new(ManualClock::new(START)))
        .await
        .expect("starts");
    let now = START.as_micros() / 1_000_000;
    let thirty_days = 30 * 86_400;
    // START is 2026-05-28T20:27Z; June begins at 1_780_272_000 s.
    for (key, end) in [
        ("fixed", (now / thirty_days + 1) * thirty_days),
        ("calendar", 1_780_272_000),
    ] {
        assert_eq!(
            admitted(&server, "quota", &[(key, "v")], 3).await,
            2,
            "{key}"
        );
        let r = ask(&server, "quota", &[&[(key, "v")]]).await;
        let status = &r.statuses[0];
        let limit = status.current_limit.as_ref().expect("stated");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, 5),
            "{key}: 2 per MONTH"
        );
        let reset = status.duration_until_reset.as_ref().expect("a reset");
        assert_eq!(reset.seconds as u64, end - now, "{key}");
    }
    server.shutdown().await;
}

/// A request over a daily and a per-second limit at once is told to come
/// back in a day: `Retry-After` is the longest wait of every descriptor
/// that denied, whichever order they come in.
#[tokio::test]
async fn retry_after_is_the_longest_wait_of_every_denial() {
    const TWO: &str = r#"
domain: two_limits
descriptors:
  - key: user_id
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 5
"#;
    let (_dir, server, _clock) = serve(&[("two.yaml", TWO)]).await;
    let user: &[(&str, &str)] = &[("user_id", "u")];
    let address: &[(&str, &str)] = &[("remote_address", "10.0.0.1")];
    assert_eq!(admitted(&server, "two_limits", user, 1).await, 1);
    assert_eq!(admitted(&server, "two_limits", address, 5).await, 5);
    for order in [[user, address], [address, user]] {
        let r = ask(&server, "two_limits", &order).await;
        assert_eq!(codes(&r), (OVER, vec![OVER, OVER]));
        let longest = r
            .statuses
            .iter()
            .filter_map(|s| s.duration_until_reset.as_ref())
            .map(|d| d.seconds)
            .max()
            .expect("waits");
        let retry: i64 = r
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "retry-after")
            .expect("a retry-after")
            .value
            .parse()
            .unwrap();
        assert!(retry >= longest, "retry-after {retry} < {longest}");
        assert!(retry > 3_600, "a day's wait, not a second's: {retry}");
    }
}

/// The descriptors of one request, each decided on its own, wait for a
/// stalled store together, fail open unless their domain says otherwise:
/// the answer comes within about one store
/// deadline, not one per descriptor in a row (before, 4 × 200 ms here:
/// past Envoy's timeout, which lets the request through).
#[tokio::test]
async fn the_descriptors_of_a_request_wait_for_a_stalled_store_together_and_fail_open() {
    let redis = tollgate_testkit::redis_server::RedisServer::start();
    let dir = redis_directory(redis.url(), "deadline = \"200ms\"", "");
    let leaves: String = (1..=4)
        .map(|i| {
            format!("  - key: k{i}\n    rate_limit: {{ unit: second, requests_per_unit: 5 }}\n")
        })
        .collect();
    dir.write(
        "config/d.yaml",
        &format!("domain: d\ndescriptors:\n{leaves}"),
    );
    dir.write(
        "config/e.yaml",
        &format!("domain: e\ntollgate: {{ on_failure: fail_closed }}\ndescriptors:\n{leaves}"),
    );
    let clock = Arc::new(tollgate_limiter::MonotonicClock::new());
    let server = Server::start(dir.path("server.toml"), clock)
        .await
        .expect("starts");
    let four: [&[(&str, &str)]; 4] = [
        &[("k1", "v")],
        &[("k2", "v")],
        &[("k3", "v")],
        &[("k4", "v")],
    ];
    assert_eq!(codes(&ask(&server, "d", &four).await), (OK, vec![OK; 4]));
    redis.pause();
    let began = std::time::Instant::now();
    let answer = ask(&server, "d", &four).await;
    let took = began.elapsed();
    let closed = ask(&server, "e", &four).await;
    // Resumed before any assertion: a stopped Redis cannot be stopped for good.
    redis.resume();
    assert!(took < Duration::from_millis(600), "answered after {took:?}");
    // A YAML limit answers a failed store as the reference does behind
    // Envoy's default (admitted), unless its domain says fail_closed.
    assert_eq!(codes(&answer), (OK, vec![OK; 4]), "fail open by default");
    assert_eq!(codes(&closed).0, OVER, "the domain's on_failure");
    server.shutdown().await;
}

const ZERO: &str = r#"
domain: zero_counted
descriptors:
  - key: remote_address
    value: 50.0.0.5
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: dry
    rate_limit: { unit: second, requests_per_unit: 0 }
    shadow_mode: true
  - key: blocked
    rate_limit: { name: block, unit: second, requests_per_unit: 0 }
  - key: unblock
    rate_limit: { unit: second, requests_per_unit: 5, replaces: [{ name: block }] }
"#;

/// A limit of 0 counts its hits on its rule's counters, as the
/// reference's do (before, a descriptor denied without a store call was
/// counted nowhere): all over the limit, and in shadow mode all shadow
/// too. A limit of 0 another descriptor replaces counts nothing (as
/// before: the reference takes it out of the request).
#[tokio::test]
async fn a_limit_of_zero_counts_its_hits_over_the_limit() {
    let (_dir, server, _clock) = serve(&[("zero.yaml", ZERO)]).await;
    let blocked_ip: &[(&str, &str)] = &[("remote_address", "50.0.0.5")];
    assert_eq!(admitted(&server, "zero_counted", blocked_ip, 3).await, 0);
    assert_eq!(
        admitted(&server, "zero_counted", &[("dry", "x")], 2).await,
        2
    );
    let r = ask(
        &server,
        "zero_counted",
        &[&[("blocked", "x")], &[("unblock", "x")]],
    )
    .await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]), "the block is replaced");
    let text = get_metrics(&server).await;
    let count = |counter: &str, rule: &str| {
        metric(
            &text,
            &format!("tollgate_rule_{counter}_total{{domain=\"zero_counted\",rule=\"{rule}\"}}"),
        )
    };
    let ip = "remote_address_50.0.0.5";
    assert_eq!(count("total_hits", ip), 3.0);
    assert_eq!(count("over_limit", ip), 3.0);
    assert_eq!(count("within_limit", ip), 0.0);
    assert_eq!(count("shadow_mode", ip), 0.0);
    assert_eq!(count("total_hits", "dry"), 2.0);
    assert_eq!(count("over_limit", "dry"), 2.0);
    assert_eq!(count("shadow_mode", "dry"), 2.0);
    assert_eq!(count("total_hits", "blocked"), 0.0, "replaced: not counted");
    assert_eq!(count("total_hits", "unblock"), 1.0);
    server.shutdown().await;
}

const SECRETS: &str = r#"
domain: keys
tollgate:
  hashed: [api_key]
descriptors:
  - key: api_key
    rate_limit: { unit: minute, requests_per_unit: 2 }
    detailed_metric: true
"#;

/// A domain's `tollgate.hashed` entries are hashed with the server's key
/// before they name anything: a client's secret (an API key) reaches
/// neither a Redis key nor a metric's label, and each value is still
/// counted on its own (before, envoyproxy/ratelimit's domains kept every
/// value as sent, whatever `hash_key_env` said).
#[tokio::test]
async fn hashed_entries_keep_secrets_out_of_keys_and_labels() {
    std::env::set_var(
        "TOLLGATE_TEST_ENVOY_HASH_KEY",
        "an-envoy-domain-hash-key-0123456",
    );
    let redis = tollgate_testkit::redis_server::RedisServer::start();
    let dir = redis_directory(
        redis.url(),
        "",
        "hash_key_env = \"TOLLGATE_TEST_ENVOY_HASH_KEY\"",
    );
    dir.write("config/keys.yaml", SECRETS);
    let clock = Arc::new(ManualClock::new(START));
    let server = Server::start(dir.path("server.toml"), clock)
        .await
        .expect("starts");
    let secret: &[(&str, &str)] = &[("api_key", "sk_live_secret")];
    assert_eq!(admitted(&server, "keys", secret, 3).await, 2);
    let other: &[(&str, &str)] = &[("api_key", "sk_live_other")];
    assert_eq!(
        admitted(&server, "keys", other, 1).await,
        1,
        "its own count"
    );
    use tollgate_testkit::resp::Reply;
    let keys: Vec<String> = match redis.command(&["KEYS", "*"]) {
        Reply::Array(Some(keys)) => keys
            .into_iter()
            .map(|key| match key {
                Reply::Bulk(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                other => panic!("a key: {other:?}"),
            })
            .collect(),
        other => panic!("KEYS: {other:?}"),
    };
    let keys = keys.join(" ");
    assert!(keys.contains("h."), "the counters are there: {keys}");
    assert!(!keys.contains("sk_live"), "a secret in a key: {keys}");
    let metrics = get_metrics(&server).await;
    assert!(metrics.contains("domain=\"keys\""), "{metrics}");
    assert!(!metrics.contains("sk_live"), "a secret in a label");
    server.shutdown().await;
}

/// `tollgate.hashed` needs the server's hash key, and names keys of the
/// domain's tree: a typo would leave the secret as sent.
#[tokio::test]
async fn hashed_entries_that_cannot_be_hashed_are_refused() {
    let no_key = directory(&[("keys.yaml", SECRETS)], "");
    let clock = Arc::new(ManualClock::new(START));
    let refused = start(&no_key, clock.clone())
        .await
        .expect_err("no hash key");
    assert!(refused.to_string().contains("hash_key_env"), "{refused}");
    std::env::set_var(
        "TOLLGATE_TEST_ENVOY_HASH_KEY_2",
        "an-envoy-domain-hash-key-0123456",
    );
    let typo = directory(
        &[("keys.yaml", &SECRETS.replace("[api_key]", "[apikey]"))],
        "hash_key_env = \"TOLLGATE_TEST_ENVOY_HASH_KEY_2\"",
    );
    let refused = start(&typo, clock)
        .await
        .expect_err("a key of no descriptor");
    assert!(refused.to_string().contains("\"apikey\""), "{refused}");
}

/// A charge of several units that does not fit (Envoy's `hits_addend`,
/// sent after the response with `apply_on_stream_done`) is counted, as the
/// reference counts every hit: the limit is empty after it. A limit named
/// by `tollgate: { policy }` keeps Tollgate's rule (a denial charges
/// nothing).
#[tokio::test]
async fn a_refused_charge_of_several_units_still_empties_the_limit() {
    let yaml = "domain: tokens\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n  - key: smooth\n    tollgate: { policy: smooth }\n";
    let (_dir, server, _clock) = serve(&[("tokens.yaml", yaml)]).await;
    let c = client(server.grpc_addr()).await;
    let charge = |key: &'static str, hits: u32| {
        let request = RateLimitRequest {
            domain: "tokens".into(),
            descriptors: vec![descriptor(&[(key, "u1")], None)],
            hits_addend: hits,
        };
        let mut c = c.clone();
        async move {
            let r = c.should_rate_limit(request).await.expect("answered");
            r.into_inner().overall_code
        }
    };
    assert_eq!(charge("user", 8).await, OK, "8 of 10");
    assert_eq!(charge("user", 5).await, OVER, "5 more do not fit");
    assert_eq!(charge("user", 1).await, OVER, "the 5 were counted: empty");
    assert_eq!(
        charge("user", 50).await,
        OVER,
        "above the limit: counted too"
    );
    // smooth: 3 a minute, burst 3.
    assert_eq!(charge("smooth", 2).await, OK);
    assert_eq!(charge("smooth", 2).await, OVER);
    assert_eq!(
        charge("smooth", 1).await,
        OK,
        "Tollgate's rule: nothing charged"
    );
    server.shutdown().await;
}
