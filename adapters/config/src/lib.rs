//! Tollgate's configuration file: the store, its failure handling, named
//! policies, and routes (endpoint groups) mapped to layers of those policies,
//! in TOML.
//!
//! ```toml
//! [store]
//! kind = "memory"          # or "redis", "redis-sentinel", "redis-cluster", or your own
//! max_keys = 100_000
//!
//! [policies.search]
//! algorithm = "token_bucket"   # swap the algorithm: change this block only
//! capacity = 5
//! refill = 1
//! period = "1s"
//!
//! [routes.search]
//! layers = [{ scope = "subject", policy = "search" }]
//! ```
//!
//! [`Config::from_toml_str`] (or [`Config::from_file`]) parses and validates
//! the whole file at once and reports **every** error with its field path,
//! for example `policies.search.window: 0 must be between 1ms and 604800s`.
//! Unknown fields are errors, and so are routes naming an undefined policy.
//! [`Config::build`] then opens the store and returns one [`Limiter`](tollgate_limiter::Limiter) per
//! route, with the route's cost, in [`Limiters`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tollgate_config::Config;
//! use tollgate_limiter::{Context, MonotonicClock, Subject};
//!
//! let config = Config::from_toml_str(r#"
//!     [store]
//!     kind = "memory"
//!
//!     [policies.search]
//!     algorithm = "fixed_window"
//!     limit = 2
//!     window = "1m"
//!
//!     [routes.search]
//!     layers = [{ scope = "subject", policy = "search" }]
//! "#)?;
//! let limiters = config.build(Arc::new(MonotonicClock::new())).await?;
//! let search = limiters.route("search").expect("configured");
//! let ctx = Context::for_subject(Subject::new("key-7")?);
//! assert!(search.limiter().check(&ctx, search.cost()).await?.is_allowed());
//!
//! // Every error at once, each with its path:
//! let err = Config::from_toml_str(r#"
//!     [policies.search]
//!     algorithm = "fixed_window"
//!     limit = 0
//!     window = "1m"
//!     colour = "red"
//!
//!     [routes.search]
//!     layers = [{ scope = "subject", policy = "serach" }]
//! "#).unwrap_err();
//! let text = err.to_string();
//! assert!(text.contains("policies.search.limit: 0 must be between 1 and"), "{text}");
//! assert!(text.contains("policies.search.colour: unknown field `colour`"), "{text}");
//! assert!(text.contains("routes.search.layers[0].policy: no policy named \"serach\""), "{text}");
//! # Ok(()) }
//! ```
//!
//! A store from outside this crate (a database of your own, say) is
//! selected by name once its [`StoreKind`] is registered: see
//! [`StoreKinds`] and [`Config::from_toml_str_with`].
//!
//! The configuration guide (`docs/configuration.md`) documents every field.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod build;
mod error;
mod live;
pub mod observe;
mod plans;
mod spec;
mod store_kind;
#[cfg(feature = "watch")]
mod watch;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tollgate_http::AccessRules;
use tollgate_limiter::{BreakerConfig, Policy, PolicyError, Scope};

pub use build::{Limiters, Route};
pub use error::{ConfigError, SetupError};
pub use live::{LiveConfig, LiveRoute, ReloadError, ReloadReport, UnknownRoute};
pub use plans::PlansDef;
pub use spec::StoreSpec;
pub use store_kind::{CustomStore, StoreKind, StoreKinds};
/// A duration as the file writes it (`"250ms"`, `"1m30s"`), for a
/// [`StoreKind`]'s settings.
pub use tollgate_limiter::DurationSpec;
#[cfg(feature = "watch")]
#[cfg_attr(docsrs, doc(cfg(feature = "watch")))]
pub use watch::{Changes, Watch, MIN_EVERY, RETRY_AT_MOST_EVERY};

/// A validated configuration file; build the limiters with [`Config::build`].
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    store: StoreSpec,
    fallback_max_keys: usize,
    breaker: BreakerConfig,
    access: AccessRules,
    policies: BTreeMap<String, Policy>,
    routes: BTreeMap<String, RouteDef>,
    plans: Option<PlansDef>,
    server: Option<toml::Table>,
    /// The kinds the file was read against (a reload reads against them).
    kinds: StoreKinds,
}

/// One route (endpoint group) as configured: its cost and its layers.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteDef {
    cost: u64,
    layers: Vec<LayerDef>,
}

impl RouteDef {
    /// Units one request on this route costs (default 1).
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[LayerDef] {
        &self.layers
    }
}

/// One layer of a route: its name, what it counts by, and its policy's name.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDef {
    name: String,
    scope: Scope,
    policy: String,
}

impl LayerDef {
    /// The layer's name (defaults to its scope: `subject`, `tenant`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the layer counts by.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The name of the layer's policy, a key of `[policies]`.
    pub fn policy(&self) -> &str {
        &self.policy
    }
}

/// Default size of the in-process emergency store (`[fallback] max_keys`).
pub const DEFAULT_FALLBACK_MAX_KEYS: usize = 10_000;

/// A syntax error with its line and column, without the line's text
/// (toml's own message quotes it, and it may hold a password).
fn syntax_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let at = e.span().map(|span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!(", line {line}, column {column}")
    });
    let message = e.message().trim_end_matches('\n');
    ConfigError::Syntax(format!("{}{}", message, at.unwrap_or_default()))
}

impl Config {
    /// Parse and validate a configuration. Fails with every error found,
    /// each naming its field path ([`ConfigError::Invalid`]), or with the
    /// TOML syntax error and its line ([`ConfigError::Syntax`]).
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str_with(text, &StoreKinds::new())
    }

    /// As [`from_toml_str`](Self::from_toml_str), with `kinds` besides
    /// the built-in stores: `[store] kind = "…"` may name one of them.
    pub fn from_toml_str_with(text: &str, kinds: &StoreKinds) -> Result<Config, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        spec::parse(table, kinds)
    }

    /// Read, parse and validate the file at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        Config::from_file_with(path, &StoreKinds::new())
    }

    /// As [`from_file`](Self::from_file), with `kinds` besides the
    /// built-in stores.
    pub fn from_file_with(
        path: impl AsRef<Path>,
        kinds: &StoreKinds,
    ) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| ConfigError::read(path, source))?;
        Config::from_file_bytes(path, &bytes, kinds)
    }

    /// Parse and validate `bytes`, the contents of the file at `path`
    /// (which errors name).
    pub(crate) fn from_file_bytes(
        path: &Path,
        bytes: &[u8],
        kinds: &StoreKinds,
    ) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            ConfigError::read(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            )
        })?;
        Config::from_toml_str_with(text, kinds).map_err(|e| e.in_file(path))
    }

    /// The store kinds the file was read against, besides the built-in
    /// ones.
    pub fn store_kinds(&self) -> &StoreKinds {
        &self.kinds
    }

    /// The store section.
    pub fn store(&self) -> &StoreSpec {
        &self.store
    }

    /// Most keys the in-process emergency store holds (used only when some
    /// policy falls back).
    pub fn fallback_max_keys(&self) -> usize {
        self.fallback_max_keys
    }

    /// The circuit breaker every limiter uses.
    pub fn breaker(&self) -> BreakerConfig {
        self.breaker
    }

    /// The `[plans]` section, if the file has one: every route's limiter
    /// decides under these plans.
    pub fn plans(&self) -> Option<&PlansDef> {
        self.plans.as_ref()
    }

    /// The `[access]` section: exempt and denied subjects and networks,
    /// methods and paths not limited — give it to the HTTP adapter's
    /// builder (`.access(config.access().clone())`). Read when the adapter
    /// is built: a reload that changes them is refused (restart to apply).
    pub fn access(&self) -> &AccessRules {
        &self.access
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.policies.get(name)
    }

    /// Every policy, by name.
    pub fn policies(&self) -> &BTreeMap<String, Policy> {
        &self.policies
    }

    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&RouteDef> {
        self.routes.get(name)
    }

    /// Every route, by name.
    pub fn routes(&self) -> &BTreeMap<String, RouteDef> {
        &self.routes
    }

    /// The `[server]` section as written, for the rate limit server
    /// (`tollgate-ratelimit-server`), which validates it; a library user's
    /// limiters ignore it, so one file can serve both.
    pub fn server_section(&self) -> Option<&toml::Table> {
        self.server.as_ref()
    }

    fn any_fallback(&self) -> bool {
        self.policies.values().any(|p| p.fallback_limit().is_some())
    }
}

/// `prefix.field: reason`, as every configuration error reads.
pub(crate) fn field_error(path: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::new(path, reason)
}

/// A duration that must be positive and at most `max`.
pub(crate) fn check_duration(
    errors: &mut Vec<PolicyError>,
    path: &str,
    value: DurationSpec,
    max: Duration,
) {
    if let Some(reason) = value.problem(max) {
        errors.push(field_error(path, reason));
    }
}
