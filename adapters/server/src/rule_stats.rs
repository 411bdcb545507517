//! Per-rule counters as envoyproxy/ratelimit keeps them, in hits (a
//! descriptor's cost): `total_hits`, `over_limit`, `near_limit`,
//! `within_limit` and `shadow_mode`, labelled by domain and rule only (both
//! from the configuration: the cardinality is bounded).
//!
//! Judged on a descriptor's tightest enforced layer: hits it admitted are
//! within the limit, and those that took it past 80 % of its limit are also
//! near it; hits it denied are over the limit (a denied request charges
//! nothing, so all of its hits are). Hits a shadow layer would have denied
//! count in `shadow_mode`.

use tollgate_limiter::LayerDecision;

/// Where the reference counts a hit as near the limit: past this share.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// The counters' names, described once at start.
pub(crate) const COUNTERS: [(&str, &str); 5] = [
    (
        "tollgate_rule_total_hits_total",
        "Hits (units) of descriptors a rule decided",
    ),
    ("tollgate_rule_over_limit_total", "Hits a rule denied"),
    (
        "tollgate_rule_near_limit_total",
        "Admitted hits past 80 % of the limit",
    ),
    ("tollgate_rule_within_limit_total", "Hits a rule admitted"),
    (
        "tollgate_rule_shadow_mode_total",
        "Hits a shadow layer would have denied",
    ),
];

/// Describe the counters (their `# HELP` lines).
pub(crate) fn describe() {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(name, metrics::Unit::Count, help);
    }
}

/// How one descriptor's hits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Counts {
    pub(crate) total: u64,
    pub(crate) over: u64,
    pub(crate) near: u64,
    pub(crate) within: u64,
    pub(crate) shadow: u64,
}

impl Counts {
    /// `hits` decided by `tightest` (its enforced layer with the least
    /// left), with `shadow_denied` when a shadow layer would have denied.
    pub(crate) fn of(hits: u64, tightest: Option<&LayerDecision>, shadow_denied: bool) -> Counts {
        let mut counts = Counts {
            total: hits,
            shadow: if shadow_denied { hits } else { 0 },
            ..Counts::default()
        };
        let Some(layer) = tightest else {
            return counts;
        };
        let v = &layer.verdict();
        if !v.allowed {
            counts.over = hits;
            return counts;
        }
        counts.within = hits;
        let near_threshold = (v.limit as f64 * NEAR_LIMIT_RATIO).floor() as u64;
        let after = v.limit.saturating_sub(v.remaining);
        let before = after.saturating_sub(hits);
        counts.near = after.saturating_sub(near_threshold.max(before));
        counts
    }

    /// `hits` denied without a store call, over a limit of 0 or an
    /// override that cannot be counted (`shadow`: in shadow mode, which
    /// admits them): all over the limit, and all shadow hits in shadow
    /// mode.
    pub(crate) fn denied_uncalled(hits: u64, shadow: bool) -> Counts {
        Counts {
            total: hits,
            over: hits,
            shadow: if shadow { hits } else { 0 },
            ..Counts::default()
        }
    }

    /// Add them to the counters of `rule` of `domain`.
    pub(crate) fn record(&self, domain: &str, rule: &str) {
        RuleCounters::new(domain, rule).add(self);
    }
}

/// One rule's counters, looked up once: a lookup in the recorder (labels
/// made, hashed and compared, five times) costs more than the decision.
#[derive(Debug, Clone)]
pub(crate) struct RuleCounters([metrics::Counter; 5]);

impl RuleCounters {
    /// The counters of `rule` of `domain`.
    pub(crate) fn new(domain: &str, rule: &str) -> RuleCounters {
        let labels = [("domain", domain.to_string()), ("rule", rule.to_string())];
        RuleCounters(COUNTERS.map(|(name, _)| metrics::counter!(name, &labels)))
    }

    /// Add `counts` to them.
    pub(crate) fn add(&self, counts: &Counts) {
        let values = [
            counts.total,
            counts.over,
            counts.near,
            counts.within,
            counts.shadow,
        ];
        for (counter, value) in self.0.iter().zip(values) {
            if value > 0 {
                counter.increment(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_limiter::{Layer, Limit, Policy, Scope, Source, Verdict};

    use super::*;

    fn layer(allowed: bool, limit: u64, remaining: u64) -> LayerDecision {
        let policy = Policy::new(
            "p",
            Limit::fixed_window(limit, Duration::from_secs(60)).unwrap(),
        )
        .unwrap();
        let layer = Layer::new("l", Scope::Subject, policy);
        let verdict = Verdict {
            allowed,
            limit,
            remaining,
            reset_after: Duration::from_secs(60),
            retry_after: None,
        };
        LayerDecision::new(&layer, verdict, Source::Store)
    }

    #[test]
    fn hits_count_as_the_reference_counts_them() {
        // Limit 10, near past 8: 6 → 9 used is 1 near (the 9th).
        let c = Counts::of(3, Some(&layer(true, 10, 1)), false);
        assert_eq!((c.total, c.within, c.near, c.over), (3, 3, 1, 0));
        // 2 → 4 used: nowhere near.
        let c = Counts::of(2, Some(&layer(true, 10, 6)), false);
        assert_eq!((c.within, c.near), (2, 0));
        // Already past 8 before: every hit is near.
        let c = Counts::of(1, Some(&layer(true, 10, 0)), false);
        assert_eq!(c.near, 1);
        let c = Counts::of(4, Some(&layer(false, 10, 0)), true);
        assert_eq!((c.total, c.over, c.within, c.shadow), (4, 4, 0, 4));
        let c = Counts::of(1, None, false);
        assert_eq!((c.total, c.over, c.within), (1, 0, 0), "no layer decided");
    }
}
