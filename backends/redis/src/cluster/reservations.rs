//! Layers on several slots: reserved group by group, in slot order, and
//! refunded when a later group denies (see the [module docs](super)).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tollgate_limiter::{LayerRequest, StoreError, Verdict, Verdicts};

use super::redirects::call;
use super::strays::Strays;
use super::{group_call, in_group, RedisClusterStore};
use crate::engine::CallCommand;
use crate::holds::Held;
use crate::script::{parse_reply, Mode, ScriptCall, TimeArgs, LAYER_ARGS};
use crate::settings::CheckedSettings;
use tollgate_redis_protocol::{parse_reserve, Charged};

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
        prepared: &super::Call,
    ) -> Result<(Verdicts, Vec<Charged>), StoreError> {
        let (groups, deadline) = (&prepared.groups, prepared.deadline);
        let request = Request {
            layers,
            keys: &prepared.keys,
            args: &prepared.args,
            time: &prepared.time,
            deadline,
            answered: &prepared.answered,
        };
        let (mut verdicts, mut contended, mut charges) =
            self.reserve_across_slots(&request, groups).await?;
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
            match self.reserve_across_slots(&request, groups).await {
                Ok((again, still, charged)) => {
                    (verdicts, contended, charges) = (again, still, charged)
                }
                Err(_) => break,
            }
        }
        Ok((verdicts, charges))
    }

    /// One pass of [`decide_across_slots`](Self::decide_across_slots): the
    /// verdicts, when the request was denied only on keys where other
    /// decisions of this process hold units those keys and their holds,
    /// and when it was admitted each layer's charge (in layer order).
    #[allow(clippy::type_complexity)]
    async fn reserve_across_slots(
        &self,
        request: &Request<'_, '_>,
        groups: &[Vec<usize>],
    ) -> Result<(Verdicts, Option<Vec<(String, u64)>>, Vec<Charged>), StoreError> {
        let Request { layers, keys, .. } = *request;
        let mut held = Held::new(&self.holds);
        let mut verdicts: Vec<Option<Verdict>> = vec![None; layers.len()];
        let mut reserved = self.reservations(request.time);
        let mut denied = None;
        for (g, group) in groups.iter().enumerate() {
            let (group_verdicts, charges) = match self.reserve_group(request, group).await {
                Ok(parsed) => parsed,
                Err(e) => {
                    // Give back what was reserved before failing, so the
                    // caller's next decision (a failure mode, or the same
                    // request without a shadow layer) does not see these
                    // charges.
                    refund_within(reserved, request.deadline).await;
                    return Err(e);
                }
            };
            let admitted = group_verdicts.iter().all(|v| v.allowed);
            for (&i, v) in group.iter().zip(group_verdicts) {
                verdicts[i] = Some(v);
            }
            if !admitted {
                denied = Some(g);
                break;
            }
            held.add(
                group
                    .iter()
                    .map(|&i| (keys[i].clone(), layers[i].cost))
                    .collect(),
            );
            reserved.groups.push(ReservedGroup {
                keys: group.iter().map(|&i| keys[i].clone()).collect(),
                layers: group
                    .iter()
                    .map(|&i| request.args[i])
                    .zip(charges)
                    .collect(),
                indices: group.clone(),
            });
        }
        let Some(denied) = denied else {
            let mut charges = vec![(0, 0); layers.len()];
            for group in reserved.groups.drain(..) {
                for (&i, (_, charged)) in group.indices.iter().zip(group.layers) {
                    charges[i] = charged;
                }
            }
            let verdicts = verdicts.into_iter().map(|v| v.expect("decided")).collect();
            return Ok((verdicts, None, charges));
        };
        let contended = self.contended(&groups[denied], keys, &verdicts, &held);
        self.deny(request, &groups[denied + 1..], reserved, &mut verdicts)
            .await;
        let verdicts = verdicts.into_iter().map(|v| v.expect("decided")).collect();
        // Denied: nothing stays charged, and each layer says so (one
        // charge per layer, none: a caller pairs them with the layers).
        Ok((verdicts, contended, vec![(0, 0); layers.len()]))
    }

    /// Reserve the layers of one slot `group`: their verdicts and charges.
    async fn reserve_group(
        &self,
        request: &Request<'_, '_>,
        group: &[usize],
    ) -> Result<(Verdicts, Vec<(u64, u64)>), StoreError> {
        let reply = self.group_reply(request, group, Mode::Reserve).await?;
        parse_reserve(&reply, group.len())
    }

    /// One slot `group`'s call in `mode`, within the request's deadline; a
    /// conflict names the group's layer.
    async fn group_reply(
        &self,
        request: &Request<'_, '_>,
        group: &[usize],
        mode: Mode,
    ) -> Result<Vec<i64>, StoreError> {
        let Request {
            layers,
            keys,
            args,
            time,
            deadline,
            answered,
        } = *request;
        let style = self.call_command();
        let cmd = group_call(keys, args, group, time, (mode, None), &[], style);
        let calling = call(
            self.conn.clone(),
            self.strays.clone(),
            cmd,
            self.runner(),
            Some(answered),
        );
        self.until(deadline, calling)
            .await?
            .map_err(|e| in_group(e, layers, group))
    }

    /// The request is denied: give back what was `reserved` and meanwhile
    /// judge the groups not reached (`unreached`, charging nothing); the
    /// charged layers report what they have without the charge.
    async fn deny(
        &self,
        request: &Request<'_, '_>,
        unreached: &[Vec<usize>],
        reserved: Reservations,
        verdicts: &mut [Option<Verdict>],
    ) {
        let charged: Vec<usize> = reserved
            .groups
            .iter()
            .flat_map(|g| g.indices.iter().copied())
            .collect();
        let refunds = reserved.refund();
        for group in unreached {
            let peeked = self.peek_unreached(request, group).await;
            for (&i, v) in group.iter().zip(peeked) {
                verdicts[i] = Some(v);
            }
        }
        await_within(refunds, request.deadline).await;
        for i in charged {
            verdicts[i] = verdicts[i].map(|v| v.uncharged(request.layers[i].cost));
        }
    }

    /// No reservations yet, for calls at `time`.
    fn reservations(&self, time: &TimeArgs) -> Reservations {
        Reservations {
            conn: self.conn.clone(),
            strays: self.strays.clone(),
            checked: self.checked.clone(),
            time: time.clone(),
            groups: Vec::new(),
            // Decisions run on a runtime; the future may be dropped off it.
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// When the denying `group` denied only on keys where other decisions
    /// of this process hold units: those keys and the units the others
    /// hold (`held`: this decision's own holds).
    fn contended(
        &self,
        group: &[usize],
        keys: &[String],
        verdicts: &[Option<Verdict>],
        held: &Held<'_>,
    ) -> Option<Vec<(String, u64)>> {
        let denying: Vec<(String, u64)> = group
            .iter()
            .filter(|&&i| verdicts[i].is_some_and(|v| !v.allowed))
            .map(|&i| {
                (
                    keys[i].clone(),
                    self.holds.held(&keys[i]) - held.mine(&keys[i]),
                )
            })
            .collect();
        denying
            .iter()
            .all(|(_, others)| *others > 0)
            .then_some(denying)
    }

    /// The verdicts of a `group` the decision did not reach, judged and not
    /// charged. The request is denied whatever these layers say: a group
    /// that cannot be read only loses its numbers, never the denial (as an
    /// error it would let a fail-open policy admit the request).
    async fn peek_unreached(&self, request: &Request<'_, '_>, group: &[usize]) -> Vec<Verdict> {
        self.group_reply(request, group, Mode::Peek)
            .await
            .and_then(|reply| parse_reply(&reply, group.len()))
            .map(|verdicts| verdicts.into_iter().collect())
            .unwrap_or_else(|_| group.iter().map(|&i| unread(&request.layers[i])).collect())
    }
}

/// One decision across slots: its layers, their keys and arguments, its
/// time and its deadline.
#[derive(Clone, Copy)]
struct Request<'r, 'a> {
    layers: &'r [LayerRequest<'a>],
    keys: &'r [String],
    args: &'r [[u64; LAYER_ARGS]],
    time: &'r TimeArgs,
    deadline: Instant,
    /// Where the groups' calls were answered by redirection.
    answered: &'r super::redirects::Answered,
}

/// Refund `reserved`, waiting for the refunds until `deadline`.
async fn refund_within(reserved: Reservations, deadline: Instant) {
    await_within(reserved.refund(), deadline).await;
}

/// Wait for `refunds` until `deadline`, so that the caller's next decision
/// sees them; past it they finish in the background (they are spawned
/// tasks).
async fn await_within(refunds: Vec<JoinHandle<()>>, deadline: Instant) {
    let _ = tokio::time::timeout_at(deadline, async {
        for refund in refunds {
            let _ = refund.await;
        }
    })
    .await;
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
    strays: Arc<Strays>,
    /// The store's settings: its runner, its deadline, its clock.
    checked: CheckedSettings,
    /// The decision's time, for a refund when the clock cannot be read.
    time: TimeArgs,
    groups: Vec<ReservedGroup>,
    /// The runtime the decision started on: its refunds run there even
    /// when the decision's future is dropped on a thread outside it.
    runtime: Option<tokio::runtime::Handle>,
}

impl Reservations {
    /// Start one refund per group (concurrently, as spawned tasks bounded
    /// by the deadline) and hand back their handles. Without a runtime
    /// the charges stay (under-admission until their states expire).
    fn refund(mut self) -> Vec<JoinHandle<()>> {
        let groups = std::mem::take(&mut self.groups);
        let runtime = self.runtime.clone();
        let Some(runtime) = runtime.or_else(|| tokio::runtime::Handle::try_current().ok()) else {
            return Vec::new();
        };
        // A refund gives back what is still ahead of its own instant, not
        // the decision's (which would give back time others charged since).
        let time = self
            .checked
            .time_args()
            .unwrap_or_else(|_| self.time.clone());
        let runner = &self.checked.runner;
        groups
            .into_iter()
            .map(|group| {
                let cmd = refund_call(&group, &time, runner.call_command());
                let (conn, strays) = (self.conn.clone(), self.strays.clone());
                let (runner, timeout) = (runner.clone(), self.checked.deadline);
                runtime.spawn(async move {
                    // A refund that fails leaves its charge: under-admission
                    // until the state's TTL, never over-admission.
                    let _ =
                        tokio::time::timeout(timeout, call(conn, strays, cmd, runner, None)).await;
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
                strays: self.strays.clone(),
                checked: self.checked.clone(),
                time: self.time.clone(),
                groups: std::mem::take(&mut self.groups),
                runtime: self.runtime.clone(),
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
