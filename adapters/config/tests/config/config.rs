//! The configuration file: every error found at once with its path, and
//! limiters built from a valid file that behave as configured.

use std::sync::Arc;
use std::time::Duration;

use tollgate_config::{Config, ConfigError, SetupError, StoreSpec};
use tollgate_limiter::{Context, ManualClock, Scope, Subject, Timestamp};

fn errors(text: &str) -> Vec<String> {
    match Config::from_toml_str(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => {
            let list: Vec<String> = e.errors().iter().map(ToString::to_string).collect();
            assert!(!list.is_empty(), "not a field error: {e}");
            list
        }
    }
}

fn has(list: &[String], wanted: &str) {
    assert!(
        list.iter()
            .any(|e| e.starts_with(wanted) || e.contains(wanted)),
        "no error like {wanted:?} in {list:#?}"
    );
}

const VALID: &str = r#"
[store]
kind = "memory"
max_keys = 1000

[fallback]
max_keys = 100

[breaker]
failure_threshold = 3
open_for = "500ms"

[policies.search]
algorithm = "token_bucket"
capacity = 5
refill = 1
period = "1s"

[policies.tenant]
algorithm = "fixed_window"
limit = 3
window = "1m"
version = 2
on_failure = { fallback_share = 2 }

[routes.search]
cost = 1
layers = [
    { scope = "subject", policy = "search" },
    { name = "per-tenant", scope = "tenant", policy = "tenant" },
]

[routes.bulk]
cost = 2
layers = [{ scope = { attribute = "region" }, policy = "search" }]
"#;

#[test]
fn a_valid_file_parses() {
    let config = Config::from_toml_str(VALID).expect("valid");
    assert!(matches!(config.store(), StoreSpec::Memory(m) if m.max_keys == Some(1000)));
    assert_eq!(config.fallback_max_keys(), 100);
    assert_eq!(config.breaker().failure_threshold, 3);
    assert_eq!(config.breaker().open_for, Duration::from_millis(500));
    assert_eq!(config.policy("tenant").unwrap().version(), 2);
    assert_eq!(
        config
            .policy("tenant")
            .unwrap()
            .fallback_limit()
            .unwrap()
            .capacity(),
        1
    );
    let search = config.route("search").unwrap();
    assert_eq!(search.layers()[0].name(), "subject");
    assert_eq!(search.layers()[1].name(), "per-tenant");
    assert_eq!(search.layers()[1].scope(), &Scope::Tenant);
    let bulk = config.route("bulk").unwrap();
    assert_eq!(bulk.cost(), 2);
    assert_eq!(bulk.layers()[0].scope(), &Scope::Attribute("region".into()));
}

#[test]
fn swapping_an_algorithm_is_one_line() {
    let swapped = VALID.replace(
        "algorithm = \"token_bucket\"\ncapacity = 5\nrefill = 1\nperiod = \"1s\"",
        "algorithm = \"sliding_log\"\nlimit = 5\nwindow = \"1s\"",
    );
    assert_ne!(swapped, VALID);
    let config = Config::from_toml_str(&swapped).expect("valid");
    assert_eq!(
        config.policy("search").unwrap().limit().algorithm_name(),
        "sliding_log"
    );
}

#[test]
fn every_error_is_reported_with_its_path() {
    let list = errors(
        r#"
[store]
kind = "memory"
max_keys = 0
colour = "blue"

[policies.search]
algorithm = "token_bucket"
capacity = 0
refill = 1
period = "1s"

[policies.login]
algorithm = "sliding_log"
limit = 3
window = "0s"

[policies.typo]
algorithm = "fixed_window"
limt = 3
window = "1m"

[policies.bad-duration]
algorithm = "gcra"
rate = 10
period = "ten seconds"
burst = "5"

[policies.badalgo]
algorithm = "leaky"

[routes.search]
cost = 9
layers = [{ scope = "subject", policy = "search" }, { scope = "tenant", policy = "nope" }]

[routes.login]
layers = [{ scope = "everyone", policy = "login" }]

[extra]
x = 1
"#,
    );
    has(&list, "store.colour: unknown field `colour`");
    has(&list, "policies.search.capacity: 0 must be between 1 and");
    has(&list, "policies.login.window: 0ns must be between 1ms");
    has(
        &list,
        "policies.typo.limt: unknown field `limt`; this algorithm takes limit, window",
    );
    has(
        &list,
        "policies.bad-duration.period: \"ten seconds\" is not a duration",
    );
    has(
        &list,
        "policies.bad-duration.burst: \"5\" must be a whole number",
    );
    has(&list, "policies.badalgo.algorithm: unknown variant `leaky`");
    has(
        &list,
        "routes.search.layers[1].policy: no policy named \"nope\"",
    );
    has(
        &list,
        "routes.login.layers[0].scope: unknown variant `everyone`",
    );
    has(&list, "extra: unknown section");
    // `max_keys = 0` is only found after the unknown field is fixed: the
    // store section is one value. Everything else is reported at once.
    has(&list, "policies.typo: missing field `limit`");
    assert_eq!(list.len(), 11, "{list:#?}");
}

/// The in-process store's settings are its own type (`MemorySettings`),
/// read and checked for the file, each error under `store.`.
#[test]
fn the_memory_stores_settings_are_checked_by_the_store() {
    let list = errors(
        r#"
[store]
kind = "memory"
max_keys = 0
shards = 0

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"
"#,
    );
    has(&list, "store.max_keys: must be > 0");
    has(&list, "store.shards: must be > 0");
    let list = errors(
        r#"
[store]
kind = "memory"
when_full = "sometimes"

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"
"#,
    );
    assert!(
        list.iter()
            .any(|e| e == "store.when_full: unknown variant `…`, expected `evict` or `refuse`"),
        "{list:#?}"
    );
}

#[test]
fn values_are_checked_beyond_their_types() {
    let list = errors(
        r#"
[store]
kind = "redis"
url = "localhost:6379"
deadline = "0ms"
pool_size = 0
prefix = "has space"

[fallback]
max_keys = 0

[breaker]
open_for = "0s"

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"
version = 0
on_failure = { fallback = { algorithm = "fixed_window", limit = 0, window = "1s" } }

[routes.r]
cost = 3
layers = [{ scope = "subject", policy = "p" }, { name = "subject", scope = "tenant", policy = "p" }]

[routes.empty]
layers = []
"#,
    );
    // The Redis store checks its own settings, when the build has it;
    // without it the kind itself is refused, and says how to get it.
    #[cfg(feature = "redis")]
    {
        has(&list, "store.url: must start with redis://");
        has(&list, "store.deadline: must be > 0");
        has(&list, "store.pool_size: 0 must be between 1 and 1024");
        has(&list, "store.prefix: invalid key prefix \"has space\"");
    }
    #[cfg(not(feature = "redis"))]
    has(
        &list,
        "store.kind: \"redis\" needs the Redis store; enable the `redis` feature",
    );
    has(&list, "fallback.max_keys: must be > 0");
    has(&list, "breaker.open_for: must be > 0");
    has(
        &list,
        "policies.p.version: 0 must be a whole number between 1",
    );
    has(
        &list,
        "routes.r.layers[1].name: two layers are named \"subject\"",
    );
    has(&list, "routes.empty.layers: must list at least one layer");
    // The invalid policy is not reported again as undefined.
    assert!(
        !list.iter().any(|e| e.contains("no policy named")),
        "{list:#?}"
    );
}

#[test]
fn layers_breaking_the_limiters_rules_are_reported_where_written() {
    let list = errors(
        r#"
[store]
kind = "memory"

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"

[routes.r]
layers = [
    { scope = "subject", policy = "p" },
    { name = "again", scope = "subject", policy = "p" },
    { name = "again", scope = "global", policy = "p" },
    { name = "who", scope = { attribute = "not ok" }, policy = "p" },
]
"#,
    );
    has(
        &list,
        "routes.r.layers[1]: layers \"subject\" and \"again\" both count policy \"p\" by the same scope",
    );
    has(
        &list,
        "routes.r.layers[2].name: two layers are named \"again\"",
    );
    has(
        &list,
        "routes.r.layers[3].scope.attribute: \"not ok\" must be 1-64 characters",
    );
    assert_eq!(list.len(), 3, "{list:#?}");
}

#[test]
fn on_failure_errors_have_their_path() {
    let list = errors(
        r#"
[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"
on_failure = { fallback = { algorithm = "fixed_window", limit = 0, window = "1s" } }

[policies.q]
algorithm = "fixed_window"
limit = 2
window = "1s"
on_failure = "fail_sometimes"

[routes.r]
cost = 3
layers = [{ scope = "subject", policy = "p" }]
"#,
    );
    has(
        &list,
        "policies.p.on_failure.fallback.limit: 0 must be between 1 and",
    );
    has(
        &list,
        "policies.q.on_failure: unknown variant `fail_sometimes`",
    );
    assert!(
        list.iter().all(|e| !e.contains('\n')),
        "one line each: {list:#?}"
    );
}

#[test]
fn the_cost_must_fit_every_layer() {
    let list = errors(
        r#"
[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1s"

[routes.r]
cost = 3
layers = [{ scope = "subject", policy = "p" }]
"#,
    );
    has(
        &list,
        "routes.r.cost: 3 is more than the capacity 2 of policy \"p\"",
    );
}

/// The emergency limit must hold the cost too: a capacity of 10 shared by
/// 4 instances is 2 each, less than a cost of 10.
#[test]
fn the_cost_must_fit_the_emergency_limit() {
    let list = errors(
        r#"
[policies.p]
algorithm = "fixed_window"
limit = 10
window = "1s"
on_failure = { fallback_share = 4 }

[routes.r]
cost = 10
layers = [{ scope = "subject", policy = "p" }]
"#,
    );
    has(
        &list,
        "routes.r.cost: 10 is more than the capacity 2 of policy \"p\"'s emergency limit",
    );
}

#[test]
fn syntax_errors_give_the_line() {
    let err = Config::from_toml_str("[policies.p]\nalgorithm = \n").unwrap_err();
    assert!(matches!(err, ConfigError::Syntax(_)), "{err}");
    assert!(err.to_string().contains("line 2"), "{err}");
}

#[test]
fn files_are_named_in_errors() {
    let path = std::env::temp_dir().join(format!("tollgate-config-{}.toml", std::process::id()));
    std::fs::write(&path, "[policies.p]\nalgorithm = \"nope\"\n").unwrap();
    let err = Config::from_file(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    let text = err.to_string();
    assert!(text.starts_with(&path.display().to_string()), "{text}");
    assert!(
        text.contains("policies.p.algorithm: unknown variant `nope`"),
        "{text}"
    );
    let missing = Config::from_file(path.with_extension("missing")).unwrap_err();
    assert!(matches!(missing, ConfigError::Read { .. }), "{missing}");
}

#[tokio::test]
async fn limiters_decide_as_configured() {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let limiters = Config::from_toml_str(VALID)
        .unwrap()
        .build(Arc::new(clock.clone()))
        .await
        .expect("builds");
    let search = limiters.route("search").unwrap();
    let ctx = |who: &str| {
        Context::for_subject(Subject::new(who).unwrap()).with_tenant(Subject::new("acme").unwrap())
    };
    // Per subject 5, per tenant 3: the tenant layer stops the fourth request.
    let mut admitted = 0;
    for who in ["a", "a", "b", "b", "c"] {
        if search
            .limiter()
            .check(&ctx(who), search.cost())
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    clock.advance(Duration::from_secs(60));
    assert!(search
        .limiter()
        .check(&ctx("a"), 1)
        .await
        .unwrap()
        .is_allowed());

    let bulk = limiters.route("bulk").unwrap();
    let region = Context::new().with_attribute("region", Subject::new("eu").unwrap());
    let first = bulk.limiter().check(&region, bulk.cost()).await.unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.layers()[0].verdict().remaining, 3, "cost 2 of 5");
}

#[tokio::test]
async fn redis_without_the_feature_or_server_is_a_clear_error() {
    let parsed = Config::from_toml_str(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:1/"
connect_timeout = "200ms"
"#,
    );
    if cfg!(feature = "redis") {
        let err = parsed
            .expect("valid")
            .build(Arc::new(tollgate_limiter::SystemClock))
            .await
            .unwrap_err();
        assert!(
            matches!(err, SetupError::Store { kind: "redis", .. }),
            "{err}"
        );
    } else {
        let err = parsed.expect_err("no Redis store in this build");
        assert!(
            err.to_string().contains(
                "store.kind: \"redis\" needs the Redis store; enable the `redis` feature"
            ),
            "{err}"
        );
    }
}

#[cfg(feature = "redis")]
#[test]
fn redis_kinds_refuse_each_others_fields() {
    let list = errors(
        r#"
[store]
kind = "redis-sentinel"
url = "redis://127.0.0.1:6379/"
pool_size = 4
sentinels = ["127.0.0.1:26379"]
client_cert_file = "client.crt"
replica_ack = 0
"#,
    );
    has(&list, "store.url: is for kind = \"redis\"");
    has(&list, "store.sentinels[0]: must start with redis://");
    has(&list, "store.service: missing");
    has(
        &list,
        "store.client_cert_file: client_cert_file and client_key_file go together",
    );
    has(&list, "store.replica_ack: must be at least 1");
    // A Sentinel store takes a pool (pool_size = 4 is fine).
    assert!(list.iter().all(|e| !e.contains("pool_size")), "{list:#?}");
    assert_eq!(list.len(), 5, "{list:#?}");

    let list = errors(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:6379/"
service = "limits"
password = "secret"
replica_ack_timeout = "10ms"
"#,
    );
    has(&list, "store.service: is for kind = \"redis-sentinel\"");
    has(
        &list,
        "store.password: is for kind = \"redis-sentinel\"; with kind = \"redis\" put it in the url",
    );
    has(&list, "store.replica_ack_timeout: needs replica_ack");
    // The password itself is never repeated.
    assert!(list.iter().all(|e| !e.contains("secret")), "{list:#?}");
}

/// Neither a syntax error nor a value of the wrong type repeats what was
/// written in `[store]`: it may be a password.
#[cfg(feature = "redis")]
#[test]
fn store_errors_never_repeat_a_password() {
    let unclosed = "[store]\nkind = \"redis\"\nurl = \"redis://:s3cret@127.0.0.1:6379/\n";
    let e = Config::from_toml_str(unclosed).unwrap_err().to_string();
    assert!(!e.contains("s3cret"), "{e}");
    assert!(e.contains("line 3"), "{e}");
    let wrong_type = "[store]\nkind = \"redis-sentinel\"\nsentinels = \"redis://:s3cret@10.0.0.1:26379\"\nservice = \"limits\"\n";
    let e = Config::from_toml_str(wrong_type).unwrap_err().to_string();
    assert!(!e.contains("s3cret"), "{e}");
    assert!(e.contains("store.sentinels"), "{e}");
    let number = "[store]\nkind = \"redis-sentinel\"\nsentinels = [\"redis://10.0.0.1:26379\"]\nservice = \"limits\"\npassword = 123456\n";
    let e = Config::from_toml_str(number).unwrap_err().to_string();
    assert!(!e.contains("123456"), "{e}");
    // A value pasted into a field of named choices.
    let choice = "[store]\nkind = \"memory\"\nwhen_full = \"hunter2\"\n";
    let e = Config::from_toml_str(choice).unwrap_err().to_string();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("store.when_full"), "{e}");
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_store_takes_its_engine() {
    let config = Config::from_toml_str(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:6379/"
engine = "preloaded-functions"
"#,
    )
    .expect("valid");
    let StoreSpec::Redis(spec) = config.store() else {
        panic!("expected a Redis store, got {:?}", config.store());
    };
    assert_eq!(
        spec.engine,
        Some(tollgate_redis::Engine::PreloadedFunctions)
    );
    // Its earlier name is still read.
    let earlier = Config::from_toml_str(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\nscripting = \"eval\"\n",
    )
    .expect("valid");
    let StoreSpec::Redis(spec) = earlier.store() else {
        panic!("expected a Redis store");
    };
    assert_eq!(spec.engine, Some(tollgate_redis::Engine::Eval));
    let list = errors(
        r#"
[store]
kind = "redis"
url = "redis://127.0.0.1:6379/"
engine = "lua"
"#,
    );
    assert!(
        list.iter()
            .any(|e| e.contains("store") && e.contains("preloaded-functions")),
        "the field and its values named: {list:#?}"
    );
}

#[cfg(feature = "redis")]
#[test]
fn a_sentinel_store_parses() {
    let config = Config::from_toml_str(
        r#"
[store]
kind = "redis-sentinel"
sentinels = ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"]
service = "limits"
username = "tollgate"
password = "secret"
db = 2
pool_size = 8
replica_ack = 1
replica_ack_timeout = "15ms"
"#,
    )
    .expect("valid");
    let StoreSpec::Redis(spec) = config.store() else {
        panic!("expected a Sentinel store, got {:?}", config.store());
    };
    assert_eq!(config.store().kind(), "redis-sentinel");
    assert_eq!(
        (
            spec.sentinels.as_ref().map(Vec::len),
            spec.service.as_deref(),
            spec.db
        ),
        (Some(2), Some("limits"), Some(2))
    );
    assert_eq!(spec.replica_ack, Some(1));
    assert_eq!(spec.pool_size, Some(8));
    assert!(!format!("{spec:?}").contains("secret"));
}

#[cfg(feature = "redis")]
#[test]
fn a_cluster_store_parses_and_refuses_other_kinds_fields() {
    let config = Config::from_toml_str(
        r#"
[store]
kind = "redis-cluster"
nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]
prefix = "limits"
deadline = "80ms"
"#,
    )
    .expect("valid");
    let StoreSpec::Redis(spec) = config.store() else {
        panic!("expected a Cluster store, got {:?}", config.store());
    };
    assert_eq!(
        (config.store().kind(), spec.nodes.as_ref().map(Vec::len)),
        ("redis-cluster", Some(2))
    );
    assert_eq!(spec.prefix.as_deref(), Some("limits"));

    let list = errors(
        r#"
[store]
kind = "redis-cluster"
url = "redis://127.0.0.1:6379/"
nodes = ["10.0.0.1:6379"]
lazy = true
"#,
    );
    has(&list, "store.url: is not for kind = \"redis-cluster\"");
    has(&list, "store.nodes[0]: must start with redis://");
    has(&list, "store.lazy: a Cluster store connects at startup");
    assert_eq!(list.len(), 3, "{list:#?}");
    let list = errors("[store]\nkind = \"redis-cluster\"\n");
    has(&list, "store.nodes: missing or empty");
    let list =
        errors("[store]\nkind = \"redis\"\nurl = \"redis://a/\"\nnodes = [\"redis://b/\"]\n");
    has(&list, "store.nodes: is for kind = \"redis-cluster\"");
}

/// `kind = "redis-cluster"` against a real 6-node cluster: a route decides
/// across it.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_store_decides_on_a_real_cluster() {
    let cluster = tollgate_testkit::redis_cluster::RedisCluster::shared();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let config = Config::from_toml_str(&format!(
        r#"
[store]
kind = "redis-cluster"
nodes = [{}]
prefix = "{}"

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1m"

[routes.r]
layers = [{{ scope = "subject", policy = "p" }}]
"#,
        nodes.join(", "),
        tollgate_testkit::conformance::unique("cfg")
    ))
    .expect("valid");
    let limiters = config
        .build(Arc::new(tollgate_limiter::MonotonicClock::new()))
        .await
        .expect("connects");
    assert_eq!(limiters.store().kind(), "redis-cluster");
    let route = limiters.route("r").expect("route");
    let ctx = Context::for_subject(Subject::new("c1").unwrap());
    let mut admitted = 0;
    for _ in 0..3 {
        if route.limiter().check(&ctx, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
}

/// `kind = "redis-sentinel"` against real sentinels: the route's limiter
/// decides on the primary they name.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_decides_through_real_sentinels() {
    use tollgate_testkit::redis_sentinel::{RedisSentinels, SERVICE};

    let group = RedisSentinels::start();
    let sentinels: Vec<String> = group
        .sentinel_urls()
        .iter()
        .map(|u| format!("{u:?}"))
        .collect();
    let text = format!(
        r#"
[store]
kind = "redis-sentinel"
sentinels = [{}]
service = "{SERVICE}"
prefix = "config-sentinel"

[policies.p]
algorithm = "fixed_window"
limit = 2
window = "1m"

[routes.r]
layers = [{{ scope = "subject", policy = "p" }}]
"#,
        sentinels.join(", ")
    );
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let limiters = Config::from_toml_str(&text)
        .expect("valid")
        .build(Arc::new(clock))
        .await
        .expect("builds through the sentinels");
    let route = limiters.route("r").unwrap();
    let ctx = Context::for_subject(Subject::new("a").unwrap());
    let mut admitted = 0;
    for _ in 0..3 {
        if route.limiter().check(&ctx, 1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
    // The subject's state is on the primary the sentinels name.
    let keys = group.primary().command(&["KEYS", "config-sentinel:{a}:*"]);
    assert_eq!(keys.strings().len(), 1, "{keys:?}");
}

#[test]
fn the_access_section_parses_and_every_bad_entry_is_named() {
    let config = Config::from_toml_str(
        r#"
[access]
exempt_subjects = ["h.0123456789abcdef0123456789abcdef"]
exempt_networks = ["10.0.0.0/8", "127.0.0.1"]
deny_subjects = ["scraper-7"]
deny_networks = ["2001:db8::/32"]
skip_methods = ["options"]
skip_paths = ["/health", "/internal/*"]
"#,
    )
    .unwrap();
    let expected = tollgate_http::AccessRules::new()
        .exempt_subject(Subject::new("h.0123456789abcdef0123456789abcdef").unwrap())
        .deny_subject(Subject::new("scraper-7").unwrap())
        .exempt_network("10.0.0.0/8".parse().unwrap())
        .exempt_network("127.0.0.1/32".parse().unwrap())
        .deny_network("2001:db8::/32".parse().unwrap())
        .skip_method("OPTIONS")
        .skip_path("/health")
        .skip_path("/internal/*");
    assert_eq!(config.access(), &expected);
    assert!(Config::from_toml_str("").unwrap().access().is_empty());

    let list = errors(
        r#"
[access]
exempt_subjects = ["ok", "has space"]
deny_networks = ["10.0.0.1/8"]
exempt_networks = ["not-a-network"]
skip_methods = ["GET POST"]
skip_paths = ["health", "/a*/b", "/café", "/é*"]
"#,
    );
    // Non-ASCII paths are refused by name (tower matches them encoded,
    // actix-web decoded), without a panic.
    has(&list, "access.skip_paths[2]");
    has(&list, "access.skip_paths[3]");
    has(&list, "access.exempt_subjects[1]");
    has(&list, "access.deny_networks[0]");
    has(&list, "host bits set");
    has(&list, "access.exempt_networks[0]");
    has(&list, "access.skip_methods[0]");
    has(&list, "access.skip_paths[0]");
    has(&list, "access.skip_paths[1]");
    let list = errors("[access]\nallow = [\"x\"]\n");
    has(&list, "access");
    // Subjects no identity writes would match no request: refused.
    let list = errors(
        r#"
[access]
deny_subjects = ["h.9F811E4CF32DC31E6F422DAAE9C8C27A", "ip:198.51.100.7", "h.9f811e4cf32dc31e6f422daae9c8c27a"]
exempt_subjects = ["ip:2001:DB8:1:2::/64", "ip:192.0.2.1/24", "ip:192.0.2.0/24"]
"#,
    );
    has(&list, "access.deny_subjects[0]");
    has(&list, "access.deny_subjects[1]");
    has(&list, "ip:2001:db8:1:2::/64");
    has(&list, "ip:192.0.2.0/24");
    assert!(
        !list
            .iter()
            .any(|e| e.contains("deny_subjects[2]") || e.contains("exempt_subjects[2]")),
        "{list:#?}"
    );
}
