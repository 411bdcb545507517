//! Why the server cannot start, or cannot answer a request.

/// Why the server cannot start or reload.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration file is invalid or its store cannot be opened.
    #[error("{0}")]
    Config(#[from] tollgate_config::ReloadError),
    /// The file is invalid (a reload is refused; the running limits stay).
    #[error("{0}")]
    Invalid(#[from] tollgate_config::ConfigError),
    /// A reload changes what only a restart can (where the server
    /// listens, the API token's variable, the body limit).
    #[error("[server] {0} changed: restart the server to apply it (the running limits are kept)")]
    NeedsRestart(&'static str),
    /// The `[server]` section is invalid.
    #[error("[server]: {0}")]
    Settings(String),
    /// A rule cannot be built from its route.
    #[error("server.rules {rule:?}: {reason}")]
    Rule {
        /// The rule's name.
        rule: String,
        /// What is wrong.
        reason: String,
    },
    /// A file of envoyproxy/ratelimit's configuration directory is
    /// invalid, as the reference would refuse it (or uses what Tollgate
    /// does not implement).
    #[error("{file}: {reason}")]
    EnvoyConfig {
        /// The file (or the directory).
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// An environment variable the file names is missing or unusable.
    #[error("environment variable {name}: {reason}")]
    Env {
        /// The variable.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A thread for a gRPC runtime cannot be started.
    #[error("cannot start a thread for a gRPC runtime: {source} (lower server.grpc_runtimes)")]
    Runtime {
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A listening address cannot be bound.
    #[error("cannot listen on {addr}: {source} (is another server running there? change server.grpc_listen / server.http_listen)")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ServerError {
    /// The class of a refused reload, as `tollgate_config_reloads_total`'s
    /// `result` label counts it.
    pub fn class(&self) -> &'static str {
        match self {
            ServerError::Config(e) => e.class(),
            ServerError::Invalid(_)
            | ServerError::Settings(_)
            | ServerError::Rule { .. }
            | ServerError::EnvoyConfig { .. } => "invalid",
            ServerError::NeedsRestart(_) => "needs_restart",
            ServerError::Env { .. } => "environment",
            ServerError::Bind { .. } => "bind",
            ServerError::Runtime { .. } => "runtime",
        }
    }
}

/// A request the server cannot decide as sent (gRPC `INVALID_ARGUMENT`,
/// HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);
