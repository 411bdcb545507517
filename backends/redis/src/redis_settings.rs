//! A Redis store as a configuration file writes it (feature `serde`): read
//! by any serde format, checked, and opened, so a configuration layer needs
//! no knowledge of the Redis stores' options. One value serves the three
//! kinds; each refuses the others' fields.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tollgate_limiter::{DurationSpec, Store, StoreError};

use crate::settings::RedisBuilder;
use crate::settings::MAX_DEADLINE;
use crate::{check_prefix, ConnectionMode, Engine, RedisStore};

/// How long `replica_ack` waits when the file does not say.
const DEFAULT_REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(20);

/// Which Redis store: `kind = "redis"`, `"redis-sentinel"` or
/// `"redis-cluster"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub enum RedisKind {
    /// `"redis"`: one server, by its `url`.
    #[serde(rename = "redis")]
    Standalone,
    /// `"redis-sentinel"`: the primary of a `service`, found through
    /// `sentinels` and followed across failovers.
    #[serde(rename = "redis-sentinel")]
    Sentinel,
    /// `"redis-cluster"`: a Redis Cluster, from some of its `nodes`.
    #[serde(rename = "redis-cluster")]
    Cluster,
}

impl RedisKind {
    /// The name a file gives each kind.
    pub const NAMES: [&'static str; 3] = ["redis", "redis-sentinel", "redis-cluster"];

    /// `redis`, `redis-sentinel` or `redis-cluster`.
    pub fn name(self) -> &'static str {
        match self {
            RedisKind::Standalone => Self::NAMES[0],
            RedisKind::Sentinel => Self::NAMES[1],
            RedisKind::Cluster => Self::NAMES[2],
        }
    }
}

/// Every Redis store's settings: where the servers are (by `kind`), and
/// what every Redis store takes. Unknown fields are refused; fields of
/// another kind are reported by [`problems`](Self::problems).
///
/// ```
/// use tollgate_redis::{RedisKind, RedisSettings};
/// let settings: RedisSettings = serde_json::from_str(
///     r#"{ "kind": "redis", "url": "redis://127.0.0.1:6379/", "deadline": "80ms" }"#,
/// )?;
/// assert_eq!(settings.kind, RedisKind::Standalone);
/// assert!(settings.problems().is_empty());
/// // The same fields for a Cluster: the URL is not one of its own.
/// let cluster: RedisSettings =
///     serde_json::from_str(r#"{ "kind": "redis-cluster", "url": "redis://a/" }"#)?;
/// let fields: Vec<String> = cluster.problems().into_iter().map(|(f, _)| f).collect();
/// assert_eq!(fields, ["url", "nodes"]);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RedisSettings {
    /// Which store.
    pub kind: RedisKind,
    /// `redis`: `redis://[user:password@]host:port/db`, `rediss://` for
    /// TLS, or `unix://` (never shown: it may hold a password).
    pub url: Option<String>,
    /// `redis`, `redis-sentinel`: a pool of this many connections (1–1024)
    /// instead of one multiplexed connection.
    pub pool_size: Option<u32>,
    /// `redis-sentinel`: the sentinels, `redis://[:password@]host:port`
    /// each (`rediss://` reaches them and the primary with TLS).
    pub sentinels: Option<Vec<String>>,
    /// `redis-sentinel`: the service (master) name the sentinels monitor.
    pub service: Option<String>,
    /// `redis-cluster`: some of the cluster's nodes, `redis://host:port`
    /// (or `rediss://`); the others are discovered.
    pub nodes: Option<Vec<String>>,
    /// `redis-sentinel`: the primary's user (default: the default user).
    pub username: Option<String>,
    /// `redis-sentinel`: the primary's password (never shown).
    pub password: Option<String>,
    /// `redis-sentinel`: the primary's database (default 0).
    pub db: Option<i64>,
    /// Text before every key (default `tollgate`).
    pub prefix: Option<String>,
    /// Longest a decision may take, for example `"50ms"` (the default).
    pub deadline: Option<DurationSpec>,
    /// Longest connecting may take (default `"1s"`).
    pub connect_timeout: Option<DurationSpec>,
    /// Start without Redis and connect on first use (default `false`: the
    /// store is not opened when Redis cannot be reached). Not for a
    /// Cluster, which learns its slots when it connects.
    #[serde(default)]
    pub lazy: bool,
    /// A PEM file with the CA to trust for TLS instead of the system's.
    pub ca_file: Option<String>,
    /// A PEM file with the client certificate for mutual TLS (with
    /// `client_key_file`).
    pub client_cert_file: Option<String>,
    /// A PEM file with the client certificate's private key.
    pub client_key_file: Option<String>,
    /// Wait for this many replicas to acknowledge every charge (with
    /// `replica_ack_timeout`, default `"20ms"`).
    pub replica_ack: Option<u32>,
    /// How long to wait for them.
    pub replica_ack_timeout: Option<DurationSpec>,
    /// How the server decides (default `"auto"`; see [`Engine`]).
    // `scripting` was its name before 0.1's engine rename.
    #[serde(alias = "scripting")]
    pub engine: Option<Engine>,
}

impl fmt::Debug for RedisSettings {
    // Addresses may hold passwords, and the password is secret: neither
    // is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("kind", &self.kind)
            .field("sentinels", &self.sentinels.as_ref().map(Vec::len))
            .field("nodes", &self.nodes.as_ref().map(Vec::len))
            .field("service", &self.service)
            .field("username", &self.username)
            .field("db", &self.db)
            .field("pool_size", &self.pool_size)
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("lazy", &self.lazy)
            .field("replica_ack", &self.replica_ack)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

/// Why [`RedisSettings::open`] opened no store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisSettingsError {
    /// The settings have a problem ([`RedisSettings::problems`] lists them all).
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// What to fix.
        reason: String,
    },
    /// `kind = "redis-cluster"` but this build has no Cluster store.
    #[error("kind: \"redis-cluster\" needs the Redis Cluster store; enable the `cluster` feature of `tollgate-redis`")]
    ClusterNotEnabled,
    /// TLS files are named but this build has no TLS for Redis.
    #[error("ca_file, client_cert_file and client_key_file need TLS; enable the `tls` feature of `tollgate-redis`")]
    TlsNotEnabled,
    /// A TLS file could not be read.
    #[error("{field}: cannot read {path:?}: {source}")]
    TlsFile {
        /// `ca_file`, `client_cert_file` or `client_key_file`.
        field: &'static str,
        /// The path as written.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The store could not be opened (Redis not reachable within the
    /// connect timeout, a bad URL, …).
    #[error("could not open the store: {0}")]
    Open(#[source] StoreError),
}

impl RedisSettings {
    /// What is wrong with these settings, each as its field (`sentinels[1]`
    /// for an element) and what to fix; none: they can be opened.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Problems::default();
        self.shared_problems(&mut problems);
        match self.kind {
            RedisKind::Standalone => self.standalone_problems(&mut problems),
            RedisKind::Sentinel => self.sentinel_problems(&mut problems),
            RedisKind::Cluster => self.cluster_problems(&mut problems),
        }
        problems.0
    }

    /// Open the store these settings name: connected now (the Cluster
    /// store always; the others unless `lazy`), TLS files read.
    pub async fn open(&self) -> Result<Arc<dyn Store>, RedisSettingsError> {
        if let Some((field, reason)) = self.problems().into_iter().next() {
            return Err(RedisSettingsError::Invalid { field, reason });
        }
        match self.kind {
            RedisKind::Standalone => {
                let url = self.url.clone().unwrap_or_default();
                self.open_standalone(RedisStore::builder(url)).await
            }
            RedisKind::Sentinel => {
                let sentinels = self.sentinels.clone().unwrap_or_default();
                let service = self.service.clone().unwrap_or_default();
                let mut builder = RedisStore::sentinel(sentinels, service);
                builder = builder.primary_db(self.db.unwrap_or(0));
                if let Some(password) = &self.password {
                    builder = builder.primary_auth(self.username.as_deref(), password);
                }
                self.open_standalone(builder).await
            }
            RedisKind::Cluster => self.open_cluster().await,
        }
    }

    /// A standalone or Sentinel store from `builder`, with a pool when
    /// asked for.
    async fn open_standalone(
        &self,
        builder: crate::RedisStoreBuilder,
    ) -> Result<Arc<dyn Store>, RedisSettingsError> {
        let mut builder = self.apply(builder)?;
        if let Some(size) = self.pool_size {
            builder = builder.connection_mode(ConnectionMode::Pool { size });
        }
        let store = if self.lazy {
            builder.build()
        } else {
            builder.connect().await
        };
        Ok(Arc::new(store.map_err(RedisSettingsError::Open)?))
    }

    #[cfg(feature = "cluster")]
    async fn open_cluster(&self) -> Result<Arc<dyn Store>, RedisSettingsError> {
        let nodes = self.nodes.clone().unwrap_or_default();
        let builder = self.apply(crate::RedisClusterStore::builder(nodes))?;
        let store = builder.connect().await.map_err(RedisSettingsError::Open)?;
        Ok(Arc::new(store))
    }

    #[cfg(not(feature = "cluster"))]
    async fn open_cluster(&self) -> Result<Arc<dyn Store>, RedisSettingsError> {
        Err(RedisSettingsError::ClusterNotEnabled)
    }

    /// `builder` (a standalone or a Cluster store's) with the settings
    /// every Redis store takes, TLS files read.
    pub fn apply<T>(
        &self,
        builder: RedisBuilder<T>,
    ) -> Result<RedisBuilder<T>, RedisSettingsError> {
        let mut builder = builder;
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(d) = self.deadline {
            builder = builder.deadline(d.0);
        }
        if let Some(d) = self.connect_timeout {
            builder = builder.connect_timeout(d.0);
        }
        if let Some(engine) = self.engine {
            builder = builder.engine(engine);
        }
        if let Some(replicas) = self.replica_ack {
            let timeout = self
                .replica_ack_timeout
                .map_or(DEFAULT_REPLICA_ACK_TIMEOUT, |d| d.0);
            builder = builder.replica_ack(replicas, timeout);
        }
        self.with_tls(builder)
    }

    #[cfg(feature = "tls")]
    fn with_tls<T>(&self, builder: RedisBuilder<T>) -> Result<RedisBuilder<T>, RedisSettingsError> {
        let read = |field: &'static str, path: &Option<String>| {
            let read_one = |p: &String| {
                std::fs::read(p).map_err(|source| RedisSettingsError::TlsFile {
                    field,
                    path: p.clone(),
                    source,
                })
            };
            path.as_ref().map(read_one).transpose()
        };
        let ca = read("ca_file", &self.ca_file)?;
        let cert = read("client_cert_file", &self.client_cert_file)?;
        let key = read("client_key_file", &self.client_key_file)?;
        if ca.is_none() && cert.is_none() {
            return Ok(builder);
        }
        let mut tls = crate::Tls::new();
        if let Some(ca) = ca {
            tls = tls.ca_pem(ca);
        }
        if let (Some(cert), Some(key)) = (cert, key) {
            tls = tls.client_pem(cert, key);
        }
        Ok(builder.tls(tls))
    }

    /// Without TLS in the build, settings that ask for it are refused.
    #[cfg(not(feature = "tls"))]
    fn with_tls<T>(&self, builder: RedisBuilder<T>) -> Result<RedisBuilder<T>, RedisSettingsError> {
        if self.ca_file.is_some() || self.client_cert_file.is_some() {
            return Err(RedisSettingsError::TlsNotEnabled);
        }
        Ok(builder)
    }

    /// The settings every kind takes.
    fn shared_problems(&self, problems: &mut Problems) {
        if let Some(prefix) = &self.prefix {
            if let Err(e) = check_prefix(prefix) {
                problems.add("prefix", e.to_string());
            }
        }
        problems.duration("deadline", self.deadline);
        problems.duration("connect_timeout", self.connect_timeout);
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            problems.add(
                "client_cert_file",
                "client_cert_file and client_key_file go together (mutual TLS needs both)",
            );
        }
        if self.replica_ack == Some(0) {
            problems.add(
                "replica_ack",
                "must be at least 1 (leave it out to not wait for replicas)",
            );
        }
        if self.replica_ack_timeout.is_some() && self.replica_ack.is_none() {
            problems.add(
                "replica_ack_timeout",
                "needs replica_ack (how many replicas to wait for)",
            );
        }
        if self.kind != RedisKind::Cluster && self.nodes.is_some() {
            problems.add("nodes", "is for kind = \"redis-cluster\"");
        }
    }

    /// `kind = "redis"`: one server's URL.
    fn standalone_problems(&self, problems: &mut Problems) {
        let for_sentinel = "is for kind = \"redis-sentinel\"";
        problems.refuse("sentinels", self.sentinels.is_some(), for_sentinel);
        problems.refuse("service", self.service.is_some(), for_sentinel);
        let in_url = "is for kind = \"redis-sentinel\"; with kind = \"redis\" put it in the url";
        problems.refuse("username", self.username.is_some(), in_url);
        problems.refuse("password", self.password.is_some(), in_url);
        problems.refuse("db", self.db.is_some(), in_url);
        match &self.url {
            None => problems.add("url", "missing; write url = \"redis://127.0.0.1:6379/\""),
            Some(url) => {
                let schemes = ["redis://", "rediss://", "unix://", "redis+unix://"];
                if !schemes.iter().any(|s| url.starts_with(s)) {
                    problems.add(
                        "url",
                        "must start with redis://, rediss:// or unix:// (for example \"redis://127.0.0.1:6379/\")",
                    );
                }
            }
        }
        problems.pool_size(self.pool_size);
    }

    /// `kind = "redis-sentinel"`: the sentinels and the service they monitor.
    fn sentinel_problems(&self, problems: &mut Problems) {
        problems.refuse(
            "url",
            self.url.is_some(),
            "is for kind = \"redis\"; a Sentinel store takes sentinels and service",
        );
        problems.pool_size(self.pool_size);
        let example = "sentinels = [\"redis://10.0.0.1:26379\", ...]";
        problems.addresses("sentinels", self.sentinels.as_deref(), example);
        if self.service.as_deref().unwrap_or_default().is_empty() {
            problems.add(
                "service",
                "missing; write the name the sentinels monitor (service = \"mymaster\")",
            );
        }
        problems.refuse(
            "username",
            self.username.is_some() && self.password.is_none(),
            "needs a password: the store logs in to the primary as username with password \
             (write password = \"…\", or leave username out to log in as the default user)",
        );
    }

    /// `kind = "redis-cluster"`: some of the cluster's nodes.
    fn cluster_problems(&self, problems: &mut Problems) {
        let for_other = "is not for kind = \"redis-cluster\" (give the cluster's nodes)";
        for (field, present) in [
            ("url", self.url.is_some()),
            ("pool_size", self.pool_size.is_some()),
            ("sentinels", self.sentinels.is_some()),
            ("service", self.service.is_some()),
            ("username", self.username.is_some()),
            ("password", self.password.is_some()),
            ("db", self.db.is_some()),
        ] {
            problems.refuse(field, present, for_other);
        }
        problems.refuse(
            "lazy",
            self.lazy,
            "a Cluster store connects at startup (it discovers the cluster's slots then)",
        );
        let example = "nodes = [\"redis://10.0.0.1:6379\", ...]";
        problems.addresses("nodes", self.nodes.as_deref(), example);
    }
}

/// The problems found so far, each a field and what to fix.
#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn add(&mut self, field: &str, reason: impl Into<String>) {
        self.0.push((field.to_string(), reason.into()));
    }

    /// A problem at `field` saying `why`, when the field is `present`.
    fn refuse(&mut self, field: &str, present: bool, why: &str) {
        if present {
            self.add(field, why);
        }
    }

    /// A duration, when given, is above zero and at most [`MAX_DEADLINE`].
    fn duration(&mut self, field: &str, value: Option<DurationSpec>) {
        if let Some(reason) = value.and_then(|d| d.problem(MAX_DEADLINE)) {
            self.add(field, reason);
        }
    }

    /// `pool_size`, when given, is 1–1024 connections.
    fn pool_size(&mut self, pool_size: Option<u32>) {
        if let Some(n) = pool_size.filter(|n| !(1..=1024).contains(n)) {
            self.add("pool_size", format!("{n} must be between 1 and 1024"));
        }
    }

    /// A list of at least one `redis://` or `rediss://` address
    /// (`example` shows one).
    fn addresses(&mut self, field: &str, urls: Option<&[String]>, example: &str) {
        let urls = urls.unwrap_or_default();
        if urls.is_empty() {
            self.add(field, format!("missing or empty; write {example}"));
        }
        for (i, url) in urls.iter().enumerate() {
            if !["redis://", "rediss://"].iter().any(|s| url.starts_with(s)) {
                self.add(
                    &format!("{field}[{i}]"),
                    "must start with redis:// or rediss://",
                );
            }
        }
    }
}
