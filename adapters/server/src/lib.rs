//! Tollgate as a rate limit service, for Envoy, Istio and every gateway
//! that speaks Envoy's rate limit protocol, and for any language over HTTP.
//!
//! One binary, `tollgate-ratelimit-server --config server.toml`, serves:
//!
//! - `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over
//!   gRPC: a request's descriptors are mapped by the file's `[server]`
//!   rules to routes and decided together, all-or-nothing, with the
//!   library's algorithms, stores (in-process, Redis, Sentinel), failure
//!   modes, breaker and fallback; a store failure that fails closed answers
//!   `OVER_LIMIT` (never a gRPC error, which Envoy would turn into an
//!   allow by default);
//! - `grpc.health.v1.Health` beside it, for Envoy's and Kubernetes' gRPC
//!   health checks;
//! - beside it, HTTP: `POST /v1/check` (JSON), `GET /healthz`, `GET
//!   /readyz` (the store answers and no breaker is open), `GET /metrics`
//!   (Prometheus text).
//!
//! Both listeners take TLS (`[server.tls]`, rustls; certificates reloaded
//! when their files change), gRPC optionally mutual TLS and a bearer
//! token, the HTTP API its own token. Decisions can be traced over OTLP
//! (`[server.traces]`), continuing Envoy's trace.
//!
//! The file is the library's configuration format (`tollgate::config`)
//! with a `[server]` section; it is reloaded on `SIGHUP` and when it
//! changes. Its `envoy_config_dir` reads envoyproxy/ratelimit's YAML
//! configuration as is. See `docs/server.md`.

mod auth;
mod envoy_config;
mod envoy_limit;
mod error;
mod grpc;
mod grpc_runtimes;
mod http_api;
mod http_serve;
mod incoming;
mod operations;
mod permit_api;
mod permits;
mod rule_stats;
mod rules;
mod runtime_stores;
mod settings;
mod tls;
mod traces;
mod wire;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use runtime_stores::RuntimeStores;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tollgate_config::{Changes, Config, LiveConfig, Watch};
use tollgate_limiter::{Clock, Store};

pub use envoy_limit::{envoy_limit, EnvoyLimit};
pub use error::{BadRequest, ServerError};
pub use rules::{Answer, Descriptor, LimitOverride, Rules, Status};
pub use settings::{Role, RuleSpec, Settings, Unknown};
pub use tls::TlsSettings;
pub use traces::TraceSettings;

/// What the gRPC service and the HTTP API share: the running rules.
pub struct Shared {
    rules: RwLock<Arc<Rules>>,
    live: LiveConfig,
    clock: Arc<dyn Clock>,
    metrics: Option<PrometheusHandle>,
    token: Option<String>,
    /// The gRPC service's bearer token, when it has one.
    grpc_token: Option<String>,
    /// The operators' tokens: (name, token).
    operators: Vec<(String, String)>,
    /// Traces, when `[server.traces]` asks for them.
    tracer: Option<traces::Tracer>,
    /// The store the rules decide over, as each gRPC runtime sees it
    /// (`runtime_stores.rs`), and what the runtimes open their own from.
    runtime_stores: RuntimeStoreSlot,
    /// The settings the server started with (what a reload cannot change).
    started: Settings,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// What the running rules were read from ([`watched`](Self::watched)'s
    /// form, read before the rules were): where a file watch starts, so an
    /// edit made while the server started, or since the last reload, is a
    /// change.
    in_force: std::sync::Mutex<Option<Vec<u8>>>,
    /// Concurrency limits' places held for HTTP clients.
    permits: permits::Permits,
    /// A shutdown began: `/readyz` answers 503 from then on.
    stopping: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// The running rules.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The emergency store to check `config`'s rules with before it is
    /// applied: the running one (the library's, so there is one), or, when
    /// nothing falls back yet, one made for the check.
    fn fallback_to_check(&self, config: &Config) -> Option<Arc<dyn Store>> {
        self.live
            .fallback_store()
            .or_else(|| config.fallback_store(self.clock.clone()))
    }

    /// Read the file again and apply it — only once it is valid whole:
    /// the library's part, the `[server]` section, every rule built, and
    /// nothing changed that needs a restart. Otherwise the running limits
    /// are kept. Every outcome is counted in
    /// `tollgate_config_reloads_total{result}`.
    async fn reload(&self) -> Result<(), ServerError> {
        let _one = self.reloading.lock().await;
        let before = self.watched();
        let checked = self.checked_file();
        self.apply(checked).await?;
        self.set_in_force(before);
        Ok(())
    }

    /// Reload as the file watch saw the files settle: only while they still
    /// hold `settled` — before and after they are read — so that a write
    /// caught halfway is never applied (the watch's next looks act on what
    /// it becomes); `None` when they changed.
    async fn reload_settled(&self, settled: &[u8]) -> Option<Result<(), ServerError>> {
        let _one = self.reloading.lock().await;
        if self.watched().as_deref() != Some(settled) {
            return None;
        }
        let checked = self.checked_file();
        if self.watched().as_deref() != Some(settled) {
            return None;
        }
        let applied = self.apply(checked).await;
        if applied.is_ok() {
            self.set_in_force(Some(settled.to_vec()));
        }
        Some(applied)
    }

    fn set_in_force(&self, contents: Option<Vec<u8>>) {
        *self.in_force.lock().unwrap_or_else(|p| p.into_inner()) = contents;
    }

    fn in_force(&self) -> Option<Vec<u8>> {
        self.in_force
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Apply what [`checked_file`](Self::checked_file) read (the reload
    /// lock held), counting a refusal.
    async fn apply(
        &self,
        checked: Result<(Config, envoy_config::Domains), ServerError>,
    ) -> Result<(), ServerError> {
        let (config, domains) = checked.inspect_err(|e| {
            tollgate_config::observe::config_reload(e.class(), Some(&e.to_string()), &[]);
        })?;
        // Counts its own outcome.
        self.live.reload_with(config.clone()).await?;
        // The directory as checked, not read again: it may have changed
        // since.
        let rules = Rules::with_domains(
            config.clone(),
            domains,
            self.runtime_stores.over(self.live.store(), &config),
            self.live.fallback_store(),
            self.clock.clone(),
        )?
        .keeping_overrides_of(&self.rules());
        *self.rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
        Ok(())
    }

    /// The directory the file's relative paths start from.
    fn base(&self) -> std::path::PathBuf {
        base_of(self.live.path().unwrap_or(Path::new("server.toml")))
    }

    /// What the file watch compares: the file's contents and, when the
    /// running rules read envoyproxy/ratelimit's configuration, its
    /// directory's (`None` when the file cannot be read).
    fn watched(&self) -> Option<Vec<u8>> {
        let file = std::fs::read(self.live.path()?).ok();
        let dir = self.rules().settings().envoy_config_dir.clone();
        watched_of(
            file,
            dir.map(|d| envoy_config::contents(&self.base().join(d))),
        )
    }

    /// The file (and envoyproxy/ratelimit's directory, if it names one),
    /// read again and checked whole: what [`reload`](Self::reload) may
    /// apply.
    fn checked_file(&self) -> Result<(Config, envoy_config::Domains), ServerError> {
        let path = self
            .live
            .path()
            .ok_or(ServerError::Config(tollgate_config::ReloadError::NoFile))?;
        let config = Config::from_file(path)?;
        let settings = Settings::of(&config)?;
        let started = &self.started;
        for (what, same) in [
            ("grpc_listen", settings.grpc_listen == started.grpc_listen),
            ("http_listen", settings.http_listen == started.http_listen),
            (
                "api_token_env",
                settings.api_token_env == started.api_token_env,
            ),
            (
                "max_body_bytes",
                settings.max_body_bytes == started.max_body_bytes,
            ),
            (
                "grpc_token_env",
                settings.grpc_token_env == started.grpc_token_env,
            ),
            ("tls", settings.tls == started.tls),
            (
                "grpc_runtimes",
                settings.grpc_runtimes == started.grpc_runtimes,
            ),
            ("traces", settings.traces == started.traces),
            (
                "grpc_keepalive",
                settings.grpc_keepalive == started.grpc_keepalive,
            ),
            (
                "operator_tokens",
                settings.operator_tokens == started.operator_tokens,
            ),
            (
                "[store] of the in-process store",
                self.keeps_in_process_store(&config),
            ),
        ] {
            if !same {
                return Err(ServerError::NeedsRestart(what));
            }
        }
        // Checked on the running store; applied on the file's (a changed
        // [store] is opened by the reload).
        let domains = Rules::domains_of(&config, &self.base())?;
        Rules::with_domains(
            config.clone(),
            domains.clone(),
            self.live.store(),
            self.fallback_to_check(&config),
            self.clock.clone(),
        )?;
        Ok((config, domains))
    }
}

impl Shared {
    /// Whether `config` keeps the running store when that store is
    /// in-process: a new one would start empty, so only a restart may
    /// replace it (another store is opened by the reload).
    fn keeps_in_process_store(&self, config: &Config) -> bool {
        !self
            .live
            .config()
            .store()
            .loses_state_when_replaced_by(config.store())
    }
}

/// How long a shutdown waits for the requests in flight.
pub const SHUTDOWN_WITHIN: Duration = Duration::from_secs(30);

/// The buckets of `tollgate_store_latency_seconds`, in seconds: from a
/// loopback Redis call to the longest deadline worth having. With buckets
/// the latency is a Prometheus histogram (it aggregates across instances;
/// without, the exporter would make it a summary, which does not).
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// The process's Prometheus recorder, installed before the first limiter
/// is built (limiters take their metric handles then).
fn metrics() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("tollgate_store_latency_seconds".into()),
                    &LATENCY_BUCKETS,
                )
                .ok()?
                .install_recorder()
                .ok()?;
            tollgate_limiter::observe::describe();
            tollgate_config::observe::describe();
            tollgate_http::observe::describe();
            rule_stats::describe();
            traces::describe();
            Some(handle)
        })
        .clone()
}

/// A running server: the gRPC service and the HTTP API.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    grpc: SocketAddr,
    http: SocketAddr,
    stop: watch::Sender<bool>,
    /// Drops the gRPC runtimes with what they still serve, once a
    /// shutdown has waited long enough.
    force: watch::Sender<bool>,
    /// `grpc.health.v1`: serving until the shutdown begins.
    health: tonic_health::server::HealthReporter,
    /// The listeners' tasks, which end with the shutdown.
    tasks: Vec<JoinHandle<()>>,
    /// The certificate files' watch, when there is TLS: stops with the
    /// server.
    certificates: Option<Watch>,
}

/// What each gRPC runtime serves, and its stop signals.
struct Serving {
    routes: tonic::service::Routes,
    tls: Option<incoming::Acceptor>,
    stopped: watch::Receiver<bool>,
    forced: watch::Receiver<bool>,
}

/// Start the gRPC runtimes (`grpc_runtimes.rs`) and the task handing
/// them the connections `listener` accepts: the tasks that end when they
/// have finished.
fn start_grpc(
    shared: &Arc<Shared>,
    listener: TcpListener,
    local: SocketAddr,
    serving: Serving,
) -> Result<Vec<JoinHandle<()>>, ServerError> {
    let mut tasks = Vec::new();
    let mut senders = Vec::new();
    for n in 0..shared.started.grpc_runtimes() {
        let (sender, handed) = grpc_runtimes::channel();
        senders.push(sender);
        let targets = shared.runtime_stores.targets.subscribe();
        tasks.push(grpc_runtimes::spawn(grpc_runtimes::Runtime {
            n,
            handed,
            local,
            tls: serving.tls.clone(),
            routes: serving.routes.clone(),
            keepalive: shared.started.grpc_keepalive.0,
            stopped: serving.stopped.clone(),
            forced: serving.forced.clone(),
            beside: Box::pin(runtime_stores::keep_local(targets, shared.clock.clone())),
        })?);
    }
    tasks.push(grpc_runtimes::hand_out(listener, senders, serving.stopped));
    Ok(tasks)
}

/// The store the rules decide over, wrapped so that each gRPC runtime
/// decides over its own connection when the store is a standalone Redis
/// (`runtime_stores.rs`).
struct RuntimeStoreSlot {
    current: std::sync::Mutex<Option<Arc<RuntimeStores>>>,
    targets: watch::Sender<runtime_stores::Target>,
}

impl RuntimeStoreSlot {
    fn new() -> RuntimeStoreSlot {
        RuntimeStoreSlot {
            current: std::sync::Mutex::new(None),
            targets: watch::channel(None).0,
        }
    }

    /// The store to build rules over for `config`, whose running store is
    /// `store`: the same wrapper while the store is the same (the
    /// runtimes keep their connections), a new one, which the runtimes
    /// open again, when it changed.
    fn over(&self, store: Arc<dyn Store>, config: &Config) -> Arc<dyn Store> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if !RuntimeStores::apply_to(config) {
            *current = None;
            self.targets.send_replace(None);
            return store;
        }
        if let Some(wrapper) = current.as_ref() {
            if Arc::ptr_eq(wrapper.shared(), &store) {
                return wrapper.clone();
            }
        }
        let wrapper = Arc::new(RuntimeStores::new(store));
        *current = Some(wrapper.clone());
        self.targets
            .send_replace(Some((wrapper.generation(), config.clone())));
        wrapper
    }
}

/// Everything a start needs before it listens: the configuration loaded
/// and its store opened, every rule built, the tokens read from their
/// variables, the certificates loaded.
async fn prepare(
    path: impl AsRef<Path>,
    clock: Arc<dyn Clock>,
) -> Result<(Arc<Shared>, Option<Certificates>), ServerError> {
    let metrics = metrics();
    // Read before the configuration is: an edit made while the server
    // starts (its store connecting) is a change for the file watch.
    let file_before = std::fs::read(path.as_ref()).ok();
    let live = LiveConfig::load(&path, clock.clone()).await?;
    let config = live.config();
    let fallback = live.fallback_store();
    let base = base_of(path.as_ref());
    let runtime_stores = RuntimeStoreSlot::new();
    let store = runtime_stores.over(live.store(), &config);
    let envoy_dir = Settings::of(&config)?.envoy_config_dir;
    let dir_before = envoy_dir.map(|dir| envoy_config::contents(&base.join(dir)));
    let rules = Rules::new(config, &base, store, fallback, clock.clone())?;
    let in_force = watched_of(file_before, dir_before);
    let settings = rules.settings().clone();
    let token = settings
        .api_token_env
        .as_deref()
        .map(|name| auth::token_from_env(name, "the HTTP API's bearer token"))
        .transpose()?;
    let grpc_token = settings
        .grpc_token_env
        .as_deref()
        .map(|name| auth::token_from_env(name, "the gRPC service's bearer token"))
        .transpose()?;
    let operators = settings
        .operator_tokens
        .iter()
        .map(|(name, env)| {
            let holds = format!("the operator token {name:?}");
            auth::token_from_env(env, &holds).map(|token| (name.clone(), token))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let certificates = settings.tls.as_ref().map(Certificates::load).transpose()?;
    let tracer = settings
        .traces
        .as_ref()
        .map(traces::Tracer::start)
        .transpose()?;
    let shared = Arc::new(Shared {
        rules: RwLock::new(Arc::new(rules)),
        live,
        clock,
        metrics,
        token,
        grpc_token,
        operators,
        tracer,
        runtime_stores,
        started: settings,
        reloading: tokio::sync::Mutex::new(()),
        in_force: std::sync::Mutex::new(in_force),
        permits: permits::Permits::default(),
        stopping: std::sync::atomic::AtomicBool::new(false),
    });
    Ok((shared, certificates))
}

/// What the file watch compares ([`Shared::watched`]): the file's
/// contents (`file`) and, when the rules read envoyproxy/ratelimit's
/// directory, a 0 and the directory's (`envoy_dir`); `None` when the
/// file could not be read (the directory's errors are in its contents).
fn watched_of(file: Option<Vec<u8>>, envoy_dir: Option<Vec<u8>>) -> Option<Vec<u8>> {
    let mut contents = file?;
    if let Some(dir) = envoy_dir {
        contents.push(0);
        contents.extend(dir);
    }
    Some(contents)
}

/// The directory a configuration file's relative paths start from: its
/// own.
fn base_of(file: &Path) -> std::path::PathBuf {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    }
}

/// A listener on `addr`, and the address it got (port 0: any free one).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Resolves once the server is told to stop.
pub(crate) async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// Serve the HTTP API on `listener`, through TLS when `tls` is set, until
/// stopped ([`http_serve`]: with a deadline for each request's head).
async fn serve_http(
    listener: TcpListener,
    tls: Option<incoming::Acceptor>,
    app: axum::Router,
    stopped: watch::Receiver<bool>,
) {
    use axum::serve::ListenerExt;
    match tls {
        Some(acceptor) => {
            match incoming::Incoming::start(incoming::Tcp::Listener(listener), acceptor) {
                Ok(incoming) => {
                    http_serve::serve(incoming, app, stopped, http_serve::HEAD_WITHIN).await
                }
                Err(e) => eprintln!("HTTP server stopped: {e}"),
            }
        }
        None => {
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            http_serve::serve(listener, app, stopped, http_serve::HEAD_WITHIN).await;
        }
    }
}

/// How often the certificate files are read for a change.
const CERTIFICATES_EVERY: Duration = Duration::from_secs(1);

/// The TLS configurations of both listeners, and the files they came from.
struct Certificates {
    settings: TlsSettings,
    grpc: incoming::Acceptor,
    http: incoming::Acceptor,
    /// The files' contents, read before the acceptors were made: where
    /// the watch starts, so a rotation made while the server started is a
    /// change.
    loaded_from: tls::Contents,
}

impl Certificates {
    /// Read the files now: a server with TLS settings it cannot use does
    /// not start.
    fn load(settings: &TlsSettings) -> Result<Certificates, ServerError> {
        let loaded_from = settings.contents();
        let acceptor = |listener| {
            let config = settings.server_config(listener)?;
            Ok::<_, ServerError>(Arc::new(RwLock::new(TlsAcceptor::from(config))))
        };
        Ok(Certificates {
            grpc: acceptor(tls::Listener::Grpc)?,
            http: acceptor(tls::Listener::Http)?,
            settings: settings.clone(),
            loaded_from,
        })
    }

    /// Read the files every `every` and swap in what they hold once it
    /// stood still for one look ([`Changes`]) and makes a valid
    /// configuration: new handshakes use it, connections already open
    /// keep theirs. Files that do not make one keep the running
    /// certificates, said on standard error.
    fn watch(self, every: Duration) -> Watch {
        let settings = self.settings.clone();
        let loaded_from = Some(self.loaded_from.clone());
        let mut files = Changes::since(every, loaded_from, move || Some(settings.contents()));
        Watch::spawn(async move {
            loop {
                files.next().await;
                let swap = |acceptor: &incoming::Acceptor, listener| {
                    let config = self.settings.server_config(listener)?;
                    *acceptor.write().unwrap_or_else(|p| p.into_inner()) =
                        TlsAcceptor::from(config);
                    Ok::<_, ServerError>(())
                };
                match swap(&self.grpc, tls::Listener::Grpc)
                    .and_then(|()| swap(&self.http, tls::Listener::Http))
                {
                    Ok(()) => eprintln!("TLS certificates reloaded"),
                    Err(e) => eprintln!("TLS certificates: {e} (the running ones are kept)"),
                }
            }
        })
    }
}

impl Server {
    /// Load the configuration at `path`, open its store and start serving
    /// (port 0 in `server.grpc_listen` / `server.http_listen`: any free
    /// port, see [`grpc_addr`](Self::grpc_addr)). `clock` is the time of
    /// in-process stores and breakers.
    pub async fn start(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<Server, ServerError> {
        let (shared, certificates) = prepare(path, clock).await?;
        let settings = shared.started.clone();
        let (grpc_listener, grpc) = bind(settings.grpc_listen).await?;
        let (http_listener, http) = bind(settings.http_listen).await?;
        let (stop, stopped) = watch::channel(false);
        let (force, forced) = watch::channel(false);
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<grpc::Service>().await;
        let routes = tonic::service::Routes::new(grpc::Service {
            shared: shared.clone(),
        })
        .add_service(health_service);
        let serving = Serving {
            routes,
            tls: certificates.as_ref().map(|c| c.grpc.clone()),
            stopped: stopped.clone(),
            forced,
        };
        let mut tasks = start_grpc(&shared, grpc_listener, grpc, serving)?;
        tasks.push(tokio::spawn(serve_http(
            http_listener,
            certificates.as_ref().map(|c| c.http.clone()),
            http_api::router(shared.clone()),
            stopped,
        )));
        let certificates = certificates.map(|c| c.watch(CERTIFICATES_EVERY));
        // Ends once the server is dropped.
        tokio::spawn(permit_api::sweep(Arc::downgrade(&shared)));
        Ok(Server {
            shared,
            grpc,
            http,
            stop,
            force,
            health,
            tasks,
            certificates,
        })
    }

    /// Check the configuration at `path` as [`start`](Self::start) would
    /// — the library's part, every rule built over the store it opens,
    /// the tokens' variables set, the certificates usable — without
    /// listening: what `--check` runs. Answers how many rules it has
    /// (`[[server.rules]]` and limits of envoyproxy/ratelimit's
    /// configuration).
    pub async fn check(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<usize, ServerError> {
        let (shared, _) = prepare(path, clock).await?;
        Ok(shared.rules().len())
    }

    /// Where the gRPC service listens.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    /// Where the HTTP API listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// The running rules.
    pub fn rules(&self) -> Arc<Rules> {
        self.shared.rules()
    }

    /// Read the file again and apply it, only when it is valid whole (the
    /// library's part, the `[server]` section, every rule) and changes
    /// nothing that needs a restart (where it listens, the API token's
    /// variable, the body limit, the gRPC token's variable, the TLS
    /// settings); otherwise the running limits are kept.
    pub async fn reload(&self) -> Result<(), ServerError> {
        self.shared.reload().await
    }

    /// Reload as [`reload`](Self::reload) does whenever the file's contents
    /// change (read every `every`; its time and length are not trusted),
    /// once they have stayed the same for one more look, so a file still
    /// being written is not applied ([`Changes`]: the configuration
    /// library's rule), reporting each outcome; stops when the returned
    /// guard is dropped. A reload whose store could not be opened for now
    /// is tried again as the library's watch does
    /// ([`Changes::retry`]).
    pub fn watch(
        &self,
        every: Duration,
        mut report: impl FnMut(Result<(), ServerError>) + Send + 'static,
    ) -> Watch {
        let shared = self.shared.clone();
        let watched = self.shared.clone();
        let in_force = self.shared.in_force();
        let mut files = Changes::since(every, in_force, move || watched.watched());
        Watch::spawn(async move {
            loop {
                let settled = files.next().await;
                let Some(outcome) = shared.reload_settled(&settled).await else {
                    files.not_applied();
                    continue;
                };
                if matches!(&outcome, Err(ServerError::Config(e)) if e.is_transient()) {
                    files.retry();
                }
                report(outcome);
            }
        })
    }

    /// Tell health checks `NOT_SERVING`, keep serving for
    /// `shutdown_drain` (when set), then stop accepting, let the requests
    /// in flight finish (for at most [`SHUTDOWN_WITHIN`]), and return.
    pub async fn shutdown(self) {
        // Health checks (gRPC's and `/readyz`) see the shutdown first
        // and, for `shutdown_drain`, while everything is still served, so
        // Envoy and Kubernetes stop sending before the listeners close.
        self.shared
            .stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        self.health.set_not_serving::<grpc::Service>().await;
        if let Some(drain) = self.shared.rules().settings().shutdown_drain {
            tokio::time::sleep(drain.0).await;
        }
        // The certificates' watch ends now: it would never end itself.
        drop(self.certificates);
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + SHUTDOWN_WITHIN;
        for mut task in self.tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                // The gRPC runtimes drop what they still serve; the HTTP
                // API's task is aborted.
                let _ = self.force.send(true);
                if tokio::time::timeout(Duration::from_secs(5), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
        }
        // The last decisions' spans go out before the process ends.
        if let Some(tracer) = &self.shared.tracer {
            tracer.flush(Duration::from_secs(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(limit: u64) -> String {
        format!(
            "[policies.per-user]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\n\n\
             [routes.api]\nlayers = [{{ name = \"user\", scope = \"subject\", policy = \"per-user\" }}]\n\n\
             [server]\ngrpc_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\n\
             [[server.rules]]\nname = \"api\"\ndomain = \"edge\"\nroute = \"api\"\n\
             entries = {{ user_id = \"subject\" }}\n"
        )
    }

    /// A server started from a file of limit 5 in a directory of its own
    /// (`name`'s): the directory, the file and the server.
    async fn started(name: &str) -> (std::path::PathBuf, std::path::PathBuf, Server) {
        let dir =
            std::env::temp_dir().join(format!("tollgate-server-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        std::fs::write(&path, file(5)).unwrap();
        let clock = Arc::new(tollgate_limiter::ManualClock::new(
            tollgate_limiter::Timestamp::from_micros(1_780_000_000_000_000),
        ));
        let server = Server::start(&path, clock).await.unwrap();
        (dir, path, server)
    }

    /// What the watch saw settle is applied only while the file still
    /// holds it: a write begun since (caught halfway, perhaps) is left to
    /// the watch's next looks.
    #[tokio::test]
    async fn settled_files_apply_only_while_they_hold_what_settled() {
        let (dir, path, server) = started("settled").await;
        let capacity = |s: &Server| s.rules().policy("per-user").unwrap().capacity();
        std::fs::write(&path, file(7)).unwrap();
        assert!(server
            .shared
            .reload_settled(file(6).as_bytes())
            .await
            .is_none());
        assert_eq!(capacity(&server), 5, "not applied: the file holds 7 now");
        let applied = server.shared.reload_settled(file(7).as_bytes()).await;
        assert!(matches!(applied, Some(Ok(()))), "{applied:?}");
        assert_eq!(capacity(&server), 7);
        server.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An edit made after the file was read at start, before the watch
    /// begins (while the store connected, say), is a change the watch
    /// applies, not the baseline it starts from.
    #[tokio::test]
    async fn an_edit_made_while_starting_is_applied_by_the_watch() {
        let (dir, path, server) = started("starting").await;
        std::fs::write(&path, file(7)).unwrap();
        let (reports, mut reported) = tokio::sync::mpsc::unbounded_channel();
        let watch = server.watch(Duration::from_millis(10), move |outcome| {
            let _ = reports.send(outcome.map_err(|e| e.to_string()));
        });
        let outcome = tokio::time::timeout(Duration::from_secs(5), reported.recv()).await;
        assert!(matches!(outcome, Ok(Some(Ok(())))), "{outcome:?}");
        assert_eq!(server.rules().policy("per-user").unwrap().capacity(), 7);
        drop(watch);
        server.shutdown().await;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
