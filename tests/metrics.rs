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

#[test]
fn decisions_and_store_calls_are_counted_with_bounded_labels() {
    let recorder = Registrations::default();
    let limiter = Limiter::builder(Arc::new(MemoryStore::default()))
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "search",
                Limit::fixed_window(1, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let secret_user = "user-4711@example.com";
    let ctx = Context::subject(Subject::new(secret_user).unwrap());
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
    assert!(
        seen.contains(&"tollgate_store_latency_seconds{store=memory}".to_string()),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|m| !m.contains(secret_user)),
        "a subject reached a label: {seen:?}"
    );
}
