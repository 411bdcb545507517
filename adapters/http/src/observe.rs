//! What the HTTP adapters count and log themselves (the limiter counts
//! its decisions): requests no identity source could identify.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `tollgate_unidentified_requests_total` | counter (feature `metrics`) | `reason` (`no_client_address`, `no_identity`) |
//!
//! With the `tracing` feature, the first request of a reason that points
//! at a misconfiguration (no client address) logs a warning.

/// Describe the adapters' metric (`# HELP` in Prometheus); harmless to
/// call again.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            metrics::describe_counter!(
                "tollgate_unidentified_requests_total",
                "HTTP requests without the identity a layer needs (answered 401), by reason."
            );
        });
    }
}

/// A request an adapter could not identify (answered 401). `reason` is a
/// short label (`no_client_address`, `no_identity`); `warning`, when
/// given, is logged the first time this reason is seen, since it points at
/// a misconfiguration rather than a client.
pub(crate) fn unidentified(reason: &'static str, warning: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("tollgate_unidentified_requests_total", "reason" => reason).increment(1);
    }
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
