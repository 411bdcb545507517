//! The store: one `EVALSHA` per decision, under a deadline.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind,
};
use tollgate_limiter::{
    duration_micros, Clock, LayerRequest, Store, StoreError, StoreKey, Verdicts,
};

use crate::error::{check_plausible, from_redis, name_conflict, RedisStoreError};
use crate::script::{self, layer_args, parse_reply, LAYER_ARGS, SCRIPT};

/// The key prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "tollgate";
/// How long a decision may take, end to end, by default.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);
/// How long establishing a connection may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How the store talks to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionMode {
    /// One multiplexed connection shared by every decision (requests are
    /// pipelined on it), re-established in the background when it drops.
    /// The default: faster than the pool in the benchmark (see
    /// `benches/redis.rs`).
    Multiplexed,
    /// A bb8 pool of `size` connections; each decision holds one for its
    /// call. A connection that fails with an I/O error is discarded.
    Pool {
        /// Connections in the pool (all opened up front by
        /// [`connect`](RedisStoreBuilder::connect)).
        size: u32,
    },
}

/// The Redis standalone store: every layer of a request decided by one Lua
/// script call, atomically; see the [crate docs](crate).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    mode: ConnectionMode,
    prefix: Arc<str>,
    clock: Option<Arc<dyn Clock>>,
    max_skew: Option<Duration>,
    deadline: Duration,
}

#[derive(Clone)]
enum Conn {
    Multiplexed(ConnectionManager),
    Pool(bb8::Pool<PoolManager>),
}

impl fmt::Debug for RedisStore {
    // The URL is left out on purpose: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("mode", &self.mode)
            .field("deadline", &self.deadline)
            .field("clock", &self.clock)
            .field("max_skew", &self.max_skew)
            .finish()
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`].
#[derive(Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    mode: ConnectionMode,
    deadline: Duration,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    max_skew: Option<Duration>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("mode", &self.mode)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("clock", &self.clock)
            .field("max_skew", &self.max_skew)
            .finish_non_exhaustive()
    }
}

impl RedisStoreBuilder {
    /// The text before every key (default `tollgate`): keys are
    /// `<prefix>:{tag}:<policy>:v<version>:<scope>:<subject>`. Tests use a
    /// unique prefix to share one server. 1–64 characters of
    /// `A-Z a-z 0-9 _ - . :`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How to connect (default [`ConnectionMode::Multiplexed`]).
    pub fn connection_mode(mut self, mode: ConnectionMode) -> Self {
        self.mode = mode;
        self
    }

    /// The longest a decision may take, waiting for a connection and a
    /// script reload included (default 50 ms). Past it the decision fails
    /// with [`StoreError::Timeout`]; nothing is queued for later.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The longest establishing a connection may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Decide with this clock's time instead of the Redis server's `TIME`
    /// (the default, which gives every key one clock whatever the app
    /// servers' clocks say). Tests pass a
    /// [`ManualClock`](tollgate_limiter::ManualClock).
    ///
    /// A time before 2020 or after 2100 fails the decision with
    /// [`StoreError::ImplausibleTime`](tollgate_limiter::StoreError::ImplausibleTime); see also
    /// [`max_skew`](RedisStoreBuilder::max_skew).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// With a [`clock`](RedisStoreBuilder::clock): fail a decision whose time
    /// is further than `max_skew` from the server's `TIME` (checked inside
    /// the script) with [`RedisStoreError::ClockSkew`]. Unchecked by default.
    pub fn max_skew(mut self, max_skew: Duration) -> Self {
        self.max_skew = Some(max_skew);
        self
    }

    fn validate(&self) -> Result<Client, StoreError> {
        check_prefix(&self.prefix)?;
        // The parser's message does not repeat the URL (it may hold a password).
        Client::open(self.url.as_str())
            .map_err(|e| RedisStoreError::InvalidUrl(e.to_string()).into())
    }

    fn connection_config(&self) -> AsyncConnectionConfig {
        // No response timeout inside redis-rs: the store's deadline bounds
        // every call, and a timed-out request must not tear the connection
        // down (the other requests pipelined on it are fine).
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None)
            // Reconnection is retried in the background, quickly at first;
            // decisions meanwhile fail at their deadline instead of waiting.
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1))
    }

    fn store(self, conn: Conn) -> RedisStore {
        RedisStore {
            conn,
            mode: self.mode,
            prefix: self.prefix.into(),
            clock: self.clock,
            max_skew: self.max_skew,
            deadline: self.deadline,
        }
    }

    /// Connect now (every pool connection, or the multiplexed one) and load
    /// the script, within the connect timeout. Fails when Redis cannot be
    /// reached; use [`build`](RedisStoreBuilder::build) to start without it.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let client = self.validate()?;
        let timeout = self.connect_timeout;
        let conn = match self.mode {
            ConnectionMode::Multiplexed => {
                let manager = ConnectionManager::new_with_config(client, self.manager_config());
                let manager = within(timeout, manager).await?.map_err(from_redis)?;
                Conn::Multiplexed(manager)
            }
            ConnectionMode::Pool { size } => {
                let pool = self
                    .pool_builder(size)
                    .min_idle(Some(size.max(1)))
                    .build(PoolManager {
                        client,
                        config: self.connection_config(),
                    });
                Conn::Pool(within(timeout, pool).await?.map_err(from_redis)?)
            }
        };
        let store = self.store(conn);
        within(timeout, store.load_script()).await??;
        Ok(store)
    }

    /// Build without connecting: connections open on first use (and the
    /// script loads on the first `NOSCRIPT`). Decisions fail with
    /// [`StoreError::Timeout`] or [`StoreError::Unavailable`] until Redis
    /// answers. Must be called inside a Tokio runtime.
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let client = self.validate()?;
        let conn = match self.mode {
            ConnectionMode::Multiplexed => Conn::Multiplexed(
                ConnectionManager::new_lazy_with_config(client, self.manager_config())
                    .map_err(from_redis)?,
            ),
            ConnectionMode::Pool { size } => {
                Conn::Pool(self.pool_builder(size).build_unchecked(PoolManager {
                    client,
                    config: self.connection_config(),
                }))
            }
        };
        Ok(self.store(conn))
    }

    fn pool_builder(&self, size: u32) -> bb8::Builder<PoolManager> {
        bb8::Pool::builder()
            .max_size(size.max(1))
            // A PING per checkout would double the round trips; broken
            // connections are found by has_broken instead.
            .test_on_check_out(false)
            .connection_timeout(self.deadline)
    }
}

impl RedisStore {
    /// A builder for a store at `url` (`redis://[user:password@]host:port/db`).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate_limiter::StoreError> {
    /// use std::time::Duration;
    /// use tollgate_redis::RedisStore;
    ///
    /// let store = RedisStore::builder("redis://127.0.0.1:6379/")
    ///     .deadline(Duration::from_millis(50))
    ///     .connect()
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_string(),
            mode: ConnectionMode::Multiplexed,
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            clock: None,
            max_skew: None,
        }
    }

    /// The Redis key holding `key`'s state: `<prefix>:<key>`.
    pub fn redis_key(&self, key: &StoreKey<'_>) -> String {
        use std::fmt::Write;
        let mut text = String::with_capacity(self.prefix.len() + 64);
        let _ = write!(text, "{}:{key}", self.prefix);
        text
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The per-decision deadline.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// How the store talks to Redis.
    pub fn connection_mode(&self) -> ConnectionMode {
        self.mode
    }

    /// `SCRIPT LOAD` the script (done by [`connect`](RedisStoreBuilder::connect);
    /// decisions also reload it on `NOSCRIPT`).
    pub async fn load_script(&self) -> Result<(), StoreError> {
        match &self.conn {
            Conn::Multiplexed(manager) => load(&mut manager.clone()).await,
            Conn::Pool(pool) => {
                let mut pooled = self.checkout(pool).await?;
                let result = load(&mut pooled.con).await;
                pooled.check(&result);
                result
            }
        }
        .map_err(from_redis)
    }

    /// The `EVALSHA` command deciding `layers`.
    fn command(&self, layers: &[LayerRequest<'_>]) -> Result<Cmd, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script::sha1()).arg(layers.len());
        for layer in layers {
            cmd.arg(self.redis_key(&layer.key));
        }
        match &self.clock {
            None => {
                cmd.arg("").arg("");
            }
            Some(clock) => {
                let now = clock.now();
                check_plausible(now)?;
                cmd.arg(now.as_micros());
                match self.max_skew {
                    Some(skew) => cmd.arg(duration_micros(skew)),
                    None => cmd.arg(""),
                };
            }
        }
        for layer in layers {
            let args: [u64; LAYER_ARGS] = layer_args(layer)?;
            for a in args {
                cmd.arg(a);
            }
        }
        Ok(cmd)
    }

    async fn checkout<'a>(
        &self,
        pool: &'a bb8::Pool<PoolManager>,
    ) -> Result<bb8::PooledConnection<'a, PoolManager>, StoreError> {
        pool.get().await.map_err(|e| match e {
            bb8::RunError::TimedOut => StoreError::Timeout(self.deadline),
            bb8::RunError::User(e) => from_redis(e),
        })
    }

    async fn evalsha(&self, cmd: &Cmd) -> Result<Vec<i64>, StoreError> {
        match &self.conn {
            Conn::Multiplexed(manager) => evalsha(&mut manager.clone(), cmd).await,
            Conn::Pool(pool) => {
                let mut pooled = self.checkout(pool).await?;
                let result = evalsha(&mut pooled.con, cmd).await;
                pooled.check(&result);
                result
            }
        }
        .map_err(from_redis)
    }
}

/// `EVALSHA`; on `NOSCRIPT` (the server lost the script: restart, failover,
/// `SCRIPT FLUSH`) load it and retry once.
async fn evalsha<C: ConnectionLike + Send>(con: &mut C, cmd: &Cmd) -> RedisResult<Vec<i64>> {
    match cmd.query_async::<Vec<i64>>(con).await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            load(con).await?;
            cmd.query_async(con).await
        }
        other => other,
    }
}

/// `SCRIPT LOAD`, checking the digest the server computed.
async fn load<C: ConnectionLike + Send>(con: &mut C) -> RedisResult<()> {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(con)
        .await?;
    if sha != script::sha1() {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "SCRIPT LOAD answered another digest than the script's SHA-1",
            sha,
        )));
    }
    Ok(())
}

/// A key prefix keeps the key layout and the Cluster hash tag: 1–64
/// characters of `A-Z a-z 0-9 _ - . :` (no braces).
pub(crate) fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
    if prefix.is_empty() || prefix.len() > 64 || !prefix.chars().all(ok) {
        return Err(RedisStoreError::InvalidPrefix(prefix.to_string()).into());
    }
    Ok(())
}

/// Await `f` for at most `limit`.
async fn within<F: std::future::Future>(limit: Duration, f: F) -> Result<F::Output, StoreError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| StoreError::Timeout(limit))
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        let cmd = self.command(layers)?;
        let reply = within(self.deadline, self.evalsha(&cmd))
            .await?
            .map_err(|e| name_conflict(e, |i| layers.get(i).map(|l| l.policy.name())))?;
        parse_reply(&reply, layers.len())
    }
}

/// One pooled connection and whether a call found it broken.
struct PooledConnection {
    con: MultiplexedConnection,
    broken: bool,
}

impl PooledConnection {
    /// Mark the connection broken after an error it cannot recover from
    /// (I/O, a dropped socket), so the pool replaces it. Server errors
    /// leave it usable.
    fn check<T>(&mut self, result: &RedisResult<T>) {
        if let Err(e) = result {
            if e.is_unrecoverable_error() {
                self.broken = true;
            }
        }
    }
}

/// Opens the pool's connections (bb8-redis's manager never reports a
/// broken connection, so a Redis restart would leave the pool full of dead
/// ones; this one drops a connection after an I/O failure).
struct PoolManager {
    client: Client,
    config: AsyncConnectionConfig,
}

impl bb8::ManageConnection for PoolManager {
    type Connection = PooledConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<PooledConnection, RedisError> {
        let con = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(PooledConnection { con, broken: false })
    }

    async fn is_valid(&self, conn: &mut PooledConnection) -> Result<(), RedisError> {
        redis::cmd("PING").query_async::<()>(&mut conn.con).await
    }

    fn has_broken(&self, conn: &mut PooledConnection) -> bool {
        conn.broken
    }
}
