//! Connections to nodes the cluster client has none to.
//!
//! Why: the client connects to the nodes its slot map names. A master just
//! added to the cluster owns no slot, so it is in no map; yet while the
//! first slot moves onto it, a key already moved answers `ASK` towards it,
//! and the client answers `ClusterConnectionNotFound` for that address
//! until the slot's handover puts the node in the map. Without a
//! connection of its own, every decision on such a key failed for as long
//! as the move took. The store opens one here, with the settings of the
//! nodes it was given (TLS, credentials), and keeps it for the next call.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, RedisResult};
use redis::{RedisError, Value};

use crate::settings::Settings;

/// Nodes kept at most: a cluster adds few masters at a time, and an
/// address that churns (a node restarted elsewhere) must not grow the map.
const MAX_STRAYS: usize = 16;

/// Connections opened on demand, by address (see the module docs).
pub(crate) struct Strays {
    /// The first node's connection settings, whose address is replaced.
    base: ConnectionInfo,
    settings: Settings,
    kept: Mutex<HashMap<(String, u16), MultiplexedConnection>>,
}

impl fmt::Debug for Strays {
    // The connection settings are left out: they may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kept = self.kept.lock().map_or(0, |k| k.len());
        f.debug_struct("Strays").field("kept", &kept).finish()
    }
}

/// What is sent to a node by address.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asking {
    /// The command as is (`MOVED`, a `FUNCTION LOAD`, a `WAIT`).
    No,
    /// `ASKING`, then the command, in one pipeline on one connection, so
    /// that no other request comes between them.
    Yes,
}

impl Strays {
    /// Connections like the one to `base` (the URL the store was given
    /// first, parsed and checked), with the store's `settings`.
    pub(crate) fn new(base: ConnectionInfo, settings: Settings) -> Self {
        Strays {
            base,
            settings,
            kept: Mutex::default(),
        }
    }

    /// Send `cmd` to the node at `host:port`: through this store's own
    /// connection there when it keeps one, else through the cluster
    /// client, else through a connection opened now (nothing was sent when
    /// the client had none, so sending it here cannot run it twice).
    ///
    /// A kept connection goes first for two reasons: each call the client
    /// cannot route makes it reconnect to every node, and a `WAIT` must go
    /// through the connection that carried the charge it waits for.
    pub(crate) async fn send(
        &self,
        conn: &mut ClusterConnection,
        (host, port): (&str, u16),
        asking: Asking,
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        if self.is_kept(host, port) {
            return self.send_own(host, port, asking, cmd).await;
        }
        let node = SingleNodeRoutingInfo::ByAddress {
            host: host.to_string(),
            port,
        };
        let routed = match asking {
            Asking::No => {
                conn.route_command(cmd.clone(), RoutingInfo::SingleNode(node))
                    .await
            }
            Asking::Yes => {
                let pipe = asking_pipeline(cmd);
                let replies = conn.route_pipeline(pipe, 1, 1, node).await;
                replies.and_then(last_reply)
            }
        };
        match routed {
            Err(e) if e.kind() == ErrorKind::ClusterConnectionNotFound => {
                self.send_own(host, port, asking, cmd).await
            }
            routed => routed,
        }
    }

    /// Send `cmd` through this store's own connection to `host:port`,
    /// opened when there is none; one that fails on I/O is dropped, so the
    /// next call opens another.
    async fn send_own(
        &self,
        host: &str,
        port: u16,
        asking: Asking,
        cmd: &Cmd,
    ) -> RedisResult<Value> {
        let mut own = self.connection(host, port).await?;
        let sent = match asking {
            Asking::No => own.req_packed_command(cmd).await,
            Asking::Yes => own
                .req_packed_commands(&asking_pipeline(cmd), 1, 1)
                .await
                .and_then(last_reply),
        };
        if sent
            .as_ref()
            .is_err_and(|e| e.is_io_error() || e.is_connection_dropped())
        {
            self.lock().remove(&(host.to_string(), port));
        }
        sent
    }

    /// Whether a connection to `host:port` is kept.
    fn is_kept(&self, host: &str, port: u16) -> bool {
        self.lock().contains_key(&(host.to_string(), port))
    }

    /// The kept connection to `host:port`, or a new one.
    async fn connection(&self, host: &str, port: u16) -> RedisResult<MultiplexedConnection> {
        let address = (host.to_string(), port);
        if let Some(kept) = self.lock().get(&address) {
            return Ok(kept.clone());
        }
        let client = crate::client::open_info(self.info_for(host, port), &self.settings)
            .map_err(|e| RedisError::from((ErrorKind::Client, "a node's client", e.to_string())))?;
        // No response timeout inside redis-rs: the store's deadline bounds
        // every call (as on the store's other connections).
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(None);
        let opened = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut kept = self.lock();
        if kept.len() >= MAX_STRAYS {
            kept.clear();
        }
        // Two calls may have opened one each: the first kept serves both.
        Ok(kept.entry(address).or_insert(opened).clone())
    }

    /// The base node's settings at `host:port`.
    fn info_for(&self, host: &str, port: u16) -> ConnectionInfo {
        let host = host.to_string();
        let addr = match self.base.addr().clone() {
            #[cfg(feature = "tls")]
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        self.base.clone().set_addr(addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), MultiplexedConnection>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `ASKING` and `cmd`, in one pipeline.
fn asking_pipeline(cmd: &Cmd) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    pipe
}

/// The command's reply, the last of a pipeline's (`ASKING`'s is skipped).
fn last_reply(mut replies: Vec<Value>) -> RedisResult<Value> {
    replies.pop().ok_or_else(|| {
        RedisError::from((
            ErrorKind::Client,
            "an empty reply to ASKING and a script call",
        ))
    })
}
