//! Metrics and logs of decisions, store calls and the circuit breaker.
//!
//! With the `metrics` feature, through the `metrics` facade (labels are
//! bounded: policy, outcome, source, store kind, error class — never a key,
//! user or IP). Install the recorder before the first decision: a limiter
//! makes its handles then, so no label is formatted per decision.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `policy`, `outcome` (`allowed`/`denied`/`shadow_denied`), `source` |
//! | `tollgate_store_errors_total` | counter | `store`, `class` |
//! | `tollgate_store_latency_seconds` | histogram (stores that wait, such as Redis: an in-process answer is not timed) | `store` |
//! | `tollgate_breaker_open` | gauge (1 open, 0 closed) | `store` |
//! | `tollgate_fallback_failures_total` | counter | `store` |
//! | `tollgate_plan_defaults_total` | counter | `reason` (`unknown_plan`, `source_failed`, `source_timeout`) |
//! | `tollgate_lease_batches_total` | counter | `policy`: batches leased layers charged in the store |
//! | `tollgate_lease_units_returned_total` | counter | `policy`: units leases did not use and gave back |
//!
//! The HTTP adapters record `tollgate_unidentified_requests_total`
//! (`tollgate-http`'s `observe`) and the configuration crate
//! `tollgate_config_reloads_total`, each with its own `metrics` feature.
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

#[cfg(feature = "metrics")]
use crate::decision::Source;
use crate::decision::{Decision, LayerDecision};
use crate::error::StoreError;
use crate::failure::BreakerState;
use crate::layer::Layer;

/// When a store call started (only measured with the `metrics` feature).
pub(crate) type Started = Option<std::time::Instant>;

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
            metrics::describe_gauge!(
                "tollgate_permits_in_flight",
                "Places this process's permits hold in concurrency layers, by policy."
            );
            metrics::describe_counter!(
                "tollgate_permits_lost_total",
                "Permits' places lost before their renewal (the lease ran out), by policy."
            );
            metrics::describe_counter!(
                "tollgate_lease_batches_total",
                "Batches of units a leased layer charged in the store, by policy."
            );
            metrics::describe_counter!(
                "tollgate_lease_units_returned_total",
                "Units leases did not use and gave back to the store, by policy."
            );
            metrics::describe_counter!(
                "tollgate_plan_defaults_total",
                "Requests decided under the default plan because their own could not be found, by reason."
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

/// A request decided under the default plan because its own could not be
/// found (`reason`: `unknown_plan`, `source_failed`, `source_timeout`);
/// a request no rule assigns a plan is not counted (the default is its
/// plan).
#[inline]
pub(crate) fn plan_defaulted(reason: &'static str) {
    #[cfg(feature = "metrics")]
    if reason != "unassigned" {
        metrics::counter!("tollgate_plan_defaults_total", "reason" => reason).increment(1);
    }
    #[cfg(feature = "tracing")]
    if reason != "unassigned" {
        tracing::debug!(reason, "request decided under the default plan");
    }
    let _ = reason;
}

/// A decision that skipped the store because the breaker is open.
pub(crate) fn store_skipped(store: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_store_errors_total", "store" => store, "class" => "circuit_open")
        .increment(1);
    let _ = store;
}

/// A renewal found a permit's place in `policy` gone (its lease ran out
/// before the renewal reached the store): the work goes on uncounted there.
#[cfg_attr(not(feature = "concurrency"), allow(dead_code))]
pub(crate) fn permit_lost(policy: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_permits_lost_total", "policy" => policy.to_string()).increment(1);
    #[cfg(feature = "tracing")]
    tracing::warn!(
        policy,
        "a permit's place was lost before its renewal: its lease ran out (renewals failing, or the process stalled)"
    );
    let _ = policy;
}

/// Places this process's permits hold in `policy` changed by `delta`
/// (taken: +1, given back or lost: −1).
#[cfg_attr(not(feature = "concurrency"), allow(dead_code))]
pub(crate) fn permits_in_flight(policy: &str, delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_permits_in_flight", "policy" => policy.to_string()).increment(delta);
    let _ = (policy, delta);
}

/// A leased layer of `policy` charged a batch of `units` in the store.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub(crate) fn lease_batch(policy: &str, units: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_lease_batches_total", "policy" => policy.to_string()).increment(1);
    #[cfg(feature = "tracing")]
    tracing::trace!(policy, units, "a lease charged a batch");
    let _ = (policy, units);
}

/// A lease of `policy` gave `units` it did not use back to the store.
#[cfg_attr(not(feature = "lease"), allow(dead_code))]
pub(crate) fn lease_returned(policy: &str, units: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_lease_units_returned_total", "policy" => policy.to_string())
        .increment(units);
    let _ = (policy, units);
}

/// A store call failed with `error`.
fn store_error(store: &'static str, error: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_store_errors_total", "store" => store, "class" => error.class())
        .increment(1);
    // An error about one key or budget is a client's doing as much as the
    // store's (a client rotating subjects fills a budget on every
    // request): it is counted, and logged at debug level, so no client
    // sets the warnings' pace. Any other warns (an outage's bounded by the
    // breaker; a wrong clock or an unsupported limit is the operator's to
    // see).
    #[cfg(feature = "tracing")]
    if !matches!(error, StoreError::Full { .. } | StoreError::Conflict { .. }) {
        tracing::warn!(
            store,
            error_class = error.class(),
            "rate-limit store failed; applying each policy's failure mode"
        );
    } else {
        tracing::debug!(
            store,
            error_class = error.class(),
            "rate-limit store refused a request; applying its policy's failure mode"
        );
    }
    let _ = (store, error);
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

/// A limiter's decision counters (one set per layer, made on first use:
/// no label is formatted and nothing allocates per decision) and its
/// store-latency histogram. Install the `metrics` recorder before the
/// first decision: a handle made earlier records into the no-op recorder.
pub(crate) struct LimiterMetrics {
    #[cfg(feature = "metrics")]
    layers: Box<[LayerCounters]>,
    #[cfg(feature = "metrics")]
    latency: std::sync::OnceLock<metrics::Histogram>,
}

/// Outcomes counted: allowed, denied, shadow-denied.
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 3] = ["allowed", "denied", "shadow_denied"];

/// Sources counted, in [`source_slot`] order.
#[cfg(feature = "metrics")]
const SOURCES: [Source; 5] = [
    Source::Store,
    Source::Fallback,
    Source::FailOpen,
    Source::FailClosed,
    Source::Cache,
];

#[cfg(feature = "metrics")]
fn source_slot(source: Source) -> usize {
    SOURCES.iter().position(|s| *s == source).unwrap_or(0)
}

#[cfg(feature = "metrics")]
struct LayerCounters {
    policy: &'static str,
    counters: [[std::sync::OnceLock<metrics::Counter>; SOURCES.len()]; OUTCOMES.len()],
}

impl std::fmt::Debug for LimiterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LimiterMetrics")
    }
}

impl LimiterMetrics {
    pub(crate) fn new(layers: &[Layer]) -> Self {
        let _ = layers;
        LimiterMetrics {
            #[cfg(feature = "metrics")]
            layers: layers
                .iter()
                .map(|l| LayerCounters {
                    policy: &l.info.policy,
                    counters: Default::default(),
                })
                .collect(),
            #[cfg(feature = "metrics")]
            latency: std::sync::OnceLock::new(),
        }
    }

    /// When a store call started (only measured with the `metrics` feature).
    pub(crate) fn start(&self) -> Started {
        cfg!(feature = "metrics").then(std::time::Instant::now)
    }

    /// A store call ended (`started`: when it started, if it was timed).
    pub(crate) fn store_call(
        &self,
        store: &'static str,
        started: Started,
        error: Option<&StoreError>,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(started) = started {
            self.latency
                .get_or_init(
                    || metrics::histogram!("tollgate_store_latency_seconds", "store" => store),
                )
                .record(started.elapsed().as_secs_f64());
        }
        if let Some(error) = error {
            store_error(store, error);
        }
        let _ = started;
    }

    /// Count every layer of `decision` (its layers are the limiter's, in
    /// order) and log what deserves it.
    #[inline]
    pub(crate) fn decision(&self, decision: &Decision) {
        for (i, layer) in decision.layers().iter().enumerate() {
            self.layer(i, layer);
        }
        events(decision);
    }

    /// Count layer `i`'s part of a decision.
    #[inline]
    pub(crate) fn layer(&self, i: usize, layer: &LayerDecision) {
        #[cfg(feature = "metrics")]
        if let Some(counters) = self.layers.get(i) {
            let outcome = match (layer.verdict().allowed, layer.is_shadow()) {
                (true, _) => 0,
                (false, false) => 1,
                (false, true) => 2,
            };
            let source = source_slot(layer.source);
            counters.counters[outcome][source]
                .get_or_init(|| {
                    metrics::counter!(
                        "tollgate_decisions_total",
                        "policy" => counters.policy,
                        "outcome" => OUTCOMES[outcome],
                        "source" => SOURCES[source].as_str()
                    )
                })
                .increment(1);
        }
        let _ = (i, layer);
    }
}

/// Log events of a decision: shadow denials, and degraded decisions.
fn events(decision: &Decision) {
    #[cfg(feature = "tracing")]
    for layer in decision.shadow_denied() {
        tracing::debug!(
            policy = layer.policy(),
            source = layer.source.as_str(),
            "a shadow-mode policy would have denied this request"
        );
    }
    #[cfg(feature = "tracing")]
    if let Some(class) = decision.store_error() {
        for layer in decision.layers() {
            tracing::debug!(
                policy = layer.policy(),
                source = layer.source.as_str(),
                error_class = class,
                "degraded rate-limit decision"
            );
        }
    }
    let _ = decision;
}
