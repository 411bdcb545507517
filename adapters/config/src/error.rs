//! What can go wrong reading a configuration and building from it.

use std::fmt;
use std::path::Path;

use tollgate_limiter::{PolicyError, StoreError};

/// A configuration that cannot be used. Its message lists what to fix.
///
/// Its `Debug` form is the message too, so a `main` returning
/// `Result<(), Box<dyn Error>>` that stops on `?` prints the list of
/// errors, not a nest of structs.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("could not read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML (the message gives line and column).
    #[error("the configuration is not valid TOML: {0}")]
    Syntax(String),
    /// The TOML is valid but some values are not: every one of them, each
    /// as `field.path: reason`.
    #[error("{}", Invalid(.0))]
    Invalid(Vec<PolicyError>),
    /// An error in the file at `path`.
    #[error("{path}: {error}")]
    InFile {
        /// The file.
        path: String,
        /// The error in it.
        #[source]
        error: Box<ConfigError>,
    },
}

impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl ConfigError {
    /// Every invalid field, each with its path and reason (empty for a
    /// syntax or read error).
    pub fn errors(&self) -> &[PolicyError] {
        match self {
            ConfigError::Invalid(errors) => errors,
            ConfigError::InFile { error, .. } => error.errors(),
            _ => &[],
        }
    }

    /// The file at `path` could not be read, for `source`.
    pub(crate) fn read(path: &Path, source: std::io::Error) -> ConfigError {
        ConfigError::Read {
            path: path.display().to_string(),
            source,
        }
    }

    pub(crate) fn in_file(self, path: &Path) -> ConfigError {
        ConfigError::InFile {
            path: path.display().to_string(),
            error: Box::new(self),
        }
    }
}

/// Shows a list of field errors, one per line.
struct Invalid<'a>(&'a [PolicyError]);

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(
            f,
            "{n} error{} in the configuration:",
            if n == 1 { "" } else { "s" }
        )?;
        for e in self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// A valid configuration that could not be turned into limiters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The file asks for a Redis Cluster store but this build has none.
    #[error("store.kind: \"redis-cluster\" needs the Redis Cluster store; enable the `redis-cluster` feature of `tollgate` (or `cluster` of `tollgate-config`)")]
    ClusterNotEnabled,
    /// The file sets TLS options but this build has no TLS for Redis.
    #[error("store: ca_file, client_cert_file and client_key_file need TLS; enable the `redis-tls` feature of `tollgate` (or `tls` of `tollgate-config`)")]
    TlsNotEnabled,
    /// A TLS file named in the configuration could not be read.
    #[error("store.{field}: cannot read {path:?}: {source}")]
    TlsFile {
        /// `ca_file`, `client_cert_file` or `client_key_file`.
        field: &'static str,
        /// The path as written.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened (for Redis: not reachable within the
    /// connect timeout, or a bad URL or prefix).
    #[error("store: could not open the {kind} store: {source}")]
    Store {
        /// The store's kind: `memory`, `redis`, …, or a registered one's name.
        kind: &'static str,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// A route's layers do not make a valid limiter.
    #[error("routes.{route}: {source}")]
    Route {
        /// The route's name.
        route: String,
        /// Why.
        #[source]
        source: tollgate_limiter::BuildError,
    },
}
