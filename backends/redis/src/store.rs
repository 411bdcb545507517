//! The store: one call per decision (`TOLLGATE.DECIDE` where the server
//! loaded Tollgate's module, else `FCALL`, else `EVALSHA`), under a
//! deadline.

use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use std::sync::Arc;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Client, Cmd, RedisError, RedisResult};
use tollgate_limiter::{
    check_holds, Adjustment, Decide, Hold, Holds, LayerRequest, Limit, Store, StoreError, Verdicts,
};
use tollgate_redis_protocol::{
    parse_renewed, parse_reserve, Charged, REPLY_FIELDS, RESERVE_FIELDS,
};

use crate::client::{self, connect_error};
use crate::conflicts;
use crate::connect_failures::{self, ConnectFailures};
use crate::engine::CallCommand;
use crate::error::{from_redis, name_conflict, RedisStoreError};
use crate::managed::Managed;
use crate::permissions::{first_refusal, load_and_probe, probe_commands};
use crate::script::{layer_args, parse_reply, with_block, Mode, ScriptCall, TimeArgs};
use crate::sentinel::{Sentinel, SentinelTarget};
use crate::settings::{in_time, within, CheckedSettings, RedisBuilder};

/// How the store talks to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionMode {
    /// One multiplexed connection shared by every decision (requests are
    /// pipelined on it), re-established in the background when it drops.
    /// The default: faster than the pool in the benchmark (see
    /// `docs/benchmarks.md`).
    Multiplexed,
    /// A bb8 pool of `size` connections; each decision holds one for its
    /// call (and its `WAIT`, with `replica_ack`: other decisions do not
    /// queue behind it). A connection that fails with an I/O error, or
    /// finds its server demoted (`READONLY`), is discarded. On a Sentinel
    /// store each new connection goes to the primary the sentinels name
    /// then.
    Pool {
        /// Connections in the pool (all opened up front by
        /// [`connect`](RedisStoreBuilder::connect)).
        size: u32,
    },
}

/// The Redis standalone store: every layer of a request decided in one
/// call (the native module, or the Lua code), atomically; see the
/// [crate docs](crate).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    mode: ConnectionMode,
    checked: CheckedSettings,
}

#[derive(Clone)]
enum Conn {
    Multiplexed(Arc<Managed>),
    Pool(bb8::Pool<PoolManager>, ConnectFailures),
    Sentinel(Arc<Sentinel>),
}

/// Where the store's server is.
#[derive(Clone)]
enum Target {
    Url(String),
    Sentinel(SentinelTarget),
}

impl fmt::Debug for RedisStore {
    // The URL is left out on purpose: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("mode", &self.mode)
            .field("checked", &self.checked)
            .finish()
    }
}

/// Where a standalone store's server is (a URL, or Sentinel's primary)
/// and how the store connects: what [`RedisStoreBuilder`] holds besides
/// the settings every Redis store takes.
#[derive(Clone)]
pub struct Standalone {
    target: Target,
    mode: ConnectionMode,
    /// A Sentinel-only setter called on a URL store, reported at build.
    misused: Option<&'static str>,
}

impl fmt::Debug for Standalone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL is left out on purpose: it may hold a password.
        f.debug_struct("Standalone")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisStore`]; see [`RedisStore::builder`], and
/// [`RedisBuilder`] for the settings every Redis store takes.
pub type RedisStoreBuilder = RedisBuilder<Standalone>;

/// What a checked builder connects through (built once, at connect: the
/// size difference does not matter).
#[allow(clippy::large_enum_variant)]
enum Source {
    Client(Client),
    Sentinel(Arc<Sentinel>),
}

impl RedisStoreBuilder {
    /// How to connect (default [`ConnectionMode::Multiplexed`]).
    pub fn connection_mode(mut self, mode: ConnectionMode) -> Self {
        self.place.mode = mode;
        self
    }

    /// Log in to the Sentinel-managed primary as `username` (`None`: the
    /// default user) with `password`; a store built with
    /// [`RedisStore::sentinel`] only (a URL carries its own credentials).
    pub fn primary_auth(mut self, username: Option<&str>, password: &str) -> Self {
        match &mut self.place.target {
            Target::Sentinel(target) => {
                target.username = username.map(str::to_string);
                target.password = Some(password.to_string());
            }
            Target::Url(_) => self.place.misused = Some("primary_auth"),
        }
        self
    }

    /// Use database `db` on the Sentinel-managed primary (default 0); a
    /// store built with [`RedisStore::sentinel`] only (a URL carries its
    /// own database).
    pub fn primary_db(mut self, db: i64) -> Self {
        match &mut self.place.target {
            Target::Sentinel(target) => target.db = db,
            Target::Url(_) => self.place.misused = Some("primary_db"),
        }
        self
    }

    fn validate(&self) -> Result<(Source, CheckedSettings), StoreError> {
        if let Some(setter) = self.place.misused {
            return Err(RedisStoreError::InvalidSetting(format!(
                "{setter} is for stores built with RedisStore::sentinel; put the credentials and database in the URL"
            ))
            .into());
        }
        let checked = self.settings.checked()?;
        let source = match &self.place.target {
            Target::Url(url) => Source::Client(client::open(url, &self.settings)?),
            Target::Sentinel(target) => Source::Sentinel(Arc::new(Sentinel::new(
                target,
                &self.settings,
                self.connection_config(),
            )?)),
        };
        Ok((source, checked))
    }

    fn connection_config(&self) -> AsyncConnectionConfig {
        // No response timeout inside redis-rs: the store's deadline bounds
        // every call, and a timed-out request must not tear the connection
        // down (the other requests pipelined on it are fine).
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(None)
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(None)
            // Reconnection is retried in the background, quickly at first;
            // decisions meanwhile fail at their deadline instead of waiting.
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1))
    }

    /// Connect now (every pool connection, or the multiplexed one) and load
    /// the code (the function library, or the script; see
    /// [`engine`](RedisStoreBuilder::engine)), within the connect
    /// timeout. Fails when Redis cannot be
    /// reached; use [`build`](RedisStoreBuilder::build) to start without it.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let (source, checked) = self.validate()?;
        let timeout = self.settings.connect_timeout;
        let conn = match (source, self.place.mode) {
            (Source::Sentinel(sentinel), ConnectionMode::Multiplexed) => {
                within(timeout, sentinel.connection()).await??;
                Conn::Sentinel(sentinel)
            }
            (source, ConnectionMode::Pool { size }) => {
                let failures = ConnectFailures::new();
                let pool = self
                    .pool_builder(size, &failures)
                    .min_idle(Some(size.max(1)))
                    .build(PoolManager {
                        source,
                        config: self.connection_config(),
                    });
                Conn::Pool(
                    within(timeout, pool).await?.map_err(connect_error)?,
                    failures,
                )
            }
            (Source::Client(client), ConnectionMode::Multiplexed) => {
                let config = self.manager_config();
                let manager = ConnectionManager::new_with_config(client.clone(), config.clone());
                match within(timeout, manager).await {
                    Ok(manager) => {
                        let manager = manager.map_err(connect_error)?;
                        Conn::Multiplexed(Arc::new(Managed::new(client, config, manager)))
                    }
                    // The manager retries until the timeout, which hides
                    // why: one plain attempt names it (a certificate that
                    // does not verify, a refused login, …).
                    Err(timed_out) => {
                        let config = self.connection_config();
                        let attempt = client.get_multiplexed_async_connection_with_config(&config);
                        return Err(match within(timeout, attempt).await {
                            Ok(Err(e)) => connect_error(e),
                            _ => timed_out,
                        });
                    }
                }
            }
        };
        let store = RedisStore {
            conn,
            mode: self.place.mode,
            checked,
        };
        let preloaded = store.checked.runner.preloaded();
        let (load, probe) = (store.load_code(), store.check_permissions());
        load_and_probe(preloaded, timeout, load, probe).await?;
        Ok(store)
    }

    /// Build without connecting: connections open on first use (and the
    /// code loads at the first call that finds it missing). Decisions fail with
    /// [`StoreError::Timeout`] or [`StoreError::Unavailable`] until Redis
    /// answers. Must be called inside a Tokio runtime.
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let (source, checked) = self.validate()?;
        let conn = match (source, self.place.mode) {
            (Source::Sentinel(sentinel), ConnectionMode::Multiplexed) => Conn::Sentinel(sentinel),
            (Source::Client(client), ConnectionMode::Multiplexed) => {
                let config = self.manager_config();
                let manager =
                    ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                        .map_err(from_redis)?;
                Conn::Multiplexed(Arc::new(Managed::new(client, config, manager)))
            }
            (source, ConnectionMode::Pool { size }) => {
                let failures = ConnectFailures::new();
                let pool = self
                    .pool_builder(size, &failures)
                    .build_unchecked(PoolManager {
                        source,
                        config: self.connection_config(),
                    });
                Conn::Pool(pool, failures)
            }
        };
        Ok(RedisStore {
            conn,
            mode: self.place.mode,
            checked,
        })
    }

    fn pool_builder(&self, size: u32, failures: &ConnectFailures) -> bb8::Builder<PoolManager> {
        bb8::Pool::builder()
            .error_sink(failures.sink())
            .max_size(size.max(1))
            // A PING per checkout would double the round trips; broken
            // connections are found by has_broken instead.
            .test_on_check_out(false)
            .connection_timeout(self.settings.deadline)
            // A failed connect is reported at once, as itself: retried
            // until the timeout, a wrong CA or password would read as "the
            // store did not answer in time". The breaker and the next
            // decision retry. (Waiting decisions hear of it through the
            // error sink: `checkout`.)
            .retry_connection(false)
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
        RedisBuilder::new(Standalone {
            target: Target::Url(url.into()),
            mode: ConnectionMode::Multiplexed,
            misused: None,
        })
    }

    /// A builder for a store on the primary of `service`, found through
    /// Redis Sentinel at `sentinels` (`redis://[:password@]host:port`, or
    /// `rediss://` with the `tls` feature, which then reaches the primary
    /// over TLS too). The store follows failovers: a call that finds the
    /// primary gone or demoted drops its connection, and the next
    /// decision asks the sentinels again (see `docs/operations.md`,
    /// "Redis in production"). The primary's own credentials and
    /// database: [`primary_auth`](RedisStoreBuilder::primary_auth),
    /// [`primary_db`](RedisStoreBuilder::primary_db).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate_limiter::StoreError> {
    /// use tollgate_redis::RedisStore;
    ///
    /// let store = RedisStore::sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "limits",
    /// )
    /// .primary_auth(Some("tollgate"), "secret")
    /// .connect()
    /// .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn sentinel<I, S>(sentinels: I, service: impl Into<String>) -> RedisStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBuilder::new(Standalone {
            target: Target::Sentinel(SentinelTarget {
                sentinels: sentinels.into_iter().map(Into::into).collect(),
                service: service.into(),
                username: None,
                password: None,
                db: 0,
            }),
            mode: ConnectionMode::Multiplexed,
            misused: None,
        })
    }

    /// The settings the store decides with: its key prefix, the
    /// Redis key of a layer, its deadline, the engine it found.
    pub fn settings(&self) -> &CheckedSettings {
        &self.checked
    }

    /// How the store talks to Redis.
    pub fn connection_mode(&self) -> ConnectionMode {
        self.mode
    }

    /// Find the fastest way the server offers and load the code: the
    /// module when it answers `TOLLGATE.PROTOCOL` (an `Auto` or `Module`
    /// store), else `FUNCTION LOAD REPLACE` of the function library, else
    /// `SCRIPT LOAD` of the script (done by
    /// [`connect`](RedisStoreBuilder::connect); a decision that finds the
    /// code missing also loads it and is sent again, up to three times in
    /// a row).
    /// Fails with [`StoreError::Timeout`] past the connect timeout.
    pub async fn load_script(&self) -> Result<(), StoreError> {
        within(self.checked.connect_timeout, self.load_code()).await?
    }

    /// [`load_script`](Self::load_script) without its time bound (the
    /// caller bounds it).
    async fn load_code(&self) -> Result<(), StoreError> {
        let runner = &self.checked.runner;
        match &self.conn {
            Conn::Multiplexed(managed) => {
                let (generation, mut con) = managed.connection();
                let result = runner.load(&mut con).await.map(|_| ());
                if let Err(e) = &result {
                    managed.check(generation, e);
                }
                result
            }
            Conn::Pool(pool, failures) => {
                let mut pooled = self.checkout(pool, failures).await?;
                let result = runner.load(&mut pooled.con).await.map(|_| ());
                pooled.check(&result);
                result
            }
            Conn::Sentinel(sentinel) => {
                let (generation, mut con) = sentinel.connection().await?;
                let result = runner.load(&mut con).await.map(|_| ());
                if let Err(e) = &result {
                    sentinel.check(generation, e);
                }
                result
            }
        }
        .map_err(connect_error)
    }

    /// Try every command the store sends (see `permissions`): a Redis user
    /// without one fails here, with the command named.
    async fn check_permissions(&self) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for cmd in probe_commands(&self.checked, self.checked.runner.call_command()) {
            pipe.add_command(cmd);
        }
        let answers: RedisResult<Vec<RedisResult<redis::Value>>> = match &self.conn {
            Conn::Multiplexed(managed) => pipe.query_async(&mut managed.connection().1).await,
            Conn::Pool(pool, failures) => {
                let mut pooled = self.checkout(pool, failures).await?;
                pipe.query_async(&mut pooled.con).await
            }
            Conn::Sentinel(sentinel) => {
                let (_, mut con) = sentinel.connection().await?;
                pipe.query_async(&mut con).await
            }
        };
        first_refusal(&answers.map_err(connect_error)?)
    }

    /// The command deciding `layers`, sent as `style`: keys and numbers
    /// are written straight into its buffer.
    fn command(
        &self,
        style: CallCommand,
        layers: &[LayerRequest<'_>],
        time: &TimeArgs,
        (mode, block): (Mode, Option<u64>),
        holds: &[Hold],
    ) -> Result<Cmd, StoreError> {
        let keys = layers.iter().map(|l| self.checked.key_arg(&l.key));
        let mut call = ScriptCall::new(style, keys, time);
        let now = time.spans_at();
        for (i, layer) in layers.iter().enumerate() {
            call = call.layer(&with_block(layer_args(layer, now)?, block));
            // A release or renewal names each layer's hold after its
            // arguments (`at`, and a mark of 0).
            if let Some(hold) = holds.get(i) {
                call = call.layer(&[hold.at, 0]);
            }
        }
        Ok(call.mode(mode))
    }

    /// A connection of the pool, or why none came: when the pool holds
    /// no connection at all, its connect error as it happens (bb8 tells
    /// only its error sink: a waiter would wait out the deadline and
    /// report a timeout), else a timeout. A pool that still holds
    /// connections is waited on: one of them comes back.
    async fn checkout<'a>(
        &self,
        pool: &'a bb8::Pool<PoolManager>,
        failures: &ConnectFailures,
    ) -> Result<bb8::PooledConnection<'a, PoolManager>, StoreError> {
        let mut got = std::pin::pin!(pool.get());
        // Watched only once the pool made this checkout wait.
        let mut failed = None;
        std::future::poll_fn(|cx| loop {
            if let Poll::Ready(got) = got.as_mut().poll(cx) {
                return Poll::Ready(got.map_err(|e| match e {
                    bb8::RunError::TimedOut => StoreError::Timeout(self.checked.deadline),
                    bb8::RunError::User(e) => from_redis(e),
                }));
            }
            let watch = failed
                .get_or_insert_with(|| Box::pin(connect_failures::next_failure(failures.watch())));
            match watch.as_mut().poll(cx) {
                Poll::Ready(e) if pool.state().connections == 0 => return Poll::Ready(Err(e)),
                // Connections remain: wait for one, and for the next failure.
                Poll::Ready(_) => failed = None,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }

    /// Decide `layers` in one call in `mode` (`block`: a block's length in
    /// µs), loading the code first where the server lost it; a key of
    /// another type is named by policy.
    async fn call(
        &self,
        layers: &[LayerRequest<'_>],
        (mode, block): (Mode, Option<u64>),
    ) -> Result<Verdicts, StoreError> {
        let reply = self.call_reply(layers, (mode, block), &[]).await?;
        parse_reply(&reply, layers.len())
    }

    /// The reply of one call over `layers` in `mode` (`holds`: each
    /// layer's hold, for a release or renewal), loading the code first
    /// where the server lost it; a key of another type is named by policy.
    async fn call_reply(
        &self,
        layers: &[LayerRequest<'_>],
        (mode, block): (Mode, Option<u64>),
        holds: &[Hold],
    ) -> Result<Vec<i64>, StoreError> {
        let time = self.checked.time_args()?;
        let runner = &*self.checked.runner;
        let style = runner.call_command();
        let cmd = self.command(style, layers, &time, (mode, block), holds)?;
        // A call is built again when a reload found another way than it
        // was built for (a fallback, or the module back); its arguments
        // were checked above, so building it cannot fail.
        let rebuild = |style| {
            self.command(style, layers, &time, (mode, block), holds)
                .unwrap_or_else(|_| cmd.clone())
        };
        // The pool's and Sentinel's ways are boxed: their futures (a
        // checkout, a search for the primary) would make every call's
        // future larger, the multiplexed one's included.
        match &self.conn {
            Conn::Multiplexed(managed) => {
                let (generation, mut con) = managed.connection();
                // Dropped unanswered when the caller's deadline passes.
                let watch = managed.watch(generation);
                let result = runner.call(&mut con, &cmd, style, rebuild).await;
                watch.answered();
                if let Err(e) = &result {
                    managed.check(generation, e);
                }
                self.answered(&mut con, result, layers, mode).await
            }
            Conn::Pool(pool, failures) => {
                Box::pin(async {
                    let mut pooled = self.checkout(pool, failures).await?;
                    // Counted until it answers: a call dropped unanswered
                    // (its deadline passed, or its caller went away)
                    // leaves the count up when the connection goes back.
                    pooled.unanswered += 1;
                    let result = runner.call(&mut pooled.con, &cmd, style, rebuild).await;
                    pooled.unanswered = 0;
                    pooled.check(&result);
                    self.answered(&mut pooled.con, result, layers, mode).await
                })
                .await
            }
            Conn::Sentinel(sentinel) => {
                Box::pin(async {
                    let (generation, mut con) = sentinel.connection().await?;
                    // Dropped unanswered when the caller's deadline passes.
                    let watch = sentinel.watch(generation);
                    let result = runner.call(&mut con, &cmd, style, rebuild).await;
                    watch.answered();
                    if let Err(e) = &result {
                        sentinel.check(generation, e);
                    }
                    self.answered(&mut con, result, layers, mode).await
                })
                .await
            }
        }
    }

    /// [`answer`](Self::answer), whose future (a `WAIT` for replicas, a
    /// conflict looked up) is boxed off the usual path: a reply with no
    /// replicas to wait for is answered as it is.
    async fn answered<C: ConnectionLike + Clone + Send + 'static>(
        &self,
        con: &mut C,
        result: RedisResult<Vec<i64>>,
        layers: &[LayerRequest<'_>],
        mode: Mode,
    ) -> Result<Vec<i64>, StoreError> {
        match result {
            Ok(reply) if self.checked.replica_ack.is_none() => Ok(reply),
            result => Box::pin(self.answer(con, result, layers, mode)).await,
        }
    }

    /// What a reservation's concurrency holds go back with: the layers
    /// that hold, their holds and the call's time (`None`: it holds none).
    /// Such a reservation is reported failed when its replicas do not
    /// acknowledge it, so no permit will release them: the store gives
    /// them back itself (best effort: a hold this fails to release is
    /// forgotten at its lease's end). Rate layers keep their charge, as any
    /// failed decision's may.
    fn refund_of<'a>(
        &self,
        layers: &[LayerRequest<'a>],
        reply: &[i64],
    ) -> Option<(Vec<LayerRequest<'a>>, Vec<Hold>, TimeArgs)> {
        let (_, charges) = parse_reserve(reply, layers.len()).ok()?;
        let (held_layers, holds) = held_layers(layers, &charges);
        let time = self.checked.time_args().ok()?;
        (!holds.is_empty()).then_some((held_layers, holds, time))
    }

    /// The give-back of a reservation's holds if its `WAIT` is abandoned
    /// (the deadline, a dropped caller): armed, it sends the refund on a
    /// clone of `con`, on a task of its own, when dropped.
    fn give_back<C: ConnectionLike + Clone + Send + 'static>(
        &self,
        con: &C,
        layers: &[LayerRequest<'_>],
        reply: &[i64],
    ) -> Option<GiveBack<C>> {
        let (held_layers, holds, time) = self.refund_of(layers, reply)?;
        let style = self.checked.runner.call_command();
        let refund = (Mode::Refund, None);
        let cmd = self
            .command(style, &held_layers, &time, refund, &holds)
            .ok()?;
        Some(GiveBack {
            call: Some((con.clone(), cmd, self.checked.deadline)),
        })
    }

    /// Give a reservation's holds back now, on the connection that wrote
    /// them (its `WAIT` answered that the replicas did not acknowledge).
    async fn give_back_now<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        layers: &[LayerRequest<'_>],
        reply: &[i64],
    ) {
        let Some((held_layers, holds, time)) = self.refund_of(layers, reply) else {
            return;
        };
        let runner = &*self.checked.runner;
        let style = runner.call_command();
        let refund = (Mode::Refund, None);
        let Ok(cmd) = self.command(style, &held_layers, &time, refund, &holds) else {
            return;
        };
        let rebuild = |style| {
            self.command(style, &held_layers, &time, refund, &holds)
                .unwrap_or_else(|_| cmd.clone())
        };
        let _ = runner.call(con, &cmd, style, rebuild).await;
    }

    /// A call's reply, once replicas acknowledged what it wrote, or its
    /// error with the conflicting layer named.
    async fn answer<C: ConnectionLike + Clone + Send + 'static>(
        &self,
        con: &mut C,
        result: RedisResult<Vec<i64>>,
        layers: &[LayerRequest<'_>],
        mode: Mode,
    ) -> Result<Vec<i64>, StoreError> {
        match result {
            Ok(reply) => {
                // A decision wrote a state only when every layer admitted
                // (a denial may lengthen a TTL, kept_by_denial: not waited
                // for, so a denial stays free of WAIT); a peek writes
                // nothing; anything else may have written.
                if let Some(ack) = &self.checked.replica_ack {
                    let every_layer_admitted = |stride: usize| {
                        reply.len() == layers.len() * stride
                            && reply.chunks_exact(stride).all(|f| f[0] == 1)
                    };
                    let wrote = match mode {
                        Mode::Decide => every_layer_admitted(REPLY_FIELDS),
                        Mode::Reserve => every_layer_admitted(RESERVE_FIELDS),
                        Mode::Peek => false,
                        _ => true,
                    };
                    if wrote {
                        // Armed while the `WAIT` waits: dropped there, it
                        // gives the holds back on a task of its own.
                        let give_back = match mode {
                            Mode::Reserve => self.give_back(con, layers, &reply),
                            _ => None,
                        };
                        let acknowledged = ack.wait(con).await;
                        if let Some(armed) = give_back {
                            armed.disarm();
                            // Given back before the caller hears why: its
                            // retry finds the place free.
                            if acknowledged.is_err() {
                                self.give_back_now(con, layers, &reply).await;
                            }
                        }
                        acknowledged?;
                    }
                }
                Ok(reply)
            }
            Err(e) => {
                let e = from_redis(e);
                if conflicts::is_unlocated(&e) {
                    return Err(conflicts::locate(con, layers, &self.checked).await);
                }
                Err(name_conflict(e, |i| layers.get(i).map(|l| l.policy.name())))
            }
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        // Written out rather than through `Decide::later` and `within`:
        // a future handed to another async function is kept twice in the
        // state of the one awaiting it, and a decision's future was 6.9 KB
        // (one copy of it per decision, and an allocation too large for
        // the allocator's per-thread cache: its lock, contended by the
        // runtime's threads).
        Decide::Later(Box::pin(async move {
            if layers.is_empty() {
                *verdicts = Verdicts::new();
                return Ok(());
            }
            let deadline = self.checked.deadline;
            let answer = tokio::time::timeout(deadline, self.call(layers, (Mode::Decide, None)));
            *verdicts = in_time(answer.await, deadline)??;
            Ok(())
        }))
    }

    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        within(self.checked.deadline, self.call(layers, (Mode::Peek, None))).await?
    }

    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        if layers.is_empty() {
            return Ok(());
        }
        within(
            self.checked.deadline,
            self.call(layers, (Mode::Reset, None)),
        )
        .await?
        .map(drop)
    }

    /// One call: every layer judged, then changed (a foreign key fails
    /// the call before anything is written).
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        let mode = Mode::of(adjustment)?;
        within(self.checked.deadline, self.call(layers, mode)).await?
    }

    /// One call in `reserve` mode: a concurrency layer's charge is its hold.
    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        if layers.is_empty() {
            return Ok((Verdicts::new(), Holds::new()));
        }
        let call = self.call_reply(layers, (Mode::Reserve, None), &[]);
        let reply = within(self.checked.deadline, call).await??;
        let (verdicts, charges) = parse_reserve(&reply, layers.len())?;
        Ok((verdicts, holds_of(layers, &charges)))
    }

    /// One call in `refund` mode: a concurrency layer's release is the
    /// refund of its charge.
    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        if layers.is_empty() {
            return Ok(());
        }
        check_holds(layers, holds)?;
        let call = self.call_reply(layers, (Mode::Refund, None), holds);
        within(self.checked.deadline, call).await?.map(drop)
    }

    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        if layers.is_empty() {
            return Ok(Holds::new());
        }
        check_holds(layers, holds)?;
        let call = self.call_reply(layers, (Mode::Renew, None), holds);
        let reply = within(self.checked.deadline, call).await??;
        let costs: Vec<u64> = holds.iter().map(|h| h.cost).collect();
        parse_renewed(&reply, &costs)
    }
}

/// The holds a reservation of `layers` made: each concurrency layer's
/// charge (none when nothing was charged).
pub(crate) fn holds_of(layers: &[LayerRequest<'_>], charges: &[Charged]) -> Holds {
    layers
        .iter()
        .zip(charges)
        .map(|(layer, &(at, _))| {
            let concurrency = matches!(layer.policy.limit(), Limit::Concurrency(_));
            (concurrency && at != 0).then_some(Hold {
                cost: layer.cost,
                at,
            })
        })
        .collect()
}

/// The layers a reservation of `layers` holds places of, each with its
/// hold: what a release of that reservation names.
pub(crate) fn held_layers<'a>(
    layers: &[LayerRequest<'a>],
    charges: &[Charged],
) -> (Vec<LayerRequest<'a>>, Vec<Hold>) {
    layers
        .iter()
        .zip(holds_of(layers, charges))
        .filter_map(|(layer, hold)| Some((*layer, hold?)))
        .unzip()
}

/// A refund of concurrency holds that runs on a task of its own when
/// dropped armed: dropping it is how a failed or abandoned `WAIT` gives
/// the holds back (the caller may be gone by then: its deadline passed).
struct GiveBack<C: ConnectionLike + Send + 'static> {
    /// The connection, the refund and how long it may take.
    call: Option<(C, Cmd, Duration)>,
}

impl<C: ConnectionLike + Send + 'static> GiveBack<C> {
    /// The replicas acknowledged: nothing to give back.
    fn disarm(mut self) {
        self.call = None;
    }
}

impl<C: ConnectionLike + Send + 'static> Drop for GiveBack<C> {
    fn drop(&mut self) {
        let Some((mut con, cmd, deadline)) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let refund = cmd.query_async::<redis::Value>(&mut con);
            let _ = tokio::time::timeout(deadline, refund).await;
        });
    }
}

/// One pooled connection and whether a call found it broken.
struct PooledConnection {
    con: MultiplexedConnection,
    broken: bool,
    /// Calls in a row dropped unanswered, mostly at their deadline (a
    /// caller's own drop counts too; three in a row in the middle of a
    /// call on one connection are rare): at
    /// [`UNANSWERED_MAX`](crate::call_watch::UNANSWERED_MAX) the connection
    /// is taken for dead, as a Sentinel connection is. A server that went
    /// silent (a frozen primary, a host gone without closing its sockets)
    /// sends no error that would mark it broken.
    unanswered: u32,
}

impl PooledConnection {
    /// Mark the connection broken after an error it cannot recover from
    /// (I/O, a dropped socket) or on a server that is no longer a primary
    /// (`READONLY`: a Sentinel failover demoted it), so the pool replaces
    /// it. Other server errors leave it usable.
    fn check<T>(&mut self, result: &RedisResult<T>) {
        if let Err(e) = result {
            let demoted = crate::error::is_read_only(e);
            if e.is_unrecoverable_error() || demoted {
                self.broken = true;
            }
        }
    }
}

/// Opens the pool's connections (bb8-redis's manager never reports a
/// broken connection, so a Redis restart would leave the pool full of dead
/// ones; this one drops a connection after an I/O failure, or on a primary
/// demoted to a replica).
struct PoolManager {
    /// A URL's server, or the primary the sentinels name (asked again for
    /// each new connection, so one opened after a failover reaches the
    /// new primary).
    source: Source,
    config: AsyncConnectionConfig,
}

impl bb8::ManageConnection for PoolManager {
    type Connection = PooledConnection;
    type Error = RedisError;

    async fn connect(&self) -> Result<PooledConnection, RedisError> {
        let con = match &self.source {
            Source::Client(client) => {
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?
            }
            Source::Sentinel(sentinel) => sentinel.open_primary().await?,
        };
        Ok(PooledConnection {
            con,
            broken: false,
            unanswered: 0,
        })
    }

    async fn is_valid(&self, conn: &mut PooledConnection) -> Result<(), RedisError> {
        redis::cmd("PING").query_async::<()>(&mut conn.con).await
    }

    fn has_broken(&self, conn: &mut PooledConnection) -> bool {
        conn.broken || conn.unanswered >= crate::call_watch::UNANSWERED_MAX
    }
}
