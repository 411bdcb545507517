//! Sending a script call to the cluster: redirections (`MOVED`, `ASK`),
//! retries of what Redis answered it did not run, and `NOSCRIPT`.

use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tollgate_limiter::StoreError;

use crate::error::from_redis;
use crate::script::SCRIPT;

/// The longest pause between two attempts of a call Redis answered it did
/// not run (`TRYAGAIN` while a slot moves, `CLUSTERDOWN` during a failover):
/// short, so a decision goes through soon after the cluster settles.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(20);

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
pub(crate) async fn call(mut conn: ClusterConnection, cmd: Cmd) -> Result<Vec<i64>, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
