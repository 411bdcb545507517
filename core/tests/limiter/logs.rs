//! Degraded decisions are logged with the policy and the error class, never
//! with the raw key or subject.
#![cfg(feature = "tracing")]

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_limiter::{Context, Limit, Limiter, Policy, Scope, Subject};
use tollgate_testkit::ready;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Keeps every event and span as `message field=value …` lines.
#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl Subscriber for Lines {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut line = Line(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut line);
        self.0.lock().unwrap().push(line.0);
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line(format!("{}", event.metadata().level()));
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn store_failures_are_logged_with_policy_and_class_but_no_key() {
    let lines = Arc::new(Lines::default());
    let limiter = Limiter::builder(Arc::new(tollgate_testkit::DownStore))
        .layer(
            "key",
            Scope::Subject,
            Policy::new(
                "login",
                Limit::sliding_log(5, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let subject = "sk_live_do_not_log_me";
    let ctx = Context::for_subject(Subject::new(subject).unwrap());
    tracing::subscriber::with_default(lines.clone(), || {
        for _ in 0..10 {
            assert!(ready(limiter.check(&ctx, 1)).unwrap().failed_closed());
        }
    });
    let lines = lines.0.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.starts_with("span tollgate.check")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("WARN") && l.contains("error_class=\"unavailable\"")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("state=\"open\"")),
        "the breaker opening is logged: {lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("policy=\"login\"") && l.contains("source=\"fail_closed\"")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains(subject)),
        "a subject reached the logs: {lines:#?}"
    );
}

/// An error about a key budget is not an outage: a client rotating
/// subjects through a full budget makes one on every request, so it is a
/// debug event, never a warning per request.
#[test]
fn errors_a_client_can_cause_do_not_warn_per_request() {
    use tollgate_limiter::{KeyBudget, OnStoreFailure, WhenFull};
    let lines = Arc::new(Lines::default());
    let policy = Policy::new(
        "search",
        Limit::fixed_window(5, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
    .with_key_budget(KeyBudget::new(1, WhenFull::Refuse).unwrap())
    .with_on_failure(OnStoreFailure::FailOpen)
    .unwrap();
    let store = Arc::new(tollgate_memory::MemoryStore::builder().build());
    let limiter = Limiter::builder(store)
        .layer("key", Scope::Subject, policy)
        .build()
        .unwrap();
    tracing::subscriber::with_default(lines.clone(), || {
        for n in 0..20 {
            let ctx = Context::for_subject(Subject::new(format!("client-{n}")).unwrap());
            let d = ready(limiter.check(&ctx, 1)).unwrap();
            assert!(d.is_allowed());
        }
    });
    let lines = lines.0.lock().unwrap().clone();
    let full = |level: &str| {
        lines
            .iter()
            .filter(|l| l.starts_with(level) && l.contains("error_class=\"full\""))
            .count()
    };
    assert_eq!(full("WARN"), 0, "{lines:#?}");
    // The refusal, and the degraded decision it led to.
    assert_eq!(
        full("DEBUG"),
        2 * 19,
        "each refusal is still logged: {lines:#?}"
    );
}
