//! One call: every layer judged against its state first, then written only
//! if the whole call may write — the Lua path's `decide`, with the
//! reference algorithms (`tollgate_algorithms`) doing the deciding.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};
use tollgate_algorithms::refund::{refund, Charge};
use tollgate_limiter::{Adjustment, Layout, State, Timestamp, Transition, Verdict};

use crate::call::{self, Call, Layer, Mode, Time};
use crate::keyspace::{self, TTL_MARGIN_MS};

/// Answer the command `args` (the command name first).
pub(crate) fn run(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let raw: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let n = call::numkeys(&raw).map_err(RedisError::String)?;
    let keys = &args[2..2 + n];
    let call = call::parse(&raw[2 + n..], n).map_err(RedisError::String)?;
    let now = now(&call, &raw[2 + n..])?;
    let reply = match call.mode {
        Mode::Refund => refund_layers(ctx, keys, &call, now)?,
        Mode::Penalize | Mode::Reward | Mode::Block => adjust(ctx, keys, &call, now)?,
        _ => decide(ctx, keys, &call, now)?,
    };
    Ok(RedisValue::Array(
        reply.into_iter().map(RedisValue::Integer).collect(),
    ))
}

/// The instant the call decides at: the server's clock, or the caller's
/// within the allowed skew.
fn now(call: &Call, argv: &[&[u8]]) -> Result<u64, RedisError> {
    match call.time {
        Time::Server => Ok(keyspace::server_micros()),
        Time::Caller {
            now,
            max_skew: None,
        } => Ok(now),
        Time::Caller {
            now,
            max_skew: Some(skew),
        } => {
            let server = keyspace::server_micros();
            if now.abs_diff(server) > skew {
                return Err(RedisError::String(format!(
                    "TOLLGATE_SKEW {now} {server} {}",
                    String::from_utf8_lossy(argv[1])
                )));
            }
            Ok(now)
        }
    }
}

/// A verdict as the reply's five integers.
fn push(reply: &mut Vec<i64>, v: &Verdict) {
    reply.extend([
        i64::from(v.allowed),
        v.limit as i64,
        v.remaining as i64,
        v.reset_after.as_micros() as i64,
        v.retry_after.map_or(-1, |r| r.as_micros() as i64),
    ]);
}

/// Layer `i` (0-based) judged at `now` for `cost`, with the state it read.
fn judge(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    i: usize,
    cost: u64,
    now: u64,
) -> Result<(Option<State>, Transition), RedisError> {
    let state = keyspace::read(ctx, key, layer, i + 1)?;
    let t = tollgate_algorithms::decide(
        &layer.limit,
        state.as_ref(),
        Timestamp::from_micros(now),
        cost,
    );
    Ok((state, t))
}

/// Write what an admitted decision of `cost` made of layer `state`.
fn write(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    before: Option<&State>,
    t: &Transition,
    cost: u64,
) -> Result<(), RedisError> {
    let Some(next) = &t.next else {
        return Ok(());
    };
    let ttl = keyspace::ttl_ms(next.ttl) + TTL_MARGIN_MS;
    match &next.state {
        State::Cells(cells) => keyspace::write_counter(ctx, key, layer.layout, *cells, ttl),
        log => keyspace::write_log(ctx, key, before, log, cost, ttl),
    }
}

/// Decide, reserve, peek or reset.
fn decide(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Vec<i64>, RedisError> {
    let mut judged = Vec::with_capacity(keys.len());
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        judged.push(judge(ctx, key, layer, i, layer.cost, now)?);
    }
    let admitted = judged.iter().all(|(_, t)| t.verdict.allowed);
    let writes = admitted && matches!(call.mode, Mode::Decide | Mode::Reserve);
    if call.mode == Mode::Reset {
        keyspace::delete(ctx, keys)?;
    }
    let mut reply = Vec::with_capacity(keys.len() * 7);
    for ((key, layer), (state, t)) in keys.iter().zip(&call.layers).zip(&judged) {
        let verdict = if writes {
            write(ctx, key, layer, state.as_ref(), t, layer.cost)?;
            t.verdict
        } else {
            // Nothing was charged: admitting layers give the cost back.
            t.verdict.uncharged(layer.cost)
        };
        push(&mut reply, &verdict);
        if call.mode == Mode::Reserve {
            let charge = match (&t.next, writes) {
                (Some(next), true) => Charge::of(&layer.limit, &next.state, layer.cost),
                _ => None,
            };
            let (at, mark) = charge.map_or((0, 0), |c| (c.at, c.mark));
            reply.extend([at as i64, mark as i64]);
        }
    }
    Ok(reply)
}

/// The end of a block still on in `state`.
fn live_block(state: Option<&State>, now: u64) -> Option<u64> {
    match state {
        Some(State::Blocked(until)) if *until > now => Some(*until),
        _ => None,
    }
}

/// Penalize, reward or block every layer (`cost`: the units, or the
/// block's length in µs); the reply is each layer's verdict for one unit
/// afterwards.
fn adjust(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Vec<i64>, RedisError> {
    // Every key read first: a foreign one fails the call unchanged.
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        keyspace::read(ctx, key, layer, i + 1)?;
    }
    let mut reply = Vec::with_capacity(keys.len() * 5);
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        let state = keyspace::read(ctx, key, layer, i + 1)?;
        let blocked = live_block(state.as_ref(), now);
        match call.mode {
            Mode::Block => {
                let until = now.saturating_add(layer.cost).max(blocked.unwrap_or(0));
                keyspace::write_block(ctx, key, layer.layout, until, now)?;
            }
            // A block is kept through penalties and rewards.
            _ if blocked.is_some() => {}
            Mode::Penalize => penalize(ctx, key, layer, i, now)?,
            _ => reward(ctx, key, layer, state.as_ref(), now)?,
        }
        let (_, t) = judge(ctx, key, layer, i, 1, now)?;
        push(&mut reply, &t.verdict.uncharged(1));
    }
    Ok(reply)
}

/// Charge what the layer has left, up to its cost, as an admitted
/// decision (saturating at empty).
fn penalize(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    i: usize,
    now: u64,
) -> Result<(), RedisError> {
    let (_, probe) = judge(ctx, key, layer, i, 1, now)?;
    if !probe.verdict.allowed {
        return Ok(());
    }
    let take = layer.cost.min(probe.verdict.remaining + 1);
    if take == 0 {
        return Ok(());
    }
    let (state, t) = judge(ctx, key, layer, i, take, now)?;
    if t.verdict.allowed {
        write(ctx, key, layer, state.as_ref(), &t, take)?;
    }
    Ok(())
}

/// Give the layer its cost back (never above full), keeping the state's
/// expiry: a reward only brings a state closer to new.
fn reward(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    state: Option<&State>,
    now: u64,
) -> Result<(), RedisError> {
    if layer.layout == Layout::Log {
        // The newest entries go (a list left empty is removed).
        return keyspace::drop_newest(ctx, key, layer.cost);
    }
    let Some(State::Cells(cells)) = state else {
        return Ok(());
    };
    let ttl = keyspace::pttl(ctx, key)?;
    if ttl <= 0 {
        return Ok(());
    }
    let rewarded = tollgate_algorithms::adjust(
        &layer.limit,
        state,
        Timestamp::from_micros(now),
        layer.cost,
        Adjustment::Reward,
    )
    .map_err(|e| RedisError::String(call::args_error(e)))?;
    match rewarded.next.map(|n| n.state) {
        Some(State::Cells(next)) if next != *cells => {
            keyspace::write_counter(ctx, key, layer.layout, next, ttl as u64)
        }
        _ => Ok(()),
    }
}

/// Give reservations back: per layer what was given.
fn refund_layers(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Vec<i64>, RedisError> {
    let mut reply = Vec::with_capacity(keys.len());
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        // A missing key or one Tollgate did not write gives nothing back.
        let state = keyspace::read(ctx, key, layer, i + 1).ok().flatten();
        let charge = Charge {
            cost: layer.cost,
            at: layer.at,
            mark: layer.mark,
        };
        let given = match state {
            Some(State::Log(_)) => keyspace::remove_newest(ctx, key, layer.cost, layer.at)?,
            Some(state @ State::Cells(_)) => {
                // The state keeps its expiry; a key without one is left
                // alone (nothing is stored without a TTL).
                let ttl = keyspace::pttl(ctx, key)?;
                let back = refund(&layer.limit, Some(&state), now, charge);
                match back.next {
                    Some(State::Cells(cells)) if ttl > 0 => {
                        keyspace::write_counter(ctx, key, layer.layout, cells, ttl as u64)?;
                        back.given
                    }
                    _ => 0,
                }
            }
            _ => 0,
        };
        reply.push(given as i64);
    }
    Ok(reply)
}
