//! The Redis Cluster store: slot-aware layered decisions.
//!
//! The layers of a request are grouped by hash slot (the `{tag}` of their
//! keys). The keys of one slot are decided by **one** script call — the
//! same script as the standalone store — all-or-nothing, so layers that
//! share a tag (per-key and per-tenant layers both tagged `{tenant}`) cost
//! one round trip, exactly as on a single server.
//!
//! Groups on different slots cannot run in one script (Redis Cluster runs a
//! script on one node). They are **reserved in turn**, in slot order: each
//! group is decided and, when it admits, charged. When a group denies, the
//! groups already charged are **refunded** (see `tollgate_algorithms::refund`) and the
//! groups not reached are judged without a charge (`peek`), so every layer
//! reports a verdict and the request is denied having charged nothing.
//!
//! What that costs and guarantees:
//!
//! - one round trip per slot group when admitted; when denied, one per
//!   group plus the refunds (sent concurrently, awaited within the
//!   deadline, finished in the background past it);
//! - **never over-admission**: every key only ever admits against its own
//!   atomic script, and a refund never gives back more than the state would
//!   hold without the charge;
//! - **brief under-admission under contention**: while a reservation is
//!   pending (between its charge and its refund) other requests see it
//!   charged, and a refund that cannot prove what is still owed (a window
//!   rolled over, a bucket that would have been full meanwhile) gives back
//!   less or nothing. A decision that fails (deadline, node down) after
//!   charging some groups refunds them in the background; a charge whose
//!   outcome is unknown (the call timed out) may stay — under-admission.
//!
//! Scripts reach every master: [`connect`](RedisClusterStoreBuilder::connect)
//! loads the script on all masters, and a `NOSCRIPT` from any node (a
//! promoted replica, a node that received a slot, a `SCRIPT FLUSH`) is
//! answered by sending the whole script with `EVAL` through the same route,
//! which caches it on that node.
//!
//! Redirections and retries are the store's own, within the decision's
//! deadline: `MOVED` and `ASK` are followed, `TRYAGAIN` (a multi-key group
//! whose keys a slot migration has split between two nodes, until they are
//! together again) and `CLUSTERDOWN` (a failover in progress) are retried
//! after short pauses. A call is resent **only** when Redis answered that it
//! did not run it; after a dropped connection it may have run, so it is not
//! resent: no reservation is charged twice, no refund given twice.
//!
//! Replication is asynchronous in Redis Cluster: a charge a master
//! acknowledged but had not yet sent to its replica is lost when the
//! replica takes over. Up to that many requests can pass again after a
//! failover.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo, SingleNodeRoutingInfo,
};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_limiter::{
    duration_micros, Clock, LayerRequest, Store, StoreError, StoreKey, Verdict, Verdicts,
};

use crate::error::{check_plausible, from_redis, name_conflict, RedisStoreError};
use crate::holds::{Held, Holds};
use crate::script::{self, layer_args, parse_reply, LAYER_ARGS, REPLY_FIELDS, SCRIPT};
use crate::store::{check_prefix, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DEADLINE, DEFAULT_PREFIX};

/// Passes of a cross-slot decision denied only where other decisions of
/// this process hold reservations (each after those settle), within the
/// deadline.
const MAX_CONTENDED_ATTEMPTS: u32 = 3;

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16_384;

/// Integers per layer in a `reserve` reply: the verdict, then the charge.
const RESERVE_FIELDS: usize = REPLY_FIELDS + 2;

/// The longest pause between two attempts of a call Redis answered it did
/// not run (`TRYAGAIN` while a slot moves, `CLUSTERDOWN` during a failover):
/// short, so a decision goes through soon after the cluster settles.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(20);

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag —
/// the text between the first `{` and the next `}`, when not empty — or of
/// the whole key, modulo 16384.
///
/// ```
/// use tollgate_redis::cluster::hash_slot;
/// // Same tag, same slot: these two layers are decided in one script call.
/// assert_eq!(hash_slot(b"tollgate:{acme}:a"), hash_slot(b"tollgate:{acme}:b"));
/// assert_eq!(hash_slot(b"123456789"), 12739);
/// ```
pub fn hash_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis
/// Cluster computes it.
fn crc16(data: &[u8]) -> u16 {
    const TABLE: [u16; 256] = {
        let mut table = [0u16; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = (i as u16) << 8;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The Redis Cluster store; see the [module docs](self).
#[derive(Clone)]
pub struct RedisClusterStore {
    conn: ClusterConnection,
    /// This process's reservations in flight, per key.
    holds: Arc<Holds>,
    prefix: Arc<str>,
    clock: Option<Arc<dyn Clock>>,
    max_skew: Option<Duration>,
    deadline: Duration,
}

impl fmt::Debug for RedisClusterStore {
    // The node URLs are left out on purpose: they may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("clock", &self.clock)
            .field("max_skew", &self.max_skew)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisClusterStore`]; see [`RedisClusterStore::builder`].
#[derive(Clone)]
pub struct RedisClusterStoreBuilder {
    nodes: Vec<String>,
    prefix: String,
    deadline: Duration,
    connect_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    max_skew: Option<Duration>,
}

impl fmt::Debug for RedisClusterStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterStoreBuilder")
            .field("nodes", &self.nodes.len())
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("clock", &self.clock)
            .field("max_skew", &self.max_skew)
            .finish()
    }
}

impl RedisClusterStoreBuilder {
    /// The text before every key (default `tollgate`), as for the standalone
    /// store: `<prefix>:{tag}:<policy>:v<version>:<scope>:<subject>`. It
    /// holds no braces, so the `{tag}` alone decides the slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest a decision may take, every slot group's round trip,
    /// redirections and retries included (default 50 ms). Past it the
    /// decision fails with [`StoreError::Timeout`].
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The longest connecting to the cluster may take (default 1 s): per
    /// node connection, and for [`connect`](RedisClusterStoreBuilder::connect)
    /// as a whole.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Decide with this clock's time instead of each node's `TIME`; see
    /// [`RedisStoreBuilder::clock`](crate::RedisStoreBuilder::clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// With a [`clock`](RedisClusterStoreBuilder::clock): fail a decision
    /// whose time is further than `max_skew` from the node's `TIME`.
    pub fn max_skew(mut self, max_skew: Duration) -> Self {
        self.max_skew = Some(max_skew);
        self
    }

    /// Connect to the cluster (discovering every node from the initial
    /// ones) and load the script on every master, within the connect
    /// timeout.
    pub async fn connect(self) -> Result<RedisClusterStore, StoreError> {
        check_prefix(&self.prefix)?;
        let client = self.client()?;
        let timeout = self.connect_timeout;
        let conn = within(timeout, client.get_async_connection())
            .await?
            .map_err(from_redis)?;
        let store = RedisClusterStore {
            conn,
            holds: Arc::default(),
            prefix: self.prefix.into(),
            clock: self.clock,
            max_skew: self.max_skew,
            deadline: self.deadline,
        };
        within(timeout, store.load_script()).await??;
        Ok(store)
    }

    fn client(&self) -> Result<ClusterClient, StoreError> {
        ClusterClientBuilder::new(self.nodes.iter().map(String::as_str))
            .connection_timeout(self.connect_timeout)
            // The client resends nothing itself: after a dropped connection
            // it cannot know whether a script ran, and a resent reservation
            // would charge twice, a resent refund give back twice. The store
            // retries only what Redis answered it did not run (`call`).
            .retries(0)
            // No response timeout inside redis-rs: the deadline bounds every call.
            .build()
            // The parser's message does not repeat the URLs.
            .map_err(|e| RedisStoreError::InvalidUrl(e.to_string()).into())
    }
}

impl RedisClusterStore {
    /// A builder for a store on the cluster reachable through `nodes`
    /// (`redis://[user:password@]host:port/` each; any subset of the nodes
    /// will do, the rest are discovered).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate_limiter::StoreError> {
    /// use tollgate_redis::cluster::RedisClusterStore;
    ///
    /// let store = RedisClusterStore::builder(["redis://10.0.0.1:6379/", "redis://10.0.0.2:6379/"])
    ///     .connect()
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder<I, S>(nodes: I) -> RedisClusterStoreBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisClusterStoreBuilder {
            nodes: nodes.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_PREFIX.to_string(),
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

    /// `SCRIPT LOAD` the script on every master (done by
    /// [`connect`](RedisClusterStoreBuilder::connect); nodes that lack it
    /// later get it on their first `NOSCRIPT`).
    pub async fn load_script(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(SCRIPT);
        let routing = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::AllSucceeded),
        ));
        let sha = self
            .conn
            .clone()
            .route_command(cmd, routing)
            .await
            .map_err(from_redis)?;
        match redis::from_redis_value::<String>(sha) {
            Ok(sha) if sha == script::sha1() => Ok(()),
            _ => Err(StoreError::Protocol(
                "SCRIPT LOAD answered another digest than the script's SHA-1".to_string(),
            )),
        }
    }

    /// The time arguments of every call of one decision: the caller's time
    /// (read once, so every slot group is judged at the same instant) and
    /// the allowed skew, or empty for each node's `TIME`.
    fn time_args(&self) -> Result<TimeArgs, StoreError> {
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

    /// Await `f` until `deadline`.
    async fn until<F: std::future::Future>(
        &self,
        deadline: Instant,
        f: F,
    ) -> Result<F::Output, StoreError> {
        tokio::time::timeout_at(deadline, f)
            .await
            .map_err(|_| StoreError::Timeout(self.deadline))
    }

    /// Layers on several slots: reserve group by group, refund on a denial.
    ///
    /// A request denied only where this process's other reservations in
    /// flight hold units (they may be refunded in a moment) waits for them
    /// to settle and is decided again (at most [`MAX_CONTENDED_ATTEMPTS`]
    /// passes, within the deadline).
    async fn decide_across_slots(
        &self,
        layers: &[LayerRequest<'_>],
        keys: Vec<String>,
        args: Vec<[u64; LAYER_ARGS]>,
        groups: Vec<Vec<usize>>,
        time: TimeArgs,
        deadline: Instant,
    ) -> Result<Verdicts, StoreError> {
        let (mut verdicts, mut contended) = self
            .reserve_across_slots(layers, &keys, &args, &groups, &time, deadline)
            .await?;
        let mut passes = 1;
        while let Some(seen) = contended.take() {
            // Decide again only once those holds settled, with time left; a
            // pass that fails leaves the denial already known standing.
            if passes >= MAX_CONTENDED_ATTEMPTS
                || !self.holds.settled(&seen, deadline).await
                || Instant::now() >= deadline
            {
                break;
            }
            passes += 1;
            match self
                .reserve_across_slots(layers, &keys, &args, &groups, &time, deadline)
                .await
            {
                Ok((again, still)) => (verdicts, contended) = (again, still),
                Err(_) => break,
            }
        }
        Ok(verdicts)
    }

    /// One pass of [`decide_across_slots`](Self::decide_across_slots): the
    /// verdicts, and when the request was denied only on keys where other
    /// decisions of this process hold units, those keys and their holds.
    #[allow(clippy::type_complexity)]
    async fn reserve_across_slots(
        &self,
        layers: &[LayerRequest<'_>],
        keys: &[String],
        args: &[[u64; LAYER_ARGS]],
        groups: &[Vec<usize>],
        time: &TimeArgs,
        deadline: Instant,
    ) -> Result<(Verdicts, Option<Vec<(String, u64)>>), StoreError> {
        let mut held = Held::new(&self.holds);
        let mut verdicts: Vec<Option<Verdict>> = vec![None; layers.len()];
        let mut reserved = Reservations {
            conn: self.conn.clone(),
            time: time.clone(),
            timeout: self.deadline,
            groups: Vec::new(),
        };
        let mut denied = None;
        for (g, group) in groups.iter().enumerate() {
            let cmd = script_call(keys, args, group, time, Mode::Reserve);
            let reply = self
                .until(deadline, call(self.conn.clone(), cmd))
                .await
                .and_then(|reply| reply.map_err(|e| in_group(e, layers, group)))
                .and_then(|reply| parse_reserve(&reply, group.len()));
            let (group_verdicts, charges) = match reply {
                Ok(parsed) => parsed,
                Err(e) => {
                    // Give back what was reserved before failing, within the
                    // deadline, so the caller's next decision (a failure
                    // mode, or the same request without a shadow layer)
                    // does not see these charges; past the deadline the
                    // refunds finish in the background.
                    let refunds = std::mem::replace(
                        &mut reserved,
                        Reservations {
                            conn: self.conn.clone(),
                            time: time.clone(),
                            timeout: self.deadline,
                            groups: Vec::new(),
                        },
                    )
                    .refund();
                    let _ = tokio::time::timeout_at(deadline, async {
                        for refund in refunds {
                            let _ = refund.await;
                        }
                    })
                    .await;
                    return Err(e);
                }
            };
            let admitted = group_verdicts.iter().all(|v| v.allowed);
            for (&i, v) in group.iter().zip(group_verdicts) {
                verdicts[i] = Some(v);
            }
            if admitted {
                held.add(
                    group
                        .iter()
                        .map(|&i| (keys[i].clone(), layers[i].cost))
                        .collect(),
                );
                reserved.groups.push(ReservedGroup {
                    keys: group.iter().map(|&i| keys[i].clone()).collect(),
                    layers: group.iter().map(|&i| args[i]).zip(charges).collect(),
                    indices: group.clone(),
                });
            } else {
                denied = Some(g);
                break;
            }
        }
        let Some(denied) = denied else {
            reserved.groups.clear();
            let verdicts = verdicts.into_iter().map(|v| v.expect("decided")).collect();
            return Ok((verdicts, None));
        };
        // Denied where other decisions of this process hold units?
        let denying: Vec<(String, u64)> = groups[denied]
            .iter()
            .filter(|&&i| verdicts[i].is_some_and(|v| !v.allowed))
            .map(|&i| {
                (
                    keys[i].clone(),
                    self.holds.held(&keys[i]) - held.mine(&keys[i]),
                )
            })
            .collect();
        let contended = denying
            .iter()
            .all(|(_, others)| *others > 0)
            .then_some(denying);
        // The request is denied: give back what was reserved, and meanwhile
        // judge the groups not reached (charging nothing).
        let charged: Vec<usize> = reserved
            .groups
            .iter()
            .flat_map(|g| g.indices.iter().copied())
            .collect();
        let refunds = reserved.refund();
        for group in &groups[denied + 1..] {
            let cmd = script_call(keys, args, group, time, Mode::Peek);
            let peeked = self
                .until(deadline, call(self.conn.clone(), cmd))
                .await
                .and_then(|reply| reply)
                .and_then(|reply| parse_reply(&reply, group.len()));
            // The request is denied whatever these layers say: a group that
            // cannot be read only loses its numbers, never the denial (as
            // an error it would let a fail-open policy admit the request).
            let peeked =
                peeked.unwrap_or_else(|_| group.iter().map(|&i| unread(&layers[i])).collect());
            for (&i, v) in group.iter().zip(peeked) {
                verdicts[i] = Some(v);
            }
        }
        // Awaited so the caller's next decision sees the refunds; past the
        // deadline they finish in the background (they are spawned tasks).
        let _ = tokio::time::timeout_at(deadline, async {
            for refund in refunds {
                let _ = refund.await;
            }
        })
        .await;
        for i in charged {
            verdicts[i] = verdicts[i].map(|v| v.uncharged(layers[i].cost));
        }
        let verdicts = verdicts.into_iter().map(|v| v.expect("decided")).collect();
        Ok((verdicts, contended))
    }
}

#[async_trait]
impl Store for RedisClusterStore {
    fn kind(&self) -> &'static str {
        "redis-cluster"
    }

    async fn decide(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        let deadline = Instant::now() + self.deadline;
        let args = layers
            .iter()
            .map(layer_args)
            .collect::<Result<Vec<_>, _>>()?;
        let time = self.time_args()?;
        let keys: Vec<String> = layers.iter().map(|l| self.redis_key(&l.key)).collect();
        let groups = slot_groups(&keys);
        if let [group] = &groups[..] {
            // One slot: one call, exactly as the standalone store decides.
            let cmd = script_call(&keys, &args, group, &time, Mode::Decide);
            let reply = self
                .until(deadline, call(self.conn.clone(), cmd))
                .await?
                .map_err(|e| in_group(e, layers, group))?;
            return parse_reply(&reply, layers.len());
        }
        self.decide_across_slots(layers, keys, args, groups, time, deadline)
            .await
    }
}

/// The verdict of a layer that could not be read after another group denied
/// the request: nothing charged, and nothing known but the policy's limit.
fn unread(layer: &LayerRequest<'_>) -> Verdict {
    let capacity = layer.policy.capacity();
    Verdict {
        allowed: true,
        limit: capacity,
        remaining: capacity,
        reset_after: Duration::ZERO,
        retry_after: None,
    }
}

/// A conflict in a call over `group` names the policy of the layer at
/// that position of the group.
fn in_group(e: StoreError, layers: &[LayerRequest<'_>], group: &[usize]) -> StoreError {
    name_conflict(e, |i| {
        group
            .get(i)
            .and_then(|&layer| layers.get(layer))
            .map(|l| l.policy.name())
    })
}

/// The layers' indices grouped by the slot of their keys, in slot order
/// (the fixed order reservations are made in), each group in layer order.
fn slot_groups(keys: &[String]) -> Vec<Vec<usize>> {
    let mut by_slot: Vec<(u16, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (hash_slot(k.as_bytes()), i))
        .collect();
    by_slot.sort_unstable();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut last = None;
    for (slot, i) in by_slot {
        match groups.last_mut() {
            Some(group) if last == Some(slot) => group.push(i),
            _ => groups.push(vec![i]),
        }
        last = Some(slot);
    }
    groups
}

/// The caller's time and skew arguments (empty: the node's `TIME`).
#[derive(Debug, Clone, Default)]
struct TimeArgs {
    now: Option<u64>,
    max_skew: Option<u64>,
}

impl TimeArgs {
    fn push(&self, cmd: &mut Cmd) {
        match self.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        match (self.now, self.max_skew) {
            (Some(_), Some(skew)) => cmd.arg(skew),
            _ => cmd.arg(""),
        };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Decide,
    Reserve,
    Peek,
}

/// `EVALSHA` deciding the layers `group` (all on one slot).
fn script_call(
    keys: &[String],
    args: &[[u64; LAYER_ARGS]],
    group: &[usize],
    time: &TimeArgs,
    mode: Mode,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script::sha1()).arg(group.len());
    for &i in group {
        cmd.arg(&keys[i]);
    }
    time.push(&mut cmd);
    for &i in group {
        for a in args[i] {
            cmd.arg(a);
        }
    }
    match mode {
        Mode::Decide => {}
        Mode::Reserve => {
            cmd.arg("reserve");
        }
        Mode::Peek => {
            cmd.arg("peek");
        }
    }
    cmd
}

/// What a reservation reported for one layer: the effective time it
/// charged at and its mark (see `lua/layered.lua`, mode `reserve`).
type Charged = (u64, u64);

/// Turn a `reserve` reply (7 integers per layer) into verdicts and charges.
fn parse_reserve(reply: &[i64], layers: usize) -> Result<(Verdicts, Vec<Charged>), StoreError> {
    if reply.len() != layers * RESERVE_FIELDS {
        return Err(StoreError::Protocol(format!(
            "the script answered {} integers for {layers} reserved layers",
            reply.len()
        )));
    }
    let mut verdict_fields = Vec::with_capacity(layers * REPLY_FIELDS);
    let mut charges = Vec::with_capacity(layers);
    for chunk in reply.chunks_exact(RESERVE_FIELDS) {
        verdict_fields.extend_from_slice(&chunk[..REPLY_FIELDS]);
        let unsigned = |v: i64| {
            u64::try_from(v)
                .map_err(|_| StoreError::Protocol(format!("the script answered a charge of {v}")))
        };
        charges.push((
            unsigned(chunk[REPLY_FIELDS])?,
            unsigned(chunk[REPLY_FIELDS + 1])?,
        ));
    }
    Ok((parse_reply(&verdict_fields, layers)?, charges))
}

/// Send a script call, resending it only when Redis answered that it did
/// not run it:
///
/// - `MOVED`: to the node named (the client refreshes its slot map meanwhile);
/// - `ASK` (the slot is moving and the keys are on the target): `ASKING` and
///   the call to the target, in one pipeline on one connection;
/// - `TRYAGAIN` (the keys of a multi-key call are split between the two
///   nodes of a moving slot), `CLUSTERDOWN` and `MASTERDOWN` (a failover in
///   progress), `LOADING`, `READONLY` (a stale map sent it to a replica), no
///   connection to the slot's node yet: after a short, growing pause;
/// - `NOSCRIPT` (this node never loaded the script: a promoted replica, the
///   target of a slot move, a flushed cache): the whole script with `EVAL`
///   through the same route, which also caches it on that node.
///
/// Anything else is returned: after an I/O error the call may have run, so
/// it is not resent (a lost reservation is under-admission; a resent one
/// would charge twice). The caller's deadline bounds the loop.
async fn call(mut conn: ClusterConnection, cmd: Cmd) -> Result<Vec<i64>, StoreError> {
    let mut eval: Option<Cmd> = None;
    let mut target: Option<(Redirect, String, u16)> = None;
    let mut pause = Duration::from_millis(1);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let current = eval.as_ref().unwrap_or(&cmd);
        let result = match target.take() {
            None => current.query_async::<Vec<i64>>(&mut conn).await,
            Some((redirect, host, port)) => send_to(&mut conn, current, redirect, host, port).await,
        };
        let e = match result {
            Ok(reply) => return Ok(reply),
            Err(e) => e,
        };
        let wait = match e.kind() {
            ErrorKind::Server(ServerErrorKind::NoScript) if eval.is_none() => {
                eval = Some(eval_of(&cmd));
                false
            }
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => {
                let redirect = if kind == ServerErrorKind::Ask {
                    Redirect::Ask
                } else {
                    Redirect::Moved
                };
                target = e
                    .redirect_node()
                    .and_then(|(addr, _slot)| addr.rsplit_once(':'))
                    .and_then(|(host, port)| {
                        Some((redirect, host.to_string(), port.parse().ok()?))
                    });
                // Redirected again and again (views still converging): slow down.
                attempts > 3
            }
            ErrorKind::Server(
                ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::ReadOnly,
            )
            | ErrorKind::ClusterConnectionNotFound => true,
            _ => return Err(from_redis(e)),
        };
        if wait {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }
}

/// Where a redirection points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redirect {
    Moved,
    Ask,
}

/// Send `cmd` to the node at `host:port`: as is after `MOVED`; after `ASK`
/// behind `ASKING`, in one pipeline so no other request comes between them
/// on the shared connection. A node the client has no connection to yet
/// (it learns the new map in the background) fails with
/// `ClusterConnectionNotFound`, which the caller retries by slot.
async fn send_to(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    redirect: Redirect,
    host: String,
    port: u16,
) -> RedisResult<Vec<i64>> {
    let node = SingleNodeRoutingInfo::ByAddress { host, port };
    let reply = match redirect {
        Redirect::Moved => {
            conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node))
                .await?
        }
        Redirect::Ask => {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            let mut replies = conn.route_pipeline(pipe, 1, 1, node).await?;
            replies.pop().ok_or_else(|| {
                RedisError::from((
                    ErrorKind::Client,
                    "an empty reply to ASKING and a script call",
                ))
            })?
        }
    };
    Ok(redis::from_redis_value(reply.extract_error()?)?)
}

/// `EVAL <script> …` with the arguments of `EVALSHA <sha> …`.
fn eval_of(evalsha: &Cmd) -> Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(SCRIPT);
    for arg in evalsha.args_iter().skip(2) {
        // Script calls hold plain arguments only (no cursor).
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval
}

/// A slot group charged by a reservation.
struct ReservedGroup {
    keys: Vec<String>,
    /// Each layer's script arguments and its charge (at, mark).
    layers: Vec<([u64; LAYER_ARGS], Charged)>,
    /// The layers' indices in the request.
    indices: Vec<usize>,
}

/// The reservations of one decision. Dropped while holding groups (an
/// error, or the caller dropping the decision's future), it refunds them in
/// the background, so a charge is never left behind by a failed decision
/// when the cluster can still take the refund.
struct Reservations {
    conn: ClusterConnection,
    time: TimeArgs,
    timeout: Duration,
    groups: Vec<ReservedGroup>,
}

impl Reservations {
    /// Start one refund per group (concurrently, as spawned tasks bounded
    /// by the deadline) and hand back their handles.
    fn refund(mut self) -> Vec<JoinHandle<()>> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Vec::new();
        };
        std::mem::take(&mut self.groups)
            .into_iter()
            .map(|group| {
                let cmd = refund_call(&group, &self.time);
                let (conn, timeout) = (self.conn.clone(), self.timeout);
                runtime.spawn(async move {
                    // A refund that fails leaves its charge: under-admission
                    // until the state's TTL, never over-admission.
                    let _ = tokio::time::timeout(timeout, call(conn, cmd)).await;
                })
            })
            .collect()
    }
}

impl Drop for Reservations {
    fn drop(&mut self) {
        if !self.groups.is_empty() {
            let held = Reservations {
                conn: self.conn.clone(),
                time: self.time.clone(),
                timeout: self.timeout,
                groups: std::mem::take(&mut self.groups),
            };
            drop(held.refund());
        }
    }
}

/// `EVALSHA … refund` giving back one group's charges. Sent at most once
/// (see [`call`]): a refund is not idempotent.
fn refund_call(group: &ReservedGroup, time: &TimeArgs) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script::sha1()).arg(group.keys.len());
    for key in &group.keys {
        cmd.arg(key);
    }
    time.push(&mut cmd);
    for (args, (at, mark)) in &group.layers {
        for a in args {
            cmd.arg(*a);
        }
        cmd.arg(*at).arg(*mark);
    }
    cmd.arg("refund");
    cmd
}

/// Await `f` for at most `limit`.
async fn within<F: std::future::Future>(limit: Duration, f: F) -> Result<F::Output, StoreError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| StoreError::Timeout(limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_eq!(
            hash_tag(b"foo{}{bar}"),
            b"foo{}{bar}",
            "empty tag: whole key"
        );
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        for key in ["a", "tollgate:{acme}:x", "{}", "{", "}{x}", "p:{t}:{u}"] {
            assert_eq!(
                redis::cluster_routing::Slot::new(hash_slot(key.as_bytes())),
                Some(redis::cluster_routing::Slot::for_key(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn groups_are_in_slot_order_and_keep_layer_order() {
        let keys: Vec<String> = ["p:{b}:1", "p:{a}:1", "p:{b}:2", "p:{a}:2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let groups = slot_groups(&keys);
        assert_eq!(groups.len(), 2);
        let first = hash_slot(keys[groups[0][0]].as_bytes());
        let second = hash_slot(keys[groups[1][0]].as_bytes());
        assert!(first < second);
        for group in &groups {
            assert!(group.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn eval_carries_the_evalsha_arguments() {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg("sha").arg(1).arg("k").arg(5).arg("reserve");
        let eval = eval_of(&cmd);
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        assert_eq!(args[0], b"EVAL");
        assert_eq!(args[1], SCRIPT.as_bytes());
        assert_eq!(
            &args[2..],
            &[
                b"1".to_vec(),
                b"k".to_vec(),
                b"5".to_vec(),
                b"reserve".to_vec()
            ]
        );
    }
}
