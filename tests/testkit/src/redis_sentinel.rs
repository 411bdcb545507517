//! Redis Sentinel for tests: a primary, one replica and three sentinels,
//! each a [`RedisServer`] on a free loopback port (same watchdog, so no
//! process outlives the test process).
//!
//! The sentinels monitor the primary as [`SERVICE`] with a quorum of two,
//! declare it down after [`DOWN_AFTER_MS`] and fail over to the replica.
//! [`start`](RedisSentinels::start) returns once the replica's link is up
//! and every sentinel knows the replica and the other sentinels, so a
//! failover can start at once.
//!
//! ```no_run
//! use tollgate_testkit::redis_sentinel::RedisSentinels;
//!
//! let group = RedisSentinels::start();
//! let sentinels = group.sentinel_urls(); // "redis://127.0.0.1:<port>/" each
//! group.primary().kill();
//! let promoted = group.wait_for_failover();
//! # let _ = (sentinels, promoted);
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;
use crate::resp::{call, Reply};
use crate::tls_certificates::TestCertificates;

/// The name the sentinels monitor the primary under.
pub const SERVICE: &str = "tollgate-test";
/// How long the primary may be unreachable before the sentinels agree it
/// is down (`down-after-milliseconds`). Short, so failover tests are short.
pub const DOWN_AFTER_MS: u64 = 500;
/// How long forming the group or a failover may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A primary, a replica and three sentinels.
#[derive(Debug)]
pub struct RedisSentinels {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinels {
    /// Start the five processes; returns when a failover could start.
    ///
    /// # Panics
    ///
    /// When `redis-server` is missing (with the install command) or the
    /// group does not settle within 30 seconds.
    pub fn start() -> RedisSentinels {
        RedisSentinels::start_with_args(&[])
    }

    /// The same, with `extra` arguments for the primary and the replica
    /// (TLS, ACL users, …).
    ///
    /// # Panics
    ///
    /// As [`start`](RedisSentinels::start).
    pub fn start_with_args(extra: &[&str]) -> RedisSentinels {
        RedisSentinels::start_with(extra, None)
    }

    /// The same group speaking TLS everywhere: the primary, the replica and
    /// the sentinels also listen with TLS, presenting `certs`' server
    /// certificate and asking clients for one signed by its CA;
    /// replication and the sentinels' links run over TLS, and the
    /// sentinels name the TLS ports (see
    /// [`tls_sentinel_urls`](RedisSentinels::tls_sentinel_urls)).
    ///
    /// # Panics
    ///
    /// As [`start`](RedisSentinels::start).
    pub fn start_tls(certs: &TestCertificates) -> RedisSentinels {
        RedisSentinels::start_with(&[], Some(certs))
    }

    fn start_with(extra: &[&str], tls: Option<&TestCertificates>) -> RedisSentinels {
        let start = |args: &[&str], config: Option<&str>| match tls {
            Some(certs) => RedisServer::start_tls_configured(certs, args, config),
            None => RedisServer::start_configured(args, config),
        };
        // Replicas sync at once instead of waiting for other replicas.
        let mut args = vec!["--repl-diskless-sync-delay", "0"];
        if tls.is_some() {
            args.extend(["--tls-replication", "yes"]);
        }
        args.extend_from_slice(extra);
        let primary = start(&args, None);
        let port = client_port(&primary).to_string();
        let mut replica_args = args.clone();
        replica_args.extend(["--replicaof", "127.0.0.1", &port]);
        let replica = start(&replica_args, None);
        let config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {SERVICE} 10000\n\
             sentinel parallel-syncs {SERVICE} 1\n"
        );
        let mut sentinel_args = vec!["--sentinel"];
        if tls.is_some() {
            // The sentinels' own links to the servers (and to each other).
            sentinel_args.extend(["--tls-replication", "yes"]);
        }
        let sentinels = (0..3)
            .map(|_| start(&sentinel_args, Some(&config)))
            .collect();
        let group = RedisSentinels {
            primary,
            replica,
            sentinels,
        };
        group.wait_until(
            "the replica is in sync and every sentinel sees the group",
            || {
                group.replica_in_sync(&group.replica, client_port(&group.primary))
                    && group.sentinels.iter().all(|s| {
                        let info = text(s.addr(), &["SENTINEL", "MASTER", SERVICE]);
                        field(&info, "num-slaves") == Some("1")
                            && field(&info, "num-other-sentinels") == Some("2")
                    })
            },
        );
        group
    }

    /// The primary at start.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The replica at start (the primary after a failover).
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// `redis://127.0.0.1:<port>/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url().to_string()).collect()
    }

    /// `rediss://127.0.0.1:<tls port>/` of every sentinel of a group from
    /// [`start_tls`](RedisSentinels::start_tls); empty otherwise.
    pub fn tls_sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter_map(RedisServer::tls_url)
            .collect()
    }

    /// The primary's port as the first sentinel names it now.
    pub fn named_primary_port(&self) -> Option<u16> {
        let reply = call_strings(
            self.sentinels[0].addr(),
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        )
        .ok()?;
        reply.get(1)?.parse().ok()
    }

    /// After the primary was killed: wait until the sentinels name the
    /// replica and it says it is the primary; returns how long that took
    /// from the call.
    ///
    /// # Panics
    ///
    /// When that does not happen within 30 seconds.
    pub fn wait_for_failover(&self) -> Duration {
        let started = Instant::now();
        self.wait_until("the replica is promoted", || {
            self.named_primary_port() == Some(client_port(&self.replica))
                && call_strings(self.replica.addr(), &["ROLE"])
                    .map(|r| r.first().map(String::as_str) == Some("master"))
                    .unwrap_or(false)
        });
        started.elapsed()
    }

    /// Whether `replica` follows the primary on `port` with its link up.
    fn replica_in_sync(&self, replica: &RedisServer, port: u16) -> bool {
        let info = text(replica.addr(), &["INFO", "replication"]);
        field(&info, "master_port") == Some(&port.to_string())
            && field(&info, "master_link_status") == Some("up")
    }

    fn wait_until(&self, what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        while !condition() {
            assert!(
                Instant::now() < deadline,
                "Sentinel test group: {what} did not happen within {SETTLE_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The port the group's members and sentinels name a server by: its TLS
/// port in a TLS group.
fn client_port(server: &RedisServer) -> u16 {
    server.tls_port().unwrap_or(server.port())
}

/// `key:value` lines (INFO), or alternating key and value lines (SENTINEL
/// MASTER, flattened by [`text`]).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(value) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            return Some(value.trim());
        }
        if line == key {
            return lines.next();
        }
    }
    None
}

/// The reply's strings joined by lines; empty on any failure (a process
/// that is not up yet answers nothing).
fn text(addr: SocketAddr, args: &[&str]) -> String {
    call_strings(addr, args)
        .map(|r| r.join("\n"))
        .unwrap_or_default()
}

/// One command; the reply's strings, or the error reply as an error.
fn call_strings(addr: SocketAddr, args: &[&str]) -> std::io::Result<Vec<String>> {
    match call(addr, args)? {
        Reply::Error(e) => Err(std::io::Error::other(e)),
        reply => Ok(reply.strings()),
    }
}
