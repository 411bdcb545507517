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
//! - beside it, HTTP: `POST /v1/check` (JSON), `GET /healthz`, `GET
//!   /readyz` (the store answers and no breaker is open), `GET /metrics`
//!   (Prometheus text).
//!
//! The file is the library's configuration format (`tollgate::config`)
//! with a `[server]` section; it is reloaded on `SIGHUP` and when it
//! changes. See `docs/server.md`.

mod envoy_limit;
mod error;
mod grpc;
mod http_api;
mod rules;
mod settings;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_config::LiveConfig;
use tollgate_limiter::Clock;

pub use envoy_limit::{envoy_limit, rate, EnvoyLimit};
pub use error::{BadRequest, ServerError};
pub use rules::{Descriptor, Outcome, Rules, Status};
pub use settings::{Role, RuleSpec, Settings, Unknown};

/// What the gRPC service and the HTTP API share: the running rules.
pub struct Shared {
    rules: RwLock<Arc<Rules>>,
    live: LiveConfig,
    clock: Arc<dyn Clock>,
    metrics: Option<PrometheusHandle>,
    token: Option<String>,
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

    /// Rebuild the rules from the running configuration (after a reload).
    fn rebuild(&self) -> Result<(), ServerError> {
        let rules = Rules::new(self.live.config(), self.live.store(), self.clock.clone())?;
        *self.rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
        Ok(())
    }
}

/// The process's Prometheus recorder, installed before the first limiter
/// is built (limiters take their metric handles then).
fn metrics() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new().install_recorder().ok()?;
            tollgate_limiter::observe::describe();
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
    tasks: Vec<JoinHandle<()>>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
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
        let metrics = metrics();
        let live = LiveConfig::load(path, clock.clone()).await?;
        let rules = Rules::new(live.config(), live.store(), clock.clone())?;
        let settings = rules.settings().clone();
        let token = match &settings.api_token_env {
            Some(name) => Some(std::env::var(name).map_err(|_| ServerError::Env {
                name: name.clone(),
                reason: "not set (it holds the HTTP API's bearer token)".into(),
            })?)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ServerError::Env {
                name: name.clone(),
                reason: "empty".into(),
            })
            .map(Some)?,
            None => None,
        };
        let shared = Arc::new(Shared {
            rules: RwLock::new(Arc::new(rules)),
            live,
            clock,
            metrics,
            token,
        });
        let grpc_listener = bind(settings.grpc_listen).await?;
        let http_listener = bind(settings.http_listen).await?;
        let grpc = grpc_listener
            .local_addr()
            .map_err(|source| ServerError::Bind {
                addr: settings.grpc_listen,
                source,
            })?;
        let http = http_listener
            .local_addr()
            .map_err(|source| ServerError::Bind {
                addr: settings.http_listen,
                source,
            })?;
        let (stop, stopped) = watch::channel(false);
        let service = RateLimitServiceServer::new(grpc::Service {
            shared: shared.clone(),
        });
        let until_stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let grpc_task = tokio::spawn({
            let stopped = until_stopped(stopped.clone());
            async move {
                // Without TCP_NODELAY a small answer waits for the
                // client's delayed ACK (40 ms).
                let incoming = tonic::transport::server::TcpIncoming::from(grpc_listener)
                    .with_nodelay(Some(true));
                if let Err(e) = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, stopped)
                    .await
                {
                    eprintln!("gRPC server stopped: {e}");
                }
            }
        });
        let http_task = tokio::spawn({
            let app = http_api::router(shared.clone(), settings.max_body_bytes);
            let stopped = until_stopped(stopped);
            async move {
                use axum::serve::ListenerExt;
                let http_listener = http_listener.tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                if let Err(e) = axum::serve(http_listener, app)
                    .with_graceful_shutdown(stopped)
                    .await
                {
                    eprintln!("HTTP server stopped: {e}");
                }
            }
        });
        Ok(Server {
            shared,
            grpc,
            http,
            stop,
            tasks: vec![grpc_task, http_task],
        })
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

    /// Read the file again and apply it: an invalid file (or `[server]`
    /// section) is refused and the running rules are kept.
    pub async fn reload(&self) -> Result<(), ServerError> {
        let previous = self.shared.live.config();
        self.shared.live.reload().await?;
        if let Err(e) = self.shared.rebuild() {
            // The library's part was applied: put it back as it was.
            let _ = self.shared.live.reload_with(previous).await;
            return Err(e);
        }
        Ok(())
    }

    /// Reload whenever the file changes (checked every `every`), reporting
    /// each outcome; stops when the returned guard is dropped.
    pub fn watch(
        &self,
        every: Duration,
        mut report: impl FnMut(Result<(), ServerError>) + Send + 'static,
    ) -> Result<tollgate_config::Watch, ServerError> {
        let shared = self.shared.clone();
        Ok(self.shared.live.watch(every, move |result| {
            report(match result {
                Ok(_) => shared.rebuild(),
                Err(e) => Err(e.into()),
            })
        })?)
    }

    /// Stop accepting, let the requests in flight finish, and return.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
