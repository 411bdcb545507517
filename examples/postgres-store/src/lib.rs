//! An example custom store for Tollgate, on PostgreSQL — the code the guide
//! `docs/writing-a-store.md` walks through.
//!
//! It uses only Tollgate's public API: the [`Store`] trait, the reference
//! algorithms ([`tollgate::algorithms::decide`]) and a [`Clock`]. Every
//! decision is one transaction:
//!
//! 1. `INSERT … ON CONFLICT DO NOTHING` a placeholder row for every layer's
//!    key (expired at 0), so that every key has a row to lock;
//! 2. `SELECT … ORDER BY key FOR UPDATE`: lock them all, always in the same
//!    order, so two decisions never deadlock over each other's keys;
//! 3. read `now` from the clock, treat expired rows as absent, and run the
//!    algorithm of every layer;
//! 4. only if every layer admits, write every layer's new state and its
//!    expiry (all-or-nothing); otherwise write nothing and delete the rows
//!    that are expired (lazily reclaiming placeholders and dead state);
//! 5. commit.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use tollgate::{Context, Limit, Limiter, Policy, Scope, Subject};
//! use tollgate_postgres_store::PgStore;
//!
//! let store = PgStore::builder("postgres://postgres@localhost:5432/postgres")
//!     .pool_size(4)
//!     .connect()
//!     .await?;
//! let limiter = Limiter::builder(Arc::new(store))
//!     .layer("key", Scope::Subject, Policy::new("api", Limit::gcra(10, Duration::from_secs(1), 20)?)?)
//!     .build()?;
//! let decision = limiter.check(&Context::for_subject(Subject::new("key-7")?), 1).await?;
//! # let _ = decision; Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "config")]
pub mod config;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};
use tollgate::{
    async_trait, check_holds, duration_micros, Adjustment, Clock, Hold, Holds, LayerRequest, Limit,
    State, Store, StoreError, SystemClock, Verdict, Verdicts, MAX_RECOVERY,
};

/// How often one decision is retried after a deadlock or a row deleted
/// under it by another decision's lazy cleanup.
const ATTEMPTS: usize = 5;

/// A Tollgate store keeping every key's state in one PostgreSQL table.
pub struct PgStore {
    config: tokio_postgres::Config,
    table: String,
    clock: Arc<dyn Clock>,
    deadline: Duration,
    /// Idle connections, and a permit per connection.
    idle: Mutex<Vec<Client>>,
    permits: Semaphore,
}

impl fmt::Debug for PgStore {
    // The connection settings are left out: they may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table)
            .field("deadline", &self.deadline)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// Builds a [`PgStore`]; see [`PgStore::builder`].
#[derive(Clone)]
pub struct PgStoreBuilder {
    url: String,
    table: String,
    pool_size: usize,
    deadline: Duration,
    connect_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for PgStoreBuilder {
    // The URL is left out: it may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStoreBuilder")
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl PgStoreBuilder {
    /// The table holding the state (default `tollgate_state`); created if
    /// missing. Letters, digits and `_` only.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Connections opened (default 4). Each decision holds one for its
    /// transaction; more decisions wait for a free one, within the deadline.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// The longest one decision may take, waiting for a connection included
    /// (default 1 s).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The longest connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The clock decisions read (default: the system clock). The
    /// conformance suite passes its manual clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Connect every pool connection and create the table if it is missing.
    /// Must run inside a Tokio runtime (the connections' tasks are spawned
    /// on it).
    pub async fn connect(self) -> Result<PgStore, StoreError> {
        if self.table.is_empty()
            || self.table.len() > 63
            || !self
                .table
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(StoreError::Backend(
                format!(
                    "table name {:?}: use 1-63 letters, digits and _",
                    self.table
                )
                .into(),
            ));
        }
        let mut config: tokio_postgres::Config = self.url.parse().map_err(|e| {
            StoreError::Backend(format!("DATABASE_URL is not a PostgreSQL URL: {e}").into())
        })?;
        config.connect_timeout(self.connect_timeout);
        let mut clients = Vec::with_capacity(self.pool_size);
        for _ in 0..self.pool_size {
            clients.push(open(&config).await?);
        }
        create_table(&mut clients[0], &self.table).await?;
        Ok(PgStore {
            config,
            table: self.table,
            clock: self.clock,
            deadline: self.deadline,
            permits: Semaphore::new(clients.len()),
            idle: Mutex::new(clients),
        })
    }
}

/// Open one connection and drive it on a spawned task.
async fn open(config: &tokio_postgres::Config) -> Result<Client, StoreError> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| StoreError::Unavailable(format!("cannot connect to PostgreSQL: {e}")))?;
    tokio::spawn(async move {
        // Ends when the client is dropped or the server goes away; the
        // client then reports itself closed and is replaced.
        let _ = connection.await;
    });
    Ok(client)
}

/// `CREATE TABLE IF NOT EXISTS` races with itself; an advisory lock makes
/// concurrent creators take turns.
async fn create_table(client: &mut Client, table: &str) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock(7105573)", &[])
        .await
        .map_err(backend)?;
    tx.batch_execute(&format!(
        "CREATE UNLOGGED TABLE IF NOT EXISTS {table} (
             key        TEXT PRIMARY KEY,
             is_log     BOOLEAN NOT NULL,
             state      BIGINT[] NOT NULL,
             expires_at BIGINT NOT NULL
         )"
    ))
    .await
    .map_err(backend)?;
    tx.commit().await.map_err(backend)
}

fn backend(e: tokio_postgres::Error) -> StoreError {
    if e.is_closed() {
        StoreError::Unavailable(format!("PostgreSQL connection lost: {e}"))
    } else {
        StoreError::Backend(Box::new(e))
    }
}

impl PgStore {
    /// A builder for a store at `url`, for example
    /// `postgres://user:password@localhost:5432/dbname` or
    /// `host=/var/run/postgresql user=postgres dbname=postgres`.
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            table: "tollgate_state".into(),
            pool_size: 4,
            deadline: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            clock: Arc::new(SystemClock),
        }
    }

    /// The table holding the state.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Rows in the table, expired ones not yet deleted included.
    pub async fn rows(&self) -> Result<i64, StoreError> {
        let _permit = self.permits.acquire().await.map_err(closed)?;
        let client = self.checkout().await?;
        let row = client
            .query_one(&format!("SELECT count(*) FROM {}", self.table), &[])
            .await;
        self.checkin(client);
        row.map(|r| r.get(0)).map_err(backend)
    }

    /// An idle connection (the caller holds a permit), or a new one.
    async fn checkout(&self) -> Result<Client, StoreError> {
        let client = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match client {
            Some(client) if !client.is_closed() => Ok(client),
            // Closed by the server, or dropped when a decision ran past its
            // deadline: open a new one.
            _ => open(&self.config).await,
        }
    }

    fn checkin(&self, client: Client) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(client);
    }

    async fn decide_on(
        &self,
        client: &mut Client,
        layers: &[LayerRequest<'_>],
        op: Op<'_>,
    ) -> Result<Option<Result<(Verdicts, Holds), StoreError>>, tokio_postgres::Error> {
        let keys: Vec<String> = layers.iter().map(|l| l.key.render()).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        let tx = client.transaction().await?;
        // 1 and 2: a row for every key, locked in key order.
        let Some(rows) = self.lock_rows(&tx, &sorted).await? else {
            // Another decision's cleanup deleted a row between our insert
            // and our lock: start again.
            tx.rollback().await?;
            return Ok(None);
        };
        // 3. Time is read under the locks; expired rows count as absent.
        let now = self.clock.now();
        if !now.is_plausible() {
            tx.rollback().await?;
            return Ok(Some(Err(StoreError::ImplausibleTime(now))));
        }
        let now_us = now.as_micros();
        let (states, expired) = match read_states(&rows, &keys, layers, now_us) {
            Ok(read) => read,
            Err(conflict) => {
                tx.rollback().await?;
                return Ok(Some(Err(conflict)));
            }
        };
        // 4. All or nothing, judged by Tollgate's own algorithms.
        let states: Vec<Option<&State>> = states.iter().map(Option::as_ref).collect();
        let (layered, holds) = match judge(layers, &states, now, op) {
            Ok(judged) => judged,
            Err(e) => {
                tx.rollback().await?;
                return Ok(Some(Err(e)));
            }
        };
        match op {
            // Nothing charged, nothing kept (not even step 1's rows).
            Op::Peek => {
                tx.rollback().await?;
                return Ok(Some(Ok((peeked(layered, layers), holds))));
            }
            // Every row was found to be this store's own (step 3): remove them.
            Op::Reset => self.delete(&tx, &sorted).await?,
            _ if layered.admitted() => {
                self.write_states(&tx, &keys, layers, layered.writes, now_us)
                    .await?
            }
            _ => {
                if !expired.is_empty() {
                    self.delete(&tx, &expired).await?;
                }
                if matches!(op, Op::Decide | Op::Acquire) {
                    self.keep_denied(&tx, &keys, &states, &layered.verdicts, now_us)
                        .await?;
                }
            }
        }
        // 5.
        tx.commit().await?;
        Ok(Some(Ok((layered.verdicts, holds))))
    }

    /// Steps 1 and 2: insert a row for every key that has none, then lock
    /// them all, in key order (`sorted`). `None` when a row was deleted
    /// in between.
    async fn lock_rows(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        sorted: &[String],
    ) -> Result<Option<Vec<tokio_postgres::Row>>, tokio_postgres::Error> {
        tx.execute(
            &format!(
                "INSERT INTO {} (key, is_log, state, expires_at)
                 SELECT k, false, '{{}}', 0 FROM unnest($1::text[]) AS k
                 ON CONFLICT (key) DO NOTHING",
                self.table
            ),
            &[&sorted],
        )
        .await?;
        let rows = tx
            .query(
                &format!(
                    "SELECT key, is_log, state, expires_at FROM {}
                     WHERE key = ANY($1) ORDER BY key FOR UPDATE",
                    self.table
                ),
                &[&sorted],
            )
            .await?;
        Ok((rows.len() == sorted.len()).then_some(rows))
    }

    /// Delete the rows of `keys`.
    async fn delete(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        keys: &[String],
    ) -> Result<(), tokio_postgres::Error> {
        let delete = format!("DELETE FROM {} WHERE key = ANY($1)", self.table);
        tx.execute(&delete, &[&keys]).await.map(drop)
    }

    /// A denial writes no state, but keeps each state a denying layer
    /// read until that verdict's reset
    /// ([`kept_by_denial`](tollgate::algorithms::kept_by_denial)): a policy
    /// changed since the state's last write (a longer window) counts it
    /// for longer than the row's expiry says.
    async fn keep_denied(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        keys: &[String],
        states: &[Option<&State>],
        verdicts: &[Verdict],
        now_us: u64,
    ) -> Result<(), tokio_postgres::Error> {
        let outlive = format!(
            "UPDATE {} SET expires_at = GREATEST(expires_at, $2) WHERE key = $1",
            self.table
        );
        for ((key, state), verdict) in keys.iter().zip(states).zip(verdicts) {
            let kept = tollgate::algorithms::kept_by_denial(verdict);
            if let (Some(kept), Some(_)) = (kept, state) {
                let until = now_us.saturating_add(duration_micros(kept)) as i64;
                tx.execute(&outlive, &[key, &until]).await?;
            }
        }
        Ok(())
    }

    /// Write each layer's next state (`writes`, in the layers' order).
    async fn write_states(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        keys: &[String],
        layers: &[LayerRequest<'_>],
        writes: tollgate::algorithms::Writes,
        now_us: u64,
    ) -> Result<(), tokio_postgres::Error> {
        let update = format!(
            "UPDATE {} SET is_log = $2, state = $3, expires_at = $4 WHERE key = $1",
            self.table
        );
        let delete = format!("DELETE FROM {} WHERE key = $1", self.table);
        for ((key, layer), write) in keys.iter().zip(layers).zip(writes) {
            let Some(next) = write else { continue };
            let mut expires_at = now_us.saturating_add(duration_micros(next.ttl)) as i64;
            let (is_log, values): (bool, Vec<i64>) = match &next.state {
                // A log emptied by a reward is no state (an empty row
                // would read as a block).
                State::Log(entries) if entries.is_empty() => {
                    tx.execute(&delete, &[key]).await?;
                    continue;
                }
                State::Log(entries) => (true, entries.iter().map(|&v| v as i64).collect()),
                State::Cells(c) => (false, c.iter().map(|&v| v as i64).collect()),
                // A block: no cells, and the row expires exactly at its end.
                State::Blocked(until) => {
                    expires_at = *until as i64;
                    (wants_log(layer.policy.limit(), false), Vec::new())
                }
                _ => (false, Vec::new()),
            };
            tx.execute(&update, &[key, &is_log, &values, &expires_at])
                .await?;
        }
        Ok(())
    }
}

/// Each layer's state from the locked `rows` (`keys`: the layers' keys, in
/// order), and the keys of rows that have expired. A row this store did
/// not write is never read, overwritten or deleted: the whole decision is
/// a conflict.
fn read_states(
    rows: &[tokio_postgres::Row],
    keys: &[String],
    layers: &[LayerRequest<'_>],
    now_us: u64,
) -> Result<(Vec<Option<State>>, Vec<String>), StoreError> {
    let mut states: Vec<Option<State>> = vec![None; layers.len()];
    let mut expired = Vec::new();
    for row in rows {
        let key: String = row.get(0);
        let is_log: bool = row.get(1);
        let cells: Vec<i64> = row.get(2);
        let expires_at = u64::try_from(row.get::<_, i64>(3)).unwrap_or(0);
        // The row step 1 inserts: no state yet.
        if !is_log && cells.is_empty() && expires_at == 0 {
            continue;
        }
        let of_key = || keys.iter().enumerate().filter(|(_, k)| **k == key);
        for (i, _) in of_key() {
            // A block ends within 14 days (and a little clock skew).
            let far_block = cells.is_empty()
                && expires_at > now_us.saturating_add(duration_micros(MAX_RECOVERY) * 2);
            let found = foreign(layers[i].policy.limit(), is_log, &cells)
                .or(far_block.then_some("not a block"));
            if let Some(found) = found {
                return Err(StoreError::Conflict {
                    policy: layers[i].policy.name().to_string(),
                    found: found.to_string(),
                });
            }
        }
        if expires_at <= now_us {
            expired.push(key);
            continue;
        }
        let state = row_state(is_log, &cells, expires_at);
        for (i, _) in of_key() {
            states[i] = Some(state.clone());
        }
    }
    Ok((states, expired))
}

/// The state a row of this store's holds.
fn row_state(is_log: bool, cells: &[i64], expires_at: u64) -> State {
    let values = cells.iter().map(|&v| v as u64);
    if cells.is_empty() {
        // A block: no cells, ending when the row expires.
        State::Blocked(expires_at)
    } else if is_log {
        State::Log(values.collect::<VecDeque<u64>>())
    } else {
        let mut c = [0u64; 3];
        for (slot, v) in c.iter_mut().zip(values) {
            *slot = v;
        }
        State::Cells(c)
    }
}

/// A peek's verdicts: what each layer would answer, nothing charged.
fn peeked(layered: tollgate::algorithms::Layered, layers: &[LayerRequest<'_>]) -> Verdicts {
    let charged = layered.admitted();
    layered
        .verdicts
        .into_iter()
        .zip(layers)
        .map(|(v, l)| if charged { v.uncharged(l.cost) } else { v })
        .collect()
}

/// Step 4: the layers' verdicts and writes for `op`, and the holds an
/// acquisition takes.
fn judge(
    layers: &[LayerRequest<'_>],
    states: &[Option<&State>],
    now: tollgate::Timestamp,
    op: Op<'_>,
) -> Result<(tollgate::algorithms::Layered, Holds), StoreError> {
    use tollgate::algorithms::{
        adjust_layers, decide_layers, holds_of, release_layers, renew_layers,
    };
    Ok(match op {
        Op::Adjust(adjustment) => (
            adjust_layers(layers, states, now, adjustment)?,
            Holds::new(),
        ),
        Op::Release(holds) => (release_layers(layers, states, now, holds), Holds::new()),
        Op::Renew(holds) => renew_layers(layers, states, now, holds),
        Op::Acquire => {
            let layered = decide_layers(layers, states, now);
            let holds = holds_of(layers, &layered);
            (layered, holds)
        }
        Op::Decide | Op::Peek | Op::Reset => (decide_layers(layers, states, now), Holds::new()),
    })
}

/// What a row holds when this store did not write it for `limit`: a log
/// where a counter belongs (or the reverse), a counter that is not three
/// numbers, a negative number. `None` for a state of the right shape.
fn foreign(limit: &Limit, is_log: bool, cells: &[i64]) -> Option<&'static str> {
    if is_log != wants_log(limit, is_log) {
        Some("wrong type")
    } else if (!is_log && !cells.is_empty() && cells.len() != 3) || cells.iter().any(|&v| v < 0) {
        Some("not a state")
    } else {
        None
    }
}

/// Whether `limit` keeps a log (a custom algorithm keeps what it `has`).
fn wants_log(limit: &Limit, has: bool) -> bool {
    match limit.layout() {
        Some(layout) => layout.is_log(),
        None => has,
    }
}

fn closed(_: tokio::sync::AcquireError) -> StoreError {
    StoreError::Unavailable("the store's connection pool is closed".into())
}

/// What a transaction does once the rows are locked and judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op<'h> {
    /// Charge when every layer admits.
    Decide,
    /// Write nothing.
    Peek,
    /// Delete the rows.
    Reset,
    /// Write what the adjustment changes.
    Adjust(Adjustment),
    /// Charge when every layer admits, and answer the holds.
    Acquire,
    /// Give these holds back.
    Release(&'h [Hold]),
    /// Renew these holds, and answer them as they now are.
    Renew(&'h [Hold]),
}

impl PgStore {
    /// Run `op` over `layers` in one transaction, retried after a
    /// deadlock, within the deadline.
    async fn run(
        &self,
        layers: &[LayerRequest<'_>],
        op: Op<'_>,
    ) -> Result<(Verdicts, Holds), StoreError> {
        let work = async {
            let _permit = self.permits.acquire().await.map_err(closed)?;
            let mut client = self.checkout().await?;
            let mut result = Err(StoreError::Protocol(format!(
                "no decision after {ATTEMPTS} attempts (rows deleted under us, or deadlocks)"
            )));
            for _ in 0..ATTEMPTS {
                match self.decide_on(&mut client, layers, op).await {
                    Ok(Some(answer)) => {
                        result = answer;
                        break;
                    }
                    Ok(None) => continue,
                    Err(e)
                        if matches!(
                            e.code(),
                            Some(&SqlState::T_R_DEADLOCK_DETECTED)
                                | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                        ) =>
                    {
                        continue
                    }
                    Err(e) => {
                        result = Err(backend(e));
                        break;
                    }
                }
            }
            self.checkin(client);
            result
        };
        tokio::time::timeout(self.deadline, work)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.deadline)))
    }
}

#[async_trait]
impl Store for PgStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> tollgate::Decide<'a> {
        tollgate::Decide::later(verdicts, async move {
            self.run(layers, Op::Decide).await.map(|(v, _)| v)
        })
    }

    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.run(layers, Op::Peek).await.map(|(v, _)| v)
    }

    /// A row this store did not write fails the reset (step 3), which then
    /// deletes nothing.
    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        self.run(layers, Op::Reset).await.map(drop)
    }

    /// A block is a row without cells that expires at the block's end.
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        self.run(layers, Op::Adjust(adjustment))
            .await
            .map(|(v, _)| v)
    }

    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        self.run(layers, Op::Acquire).await
    }

    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        check_holds(layers, holds)?;
        self.run(layers, Op::Release(holds)).await.map(drop)
    }

    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        check_holds(layers, holds)?;
        self.run(layers, Op::Renew(holds)).await.map(|(_, h)| h)
    }
}
