//! Sending a call to the cluster: redirections (`MOVED`, `ASK`), retries
//! of what Redis answered it did not run, and nodes that lack the code.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tollgate_limiter::StoreError;

use super::slots::hash_slot;
use super::strays::{Asking, Strays};
use crate::engine::{
    check_load, is_missing_function, is_module_missing, is_unknown, CallCommand, Runner,
};
use crate::error::from_redis;
use crate::script::{eval_script, function_name};

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
/// - the node lacks the code (a promoted replica, the target of a slot
///   move, a `FUNCTION FLUSH` or `SCRIPT FLUSH`): for `FCALL`, `FUNCTION
///   LOAD REPLACE` on that node and the call once more; for `EVALSHA`
///   (`NOSCRIPT`), the whole script with `EVAL` through the same route,
///   which also caches it on that node. A node without functions at all
///   (before Redis 7.0) turns an `Auto` store to the script; a node
///   without the module (`TOLLGATE.DECIDE` unknown there) turns it to the
///   function library, and the call is sent again as `FCALL`.
///
/// The module's command is routed by its first key's slot here: the
/// client does not know where its keys are (it would route by `numkeys`).
///
/// Anything else is returned: after an I/O error the call may have run, so
/// it is not resent (a lost reservation is under-admission; a resent one
/// would charge twice). The caller's deadline bounds the loop.
pub(crate) async fn call(
    mut conn: ClusterConnection,
    strays: Arc<Strays>,
    cmd: Cmd,
    runner: Arc<Runner>,
    answered: Option<&Answered>,
) -> Result<Vec<i64>, StoreError> {
    let mut sending = Sending::new(cmd);
    loop {
        sending.attempts += 1;
        let sent_to = sending.target.take();
        let e = match sending.send(&mut conn, &strays, sent_to.clone()).await {
            Ok(reply) => {
                if let Some(answered) = answered {
                    let node = sent_to.map(|(_, host, port)| (host, port));
                    answered.record(slot_of(&sending.cmd), node);
                }
                return Ok(reply);
            }
            Err(e) => e,
        };
        let e = match sending
            .lacks_code(&mut conn, &strays, &runner, e, &sent_to)
            .await?
        {
            None => {
                sending.target = sent_to;
                continue;
            }
            Some(e) => e,
        };
        if sending.resend_after(e)? {
            tokio::time::sleep(sending.pause).await;
            sending.pause = (sending.pause * 2).min(MAX_RETRY_PAUSE);
        }
    }
}

/// The nodes that answered a request's calls by redirection (`MOVED`,
/// `ASK`), by slot: what the call wrote is on that node, and a `WAIT` for
/// its replicas must go there (the client's map may still name the slot's
/// old master, which never received it).
#[derive(Debug, Default)]
pub(crate) struct Answered(std::sync::Mutex<Vec<(u16, String, u16)>>);

impl Answered {
    /// `slot`'s call was answered by the node at `node` after a
    /// redirection, or (`None`) by the slot's master in the client's map:
    /// the last answer counts (a later pass of the request may go
    /// elsewhere).
    fn record(&self, slot: u16, node: Option<(String, u16)>) {
        let mut nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        nodes.retain(|(s, _, _)| *s != slot);
        if let Some((host, port)) = node {
            nodes.push((slot, host, port));
        }
    }

    /// Where `slot`'s call was answered (host and port), when it was
    /// redirected.
    pub(crate) fn node_of(&self, slot: u16) -> Option<(String, u16)> {
        let nodes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        nodes
            .iter()
            .find(|(s, _, _)| *s == slot)
            .map(|(_, host, port)| (host.clone(), *port))
    }
}

/// A call being sent, and what its attempts so far have learned.
struct Sending {
    /// The call as built (`FCALL`, `EVALSHA` or the module's command;
    /// `FCALL` once a node turned out to lack the module).
    cmd: Cmd,
    call_command: CallCommand,
    /// The whole script, once a node lacked it (`NOSCRIPT`) or functions.
    eval: Option<Cmd>,
    /// Whether the library was loaded for this call already.
    loaded: bool,
    /// Where a redirection sends the next attempt.
    target: Option<(Redirect, String, u16)>,
    pause: Duration,
    attempts: u32,
}

impl Sending {
    fn new(cmd: Cmd) -> Sending {
        Sending {
            call_command: call_command_of(&cmd),
            cmd,
            eval: None,
            loaded: false,
            target: None,
            pause: Duration::from_millis(1),
            attempts: 0,
        }
    }

    /// One attempt: to `sent_to` after a redirection, else by slot.
    async fn send(
        &self,
        conn: &mut ClusterConnection,
        strays: &Strays,
        sent_to: Option<(Redirect, String, u16)>,
    ) -> RedisResult<Vec<i64>> {
        let current = self.eval.as_ref().unwrap_or(&self.cmd);
        match sent_to {
            None if self.call_command == CallCommand::Module => {
                let node = SingleNodeRoutingInfo::SpecificNode(Route::new(
                    slot_of(current),
                    SlotAddr::Master,
                ));
                send(conn, current, node).await
            }
            None => current.query_async::<Vec<i64>>(conn).await,
            Some((redirect, host, port)) => {
                let asking = match redirect {
                    Redirect::Moved => Asking::No,
                    Redirect::Ask => Asking::Yes,
                };
                let reply = strays.send(conn, (&host, port), asking, current).await?;
                Ok(redis::from_redis_value(reply.extract_error()?)?)
            }
        }
    }

    /// When `e` says the node lacks the code the call needs: make it
    /// available (fall back from the module, load the library, turn to the
    /// script) and answer `None` to send again to the same place;
    /// otherwise hand `e` back.
    async fn lacks_code(
        &mut self,
        conn: &mut ClusterConnection,
        strays: &Strays,
        runner: &Runner,
        e: RedisError,
        sent_to: &Option<(Redirect, String, u16)>,
    ) -> Result<Option<RedisError>, StoreError> {
        if self.call_command == CallCommand::Module && is_module_missing(&e) {
            // This node has no module: an `Auto` store goes on with the
            // function library (a node without it gets it below, on
            // `Function not found`).
            runner
                .fall_back_on(self.call_command, e)
                .map_err(from_redis)?;
            self.cmd = fcall_of(&self.cmd);
            self.call_command = CallCommand::Fcall;
            return Ok(None);
        }
        if self.call_command != CallCommand::Fcall || self.eval.is_some() {
            return Ok(Some(e));
        }
        if is_missing_function(&e) && runner.preloaded() {
            // An administrator loads it; this store never does.
            return Err(from_redis(Runner::preloaded_error(e)));
        }
        if is_missing_function(&e) && !self.loaded {
            // Load where the call went, then send it there again.
            let load = Runner::load_command(CallCommand::Fcall);
            let answer = match sent_to {
                Some((_, host, port)) => strays.send(conn, (host, *port), Asking::No, &load).await,
                None => {
                    let node = SingleNodeRoutingInfo::SpecificNode(Route::new(
                        slot_of(&self.cmd),
                        SlotAddr::Master,
                    ));
                    conn.route_command(load, RoutingInfo::SingleNode(node))
                        .await
                }
            };
            loaded(answer).map_err(from_redis)?;
            self.loaded = true;
            return Ok(None);
        }
        if is_unknown(&e, "fcall") {
            runner
                .fall_back_on(self.call_command, e)
                .map_err(from_redis)?;
            self.eval = Some(eval_of(&self.cmd));
            return Ok(None);
        }
        Ok(Some(e))
    }

    /// Whether Redis answered `e` without running the call, so that it is
    /// sent again (after a pause: `true`); any other error is the call's.
    fn resend_after(&mut self, e: RedisError) -> Result<bool, StoreError> {
        Ok(match e.kind() {
            ErrorKind::Server(ServerErrorKind::NoScript) if self.eval.is_none() => {
                self.eval = Some(eval_of(&self.cmd));
                false
            }
            ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask)) => {
                let redirect = if kind == ServerErrorKind::Ask {
                    Redirect::Ask
                } else {
                    Redirect::Moved
                };
                self.target = e
                    .redirect_node()
                    .and_then(|(addr, _slot)| addr.rsplit_once(':'))
                    .and_then(|(host, port)| {
                        Some((redirect, host.to_string(), port.parse().ok()?))
                    });
                // Redirected again and again (views still converging): slow down.
                self.attempts > 3
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
        })
    }
}

/// Where a redirection points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redirect {
    Moved,
    Ask,
}

/// Send `cmd` to `node` as is.
async fn send(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    node: SingleNodeRoutingInfo,
) -> RedisResult<Vec<i64>> {
    let reply = conn
        .route_command(cmd.clone(), RoutingInfo::SingleNode(node))
        .await?;
    Ok(redis::from_redis_value(reply.extract_error()?)?)
}

/// The style a call was built in (its first word).
fn call_command_of(cmd: &Cmd) -> CallCommand {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(b"TOLLGATE.DECIDE")) => CallCommand::Module,
        Some(redis::Arg::Simple(b"FCALL")) => CallCommand::Fcall,
        _ => CallCommand::Evalsha,
    }
}

/// The slot of a call's keys (all in one slot): its first key's, the
/// third word of the module's command (`TOLLGATE.DECIDE <numkeys> <key>
/// …`), else the fourth (`FCALL <function> <numkeys> <key> …`).
fn slot_of(cmd: &Cmd) -> u16 {
    let at = if call_command_of(cmd) == CallCommand::Module {
        2
    } else {
        3
    };
    match cmd.args_iter().nth(at) {
        Some(redis::Arg::Simple(key)) => hash_slot(key),
        _ => 0,
    }
}

/// `FCALL <function> …` with the arguments of `TOLLGATE.DECIDE …`.
fn fcall_of(module: &Cmd) -> Cmd {
    let mut fcall = redis::cmd("FCALL");
    fcall.arg(function_name());
    for arg in module.args_iter().skip(1) {
        // Calls hold plain arguments only (no cursor).
        if let redis::Arg::Simple(bytes) = arg {
            fcall.arg(bytes);
        }
    }
    fcall
}

/// Whether `FUNCTION LOAD REPLACE`'s `answer` says the library loaded.
fn loaded(answer: RedisResult<redis::Value>) -> RedisResult<()> {
    let name: String = redis::from_redis_value(answer?)?;
    check_load(CallCommand::Fcall, &name)
}

/// `EVAL <script> …` with the arguments of `EVALSHA <sha> …` (or of
/// `FCALL <function> …`).
fn eval_of(evalsha: &Cmd) -> Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(eval_script());
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
    fn a_call_knows_its_style_and_slot() {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg("f").arg(1).arg("p:{tag}:x").arg("");
        assert_eq!(call_command_of(&fcall), CallCommand::Fcall);
        assert_eq!(slot_of(&fcall), hash_slot(b"tag"));
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg("sha").arg(1).arg("p:{other}:x");
        assert_eq!(call_command_of(&evalsha), CallCommand::Evalsha);
        assert_eq!(slot_of(&evalsha), hash_slot(b"other"));
        let mut module = redis::cmd("TOLLGATE.DECIDE");
        module.arg(1).arg("p:{third}:x").arg("");
        assert_eq!(call_command_of(&module), CallCommand::Module);
        assert_eq!(slot_of(&module), hash_slot(b"third"));
        let fcall = fcall_of(&module);
        assert_eq!(call_command_of(&fcall), CallCommand::Fcall);
        assert_eq!(slot_of(&fcall), hash_slot(b"third"));
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
        assert_eq!(args[1], eval_script().as_bytes());
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
