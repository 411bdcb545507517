//! Metrics and logs of decisions, store calls and the circuit breaker.
//!
//! With the `metrics` feature, through the `metrics` facade (labels are
//! bounded: policy, outcome, source, store kind, error class — never a key,
//! user or IP):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `policy`, `outcome` (`allowed`/`denied`/`shadow_denied`), `source` |
//! | `tollgate_store_errors_total` | counter | `store`, `class` |
//! | `tollgate_store_latency_seconds` | histogram | `store` |
//! | `tollgate_breaker_open` | gauge (1 open, 0 closed) | `store` |
//! | `tollgate_fallback_failures_total` | counter | `store` |
//! | `tollgate_unidentified_requests_total` | counter | `reason` |
//! | `tollgate_config_reloads_total` | counter | `result` |
//!
//! Every metric is described (`# HELP` in Prometheus) and a limiter's
//! decision series are registered at zero when it is built, so dashboards
//! and alerts see them before the first event. Decisions skipped by an open
//! circuit breaker count as store errors of class `circuit_open`.
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

/// Describe every metric once (units and help text); called when a
/// limiter is built, and harmless to call again.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            metrics::describe_counter!(
                "tollgate_decisions_total",
                "Rate-limit decisions per layer, by policy, outcome and what decided them."
            );
            metrics::describe_counter!(
                "tollgate_store_errors_total",
                "Store calls that failed or were skipped (class circuit_open), by store kind and error class."
            );
            metrics::describe_histogram!(
                "tollgate_store_latency_seconds",
                metrics::Unit::Seconds,
                "Duration of rate-limit store calls."
            );
            metrics::describe_gauge!(
                "tollgate_breaker_open",
                "1 while the circuit breaker in front of the store is open, else 0."
            );
            metrics::describe_counter!(
                "tollgate_fallback_failures_total",
                "Decisions the emergency store could not make either (failed closed)."
            );
            metrics::describe_counter!(
                "tollgate_config_reloads_total",
                "Configuration reloads, by result (ok, or why the new configuration was refused)."
            );
            metrics::describe_counter!(
                "tollgate_unidentified_requests_total",
                "HTTP requests without the identity a layer needs (answered 401), by reason."
            );
        });
    }
}

/// Register the series a limiter will report, at zero, so they exist
/// before their first event.
pub(crate) fn register(store: &'static str, policies: &[&str]) {
    describe();
    #[cfg(feature = "metrics")]
    {
        for &policy in policies {
            for outcome in ["allowed", "denied"] {
                metrics::counter!(
                    "tollgate_decisions_total",
                    "policy" => policy.to_string(),
                    "outcome" => outcome,
                    "source" => "store"
                )
                .increment(0);
            }
        }
        metrics::gauge!("tollgate_breaker_open", "store" => store).increment(0.0);
    }
    let _ = (store, policies);
}

/// A configuration reload: `result` is `ok` or the refusal's class;
/// `error`, when refused, what was wrong (logged once, here); routes no
/// code is bound to are logged as a warning.
pub fn config_reload(result: &'static str, error: Option<&str>, unbound_routes: &[String]) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_config_reloads_total", "result" => result).increment(1);
    #[cfg(feature = "tracing")]
    {
        match error {
            Some(error) => tracing::error!(result, "{error}"),
            None => tracing::info!(result, "rate-limit configuration reloaded"),
        }
        if !unbound_routes.is_empty() {
            tracing::warn!(
                routes = unbound_routes.join(", "),
                "configured routes that no code is bound to decide nothing (a typo in a route name?)"
            );
        }
    }
    let _ = (result, error, unbound_routes);
}

/// A decision that skipped the store because the breaker is open.
pub(crate) fn store_skipped(store: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_store_errors_total", "store" => store, "class" => "circuit_open")
        .increment(1);
    let _ = store;
}

/// A request an HTTP adapter could not identify (answered 401). `reason`
/// is a short label (`no_client_address`, `no_identity`); `warning`, when
/// given, is logged the first time this reason is seen, since it points at
/// a misconfiguration rather than a client.
pub fn unidentified(reason: &'static str, warning: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_unidentified_requests_total", "reason" => reason).increment(1);
    #[cfg(feature = "tracing")]
    if let Some(warning) = warning {
        use std::sync::Mutex;
        static SEEN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.contains(&reason) {
            seen.push(reason);
            tracing::warn!(reason, "{warning}");
        }
    }
    let _ = (reason, warning);
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
        let outcome = match (layer.allowed, layer.policy.is_shadow()) {
            (true, _) => "allowed",
            (false, true) => "shadow_denied",
            (false, false) => "denied",
        };
        metrics::counter!(
            "tollgate_decisions_total",
            "policy" => layer.policy.name().to_string(),
            "outcome" => outcome,
            "source" => layer.source.as_str()
        )
        .increment(1);
    }
    #[cfg(feature = "tracing")]
    for layer in decision.shadow_denied() {
        tracing::debug!(
            policy = layer.policy.name(),
            source = layer.source.as_str(),
            "a shadow-mode policy would have denied this request"
        );
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
