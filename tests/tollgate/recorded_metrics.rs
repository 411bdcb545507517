//! Decisions are counted through the `metrics` facade with bounded labels:
//! never a key, user or IP.
#![cfg(all(feature = "metrics", feature = "memory"))]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tollgate::{Context, Limit, Limiter, MemoryStore, Policy, Scope, Subject};
use tollgate_testkit::ready;

/// Remembers every metric registration (each macro call registers) as
/// `name{label=value,…}`.
#[derive(Default)]
struct Registrations(Mutex<Vec<String>>);

impl Registrations {
    fn note(&self, key: &Key) {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        self.0
            .lock()
            .unwrap()
            .push(format!("{}{{{}}}", key.name(), labels.join(",")));
    }
}

impl Recorder for Registrations {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.note(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.note(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.note(key);
        Histogram::noop()
    }
}

/// A limiter with one layer `layer` per subject: policy `policy`, `limit`
/// a minute.
fn one_layer(layer: &str, policy: &str, limit: u64) -> tollgate::LimiterBuilder {
    let limit = Limit::fixed_window(limit, Duration::from_secs(60)).unwrap();
    Limiter::builder(Arc::new(MemoryStore::default())).layer(
        layer,
        Scope::Subject,
        Policy::new(policy, limit).unwrap(),
    )
}

#[test]
fn decisions_and_store_calls_are_counted_with_bounded_labels() {
    let recorder = Registrations::default();
    let limiter = one_layer("key", "search", 1).build().unwrap();
    let secret_user = "user-4711@example.com";
    let ctx = Context::for_subject(Subject::new(secret_user).unwrap());
    metrics::with_local_recorder(&recorder, || {
        assert!(ready(limiter.check(&ctx, 1)).unwrap().is_allowed());
        assert!(!ready(limiter.check(&ctx, 1)).unwrap().is_allowed());
    });
    let seen = recorder.0.lock().unwrap().clone();
    assert!(
        seen.contains(
            &"tollgate_decisions_total{policy=search,outcome=allowed,source=store}".to_string()
        ),
        "{seen:?}"
    );
    assert!(
        seen.contains(
            &"tollgate_decisions_total{policy=search,outcome=denied,source=store}".to_string()
        ),
        "{seen:?}"
    );
    // An in-process answer takes less time than timing it would: only
    // stores that wait are timed (see the next test).
    assert!(
        !seen
            .iter()
            .any(|m| m.starts_with("tollgate_store_latency_seconds")),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|m| !m.contains(secret_user)),
        "a subject reached a label: {seen:?}"
    );
}

/// Decisions an open breaker answers without the store are counted as
/// store errors of class `circuit_open`, as documented; shadow denials
/// have their own outcome; a limiter's series exist from its build.
#[test]
fn circuit_open_shadow_denials_and_registration_are_counted() {
    let recorder = Registrations::default();
    let ctx = Context::for_subject(Subject::new("k").unwrap());
    metrics::with_local_recorder(&recorder, || {
        let limiter = Limiter::builder(Arc::new(tollgate_testkit::DownStore))
            .layer(
                "key",
                Scope::Subject,
                Policy::new(
                    "api",
                    Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
                )
                .unwrap(),
            )
            .breaker(tollgate::BreakerConfig {
                failure_threshold: 1,
                open_for: Duration::from_secs(60),
            })
            .build()
            .unwrap();
        for _ in 0..3 {
            assert!(!ready(limiter.check(&ctx, 1)).unwrap().is_allowed());
        }
        let shadow = Limiter::builder(Arc::new(MemoryStore::default()))
            .layer(
                "trial",
                Scope::Subject,
                Policy::new(
                    "trial",
                    Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
                )
                .unwrap()
                .shadow(),
            )
            .build()
            .unwrap();
        for _ in 0..2 {
            assert!(ready(shadow.check(&ctx, 1)).unwrap().is_allowed());
        }
    });
    let seen = recorder.0.lock().unwrap().clone();
    for wanted in [
        "tollgate_store_errors_total{store=down,class=circuit_open}",
        "tollgate_store_latency_seconds{store=down}",
        "tollgate_decisions_total{policy=api,outcome=denied,source=store}",
        "tollgate_breaker_open{store=down}",
        "tollgate_decisions_total{policy=trial,outcome=shadow_denied,source=store}",
    ] {
        assert!(
            seen.contains(&wanted.to_string()),
            "{wanted} missing: {seen:?}"
        );
    }
}

/// A request without the client address the identity needs (a server that
/// records none, axum 0.7's `ConnectInfo`) is answered 401 and counted
/// under its reason; nothing about it reaches the client.
#[cfg(feature = "tower")]
#[test]
fn requests_without_a_client_address_are_counted() {
    use tollgate::tower::{ClientIp, Gate, Identity, Outcome};
    let recorder = Registrations::default();
    let limiter = one_layer("ip", "per-ip", 5).build().unwrap();
    let gate: Gate<http::request::Parts> = Gate::builder(limiter)
        .identity(Identity::new().client_ip(ClientIp::direct()))
        .build()
        .unwrap();
    let (parts, ()) = http::Request::get("/").body(()).unwrap().into_parts();
    metrics::with_local_recorder(&recorder, || {
        let prepared = gate.prepare(&parts, &parts).expect("rate limited");
        let Outcome::Reject(reply) = ready(gate.decide(&prepared)) else {
            panic!("no client address: no identity")
        };
        assert_eq!(reply.status(), 401);
        assert!(!reply.body().contains("address"), "{}", reply.body());
    });
    let seen = recorder.0.lock().unwrap().clone();
    assert!(
        seen.contains(
            &"tollgate_unidentified_requests_total{reason=no_client_address}".to_string()
        ),
        "{seen:?}"
    );
}

/// A request whose plan cannot be found (a name the limiter does not
/// know) is decided under the default plan and counted, by reason.
#[test]
fn requests_decided_under_the_default_plan_are_counted() {
    use tollgate::{Plan, PlanName, Plans};
    let recorder = Registrations::default();
    let limiter = one_layer("key", "search", 5)
        .plans(Plans::new(Plan::new("free").unwrap()))
        .build()
        .unwrap();
    let subject = Context::for_subject(Subject::new("key-1").unwrap());
    metrics::with_local_recorder(&recorder, || {
        // Unassigned: the default is the customer's plan, not a fallback.
        ready(limiter.check(&subject, 1)).unwrap();
        let unknown = subject.clone().with_plan(PlanName::new("gold").unwrap());
        let decision = ready(limiter.check(&unknown, 1)).unwrap();
        assert_eq!(decision.layers()[0].plan(), Some("free"));
    });
    let seen = recorder.0.lock().unwrap().clone();
    let defaults: Vec<&String> = seen
        .iter()
        .filter(|s| s.starts_with("tollgate_plan_defaults_total"))
        .collect();
    assert_eq!(
        defaults,
        ["tollgate_plan_defaults_total{reason=unknown_plan}"],
        "{seen:?}"
    );
}

/// A permit's places are counted while held, by policy, and no longer
/// once given back.
#[cfg(feature = "concurrency")]
#[test]
fn places_held_by_permits_are_counted() {
    let recorder = Registrations::default();
    let policy = Policy::new(
        "exports",
        Limit::concurrency(2, Duration::from_secs(30)).unwrap(),
    );
    let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer("in-flight", Scope::Subject, policy.unwrap())
        .build()
        .unwrap();
    let subject = Context::for_subject(Subject::new("key-1").unwrap());
    metrics::with_local_recorder(&recorder, || {
        let acquired = ready(limiter.acquire(&subject, 1)).unwrap();
        let permit = acquired.permit.expect("admitted");
        ready(permit.release()).unwrap();
    });
    let seen = recorder.0.lock().unwrap().clone();
    let in_flight: Vec<&String> = seen
        .iter()
        .filter(|s| s.starts_with("tollgate_permits"))
        .collect();
    // Taken (+1), then given back (−1): one series, by policy.
    assert_eq!(
        in_flight,
        [
            "tollgate_permits_in_flight{policy=exports}",
            "tollgate_permits_in_flight{policy=exports}"
        ],
        "{seen:?}"
    );
}

/// Counts the values each histogram records, by `name{label=value,…}`.
#[derive(Default)]
struct Samples(Mutex<std::collections::HashMap<String, Arc<Counted>>>);

/// How many values one histogram recorded.
#[derive(Default)]
struct Counted(std::sync::atomic::AtomicU64);

impl metrics::HistogramFn for Counted {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Samples {
    fn recorded(&self, name: &str) -> u64 {
        let seen = self.0.lock().unwrap();
        seen.get(name)
            .map_or(0, |c| c.0.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl Recorder for Samples {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counted = self.0.lock().unwrap().entry(name).or_default().clone();
        Histogram::from_arc(counted)
    }
}

/// The in-process store, answering as a store that waits does (a future).
#[derive(Debug)]
struct Waiting(MemoryStore);

#[tollgate::async_trait]
impl tollgate::Store for Waiting {
    fn kind(&self) -> &'static str {
        "waiting"
    }
    fn decide<'a>(
        &'a self,
        layers: &'a [tollgate::LayerRequest<'a>],
        verdicts: &'a mut tollgate::Verdicts,
    ) -> tollgate::Decide<'a> {
        tollgate::Decide::later(verdicts, tollgate::ask(&self.0, layers))
    }
}

/// A request only a shadow layer denies is decided again without it: on a
/// store that waits, each of its store calls is timed, the second pass's
/// too (before, only the first was).
#[test]
fn every_pass_past_a_shadow_denial_is_timed() {
    let recorder = Samples::default();
    let ctx = Context::for_subject(Subject::new("k").unwrap());
    let minute = |n| Limit::fixed_window(n, Duration::from_secs(60)).unwrap();
    metrics::with_local_recorder(&recorder, || {
        let limiter = Limiter::builder(Arc::new(Waiting(MemoryStore::default())))
            .layer(
                "trial",
                Scope::Subject,
                Policy::new("trial", minute(1)).unwrap().shadow(),
            )
            .layer(
                "key",
                Scope::Subject,
                Policy::new("api", minute(10)).unwrap(),
            )
            .build()
            .unwrap();
        // Both admit: one call. Then the shadow layer denies: two.
        for _ in 0..2 {
            assert!(ready(limiter.check(&ctx, 1)).unwrap().is_allowed());
        }
    });
    assert_eq!(
        recorder.recorded("tollgate_store_latency_seconds{store=waiting}"),
        3
    );
}
