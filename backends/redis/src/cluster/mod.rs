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
//! The code reaches every master: [`connect`](RedisClusterStoreBuilder::connect)
//! loads it on all masters (the function library, or the script; see
//! [`engine`](RedisClusterStoreBuilder::engine)), and a node that
//! lacks it (a promoted replica, a node that received a slot, a `FUNCTION
//! FLUSH` or `SCRIPT FLUSH`) gets it on the spot: `FUNCTION LOAD REPLACE`
//! on that node and the `FCALL` once more, or for the script the whole
//! script with `EVAL` through the same route, which caches it there.
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
//! failover, unless the store waits for replicas (`replica_ack`: a `WAIT`
//! on the master of every slot group it charged).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use tokio::time::Instant;
use tollgate_limiter::{
    check_holds, Adjustment, Decide, Hold, LayerRequest, Store, StoreError, Verdict, Verdicts,
};
// A request's concurrency holds (`Holds` here is this store's
// reservations in flight).
use tollgate_limiter::Holds as HeldUnits;
use tollgate_redis_protocol::{parse_renewed, parse_reserve, Charged};

use crate::store::{held_layers, holds_of};

use crate::client::connect_error;
use crate::conflicts;
use crate::engine::{check_load, CallCommand, Runner};
use crate::error::{from_redis, name_conflict, RedisStoreError};
use crate::holds::Holds;
use crate::permissions::{first_refusal, load_and_probe, probe_commands};
use crate::script::{layer_args, parse_reply, with_block, Mode, ScriptCall, LAYER_ARGS};
use crate::settings::{within, CheckedSettings, RedisBuilder};

mod redirects;
mod reservations;
mod slots;
mod strays;

use redirects::call;
use slots::slot_groups;
pub use slots::{hash_slot, SLOT_COUNT};

/// The Redis Cluster store; see the [module docs](self).
#[derive(Clone)]
pub struct RedisClusterStore {
    conn: ClusterConnection,
    /// Connections to nodes the client has none to (a new master).
    strays: Arc<strays::Strays>,
    /// This process's reservations in flight, per key.
    holds: Arc<Holds>,
    checked: CheckedSettings,
}

impl fmt::Debug for RedisClusterStore {
    // The node URLs are left out on purpose: they may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClusterStore")
            .field("checked", &self.checked)
            .finish_non_exhaustive()
    }
}

/// A cluster's initial nodes: what [`RedisClusterStoreBuilder`] holds
/// besides the settings every Redis store takes.
#[derive(Clone)]
pub struct ClusterNodes {
    nodes: Vec<String>,
}

impl fmt::Debug for ClusterNodes {
    // The node URLs are left out on purpose: they may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterNodes")
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

/// Builds a [`RedisClusterStore`]; see [`RedisClusterStore::builder`], and
/// [`RedisBuilder`] for the settings every Redis
/// store takes.
pub type RedisClusterStoreBuilder = RedisBuilder<ClusterNodes>;

impl RedisClusterStoreBuilder {
    /// Connect to the cluster (discovering every node from the initial
    /// ones) and load the code on every master, within the connect
    /// timeout.
    pub async fn connect(self) -> Result<RedisClusterStore, StoreError> {
        let checked = self.settings.checked()?;
        let client = self.client()?;
        let first = self
            .place
            .nodes
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let base = crate::client::connection_info(first, &self.settings)?;
        let strays = Arc::new(strays::Strays::new(base, self.settings.clone()));
        let timeout = self.settings.connect_timeout;
        let conn = within(timeout, client.get_async_connection())
            .await?
            .map_err(connect_error)?;
        let store = RedisClusterStore {
            conn,
            strays,
            holds: Arc::default(),
            checked,
        };
        let preloaded = store.checked.runner.preloaded();
        let (load, probe) = (store.load_code(), store.check_permissions());
        load_and_probe(preloaded, timeout, load, probe).await?;
        Ok(store)
    }

    fn client(&self) -> Result<ClusterClient, StoreError> {
        // Each URL is checked as the standalone store checks its one
        // (rediss:// needs the `tls` feature, TLS settings need rediss://).
        for url in &self.place.nodes {
            crate::client::connection_info(url, &self.settings)?;
        }
        let builder = ClusterClientBuilder::new(self.place.nodes.iter().map(String::as_str));
        #[cfg(feature = "tls")]
        if self
            .place
            .nodes
            .iter()
            .any(|url| crate::client::is_tls_url(url))
        {
            crate::tls::choose_crypto();
        }
        #[cfg(feature = "tls")]
        let builder = match &self.settings.tls {
            Some(tls) => builder.certs(tls.certificates()),
            None => builder,
        };
        builder
            .connection_timeout(self.settings.connect_timeout)
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
        RedisBuilder::new(ClusterNodes {
            nodes: nodes.into_iter().map(Into::into).collect(),
        })
    }

    /// The settings the store decides with: its key prefix, the
    /// Redis key of a layer, its deadline, the engine it found.
    pub fn settings(&self) -> &CheckedSettings {
        &self.checked
    }

    /// Find the fastest way every master offers (the module on all of
    /// them, else functions, else the script) and load the code on every
    /// master: `FUNCTION LOAD REPLACE` of the function library, or `SCRIPT
    /// LOAD` of the script (done by
    /// [`connect`](RedisClusterStoreBuilder::connect); nodes that lack it
    /// later get it at their first call).
    /// Fails with [`StoreError::Timeout`] past the connect timeout.
    pub async fn load_script(&self) -> Result<(), StoreError> {
        within(self.checked.connect_timeout, self.load_code()).await?
    }

    /// [`load_script`](Self::load_script) without its time bound (the
    /// caller bounds it).
    async fn load_code(&self) -> Result<(), StoreError> {
        let runner = &self.checked.runner;
        if runner.preloaded() {
            return self.check_preloaded().await;
        }
        let mut style = runner.first_call_command();
        loop {
            // Every master's own answer (no combined one: a combined
            // answer is one node's), each checked as the standalone store
            // checks its server's.
            let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let sent = self
                .conn
                .clone()
                .route_command(Runner::load_command(style), routing)
                .await
                // A node's refusal (no module, no permission, no
                // functions) comes back inside the answers.
                .and_then(redis::Value::extract_error);
            let answers = match sent {
                Ok(answers) => answers,
                Err(e) => {
                    style = runner.next_style(style, e).map_err(connect_error)?;
                    continue;
                }
            };
            match every_answer(style, answers)? {
                Ok(()) => {
                    runner.settle(style);
                    return Ok(());
                }
                // A module speaking another protocol: the next way may do.
                Err(e) if style == CallCommand::Module => {
                    style = runner.next_style(style, e).map_err(connect_error)?;
                }
                Err(e) => return Err(from_redis(e)),
            }
        }
    }

    /// A preloaded store's check in place of a load: every master has the
    /// library an administrator loads (a call of no layers on each).
    async fn check_preloaded(&self) -> Result<(), StoreError> {
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        self.conn
            .clone()
            .route_command(Runner::preloaded_check(), routing)
            .await
            .and_then(redis::Value::extract_error)
            .map(|_| ())
            .map_err(|e| connect_error(Runner::preloaded_error(e)))
    }

    /// Try every command the store sends (see `permissions`), one at a
    /// time (the probe's keys share one slot, its keyless commands go to
    /// any node): a Redis user without one fails here, with the command
    /// named.
    async fn check_permissions(&self) -> Result<(), StoreError> {
        let mut answers = Vec::new();
        for cmd in probe_commands(&self.checked, self.call_command()) {
            answers.push(
                cmd.query_async::<redis::Value>(&mut self.conn.clone())
                    .await,
            );
        }
        // What only the Cluster store sends: `ASKING` before a call that
        // follows a slot in migration (tried here behind nothing but a
        // `TIME`, so the flag it sets is spent at once), and for the script
        // form `EVAL`, how a node that lacks the script gets it.
        let mut asking = redis::pipe();
        asking.cmd("ASKING").cmd("TIME");
        let answer = self
            .conn
            .clone()
            .route_pipeline(asking, 0, 2, SingleNodeRoutingInfo::Random)
            .await;
        // A refusal comes back inside the pipeline's answers.
        let answer = answer.and_then(|values| {
            values
                .into_iter()
                .try_for_each(|v| v.extract_error().map(drop))
        });
        answers.push(answer.map(|()| redis::Value::Nil));
        if self.call_command() == CallCommand::Evalsha {
            let mut eval = redis::cmd("EVAL");
            eval.arg("return 0").arg(0);
            answers.push(eval.query_async(&mut self.conn.clone()).await);
        }
        first_refusal(&answers)
    }

    /// How calls are sent now.
    fn call_command(&self) -> CallCommand {
        self.checked.runner.call_command()
    }

    /// The store's runner, for a call.
    fn runner(&self) -> Arc<Runner> {
        self.checked.runner.clone()
    }

    /// Await `f` until `deadline`.
    async fn until<F: std::future::Future>(
        &self,
        deadline: Instant,
        f: F,
    ) -> Result<F::Output, StoreError> {
        tokio::time::timeout_at(deadline, f)
            .await
            .map_err(|_| StoreError::Timeout(self.checked.deadline))
    }
}

impl RedisClusterStore {
    /// An operator's write (`Reset` or an adjustment) of every slot group:
    /// across slots every group is peeked first, so data Tollgate did not
    /// write in any of them fails the call before a state is changed; with
    /// `replica_ack`, acknowledged by the replicas.
    async fn write_per_group(
        &self,
        layers: &[LayerRequest<'_>],
        (mode, block): (Mode, Option<u64>),
    ) -> Result<Verdicts, StoreError> {
        let keys: Vec<String> = layers
            .iter()
            .map(|l| self.checked.redis_key(&l.key))
            .collect();
        if slot_groups(&keys).len() > 1 {
            self.per_group(layers, Mode::Peek, None).await?;
        }
        let (verdicts, answered) = self.per_group(layers, mode, block).await?;
        self.acknowledged(&keys, &answered).await.map(|()| verdicts)
    }

    /// With `replica_ack`: `WAIT` after a write to `keys` other than a
    /// decision (a reset, an adjustment, a release, a renewal), on the
    /// nodes that took it (`answered`: those a redirection sent it to).
    async fn acknowledged(
        &self,
        keys: &[String],
        answered: &redirects::Answered,
    ) -> Result<(), StoreError> {
        let Some(ack) = &self.checked.replica_ack else {
            return Ok(());
        };
        let deadline = Instant::now() + self.checked.deadline;
        self.until(
            deadline,
            self.acknowledge(ack, keys, &slot_groups(keys), answered),
        )
        .await?
    }

    /// `WAIT` on the node that took every group's charge, through the
    /// connection its charge went through (a `WAIT` counts the writes of
    /// its own connection): the client's to the slot's master, or, after a
    /// redirection (`answered`), the one the call was redirected through
    /// (the client's, or this store's own to a node the client had none
    /// to: [`strays`]).
    async fn acknowledge(
        &self,
        ack: &crate::replication::ReplicaAck,
        keys: &[String],
        groups: &[Vec<usize>],
        answered: &redirects::Answered,
    ) -> Result<(), StoreError> {
        for group in groups {
            let slot = hash_slot(keys[group[0]].as_bytes());
            let mut conn = self.conn.clone();
            let reply = match answered.node_of(slot) {
                Some((host, port)) => {
                    let (wait, asking) = (ack.command(), strays::Asking::No);
                    let sent = self.strays.send(&mut conn, (&host, port), asking, &wait);
                    sent.await
                }
                None => {
                    let node = Route::new(slot, SlotAddr::Master);
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(node));
                    conn.route_command(ack.command(), route).await
                }
            }
            .map_err(from_redis)?;
            let acknowledged: u64 = redis::from_redis_value(reply)
                .map_err(|e| StoreError::Protocol(format!("WAIT's answer: {e}")))?;
            ack.judge(acknowledged)?;
        }
        Ok(())
    }
}

/// What every call over some layers starts from.
struct Call {
    deadline: Instant,
    args: Vec<[u64; LAYER_ARGS]>,
    time: crate::script::TimeArgs,
    keys: Vec<String>,
    groups: Vec<Vec<usize>>,
    /// Where its groups' calls were answered by redirection.
    answered: redirects::Answered,
}

impl RedisClusterStore {
    /// The deadline, arguments, time, keys and slot groups of a call over
    /// `layers`.
    fn call_of(&self, layers: &[LayerRequest<'_>]) -> Result<Call, StoreError> {
        let keys: Vec<String> = layers
            .iter()
            .map(|l| self.checked.redis_key(&l.key))
            .collect();
        let time = self.checked.time_args()?;
        let now = time.spans_at();
        Ok(Call {
            deadline: Instant::now() + self.checked.deadline,
            args: layers
                .iter()
                .map(|layer| layer_args(layer, now))
                .collect::<Result<Vec<_>, _>>()?,
            time,
            groups: slot_groups(&keys),
            keys,
            answered: redirects::Answered::default(),
        })
    }

    /// A key of another type fails a call without saying which: name its
    /// layer (or time out).
    async fn locate_conflict(
        &self,
        result: Result<Verdicts, StoreError>,
        layers: &[LayerRequest<'_>],
        deadline: Instant,
    ) -> Result<Verdicts, StoreError> {
        match result {
            Err(e) if conflicts::is_unlocated(&e) => {
                let mut conn = self.conn.clone();
                let located = self.until(
                    deadline,
                    conflicts::locate(&mut conn, layers, &self.checked),
                );
                Err(located.await.unwrap_or_else(|timeout| timeout))
            }
            other => other,
        }
    }

    /// Every slot group called in `mode` (`Peek`, `Reset` or an
    /// adjustment; `block`: a block's length in µs), one call per group,
    /// in slot order: the verdicts in layer order, and where the calls
    /// were answered by redirection.
    async fn per_group(
        &self,
        layers: &[LayerRequest<'_>],
        mode: Mode,
        block: Option<u64>,
    ) -> Result<(Verdicts, redirects::Answered), StoreError> {
        let prepared = self.call_of(layers)?;
        let replies = self.replies(&prepared, layers, (mode, block), &[]).await;
        let result = replies.and_then(|replies| {
            let mut verdicts: Vec<Option<Verdict>> = vec![None; layers.len()];
            for (group, reply) in replies {
                for (&i, v) in group.iter().zip(parse_reply(&reply, group.len())?) {
                    verdicts[i] = Some(v);
                }
            }
            Ok(verdicts.into_iter().flatten().collect())
        });
        let verdicts = self
            .locate_conflict(result, layers, prepared.deadline)
            .await?;
        Ok((verdicts, prepared.answered))
    }

    /// One call per slot group of `call` in `mode` (`holds`: each layer's
    /// hold, for a release or renewal), in slot order, until one fails:
    /// each group's layers and reply.
    async fn replies(
        &self,
        prepared: &Call,
        layers: &[LayerRequest<'_>],
        (mode, block): (Mode, Option<u64>),
        holds: &[Hold],
    ) -> Result<Vec<(Vec<usize>, Vec<i64>)>, StoreError> {
        let mut replies = Vec::with_capacity(prepared.groups.len());
        for group in &prepared.groups {
            let reply = self
                .slot_group_reply(prepared, layers, group, (mode, block), holds)
                .await?;
            replies.push((group.clone(), reply));
        }
        Ok(replies)
    }

    /// The reply of one slot `group` of `prepared` in `mode`.
    async fn slot_group_reply(
        &self,
        prepared: &Call,
        layers: &[LayerRequest<'_>],
        group: &[usize],
        (mode, block): (Mode, Option<u64>),
        holds: &[Hold],
    ) -> Result<Vec<i64>, StoreError> {
        let cmd = group_call(
            &prepared.keys,
            &prepared.args,
            group,
            &prepared.time,
            (mode, block),
            holds,
            self.call_command(),
        );
        let answered = Some(&prepared.answered);
        self.until(
            prepared.deadline,
            call(
                self.conn.clone(),
                self.strays.clone(),
                cmd,
                self.runner(),
                answered,
            ),
        )
        .await?
        .map_err(|e| in_group(e, layers, group))
    }
}

impl RedisClusterStore {
    /// Decide `layers` (`mode`: `Decide`, or `Reserve` to learn each
    /// layer's charge): one call on one slot, exactly as the standalone
    /// store decides; across slots, reserved group by group. The charges
    /// are empty unless reserved and admitted.
    async fn charge(
        &self,
        layers: &[LayerRequest<'_>],
        mode: Mode,
    ) -> Result<(Verdicts, Vec<Charged>), StoreError> {
        let prepared = self.call_of(layers)?;
        let result = if let [group] = &prepared.groups[..] {
            self.slot_group_reply(&prepared, layers, group, (mode, None), &[])
                .await
                .and_then(|reply| match mode {
                    Mode::Reserve => parse_reserve(&reply, layers.len()),
                    _ => parse_reply(&reply, layers.len()).map(|v| (v, Vec::new())),
                })
        } else {
            self.decide_across_slots(layers, &prepared).await
        };
        let result = match (result, &self.checked.replica_ack) {
            // Admitted: every group was charged on its master.
            (Ok((verdicts, charges)), Some(ack)) if verdicts.iter().all(|v| v.allowed) => {
                let acked = self
                    .until(
                        prepared.deadline,
                        self.acknowledge(ack, &prepared.keys, &prepared.groups, &prepared.answered),
                    )
                    .await
                    .and_then(|acked| acked);
                if let Err(e) = acked {
                    // Reported failed, no permit will release its holds.
                    if mode == Mode::Reserve {
                        self.give_back_holds(layers, &charges).await;
                    }
                    return Err(e);
                }
                Ok((verdicts, charges))
            }
            (other, _) => other,
        };
        let charges = match &result {
            Ok((_, charges)) => charges.clone(),
            Err(_) => Vec::new(),
        };
        let verdicts = self
            .locate_conflict(result.map(|(v, _)| v), layers, prepared.deadline)
            .await?;
        Ok((verdicts, charges))
    }
}

impl RedisClusterStore {
    /// A reservation that replicas did not acknowledge is reported failed,
    /// so no permit will release its concurrency holds: give them back now
    /// (best effort: a hold this fails to release is forgotten at its
    /// lease's end). Rate layers keep their charge, as any failed
    /// decision's may.
    async fn give_back_holds(&self, layers: &[LayerRequest<'_>], charges: &[Charged]) {
        let (held_layers, holds) = held_layers(layers, charges);
        if !holds.is_empty() {
            let _ = Store::release(self, &held_layers, &holds).await;
        }
    }
}

/// The call deciding the layers of `group` (all on one slot) in `mode`
/// (`block`: a block's length in µs; `holds`: each layer's hold, for a
/// release or renewal), sent as `style`.
fn group_call(
    keys: &[String],
    args: &[[u64; LAYER_ARGS]],
    group: &[usize],
    time: &crate::script::TimeArgs,
    (mode, block): (Mode, Option<u64>),
    holds: &[Hold],
    style: CallCommand,
) -> redis::Cmd {
    let mut script = ScriptCall::new(style, group.iter().map(|&i| keys[i].as_str()), time);
    for &i in group {
        script = script.layer(&with_block(args[i], block));
        if let Some(hold) = holds.get(i) {
            script = script.layer(&[hold.at, 0]);
        }
    }
    script.mode(mode)
}

#[async_trait]
impl Store for RedisClusterStore {
    fn kind(&self) -> &'static str {
        "redis-cluster"
    }

    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        Decide::later(verdicts, async move {
            if layers.is_empty() {
                return Ok(Verdicts::new());
            }
            self.charge(layers, Mode::Decide).await.map(|(v, _)| v)
        })
    }

    /// As a decision; a concurrency layer's charge is its hold.
    async fn acquire(
        &self,
        layers: &[LayerRequest<'_>],
    ) -> Result<(Verdicts, HeldUnits), StoreError> {
        if layers.is_empty() {
            return Ok((Verdicts::new(), HeldUnits::new()));
        }
        let (verdicts, charges) = self.charge(layers, Mode::Reserve).await?;
        Ok((verdicts, holds_of(layers, &charges)))
    }

    /// Atomic per slot group (each group's holds are given back in one
    /// call); with `replica_ack`, acknowledged by the replicas.
    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        check_holds(layers, holds)?;
        let prepared = self.call_of(layers)?;
        // Every group is given back, whatever another answered: sent
        // together, so that a slow master's group does not use up the
        // deadline of the groups after it (which were then dropped
        // unsent, their places kept until their lease ran out).
        let replies = join_all(prepared.groups.iter().map(|group| {
            self.slot_group_reply(&prepared, layers, group, (Mode::Refund, None), holds)
        }));
        let mut failed = Ok(());
        let mut answered = Vec::new();
        for (group, reply) in prepared.groups.iter().zip(replies.await) {
            match reply {
                Ok(_) => answered.extend(group.iter().map(|&i| prepared.keys[i].clone())),
                Err(e) => failed = Err(e),
            }
        }
        failed.and(self.acknowledged(&answered, &prepared.answered).await)
    }

    /// Atomic per slot group. A group whose call failed keeps the holds it
    /// had (its entries did not move, unless the call ran after its
    /// deadline); the call fails only when every group did, or, with
    /// `replica_ack`, when the replicas did not acknowledge it.
    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<HeldUnits, StoreError> {
        check_holds(layers, holds)?;
        let prepared = self.call_of(layers)?;
        // Sent together, as a release's groups are.
        let replies = join_all(prepared.groups.iter().map(|group| {
            self.slot_group_reply(&prepared, layers, group, (Mode::Renew, None), holds)
        }));
        let (renewed, answered, failure) = renewed_by_group(&prepared.groups, replies.await, holds);
        let answered: Vec<String> = answered.iter().map(|&i| prepared.keys[i].clone()).collect();
        match failure {
            Some(e) if answered.is_empty() => Err(e),
            // A renewal a failover could undo would let a second holder
            // in while the first still works: acknowledged first.
            _ => self
                .acknowledged(&answered, &prepared.answered)
                .await
                .map(|()| renewed),
        }
    }

    /// One call per slot group, each judged without a charge.
    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        self.per_group(layers, Mode::Peek, None)
            .await
            .map(|(verdicts, _)| verdicts)
    }

    /// Atomic per slot group. Across slots, every group is peeked first,
    /// so data Tollgate did not write in any of them fails the reset
    /// before a key is removed.
    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        if layers.is_empty() {
            return Ok(());
        }
        self.write_per_group(layers, (Mode::Reset, None))
            .await
            .map(drop)
    }

    /// Atomic per slot group, as [`reset`](Store::reset) is: across
    /// slots every group is peeked first, so data Tollgate did not write
    /// in any of them fails the call before a state is changed.
    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        if layers.is_empty() {
            return Ok(Verdicts::new());
        }
        self.write_per_group(layers, Mode::of(adjustment)?).await
    }
}

/// The holds after a renewal whose slot `groups` answered `replies`: each
/// answered group's holds as its reply says, each other group's as they
/// were (a call that failed, or whose reply cannot be read, moved nothing
/// this store can know of); with the layers of the groups that answered,
/// and the last failure. (A reply that could not be read ended the
/// renewal before: the groups answered before it lost their new holds,
/// and their places were kept by nobody until their lease ran out.)
fn renewed_by_group(
    groups: &[Vec<usize>],
    replies: Vec<Result<Vec<i64>, StoreError>>,
    holds: &[Hold],
) -> (HeldUnits, Vec<usize>, Option<StoreError>) {
    let mut renewed: HeldUnits = holds.iter().copied().map(Some).collect();
    let (mut answered, mut failure) = (Vec::new(), None);
    for (group, reply) in groups.iter().zip(replies) {
        let costs: Vec<u64> = group.iter().map(|&i| holds[i].cost).collect();
        match reply.and_then(|reply| parse_renewed(&reply, &costs)) {
            Ok(moved) => {
                for (&i, hold) in group.iter().zip(moved) {
                    renewed[i] = hold;
                }
                answered.extend_from_slice(group);
            }
            Err(e) => failure = Some(e),
        }
    }
    (renewed, answered, failure)
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

/// Every master's answer to the load command of `style` (a map of node to
/// answer), checked: the first mismatch, or `Ok`. An answer that is not
/// text is a protocol error.
fn every_answer(
    style: CallCommand,
    answers: redis::Value,
) -> Result<redis::RedisResult<()>, StoreError> {
    let redis::Value::Map(answers) = answers else {
        return Err(StoreError::Protocol(format!(
            "loading the code: expected one answer per master, got {answers:?}"
        )));
    };
    for (_, answer) in answers {
        let answer: String = redis::from_redis_value(answer)
            .map_err(|e| StoreError::Protocol(format!("loading the code: {e}")))?;
        if let Err(e) = check_load(style, &answer) {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose reply cannot be read keeps its holds; the groups
    /// that answered keep their new ones, before it as after it.
    #[test]
    fn a_bad_reply_loses_no_other_groups_renewal() {
        let hold = |at| Hold { cost: 1, at };
        let holds = [hold(10), hold(20), hold(30)];
        let groups = [vec![0], vec![1], vec![2]];
        let replies = vec![
            Ok(vec![11]),
            Ok(vec![21, 99]),
            Err(StoreError::Timeout(std::time::Duration::from_millis(50))),
        ];
        let (renewed, answered, failure) = renewed_by_group(&groups, replies, &holds);
        assert_eq!(
            renewed.to_vec(),
            [Some(hold(11)), Some(hold(20)), Some(hold(30))]
        );
        assert_eq!(answered, [0]);
        assert!(
            matches!(failure, Some(StoreError::Timeout(_))),
            "{failure:?}"
        );
        let lost = renewed_by_group(&groups[..1], vec![Ok(vec![0])], &holds[..1]);
        assert_eq!(lost.0.to_vec(), [None], "a lost hold is answered lost");
    }
}
