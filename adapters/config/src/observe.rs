//! What the configuration crate counts and logs itself: reloads.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `tollgate_config_reloads_total` | counter (feature `metrics`) | `result` (`ok`, or the refusal's class) |
//!
//! With the `tracing` feature, every reload is logged once (a refusal at
//! error level, with what was wrong), and routes no code is bound to as a
//! warning.

/// Describe the reload metric (`# HELP` in Prometheus); harmless to call
/// again.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            metrics::describe_counter!(
                "tollgate_config_reloads_total",
                "Configuration reloads, by result (ok, or why the new configuration was refused)."
            );
        });
    }
}

/// A configuration reload: `result` is `ok` or the refusal's class;
/// `error`, when refused, what was wrong (logged once, here); routes no
/// code is bound to are logged as a warning.
pub fn config_reload(result: &'static str, error: Option<&str>, unbound_routes: &[String]) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("tollgate_config_reloads_total", "result" => result).increment(1);
    }
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
