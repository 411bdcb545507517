//! What the standalone and Cluster stores share: their settings (key
//! prefix, deadline, connect timeout, clock and allowed skew), one builder
//! type with their setters, key rendering, the time arguments of a script
//! call, and the deadline.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{duration_micros, Clock, StoreError, StoreKey};

use crate::engine::{Engine, Runner};
use crate::error::{check_plausible, RedisStoreError};
use crate::replication::ReplicaAck;
use crate::script::TimeArgs;

/// The key prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "tollgate";
/// How long a decision may take, end to end, by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);
/// How long establishing a connection may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A builder's settings, before they are checked. Nothing here holds a
/// secret (URLs are kept elsewhere, and never shown).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) deadline: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) max_skew: Option<Duration>,
    pub(crate) engine: Engine,
    pub(crate) replica_ack: Option<ReplicaAck>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::Tls>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: DEFAULT_PREFIX.to_string(),
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            max_skew: None,
            engine: Engine::Auto,
            replica_ack: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl Settings {
    /// The settings a store decides with, once the prefix is checked.
    pub(crate) fn checked(&self) -> Result<CheckedSettings, StoreError> {
        check_prefix(&self.prefix)?;
        for (name, value) in [
            ("deadline", self.deadline),
            ("connect_timeout", self.connect_timeout),
        ] {
            check_wait(name, value)?;
        }
        if let Some(ack) = self.replica_ack {
            ack.check(self.deadline)?;
        }
        if self.max_skew.is_some() && self.clock.is_none() {
            return Err(RedisStoreError::InvalidSetting(
                "max_skew bounds a clock of the store's own against the server's, and no clock \
                 was given: give one with clock(…), or leave max_skew out (the server's TIME \
                 needs no bound)"
                    .into(),
            )
            .into());
        }
        Ok(CheckedSettings {
            replica_ack: self.replica_ack,
            prefix: self.prefix.as_str().into(),
            deadline: self.deadline,
            connect_timeout: self.connect_timeout,
            clock: self.clock.clone(),
            max_skew: self.max_skew,
            runner: Arc::new(Runner::new(self.engine)),
        })
    }
}

/// A Redis store's builder: where the servers are (`T`: a standalone
/// server or Sentinel's primary, [`Standalone`](crate::Standalone); a
/// Cluster's nodes, `ClusterNodes`, with the `cluster` feature), and the
/// settings every Redis store takes, set here once for both kinds.
#[derive(Clone)]
pub struct RedisBuilder<T> {
    pub(crate) place: T,
    pub(crate) settings: Settings,
}

impl<T> RedisBuilder<T> {
    pub(crate) fn new(place: T) -> Self {
        RedisBuilder {
            place,
            settings: Settings::default(),
        }
    }

    /// The text before every key (default `tollgate`): keys are
    /// `<prefix>:{tag}:<policy>:v<version>:<algorithm>:<scope>:<subject>`
    /// (see [`StoreKey`](tollgate_limiter::StoreKey)).
    /// 1–64 characters of `A-Z a-z 0-9 _ - . :` (no braces, so the
    /// `{tag}` alone decides a key's Cluster slot). Tests use a unique
    /// prefix to share one server.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The longest a decision may take, end to end (default 50 ms):
    /// waiting for a connection, every round trip, a script reload,
    /// redirections and retries included. Past it the decision fails
    /// with [`StoreError::Timeout`](tollgate_limiter::StoreError::Timeout);
    /// nothing is queued for later. Above zero and at most a minute, or
    /// the store refuses to build.
    pub fn deadline(mut self, deadline: std::time::Duration) -> Self {
        self.settings.deadline = deadline;
        self
    }

    /// The longest establishing a connection may take (default 1 s):
    /// above zero and at most a minute.
    pub fn connect_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Decide with this clock's time instead of the Redis server's
    /// `TIME` (the default, which gives every key one clock whatever
    /// the app servers' clocks say). Tests pass a
    /// [`ManualClock`](tollgate_limiter::ManualClock).
    ///
    /// A time before 2020 or after 2100 fails the decision with
    /// [`StoreError::ImplausibleTime`](tollgate_limiter::StoreError::ImplausibleTime);
    /// see also `max_skew`.
    pub fn clock(mut self, clock: std::sync::Arc<dyn tollgate_limiter::Clock>) -> Self {
        self.settings.clock = Some(clock);
        self
    }

    /// With a `clock`: fail a decision whose time is further than
    /// `max_skew` from the server's `TIME` (checked inside the script)
    /// with [`RedisStoreError::ClockSkew`](crate::RedisStoreError::ClockSkew).
    /// Unchecked by default.
    pub fn max_skew(mut self, max_skew: std::time::Duration) -> Self {
        self.settings.max_skew = Some(max_skew);
        self
    }

    /// How the server decides (default
    /// [`Engine::Auto`](crate::Engine::Auto): Tollgate's native
    /// module where the server loaded it, else a function library and
    /// `FCALL` on Redis 7.0 and later, else `EVALSHA` of the script).
    /// All of them decide alike, with one protocol; the module costs
    /// Redis the least CPU per call, the library less than the script.
    /// [`Engine::Module`](crate::Engine::Module) insists on the
    /// module, [`Engine::Eval`](crate::Engine::Eval) forces
    /// `EVALSHA` (for example for an ACL user without `FCALL`).
    pub fn engine(mut self, engine: crate::Engine) -> Self {
        self.settings.engine = engine;
        self
    }

    /// After every decision that charged, wait until `replicas`
    /// replicas have acknowledged it (Redis `WAIT`), for at most
    /// `timeout`; off by default. A charge not acknowledged in time
    /// fails the decision with
    /// [`RedisStoreError::NotReplicated`](crate::RedisStoreError::NotReplicated)
    /// (its failure mode decides), so an admitted decision is one whose
    /// charge survives the primary's death. Operators' writes (a reset,
    /// a penalty, a reward, a block) wait the same way and fail with
    /// the same error. `replicas` must be at least
    /// 1 and `timeout` at least 1 ms and shorter than the deadline. It
    /// costs a round trip to the replicas per admitted decision, and
    /// on a multiplexed connection a `WAIT` holds up the calls queued
    /// behind it (a [`ConnectionMode::Pool`](crate::ConnectionMode::Pool)
    /// avoids that, standalone or Sentinel): see
    /// `docs/operations.md`, "Redis in production".
    pub fn replica_ack(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
        self.settings.replica_ack = Some(crate::replication::ReplicaAck { replicas, timeout });
        self
    }

    /// TLS beyond the `rediss://` URL: a CA of its own, a client
    /// certificate (see [`Tls`](crate::Tls)).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: crate::Tls) -> Self {
        self.settings.tls = Some(tls);
        self
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for RedisBuilder<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("place", &self.place)
            .field("settings", &self.settings)
            .finish()
    }
}

/// The settings a Redis store decides with, checked when it was built
/// (its [`settings`](crate::RedisStore::settings)).
#[derive(Debug, Clone)]
pub struct CheckedSettings {
    pub(crate) prefix: Arc<str>,
    pub(crate) deadline: Duration,
    /// What loading the code may take (at connect and on request).
    pub(crate) connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    max_skew: Option<Duration>,
    /// Wait for replicas after a charge (off: `None`).
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// How calls are sent, shared by the store's clones.
    pub(crate) runner: Arc<Runner>,
}

impl CheckedSettings {
    /// The Redis key holding `key`'s state: `<prefix>:<key>`.
    pub fn redis_key(&self, key: &tollgate_limiter::StoreKey<'_>) -> String {
        self.key_arg(key).to_string()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether calls go to the function library (`FCALL`) rather than
    /// the script (`EVALSHA`): true unless the store was built with
    /// [`Engine::Eval`](crate::Engine::Eval) or found that its
    /// server has no functions.
    pub fn uses_functions(&self) -> bool {
        self.runner.call_command() == crate::engine::CallCommand::Fcall
    }

    /// Whether calls go to Tollgate's module (`TOLLGATE.DECIDE`): true
    /// when the server has loaded it (and it speaks this store's
    /// protocol) and the store was built with
    /// [`Engine::Auto`](crate::Engine::Auto) or
    /// [`Engine::Module`](crate::Engine::Module).
    pub fn uses_module(&self) -> bool {
        self.runner.call_command() == crate::engine::CallCommand::Module
    }

    /// The per-decision deadline.
    pub fn deadline(&self) -> std::time::Duration {
        self.deadline
    }

    /// The same key as a command argument, written into the command's
    /// buffer without a `String` of its own.
    pub(crate) fn key_arg<'a>(&'a self, key: &'a StoreKey<'a>) -> KeyArg<'a> {
        KeyArg {
            prefix: &self.prefix,
            key,
        }
    }

    /// The time arguments of every call of one decision: the caller's
    /// time (read once, so every call of a decision is judged at the same
    /// instant) and the allowed skew, or empty for the server's `TIME`.
    pub(crate) fn time_args(&self) -> Result<TimeArgs, StoreError> {
        match &self.clock {
            None => Ok(TimeArgs::default()),
            Some(clock) => {
                let now = clock.now();
                check_plausible(now)?;
                Ok(TimeArgs {
                    now: Some(now.as_micros()),
                    max_skew: self.max_skew.map(duration_micros),
                })
            }
        }
    }
}

/// The longest `deadline` and `connect_timeout`: a wait past it is a
/// mistake (a store that answers nothing for a minute is down), and time
/// arithmetic on it stays far from overflowing.
pub(crate) const MAX_DEADLINE: Duration = Duration::from_secs(60);

/// `value` as a `deadline` or `connect_timeout` (`name`): above zero (a
/// zero wait fails every call) and at most [`MAX_DEADLINE`].
fn check_wait(name: &str, value: Duration) -> Result<(), RedisStoreError> {
    if value.is_zero() || value > MAX_DEADLINE {
        return Err(RedisStoreError::InvalidSetting(format!(
            "{name} {value:?} must be above zero and at most {MAX_DEADLINE:?}"
        )));
    }
    Ok(())
}

/// Whether `prefix` can start a store's keys: 1–64 characters of
/// `A-Z a-z 0-9 _ - . :` (no braces, so the key layout and the Cluster
/// hash tag stay intact). The builders check it at connect; the
/// configuration file checks it with this same rule.
///
/// ```
/// assert!(tollgate_redis::check_prefix("limits:eu").is_ok());
/// assert!(tollgate_redis::check_prefix("{oops}").is_err());
/// ```
pub fn check_prefix(prefix: &str) -> Result<(), RedisStoreError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if prefix.is_empty() || prefix.len() > 64 || !prefix.chars().all(ok) {
        return Err(RedisStoreError::InvalidPrefix(prefix.to_string()));
    }
    Ok(())
}

/// Await `f` for at most `limit`.
pub(crate) async fn within<F: std::future::Future>(
    limit: Duration,
    f: F,
) -> Result<F::Output, StoreError> {
    in_time(tokio::time::timeout(limit, f).await, limit)
}

/// What a call given `limit` (`tokio::time::timeout`) answered, or the
/// timeout it ran into.
pub(crate) fn in_time<T>(
    answer: Result<T, tokio::time::error::Elapsed>,
    limit: Duration,
) -> Result<T, StoreError> {
    answer.map_err(|_| StoreError::Timeout(limit))
}

/// A rendered Redis key, `<prefix>:<key>`, as a command argument.
pub(crate) struct KeyArg<'a> {
    prefix: &'a str,
    key: &'a StoreKey<'a>,
}

impl std::fmt::Display for KeyArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.prefix, self.key)
    }
}

impl redis::ToRedisArgs for KeyArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}
