//! The permission check at connect: every command a store sends, inside
//! its code or around it, tried once on keys under its prefix, so a Redis
//! user that lacks one fails at connect with the command named, not at
//! the first decision that needs it.

use std::future::Future;
use std::time::Duration;

use redis::{Cmd, RedisResult, Value};
use tollgate_limiter::StoreError;

use crate::client::is_no_permission;
use crate::engine::CallCommand;
use crate::error::RedisStoreError;
use crate::script::{ScriptCall, TimeArgs};
use crate::settings::{within, CheckedSettings};

/// The probe's keys are the store's own, under its prefix, in a hash tag
/// no state key has (state keys carry a policy and a version after the
/// tag). They get a TTL of 1 ms and are then deleted (the `DEL` a reset
/// needs), so they are gone at once.
const PROBE_TTL_MS: u64 = 10_000;

/// The commands of the probe, in the order a decision could need them:
/// the code's call (zero layers: it reads the server's time and decides
/// nothing), then what the code runs on a counter (a string) and on a
/// sliding log (a list), `TYPE` (conflicts are located with it), `DEL`
/// (a reset), and
/// `WAIT` when the store waits for replicas. Loading the code
/// (`FUNCTION LOAD` or `SCRIPT LOAD`) is checked by the load itself.
pub(crate) fn probe_commands(checked: &CheckedSettings, style: CallCommand) -> Vec<Cmd> {
    let string = format!("{}:{{tollgate-probe}}:s", checked.prefix);
    let list = format!("{}:{{tollgate-probe}}:l", checked.prefix);
    let keyless: [&str; 0] = [];
    let mut commands = vec![
        ScriptCall::new(style, keyless.iter(), &TimeArgs::default())
            .mode(crate::script::Mode::Decide),
        redis::cmd("TIME"),
    ];
    let mut push = |args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        commands.push(cmd);
    };
    let ttl = PROBE_TTL_MS.to_string();
    push(&["SET", &string, "0", "PX", &ttl]);
    push(&["GET", &string]);
    push(&["PTTL", &string]);
    push(&["TYPE", &string]);
    push(&["PEXPIRE", &string, "1"]);
    push(&["RPUSH", &list, "0"]);
    push(&["PEXPIRE", &list, &ttl]);
    push(&["LLEN", &list]);
    push(&["LRANGE", &list, "0", "-1"]);
    push(&["LINDEX", &list, "0"]);
    push(&["LTRIM", &list, "0", "-1"]);
    push(&["LREM", &list, "0", "-"]);
    push(&["PEXPIRE", &list, "1"]);
    push(&["DEL", &string, &list]);
    if checked.replica_ack.is_some() {
        // Zero replicas are always enough: this returns at once.
        push(&["WAIT", "0", "1"]);
    }
    commands
}

/// The first refusal among the probe's `answers`, as the error a user
/// can act on. Other errors are not the probe's business.
pub(crate) fn first_refusal(answers: &[RedisResult<Value>]) -> Result<(), StoreError> {
    for answer in answers {
        if let Err(e) = answer {
            if is_no_permission(e) {
                return Err(RedisStoreError::NoPermission(e.to_string()).into());
            }
        }
    }
    Ok(())
}

/// At connect: the code loaded (or, for a preloaded library, found) and
/// every permission probed, each within `timeout`. A preloaded library's
/// check is a call that runs the code, whose refusal would hide which
/// permission is missing: the probe, which names it, goes first then.
pub(crate) async fn load_and_probe(
    preloaded: bool,
    timeout: Duration,
    load: impl Future<Output = Result<(), StoreError>>,
    probe: impl Future<Output = Result<(), StoreError>>,
) -> Result<(), StoreError> {
    if preloaded {
        within(timeout, probe).await??;
        within(timeout, load).await?
    } else {
        within(timeout, load).await??;
        within(timeout, probe).await?
    }
}
