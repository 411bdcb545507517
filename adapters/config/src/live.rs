//! A configuration that can be replaced while the service runs.
//!
//! [`LiveConfig`] holds the running configuration and every route's limits
//! behind one atomic pointer. Code binds handlers to routes by name
//! ([`LiveConfig::route`]); the HTTP adapters read a [`LiveRoute`]'s limits
//! anew for each request. A reload validates and builds the new
//! configuration completely, then swaps it in at once: a decision in
//! flight finishes on the configuration it began with, and an invalid file
//! changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use tollgate_limiter::{Clock, Limit, RouteLimits, RouteRequirement, Store, StoreError};

use crate::observe;

use crate::{Config, ConfigError, SetupError, StoreKinds};

/// The running configuration and what was built from it.
struct Running {
    config: Config,
    store: Arc<dyn Store>,
    fallback: Option<Arc<dyn Store>>,
    routes: BTreeMap<String, Arc<RouteLimits>>,
}

struct Shared {
    path: Option<PathBuf>,
    clock: Arc<dyn Clock>,
    /// A store given by the code: kept across reloads, `[store]` ignored.
    given_store: bool,
    running: ArcSwap<Running>,
    /// Route names the code bound handlers to.
    bound: Mutex<BTreeSet<String>>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// The file's contents the running configuration was read from (or
    /// last applied from the file): where a watch begins.
    in_force: Mutex<Option<Vec<u8>>>,
    /// Every limit applied since the process started, by policy name and
    /// version: see [`lease_changed`].
    leases: Mutex<BTreeMap<(String, u32), Limit>>,
    /// What the gates built on each route need of its limits, held weakly
    /// (a dropped gate withdraws its own): a reload must meet them all.
    requirements: Mutex<Requirements>,
}

/// A configuration that can be reloaded while the service runs.
///
/// It holds the running configuration and every route's limits behind one
/// atomic pointer. Code binds handlers to routes by name
/// ([`route`](Self::route)); the HTTP adapters read a [`LiveRoute`]'s
/// limits anew for each request. A reload validates and builds the new
/// configuration completely, then swaps it in at once: a decision in
/// flight finishes on the configuration it began with, and an invalid file
/// changes nothing.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use tollgate_config::{Config, LiveConfig};
///
/// let v1 = r#"
///     [policies.search]
///     algorithm = "fixed_window"
///     limit = 5
///     window = "1m"
///     [routes.search]
///     layers = [{ scope = "subject", policy = "search" }]
/// "#;
/// let live = LiveConfig::new(Config::from_toml_str(v1)?, Arc::new(tollgate_limiter::MonotonicClock::new())).await?;
/// let search = live.route("search")?; // give this to the HTTP adapter
/// assert_eq!(search.limits().limiter().layers()[0].policy().capacity(), 5);
///
/// let report = live.reload_with(Config::from_toml_str(&v1.replace("limit = 5", "limit = 50"))?).await?;
/// assert!(!report.store_reopened);
/// assert_eq!(search.limits().limiter().layers()[0].policy().capacity(), 50);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LiveConfig {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LiveConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveConfig")
            .field("path", &self.shared.path)
            .field("routes", &self.shared.running.load().routes.keys())
            .finish_non_exhaustive()
    }
}

/// One named route of a [`LiveConfig`]: hand it to an HTTP adapter
/// (`RateLimitLayer::builder(route)`) and every request reads the route's
/// limits as the running configuration has them.
#[derive(Clone)]
pub struct LiveRoute {
    name: Arc<str>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LiveRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveRoute")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LiveRoute {
    /// The route's limits now.
    pub fn limits(&self) -> Arc<RouteLimits> {
        tollgate_limiter::ReloadableRoute::current(self)
    }
}

impl tollgate_limiter::ReloadableRoute for LiveRoute {
    fn name(&self) -> &str {
        &self.name
    }

    fn current(&self) -> Arc<RouteLimits> {
        self.shared
            .running
            .load()
            .routes
            .get(&*self.name)
            .cloned()
            // A reload that drops a bound route is refused, so the route
            // is always there.
            .expect("a bound route stays in the configuration")
    }

    fn require(&self, requirement: Weak<RouteRequirement>) {
        let mut all = self
            .shared
            .requirements
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.retain(|(_, r)| r.strong_count() > 0);
        all.push((self.name.clone(), requirement));
    }
}

impl From<LiveRoute> for tollgate_limiter::LimiterSource {
    fn from(route: LiveRoute) -> Self {
        tollgate_limiter::LimiterSource::Live(Arc::new(route))
    }
}

/// What a successful reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// Whether the `[store]` section changed, so a new store was opened
    /// (its counters start empty); otherwise the store and its connections
    /// were kept.
    pub store_reopened: bool,
    /// Routes of the new configuration no code is bound to: they decide
    /// nothing (a typo in a route name, or a route not deployed yet).
    pub unbound_routes: Vec<String>,
}

/// Why a reload was refused. The running configuration is unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The new configuration is invalid (every error, with its path).
    #[error("the new configuration was not applied: {0}")]
    Invalid(#[from] ConfigError),
    /// Routes that code is bound to are missing from the new configuration.
    #[error("the new configuration was not applied: it has no route {}, which the service uses; keep them (their limits can change)", .0.join(", "))]
    MissingRoutes(Vec<String>),
    /// The new configuration could not be built (a store that cannot be
    /// opened, a route whose layers are invalid together).
    #[error("the new configuration was not applied: {0}")]
    Build(#[from] SetupError),
    /// The configuration was not read from a file.
    #[error(
        "this configuration was not loaded from a file: reload it with LiveConfig::reload_with"
    )]
    NoFile,
}

impl ReloadError {
    /// Whether the same file may apply if tried again: its store could
    /// not be opened for now (unreachable, timed out). A watch tries such
    /// a file again until it applies or changes.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ReloadError::Build(SetupError::Store {
                source: StoreError::Timeout(_)
                    | StoreError::Unavailable(_)
                    | StoreError::CircuitOpen(_),
                ..
            })
        )
    }

    /// A short label for metrics: `invalid`, `missing_routes`, `build`, `no_file`.
    pub fn class(&self) -> &'static str {
        match self {
            ReloadError::Invalid(_) => "invalid",
            ReloadError::MissingRoutes(_) => "missing_routes",
            ReloadError::Build(_) => "build",
            ReloadError::NoFile => "no_file",
        }
    }
}

/// Why a route cannot be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the configuration has no route {name:?} (routes: {})", .known.join(", "))]
pub struct UnknownRoute {
    /// The name asked for.
    pub name: String,
    /// The routes the configuration has.
    pub known: Vec<String>,
}

impl LiveConfig {
    /// Load the file at `path`; [`reload`](Self::reload) reads it again.
    /// `clock` is as for [`Config::build`].
    pub async fn load(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<LiveConfig, ReloadError> {
        LiveConfig::load_with(path, &StoreKinds::new(), clock).await
    }

    /// As [`load`](Self::load), with `kinds` besides the built-in stores
    /// (and on every reload).
    pub async fn load_with(
        path: impl AsRef<Path>,
        kinds: &StoreKinds,
        clock: Arc<dyn Clock>,
    ) -> Result<LiveConfig, ReloadError> {
        let (path, bytes) = read(path.as_ref())?;
        let config = Config::from_file_bytes(&path, &bytes, kinds)?;
        LiveConfig::start(Some((path, bytes)), config, None, clock).await
    }

    /// Load the file at `path`, deciding on `store` (a store you opened
    /// yourself): the `[store]` section is ignored, now and on reloads.
    pub async fn load_on(
        path: impl AsRef<Path>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
    ) -> Result<LiveConfig, ReloadError> {
        let (path, bytes) = read(path.as_ref())?;
        let config = Config::from_file_bytes(&path, &bytes, &StoreKinds::new().ignoring_store())?;
        LiveConfig::start(Some((path, bytes)), config, Some(store), clock).await
    }

    /// Run `config` (not from a file: reload with
    /// [`reload_with`](Self::reload_with)).
    pub async fn new(config: Config, clock: Arc<dyn Clock>) -> Result<LiveConfig, ReloadError> {
        LiveConfig::start(None, config, None, clock).await
    }

    /// Run `config`, read from `file` (its path and contents) if any.
    async fn start(
        file: Option<(PathBuf, Vec<u8>)>,
        config: Config,
        given_store: Option<Arc<dyn Store>>,
        clock: Arc<dyn Clock>,
    ) -> Result<LiveConfig, ReloadError> {
        let given = given_store.is_some();
        let store = match given_store {
            Some(store) => store,
            None => config.open_store(clock.clone()).await?,
        };
        let fallback = config.fallback_store(clock.clone());
        let routes = config.routes_over(&store, &fallback, &clock)?;
        tollgate_limiter::observe::describe();
        observe::describe();
        let (path, in_force) = file.unzip();
        let running_config = config.clone();
        Ok(LiveConfig {
            shared: Arc::new(Shared {
                path,
                in_force: Mutex::new(in_force),
                clock,
                given_store: given,
                running: ArcSwap::from_pointee(Running {
                    config,
                    store,
                    fallback,
                    routes,
                }),
                bound: Mutex::new(BTreeSet::new()),
                reloading: tokio::sync::Mutex::new(()),
                leases: Mutex::new(leases_of(&running_config)),
                requirements: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Bind code to the route `name`: the handle reads the route's limits
    /// as the running configuration has them. From now on a reload that
    /// drops this route is refused.
    pub fn route(&self, name: &str) -> Result<LiveRoute, UnknownRoute> {
        // Under the lock a reload swaps under: the route cannot vanish
        // between this check and the binding.
        let mut bound = self.bound();
        let running = self.shared.running.load();
        if !running.routes.contains_key(name) {
            return Err(UnknownRoute {
                name: name.to_string(),
                known: running.routes.keys().cloned().collect(),
            });
        }
        bound.insert(name.to_string());
        drop(bound);
        Ok(LiveRoute {
            name: name.into(),
            shared: self.shared.clone(),
        })
    }

    /// The limits of route `name` in the running configuration, without
    /// binding it (a reload may still drop it): for a caller that decides
    /// once and keeps nothing, such as an HTTP API naming routes per call.
    /// `None` when the configuration has no such route.
    pub fn route_limits(&self, name: &str) -> Option<Arc<RouteLimits>> {
        self.shared.running.load().routes.get(name).cloned()
    }

    /// Routes of the running configuration no code is bound to.
    pub fn unbound_routes(&self) -> Vec<String> {
        let bound = self.bound();
        self.shared
            .running
            .load()
            .routes
            .keys()
            .filter(|name| !bound.contains(*name))
            .cloned()
            .collect()
    }

    /// The running configuration.
    pub fn config(&self) -> Config {
        self.shared.running.load().config.clone()
    }

    /// The store every route decides on.
    pub fn store(&self) -> Arc<dyn Store> {
        self.shared.running.load().store.clone()
    }

    /// The in-process emergency store of the policies that fall back
    /// (`None` while none does): one per running configuration, kept
    /// across reloads while `[fallback]` is unchanged. Build other
    /// limiters on it rather than on one of their own, so one bound holds.
    pub fn fallback_store(&self) -> Option<Arc<dyn Store>> {
        self.shared.running.load().fallback.clone()
    }

    /// The file this configuration was loaded from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.shared.path.as_deref()
    }

    /// Read the file again and apply it; see [`reload_with`](Self::reload_with).
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        // The file is read under the reload lock: of two reloads racing (a
        // signal and a file watch), the later read is the one applied last.
        let _one_at_a_time = self.shared.reloading.lock().await;
        let Some(path) = &self.shared.path else {
            return Err(reported(ReloadError::NoFile));
        };
        match std::fs::read(path) {
            Ok(bytes) => self.applied_file(path, bytes).await,
            Err(source) => Err(reported(ConfigError::read(path, source).into())),
        }
    }

    /// Apply the file's contents `bytes`, if they parse; applied, they are
    /// the contents in force, where a watch started later begins.
    async fn applied_file(&self, path: &Path, bytes: Vec<u8>) -> Result<ReloadReport, ReloadError> {
        let outcome = self.applied_if_parsed(self.parsed(path, &bytes)).await;
        if outcome.is_ok() {
            *self.in_force() = Some(bytes);
        }
        outcome
    }

    fn in_force(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.shared
            .in_force
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// `bytes`, the file's contents, parsed against the store kinds the
    /// running file was read against (`[store]` unread with a given store).
    fn parsed(&self, path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        let running = self.shared.running.load();
        let kinds = running.config.store_kinds();
        if self.shared.given_store {
            Config::from_file_bytes(path, bytes, &kinds.ignoring_store())
        } else {
            Config::from_file_bytes(path, bytes, kinds)
        }
    }

    /// Apply `config` if it parsed; count and log the outcome either way.
    async fn applied_if_parsed(
        &self,
        config: Result<Config, ConfigError>,
    ) -> Result<ReloadReport, ReloadError> {
        match config {
            Ok(config) => self.applied(config).await,
            Err(e) => Err(reported(e.into())),
        }
    }

    /// Apply `config`: build every route over the running store (a new
    /// store only if the `[store]` section changed), then swap the routes,
    /// policies, layers and costs in at once. Refused — the running
    /// configuration unchanged — when a route the code is bound to is
    /// missing or the new configuration cannot be built. Every outcome is
    /// counted in `tollgate_config_reloads_total{result}` and logged once.
    pub async fn reload_with(&self, config: Config) -> Result<ReloadReport, ReloadError> {
        let _one_at_a_time = self.shared.reloading.lock().await;
        self.applied(config).await
    }

    /// Apply `config` (the reload lock held), counting and logging the outcome.
    async fn applied(&self, config: Config) -> Result<ReloadReport, ReloadError> {
        match self.apply(config).await {
            Ok(report) => {
                observe::config_reload("ok", None, &report.unbound_routes);
                Ok(report)
            }
            Err(e) => Err(reported(e)),
        }
    }

    async fn apply(&self, config: Config) -> Result<ReloadReport, ReloadError> {
        let running = self.shared.running.load_full();
        let missing: Vec<String> = self
            .bound()
            .iter()
            .filter(|name| config.route(name).is_none())
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ReloadError::MissingRoutes(missing));
        }
        if let Some(error) = lease_changed(&self.leases(), &config) {
            return Err(ReloadError::Invalid(ConfigError::Invalid(vec![error])));
        }
        if config.access() != running.config.access() {
            // Applied, it would be reported as done while every running
            // gate kept the rules it was built with (a key denied in the
            // file would still pass).
            return Err(ReloadError::Invalid(ConfigError::Invalid(vec![
                tollgate_limiter::PolicyError::new(
                    "access",
                    "changed, but running gates read [access] when they are built: restart the service to apply it, and reload with [access] as it runs",
                ),
            ])));
        }
        let clock = &self.shared.clock;
        let store_reopened = !self.shared.given_store
            && !config
                .store()
                .opens_the_same_store_as(running.config.store());
        let running_store = running.config.store();
        if !self.shared.given_store && running_store.loses_state_when_replaced_by(config.store()) {
            return Err(ReloadError::Invalid(ConfigError::Invalid(vec![
                tollgate_limiter::PolicyError::new(
                    "store",
                    "changes the running in-process store, whose counters and places held live in this process: a new store would start empty (every limit lifted once, a concurrency limit's places given twice); restart to apply it, and reload with [store] as it runs",
                ),
            ])));
        }
        let store = if store_reopened {
            config.open_store(clock.clone()).await?
        } else {
            running.store.clone()
        };
        let fallback = if config.fallback_max_keys() == running.config.fallback_max_keys() {
            running
                .fallback
                .clone()
                .or_else(|| config.fallback_store(clock.clone()))
        } else {
            config.fallback_store(clock.clone())
        };
        let routes = config.routes_over(&store, &fallback, clock)?;
        // Held through the swap: a gate registering meanwhile either is
        // checked here or reads the limits swapped in.
        let requirements = self.requirements();
        if let Some(error) = unserved(&requirements, &routes) {
            return Err(ReloadError::Invalid(ConfigError::Invalid(vec![error])));
        }
        // Checked again under the lock `route` binds under, and swapped
        // under it: no route is bound to a configuration that lacks it.
        let bound = self.bound();
        let missing: Vec<String> = bound
            .iter()
            .filter(|name| !routes.contains_key(*name))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(ReloadError::MissingRoutes(missing));
        }
        let unbound_routes = routes
            .keys()
            .filter(|name| !bound.contains(*name))
            .cloned()
            .collect();
        self.leases().extend(leases_of(&config));
        let replaced = self.shared.running.swap(Arc::new(Running {
            config,
            store,
            fallback,
            routes,
        }));
        drop(bound);
        drop(requirements);
        // The old configuration (perhaps the last handle on a replaced
        // store) is dropped outside the lock.
        drop(replaced);
        Ok(ReloadReport {
            store_reopened,
            unbound_routes,
        })
    }

    fn requirements(&self) -> std::sync::MutexGuard<'_, Requirements> {
        self.shared
            .requirements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn bound(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.shared.bound.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, u32), Limit>> {
        self.shared.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reload whenever the file's contents change, read every `every` (at
    /// least [`MIN_EVERY`](crate::MIN_EVERY)), once they stayed the same
    /// for one more look and the file still holds them when the reload's
    /// turn comes (a file still being written is not applied; see
    /// [`Changes`](crate::Changes)), and hand each outcome to `report` (an
    /// invalid file's errors included); stops when the returned handle is
    /// dropped. Changes count from the contents the running configuration
    /// was read from (an edit made between [`load`](Self::load) and this
    /// call is applied). Each change is reloaded once — an invalid file is
    /// reported once, not at every check — unless it failed for a
    /// transient reason ([`ReloadError::is_transient`]: its store could
    /// not be opened for now): then it is tried again
    /// ([`Changes::retry`](crate::Changes::retry): after `every`, then
    /// twice as long each time up to a minute), each failure reported,
    /// until it applies or the file changes.
    #[cfg(feature = "watch")]
    #[cfg_attr(docsrs, doc(cfg(feature = "watch")))]
    pub fn watch(
        &self,
        every: std::time::Duration,
        mut report: impl FnMut(Result<ReloadReport, ReloadError>) + Send + 'static,
    ) -> Result<crate::Watch, ReloadError> {
        let path = self.shared.path.clone().ok_or(ReloadError::NoFile)?;
        let live = self.clone();
        let in_force = self.in_force().clone();
        let mut changes = crate::Changes::since(every, in_force, move || std::fs::read(&path).ok());
        Ok(crate::Watch::spawn(async move {
            loop {
                let settled = changes.next().await;
                let Some(outcome) = live.reload_settled(settled).await else {
                    changes.not_applied();
                    continue;
                };
                if outcome.as_ref().is_err_and(ReloadError::is_transient) {
                    changes.retry();
                }
                report(outcome);
            }
        }))
    }

    /// Apply the file's contents `settled`, as the watch saw them settle,
    /// if the file still holds them once this reload's turn comes (read
    /// again under the reload lock); `None` when it changed since — a
    /// write begun meanwhile, caught halfway, is never applied, and the
    /// watch's next looks act on what it becomes.
    #[cfg(feature = "watch")]
    async fn reload_settled(&self, settled: Vec<u8>) -> Option<Result<ReloadReport, ReloadError>> {
        let _one_at_a_time = self.shared.reloading.lock().await;
        let path = self.shared.path.as_ref()?;
        if std::fs::read(path).ok().as_deref() != Some(settled.as_slice()) {
            return None;
        }
        Some(self.applied_file(path, settled).await)
    }
}

/// What the gates built on each route need of its limits, by route name.
type Requirements = Vec<(Arc<str>, Weak<RouteRequirement>)>;

/// The first requirement of a gate that `routes` would fail (every
/// request of that gate would), as a configuration error.
fn unserved(
    requirements: &Requirements,
    routes: &BTreeMap<String, Arc<RouteLimits>>,
) -> Option<tollgate_limiter::PolicyError> {
    requirements.iter().find_map(|(name, requirement)| {
        let requirement = requirement.upgrade()?;
        let why = requirement(routes.get(&**name)?).err()?;
        Some(tollgate_limiter::PolicyError::new(
            format!("routes.{name}"),
            format!("cannot serve the gate built on it, whose every request would fail: {why}; keep what the gate needs, or build a gate that supplies it and restart"),
        ))
    })
}

/// A concurrency limit of `new` whose lease differs from one applied under
/// the same name and version since the process started (`seen`), the
/// running configuration's included: its places, kept in the same keys,
/// would be read with the new lease (a shorter one counts the older places
/// as gone, and admits past the limit). A policy removed by one reload and
/// brought back by a later one still has its places in the store. A lease
/// changes with the version.
fn lease_changed(
    seen: &BTreeMap<(String, u32), Limit>,
    new: &Config,
) -> Option<tollgate_limiter::PolicyError> {
    new.policies().iter().find_map(|(name, policy)| {
        let old = seen.get(&(name.clone(), policy.version()))?;
        let (was, now) = old.lease_change(policy.limit())?;
        Some(tollgate_limiter::PolicyError::new(
            format!("policies.{name}.lease"),
            format!(
                "changes from {was:?} to {now:?} under the same version: bump `version` (places held now are kept under the old lease until they end)"
            ),
        ))
    })
}

/// `config`'s limits, by policy name and version (those of concurrency
/// limits are the ones [`lease_changed`] reads).
fn leases_of(config: &Config) -> BTreeMap<(String, u32), Limit> {
    config
        .policies()
        .iter()
        .map(|(name, policy)| ((name.clone(), policy.version()), policy.limit().clone()))
        .collect()
}

/// `path` and the file's contents.
fn read(path: &Path) -> Result<(PathBuf, Vec<u8>), ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::read(path, source))?;
    Ok((path.to_path_buf(), bytes))
}

/// Count and log a refused reload, once.
fn reported(e: ReloadError) -> ReloadError {
    observe::config_reload(e.class(), Some(&e.to_string()), &[]);
    e
}

#[cfg(all(test, feature = "watch"))]
mod tests {
    use super::*;

    fn limits(limit: u64) -> String {
        format!(
            "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\n\n\
             [routes.api]\nlayers = [{{ scope = \"subject\", policy = \"api\" }}]\n"
        )
    }

    /// What the watch saw settle is applied only while the file still
    /// holds it: a write begun since (caught halfway, perhaps) is left to
    /// the watch's next looks.
    #[tokio::test]
    async fn settled_contents_apply_only_while_the_file_holds_them() {
        let dir = std::env::temp_dir().join(format!("tollgate-settled-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.toml");
        std::fs::write(&path, limits(5)).unwrap();
        let clock = Arc::new(tollgate_limiter::MonotonicClock::new());
        let live = LiveConfig::load(&path, clock).await.unwrap();
        std::fs::write(&path, limits(7)).unwrap();
        let capacity = |live: &LiveConfig| live.config().policy("api").unwrap().capacity();
        assert!(live.reload_settled(limits(6).into_bytes()).await.is_none());
        assert_eq!(capacity(&live), 5, "not applied: the file holds 7 now");
        let applied = live.reload_settled(limits(7).into_bytes()).await;
        assert!(matches!(applied, Some(Ok(_))), "{applied:?}");
        assert_eq!(capacity(&live), 7);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Contents the watch saw settle but could not apply (the file changed
    /// while the reload waited its turn) are applied when the file holds
    /// them again: a write that ended where it began is not lost.
    #[tokio::test(start_paused = true)]
    async fn contents_not_applied_are_applied_when_they_return() {
        let dir = std::env::temp_dir().join(format!("tollgate-returned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("limits.toml");
        std::fs::write(&path, limits(5)).unwrap();
        let clock = Arc::new(tollgate_limiter::MonotonicClock::new());
        let live = LiveConfig::load(&path, clock).await.unwrap();
        let capacity = |live: &LiveConfig| live.config().policy("api").unwrap().capacity();
        let every = crate::MIN_EVERY;
        let _watch = live.watch(every, |_| {}).unwrap();
        let look = || async {
            tokio::time::sleep(every).await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };
        // Another reload holds the turn while 7 settles.
        let turn = live.shared.reloading.lock().await;
        std::fs::write(&path, limits(7)).unwrap();
        look().await;
        look().await;
        // The file is rewritten: caught halfway when the turn comes.
        std::fs::write(&path, "[policies.api]\n").unwrap();
        drop(turn);
        look().await;
        assert_eq!(capacity(&live), 5, "nothing applied yet");
        // The write ends with 7 again.
        std::fs::write(&path, limits(7)).unwrap();
        look().await;
        look().await;
        look().await;
        assert_eq!(capacity(&live), 7, "7 applied once it settled again");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
