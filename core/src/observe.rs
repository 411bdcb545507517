//! Metrics and logs of decisions, store calls and the circuit breaker.
//!
//! With the `metrics` feature, through the `metrics` facade (labels are
//! bounded: policy, outcome, source, store kind, error class — never a key,
//! user or IP):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `policy`, `outcome` (`allowed`/`denied`), `source` |
//! | `tollgate_store_errors_total` | counter | `store`, `class` |
//! | `tollgate_store_latency_seconds` | histogram | `store` |
//! | `tollgate_breaker_open` | gauge (1 open, 0 closed) | `store` |
//! | `tollgate_fallback_failures_total` | counter | `store` |
//!
//! With the `tracing` feature, log events carry the store kind, policy and
//! error class, never a raw key or secret: a warning per store error while
//! the breaker is closed (at most `failure_threshold` in a row, then one per
//! probe) and on every breaker transition; degraded decisions themselves at
//! debug level (the metric counts all of them).

use crate::decision::Decision;
use crate::error::StoreError;
use crate::failure::BreakerState;

/// When a store call started (only measured with the `metrics` feature).
pub(crate) type Started = Option<std::time::Instant>;

pub(crate) fn start() -> Started {
    if cfg!(feature = "metrics") {
        Some(std::time::Instant::now())
    } else {
        None
    }
}

pub(crate) fn store_call(store: &'static str, started: Started, error: Option<&StoreError>) {
    #[cfg(feature = "metrics")]
    {
        if let Some(started) = started {
            metrics::histogram!("tollgate_store_latency_seconds", "store" => store)
                .record(started.elapsed().as_secs_f64());
        }
        if let Some(e) = error {
            metrics::counter!("tollgate_store_errors_total", "store" => store, "class" => e.class()).increment(1);
        }
    }
    #[cfg(feature = "tracing")]
    if let Some(e) = error {
        tracing::warn!(
            store,
            error_class = e.class(),
            "rate-limit store failed; applying each policy's failure mode"
        );
    }
    let _ = (store, started, error);
}

pub(crate) fn breaker(store: &'static str, state: BreakerState, error: Option<&StoreError>) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_breaker_open", "store" => store).set(
        if state == BreakerState::Open {
            1.0
        } else {
            0.0
        },
    );
    #[cfg(feature = "tracing")]
    tracing::warn!(
        store,
        state = state.as_str(),
        error_class = error.map(StoreError::class),
        "rate-limit circuit breaker changed state"
    );
    let _ = (store, state, error);
}

pub(crate) fn fallback_failed(store: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_fallback_failures_total", "store" => store).increment(1);
    #[cfg(feature = "tracing")]
    tracing::warn!(store, "the emergency store failed too; failing closed");
    let _ = store;
}

pub(crate) fn decision(decision: &Decision) {
    #[cfg(feature = "metrics")]
    for layer in decision.layers() {
        let outcome = if layer.allowed { "allowed" } else { "denied" };
        metrics::counter!(
            "tollgate_decisions_total",
            "policy" => layer.policy.name().to_string(),
            "outcome" => outcome,
            "source" => layer.source.as_str()
        )
        .increment(1);
    }
    #[cfg(feature = "tracing")]
    if let Some(class) = decision.store_error() {
        for layer in decision.layers() {
            tracing::debug!(
                policy = layer.policy.name(),
                source = layer.source.as_str(),
                error_class = class,
                "degraded rate-limit decision"
            );
        }
    }
    let _ = decision;
}
