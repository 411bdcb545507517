//! A real Redis Cluster for tests: three masters and three replicas.
//!
//! [`RedisCluster::start`] runs six `redis-server` processes (each a
//! [`RedisServer`]: free loopback port, own temporary directory, no
//! persistence, the same watchdog, so no process outlives the test process)
//! with `--cluster-enabled yes` and a one-second node timeout, then forms the
//! cluster by hand over plain TCP — `CLUSTER SET-CONFIG-EPOCH`, `ADDSLOTS`,
//! `MEET`, `REPLICATE` — so only `redis-server` is needed (no `redis-cli`,
//! no Ruby). It returns once every node reports `cluster_state:ok`, knows all
//! six nodes and their roles, and every replica's link to its master is up.
//!
//! Masters are nodes 0, 1 and 2 (slots `0-5460`, `5461-10921`,
//! `10922-16383`); node `3 + i` replicates master `i`.
//!
//! Fault and resharding helpers:
//!
//! - [`kill`](RedisCluster::kill) sends `SIGKILL` to a node;
//!   [`wait_for_failover`](RedisCluster::wait_for_failover) polls until a
//!   replica of a dead master owns its slots and the cluster is `ok` again
//!   (automatic failover: `CLUSTER FAILOVER` cannot run on a dead master);
//! - [`begin_migration`](RedisCluster::begin_migration) moves one slot in
//!   the steps Redis defines (`SETSLOT IMPORTING` / `MIGRATING`, `MIGRATE`
//!   of the keys, `SETSLOT NODE`), so a test can send traffic between them
//!   and see `ASK` and then `MOVED` redirections;
//!   [`migrate_slot`](RedisCluster::migrate_slot) does all steps at once.
//!
//! When `redis-server` is missing, starting a cluster panics at once with
//! the command that installs it, like [`RedisServer`].
//!
//! ```no_run
//! use tollgate_testkit::redis_cluster::RedisCluster;
//!
//! let cluster = RedisCluster::start();
//! let urls = cluster.urls(); // every node, "redis://127.0.0.1:<port>/"
//! let slot = cluster.keyslot("{acme}:x");
//! let master = cluster.master_for_slot(slot);
//! # let _ = (urls, master);
//! ```

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::redis_server::{RedisServer, INSTALL_HINT, SERVER_ENV};
use crate::resp::call;
pub use crate::resp::Reply;
use crate::tls_certificates::TestCertificates;

/// Masters in a cluster from [`RedisCluster::start`].
pub const MASTERS: usize = 3;
/// Hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16_384;
/// The `cluster-node-timeout` of every node, in milliseconds: how long a
/// master may be unreachable before it is marked failing and its replica
/// takes over. Short, so failover tests stay short.
pub const NODE_TIMEOUT_MS: u64 = 1_000;

/// How long forming the cluster, a failover or a slot move may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How often conditions are polled.
const POLL: Duration = Duration::from_millis(20);
/// Attempts to start one node when its cluster bus port was taken between
/// choosing it and the server binding it.
const NODE_ATTEMPTS: usize = 3;

/// One node of the cluster.
pub struct ClusterNode {
    server: RedisServer,
    id: String,
    bus_port: u16,
    killed: bool,
}

impl fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterNode")
            .field("url", &self.server.url())
            .field("id", &self.id)
            .field("killed", &self.killed)
            .finish()
    }
}

impl ClusterNode {
    /// The node's `redis://127.0.0.1:<port>/` URL.
    pub fn url(&self) -> &str {
        self.server.url()
    }

    /// The node's loopback address.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The node's client port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The node's cluster bus port.
    pub fn bus_port(&self) -> u16 {
        self.bus_port
    }

    /// The node's cluster node id (40 hex characters).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The `redis-server` behind the node (pid, directory, log).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// Whether [`RedisCluster::kill`] killed this node.
    pub fn is_killed(&self) -> bool {
        self.killed
    }
}

/// A running 3-master, 3-replica Redis Cluster, stopped on drop.
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl RedisCluster {
    /// Start six nodes and form a cluster of three masters with one replica
    /// each; returns when the cluster is ready (see the [module docs](self)).
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message gives the install
    /// command), or the cluster is not ready within 30 seconds.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(None, &[])
    }

    /// The same cluster with TLS everywhere: every node also listens with
    /// TLS (see [`tls_urls`](RedisCluster::tls_urls)), presenting `certs`'
    /// server certificate and asking clients for one signed by its CA
    /// (Redis's default), and the cluster bus and replication run over TLS
    /// (`tls-cluster`, `tls-replication`). The harness itself forms the
    /// cluster over the plain ports.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisCluster::start).
    pub fn start_tls(certs: &TestCertificates) -> RedisCluster {
        RedisCluster::start_with(Some(certs), &[])
    }

    /// The cluster of [`start`](RedisCluster::start) with `extra`
    /// `redis-server` arguments on every node.
    pub(crate) fn start_with_extra(extra: &[&str]) -> RedisCluster {
        RedisCluster::start_with(None, extra)
    }

    fn start_with(tls: Option<&TestCertificates>, extra: &[&str]) -> RedisCluster {
        let new_enough = check_binary();
        let servers: Vec<(RedisServer, u16)> = (0..2 * MASTERS)
            .map(|_| start_node(new_enough, tls, extra))
            .collect();
        let mut nodes = Vec::with_capacity(servers.len());
        for (i, (server, bus_port)) in servers.into_iter().enumerate() {
            let id = call_text(server.addr(), &["CLUSTER", "MYID"]);
            // Distinct epochs up front: no epoch collisions to resolve later.
            let epoch = (i + 1).to_string();
            call_ok(server.addr(), &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
            nodes.push(ClusterNode {
                server,
                id,
                bus_port,
                killed: false,
            });
        }
        let cluster = RedisCluster { nodes };
        cluster.form(new_enough);
        cluster
    }

    /// The process-wide cluster shared by every test of this process that
    /// only needs isolation by key prefix. Started on first use, stopped when
    /// the process exits. Tests that kill nodes must
    /// [`start`](RedisCluster::start) their own; moving a slot whose keys
    /// only the test itself uses is fine.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: OnceLock<RedisCluster> = OnceLock::new();
        SHARED.get_or_init(RedisCluster::start)
    }

    fn form(&self, new_enough: bool) {
        let ranges = slot_ranges();
        for (master, (start, end)) in self.nodes[..MASTERS].iter().zip(ranges) {
            let mut args = vec!["CLUSTER".to_string(), "ADDSLOTS".to_string()];
            args.extend((start..=end).map(|s| s.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            call_ok(master.addr(), &args);
        }
        let first = self.nodes[0].addr();
        for node in &self.nodes[1..] {
            let port = node.port().to_string();
            let bus = node.bus_port.to_string();
            let mut meet = vec!["CLUSTER", "MEET", "127.0.0.1", &port];
            if new_enough {
                meet.push(&bus);
            }
            call_ok(first, &meet);
        }
        // A replica can only follow a master it knows.
        self.wait_until("every node knows every other node", || self.all_met());
        for (i, replica) in self.nodes[MASTERS..].iter().enumerate() {
            call_ok(replica.addr(), &["CLUSTER", "REPLICATE", &self.nodes[i].id]);
        }
        self.wait_until("the cluster is ok with every replica in sync", || {
            self.is_settled()
        });
    }

    /// Whether every live node knows every node, none still in handshake.
    fn all_met(&self) -> bool {
        self.live().all(|n| {
            let table = nodes_table(n.addr());
            table.len() == self.nodes.len()
                && table
                    .iter()
                    .all(|e| !e.has_flag("handshake") && !e.has_flag("noaddr"))
        })
    }

    /// Whether every live node says `cluster_state:ok`, sees every master and
    /// replica in its role, and every live replica's link is up.
    fn is_settled(&self) -> bool {
        self.live().all(|node| {
            let info = info_map(&call_text(node.addr(), &["CLUSTER", "INFO"]));
            if info.get("cluster_state").map(String::as_str) != Some("ok")
                || info.get("cluster_slots_assigned").map(String::as_str) != Some("16384")
            {
                return false;
            }
            let table = nodes_table(node.addr());
            let masters = table
                .iter()
                .filter(|e| e.has_flag("master") && !e.has_flag("fail") && !e.slots.is_empty())
                .count();
            let replicas_known = self
                .live()
                .filter(|n| {
                    table
                        .iter()
                        .any(|e| e.id == n.id && e.has_flag("slave") && !e.has_flag("fail"))
                })
                .count();
            let live_replicas = self.live().count() - masters;
            let me = table.iter().find(|e| e.has_flag("myself"));
            let synced = match me {
                Some(e) if e.has_flag("slave") => {
                    let repl = info_map(&call_text(node.addr(), &["INFO", "replication"]));
                    repl.get("master_link_status").map(String::as_str) == Some("up")
                        && repl.get("master_sync_in_progress").map(String::as_str) != Some("1")
                }
                _ => true,
            };
            masters == MASTERS && replicas_known == live_replicas && synced
        })
    }

    /// Poll `condition` until it holds; panic after 30 seconds.
    fn wait_until(&self, what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !condition() {
            if Instant::now() > deadline {
                panic!("the test cluster: {what} did not happen within {SETTLE_TIMEOUT:?}; nodes: {self:?}");
            }
            std::thread::sleep(POLL);
        }
    }

    fn live(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes.iter().filter(|n| !n.killed)
    }

    /// Every node, in start order (masters 0–2, then their replicas 3–5;
    /// roles change after a failover: see [`master_for_slot`](RedisCluster::master_for_slot)).
    pub fn nodes(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// Every node's TLS URL (`rediss://127.0.0.1:<tls port>/`) for a
    /// cluster from [`start_tls`](RedisCluster::start_tls); empty otherwise.
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.server.tls_url())
            .collect()
    }

    /// Every node's URL, killed ones included (a client's list of initial
    /// nodes).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url().to_string()).collect()
    }

    /// Send one command to node `node` and return its reply (a Redis error
    /// is `Ok(Reply::Error)`; `Err` is a connection failure).
    pub fn command(&self, node: usize, args: &[&str]) -> Result<Reply, String> {
        call(self.nodes[node].addr(), args).map_err(|e| e.to_string())
    }

    /// The hash slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let node = self.live().next().expect("a live node");
        match call(node.addr(), &["CLUSTER", "KEYSLOT", key]) {
            Ok(Reply::Int(slot)) => u16::try_from(slot).expect("a slot number"),
            other => panic!("CLUSTER KEYSLOT answered {other:?}"),
        }
    }

    /// The index of the node that serves `slot` now, as a live master sees it.
    ///
    /// # Panics
    ///
    /// When no live node reports an owner (the cluster is down).
    pub fn master_for_slot(&self, slot: u16) -> usize {
        for node in self.live() {
            let table = nodes_table(node.addr());
            if let Some(owner) = table
                .iter()
                .find(|e| e.has_flag("master") && !e.has_flag("fail") && e.owns(slot))
            {
                if let Some(i) = self.index_of(&owner.id) {
                    return i;
                }
            }
        }
        panic!("no live node reports an owner of slot {slot}: {self:?}")
    }

    /// The index of the live replica following master `master`, if any.
    pub fn replica_of(&self, master: usize) -> Option<usize> {
        let master_id = &self.nodes[master].id;
        let node = self.live().next()?;
        nodes_table(node.addr())
            .into_iter()
            .find(|e| e.has_flag("slave") && &e.master == master_id && !e.has_flag("fail"))
            .and_then(|e| self.index_of(&e.id))
            .filter(|&i| !self.nodes[i].killed)
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    /// A slot that master `master` serves now (its first one).
    pub fn slot_of_master(&self, master: usize) -> u16 {
        let node = self.live().next().expect("a live node");
        nodes_table(node.addr())
            .into_iter()
            .find(|e| e.id == self.nodes[master].id)
            .and_then(|e| e.slots.first().map(|&(start, _)| start))
            .unwrap_or_else(|| panic!("node {master} serves no slot"))
    }

    /// Kill node `node` with `SIGKILL` (no shutdown, no goodbye to the other
    /// nodes: a crash) and wait until it no longer answers.
    pub fn kill(&mut self, node: usize) {
        self.nodes[node].server.kill();
        self.nodes[node].killed = true;
        let server = &self.nodes[node].server;
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while server.is_up() {
            assert!(Instant::now() < deadline, "node {node} still answers");
            std::thread::sleep(POLL);
        }
    }

    /// Wait until the slots of dead master `dead` are served by a live node
    /// and every live node says `cluster_state:ok`; returns the new master's
    /// index and how long the wait took.
    ///
    /// # Panics
    ///
    /// When that does not happen within 30 seconds.
    pub fn wait_for_failover(&self, dead: usize, slot: u16) -> (usize, Duration) {
        let started = Instant::now();
        let mut promoted = None;
        self.wait_until("a replica takes over the dead master's slots", || {
            let owners: Vec<Option<usize>> = self
                .live()
                .map(|n| {
                    nodes_table(n.addr())
                        .iter()
                        .find(|e| e.has_flag("master") && !e.has_flag("fail") && e.owns(slot))
                        .and_then(|e| self.index_of(&e.id))
                })
                .collect();
            let agreed = owners
                .first()
                .copied()
                .flatten()
                .filter(|&o| o != dead && owners.iter().all(|&x| x == Some(o)));
            let ok = self.live().all(|n| {
                info_map(&call_text(n.addr(), &["CLUSTER", "INFO"]))
                    .get("cluster_state")
                    .map(String::as_str)
                    == Some("ok")
            });
            promoted = agreed;
            agreed.is_some() && ok
        });
        (promoted.expect("a new master"), started.elapsed())
    }

    /// Start one more node and join it as a master that owns no slot, as
    /// when a cluster is scaled out: until a slot moves onto it, no slot
    /// map names it. Returns its index; the cluster's other nodes keep
    /// theirs. (For a cluster from [`start`](RedisCluster::start): the new
    /// node listens without TLS.)
    ///
    /// # Panics
    ///
    /// When the node does not start, or the others do not all know it
    /// within 30 seconds.
    pub fn add_master(&mut self) -> usize {
        let new_enough = check_binary();
        let (server, bus_port) = start_node(new_enough, None, &[]);
        let id = call_text(server.addr(), &["CLUSTER", "MYID"]);
        let epoch = (self.nodes.len() + 1).to_string();
        call_ok(server.addr(), &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
        let (port, bus) = (server.port().to_string(), bus_port.to_string());
        let mut meet = vec!["CLUSTER", "MEET", "127.0.0.1", &port];
        if new_enough {
            meet.push(&bus);
        }
        let known = self.live().next().expect("a live node").addr();
        call_ok(known, &meet);
        self.nodes.push(ClusterNode {
            server,
            id,
            bus_port,
            killed: false,
        });
        let added = self.nodes.len() - 1;
        self.wait_until("every node knows the new master, and it the slots", || {
            let info = info_map(&call_text(self.nodes[added].addr(), &["CLUSTER", "INFO"]));
            info.get("cluster_state").map(String::as_str) == Some("ok") && self.all_met()
        });
        added
    }

    /// Start moving `slot` to node `to`: `SETSLOT IMPORTING` on `to`, then
    /// `SETSLOT MIGRATING` on the current owner. Until
    /// [`SlotMigration::finish`], keys still on the owner are served there
    /// and others are redirected to `to` with `ASK`.
    pub fn begin_migration(&self, slot: u16, to: usize) -> SlotMigration<'_> {
        let from = self.master_for_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let slot_text = slot.to_string();
        call_ok(
            self.nodes[to].addr(),
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_text,
                "IMPORTING",
                &self.nodes[from].id,
            ],
        );
        call_ok(
            self.nodes[from].addr(),
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_text,
                "MIGRATING",
                &self.nodes[to].id,
            ],
        );
        SlotMigration {
            cluster: self,
            slot,
            from,
            to,
        }
    }

    /// Move `slot` to node `to` in one go (every step of
    /// [`begin_migration`](RedisCluster::begin_migration)).
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        self.begin_migration(slot, to).finish();
    }
}

/// A slot being moved between two masters; see
/// [`RedisCluster::begin_migration`].
#[derive(Debug)]
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the node the slot leaves.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the node the slot goes to.
    pub fn to(&self) -> usize {
        self.to
    }

    /// `MIGRATE` up to `batch` of the slot's keys still on the source (all of
    /// them in one atomic `MIGRATE … KEYS`); returns how many moved.
    pub fn move_keys(&self, batch: usize) -> usize {
        let from = self.cluster.nodes[self.from].addr();
        let slot = self.slot.to_string();
        let count = batch.to_string();
        let keys = match call(from, &["CLUSTER", "GETKEYSINSLOT", &slot, &count]) {
            Ok(Reply::Array(Some(keys))) => keys,
            other => panic!("CLUSTER GETKEYSINSLOT answered {other:?}"),
        };
        let keys: Vec<String> = keys.iter().filter_map(Reply::text).collect();
        if keys.is_empty() {
            return 0;
        }
        let port = self.cluster.nodes[self.to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        match call(from, &args) {
            Ok(Reply::Status(s)) if s == "OK" || s == "NOKEY" => keys.len(),
            other => panic!("MIGRATE answered {other:?}"),
        }
    }

    /// Move every remaining key, then give the slot to the target
    /// (`SETSLOT NODE` on the target, the source and the other masters) and
    /// wait until every live node agrees; clients with the old map now get
    /// `MOVED`.
    pub fn finish(self) {
        while self.move_keys(100) > 0 {}
        let slot = self.slot.to_string();
        let to_id = self.cluster.nodes[self.to].id.clone();
        let masters: Vec<usize> = {
            let node = self.cluster.live().next().expect("a live node");
            nodes_table(node.addr())
                .iter()
                .filter(|e| e.has_flag("master") && !e.has_flag("fail"))
                .filter_map(|e| self.cluster.index_of(&e.id))
                .collect()
        };
        // The target first: it bumps its epoch, so its claim wins gossip.
        let mut order = vec![self.to, self.from];
        order.extend(
            masters
                .into_iter()
                .filter(|&m| m != self.to && m != self.from),
        );
        for node in order {
            call_ok(
                self.cluster.nodes[node].addr(),
                &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id],
            );
        }
        let (cluster, target) = (self.cluster, self.slot);
        cluster.wait_until("every node agrees on the moved slot", || {
            cluster.live().all(|n| {
                nodes_table(n.addr())
                    .iter()
                    .any(|e| e.id == to_id && e.owns(target) && e.migrating.is_empty())
                    && nodes_table(n.addr()).iter().all(|e| e.migrating.is_empty())
            })
        });
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeEntry {
    id: String,
    flags: Vec<String>,
    /// The master's id for a replica, `-` otherwise.
    master: String,
    /// Served slot ranges, inclusive.
    slots: Vec<(u16, u16)>,
    /// `[slot->-id]` / `[slot-<-id]` entries (only on the nodes involved).
    migrating: Vec<String>,
}

impl NodeEntry {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| a <= slot && slot <= b)
    }
}

/// Parse `CLUSTER NODES`:
/// `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`.
fn parse_nodes(text: &str) -> Vec<NodeEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let mut slots = Vec::new();
            let mut migrating = Vec::new();
            for s in &fields[8..] {
                if s.starts_with('[') {
                    migrating.push((*s).to_string());
                } else if let Some((a, b)) = s.split_once('-') {
                    slots.push((a.parse().ok()?, b.parse().ok()?));
                } else {
                    let n = s.parse().ok()?;
                    slots.push((n, n));
                }
            }
            Some(NodeEntry {
                id: fields[0].to_string(),
                flags: fields[2].split(',').map(str::to_string).collect(),
                master: fields[3].to_string(),
                slots,
                migrating,
            })
        })
        .collect()
}

fn nodes_table(addr: SocketAddr) -> Vec<NodeEntry> {
    match call(addr, &["CLUSTER", "NODES"]) {
        Ok(reply) => parse_nodes(&reply.text().unwrap_or_default()),
        Err(_) => Vec::new(),
    }
}

/// `key:value` lines (`INFO`, `CLUSTER INFO`) as a map.
fn info_map(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The three masters' slot ranges, inclusive, as `redis-cli --cluster create`
/// splits them.
fn slot_ranges() -> [(u16, u16); MASTERS] {
    [(0, 5460), (5461, 10921), (10922, SLOTS - 1)]
}

/// Check that `redis-server` runs (panicking with the install command when
/// not) and whether it is 7.0 or later (`cluster-port`, `MEET … <bus port>`).
fn check_binary() -> bool {
    static CHECKED: OnceLock<bool> = OnceLock::new();
    *CHECKED.get_or_init(|| {
        let binary = std::env::var(SERVER_ENV).unwrap_or_else(|_| "redis-server".to_string());
        let out = match Command::new(&binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => out,
            Ok(out) => panic!(
                "`{binary} --version` failed ({}); the Redis Cluster tests need a working \
                 redis-server. Install it with: {INSTALL_HINT}",
                out.status
            ),
            Err(e) => panic!(
                "redis-server was not found ({binary}: {e}); the Redis Cluster tests start real \
                 redis-server processes and are never skipped. Install it with: {INSTALL_HINT} \
                 (or set {SERVER_ENV} to its path)"
            ),
        };
        // "Redis server v=7.0.15 sha=…"
        let text = String::from_utf8_lossy(&out.stdout);
        let major = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse::<u32>().ok())
            .unwrap_or(0);
        major >= 7
    })
}

/// Start one cluster-enabled node; returns it and its bus port.
///
/// Redis 7 takes the bus port as `--cluster-port` (a free port chosen here:
/// the default, port + 10000, is out of range for the upper ephemeral
/// ports); older servers use port + 10000, and the harness's own retries
/// skip ports whose bus port does not exist.
fn start_node(
    new_enough: bool,
    tls: Option<&TestCertificates>,
    extra: &[&str],
) -> (RedisServer, u16) {
    let timeout = NODE_TIMEOUT_MS.to_string();
    let mut last_panic = None;
    for _ in 0..NODE_ATTEMPTS {
        let bus = free_port();
        let bus_text = bus.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            &timeout,
            // Relative to the node's own working directory.
            "--cluster-config-file",
            "nodes.conf",
        ];
        if new_enough {
            args.extend(["--cluster-port", &bus_text]);
        }
        // The only expected failure is the bus port being taken meanwhile;
        // RedisServer panics on a failed start, so catch that and retry.
        if tls.is_some() {
            args.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        }
        args.extend_from_slice(extra);
        let start = || match tls {
            Some(certs) => RedisServer::start_tls(certs, &args),
            None => RedisServer::start_with_args(&args),
        };
        match std::panic::catch_unwind(start) {
            Ok(server) => {
                let bus = if new_enough {
                    bus
                } else {
                    server.port() + 10_000
                };
                return (server, bus);
            }
            Err(panic) => last_panic = Some(panic),
        }
    }
    std::panic::resume_unwind(last_panic.expect("at least one attempt"))
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
        .port()
}

/// The reply's text; panics on errors (harness setup must not fail quietly).
fn call_text(addr: SocketAddr, args: &[&str]) -> String {
    match call(addr, args) {
        Ok(Reply::Error(e)) => panic!("{} on {addr} failed: {e}", args.join(" ")),
        Ok(reply) => reply.text().unwrap_or_default(),
        Err(e) => panic!("{} on {addr} failed: {e}", args.join(" ")),
    }
}

fn call_ok(addr: SocketAddr, args: &[&str]) {
    let text = call_text(addr, args);
    assert!(
        text == "OK",
        "{} on {addr} answered {text:?}",
        args.first().copied().unwrap_or_default()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 7000 [93->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert!(nodes[0].has_flag("slave"));
        assert_eq!(nodes[0].master, nodes[2].id);
        assert!(nodes[1].owns(5461) && nodes[1].owns(10922) && !nodes[1].owns(5460));
        assert!(nodes[2].has_flag("myself") && nodes[2].owns(7000) && !nodes[2].owns(7001));
        assert_eq!(nodes[2].migrating.len(), 1);
    }

    #[test]
    fn the_ranges_cover_every_slot_once() {
        let ranges = slot_ranges();
        assert_eq!(ranges[0].0, 0);
        assert_eq!(ranges[MASTERS - 1].1, SLOTS - 1);
        for w in ranges.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0);
        }
    }
}
