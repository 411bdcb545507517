//! Layers on several slots: reserved group by group, in slot order, and
//! refunded when a later group denies (see the [module docs](super)).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_limiter::{LayerRequest, StoreError, Verdict, Verdicts};

use super::redirects::call;
use super::{group_call, in_group, RedisClusterStore};
use crate::holds::Held;
use crate::script::{parse_reply, Mode, ScriptCall, TimeArgs, LAYER_ARGS};
use crate::scripting::{CallCommand, Runner};
use tollgate_redis_protocol::{REPLY_FIELDS, RESERVE_FIELDS};

/// Passes of a cross-slot decision denied only where other decisions of
/// this process hold reservations (each after those settle), within the
/// deadline.
const MAX_CONTENDED_ATTEMPTS: u32 = 3;

impl RedisClusterStore {
    /// Layers on several slots: reserve group by group, refund on a denial.
    ///
    /// A request denied only where this process's other reservations in
    /// flight hold units (they may be refunded in a moment) waits for them
    /// to settle and is decided again (at most [`MAX_CONTENDED_ATTEMPTS`]
    /// passes, within the deadline).
    pub(super) async fn decide_across_slots(
        &self,
        layers: &[LayerRequest<'_>],
        keys: &[String],
        args: Vec<[u64; LAYER_ARGS]>,
        groups: &[Vec<usize>],
        time: TimeArgs,
        deadline: Instant,
    ) -> Result<Verdicts, StoreError> {
        let (mut verdicts, mut contended) = self
            .reserve_across_slots(layers, keys, &args, groups, &time, deadline)
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
                .reserve_across_slots(layers, keys, &args, groups, &time, deadline)
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
            runner: self.runner(),
            time: time.clone(),
            timeout: self.checked.deadline,
            groups: Vec::new(),
        };
        let mut denied = None;
        for (g, group) in groups.iter().enumerate() {
            let cmd = group_call(
                keys,
                args,
                group,
                time,
                (Mode::Reserve, None),
                self.call_command(),
            );
            let reply = self
                .until(deadline, call(self.conn.clone(), cmd, self.runner()))
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
                            runner: self.runner(),
                            time: time.clone(),
                            timeout: self.checked.deadline,
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
            let cmd = group_call(
                keys,
                args,
                group,
                time,
                (Mode::Peek, None),
                self.call_command(),
            );
            let peeked = self
                .until(deadline, call(self.conn.clone(), cmd, self.runner()))
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
    runner: Arc<Runner>,
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
                let cmd = refund_call(&group, &self.time, self.runner.call_command());
                let (conn, runner, timeout) =
                    (self.conn.clone(), self.runner.clone(), self.timeout);
                runtime.spawn(async move {
                    // A refund that fails leaves its charge: under-admission
                    // until the state's TTL, never over-admission.
                    let _ = tokio::time::timeout(timeout, call(conn, cmd, runner)).await;
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
                runner: self.runner.clone(),
                time: self.time.clone(),
                timeout: self.timeout,
                groups: std::mem::take(&mut self.groups),
            };
            drop(held.refund());
        }
    }
}

/// The `refund` call giving back one group's charges. Sent at most once
/// (see [`call`]): a refund is not idempotent.
fn refund_call(group: &ReservedGroup, time: &TimeArgs, style: CallCommand) -> redis::Cmd {
    let mut call = ScriptCall::new(style, group.keys.iter().map(String::as_str), time);
    for (args, (at, mark)) in &group.layers {
        call = call.layer(args).layer(&[*at, *mark]);
    }
    call.mode(Mode::Refund)
}
