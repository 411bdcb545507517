//! Which requests are not rate limited: passed on without a decision.
//!
//! One mechanism for every rule: the built-in one (CORS preflights), methods
//! and paths ([`AccessRules`](crate::AccessRules)) and the application's own
//! ([`GateBuilder::skip_if`](crate::GateBuilder::skip_if)).

use std::fmt;
use std::sync::Arc;

use crate::access::path_matches;
use crate::identity::RequestView;

type Rule<R> = Arc<dyn Fn(&R, &dyn RequestView) -> bool + Send + Sync>;

/// The skip rules of a gate.
pub(crate) struct Skip<R: ?Sized> {
    /// Skip CORS preflights (not by default: any client can send one).
    preflights: bool,
    /// Methods not limited (uppercase).
    methods: Vec<String>,
    /// Paths not limited (exact, or a prefix ending in `*`).
    paths: Vec<String>,
    rules: Vec<Rule<R>>,
}

impl<R: ?Sized> Default for Skip<R> {
    fn default() -> Self {
        Skip {
            preflights: false,
            methods: Vec::new(),
            paths: Vec::new(),
            rules: Vec::new(),
        }
    }
}

impl<R: ?Sized> Skip<R> {
    pub(crate) fn preflights(mut self, skip: bool) -> Self {
        self.preflights = skip;
        self
    }

    pub(crate) fn with(mut self, rule: Rule<R>) -> Self {
        self.rules.push(rule);
        self
    }

    /// Also skip these methods (uppercase) and paths.
    pub(crate) fn methods_and_paths(mut self, methods: Vec<String>, paths: Vec<String>) -> Self {
        self.methods.extend(methods);
        self.paths.extend(paths);
        self
    }

    /// Whether `request` is not rate limited.
    pub(crate) fn matches(&self, request: &R, view: &dyn RequestView) -> bool {
        (self.preflights && is_cors_preflight(view))
            || self.methods.iter().any(|m| m == view.method())
            || (!self.paths.is_empty() && {
                let path = view.path();
                self.paths.iter().any(|rule| path_matches(rule, path))
            })
            || self.rules.iter().any(|r| r(request, view))
    }
}

/// A browser's CORS preflight: `OPTIONS` with `Origin` and
/// `Access-Control-Request-Method` (the Fetch standard sends both). A plain
/// `OPTIONS` is an ordinary request. Any client can send these headers, so
/// preflights are charged unless the gate is told otherwise
/// (`charge_preflights(false)`), which is safe only where no handler
/// behind the limiter answers `OPTIONS` (a CORS layer answers them).
pub fn is_cors_preflight(view: &dyn RequestView) -> bool {
    view.method() == "OPTIONS"
        && !view.header_values("origin").is_empty()
        && !view
            .header_values("access-control-request-method")
            .is_empty()
}

impl<R: ?Sized> Clone for Skip<R> {
    fn clone(&self) -> Self {
        Skip {
            preflights: self.preflights,
            methods: self.methods.clone(),
            paths: self.paths.clone(),
            rules: self.rules.clone(),
        }
    }
}

impl<R: ?Sized> fmt::Debug for Skip<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Skip")
            .field("preflights", &self.preflights)
            .field("methods", &self.methods)
            .field("paths", &self.paths)
            .field("rules", &self.rules.len())
            .finish()
    }
}
