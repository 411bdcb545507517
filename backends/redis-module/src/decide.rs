//! One call: every layer's state read (a foreign one fails the call before
//! anything is written), decided or adjusted by the reference
//! (`tollgate_algorithms::decide_layers`, `adjust_layers`), and what the
//! reference says to write turned into keyspace writes.

use redis_module::{Context, RedisError, RedisString};
use smallvec::SmallVec;
use tollgate_algorithms::refund::{refund, Charge};
use tollgate_algorithms::{adjust_layers, decide_layers, release, renew, Layered};
use tollgate_limiter::{Hold, Layout, Limit, State, Timestamp, Verdict};
use tollgate_redis_protocol::{self as protocol, verdict_fields, Call, Mode, Time};

use crate::keyspace::Holders;
use crate::{keyspace, list_log};

/// Answer the command `args` (the command name first): the reply's
/// integers, an array of them.
pub(crate) fn run(ctx: &Context, args: &[RedisString]) -> Result<Vec<i64>, RedisError> {
    let raw: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let n = protocol::numkeys(&raw).map_err(args_error)?;
    let keys = &args[2..2 + n];
    let call = protocol::parse(&raw[2 + n..], n).map_err(args_error)?;
    let now = now(&call, &raw[2 + n..])?;
    let reply = if call.mode == Mode::Refund {
        refund_layers(ctx, keys, &call, now)?
    } else if call.mode == Mode::Renew {
        renew_layers(ctx, keys, &call, now)?
    } else {
        // Every key read first: a foreign one fails the call unchanged.
        let states = match list_log::decide(ctx, keys, &call, now)? {
            list_log::Outcome::Decided(reply) => return Ok(reply),
            list_log::Outcome::Read(states) => states,
            list_log::Outcome::Unread => read_states(ctx, keys, &call)?,
        };
        let at = Layers {
            keys,
            call: &call,
            states: &states,
            now: Timestamp::from_micros(now),
        };
        match call.mode {
            Mode::Penalize | Mode::Reward | Mode::Block => adjust(ctx, &at)?,
            _ => decide(ctx, &at)?,
        }
    };
    Ok(reply)
}

fn args_error(e: protocol::ArgsError) -> RedisError {
    RedisError::String(e.to_string())
}

/// The instant the call decides at: the server's clock, or the caller's
/// within the allowed skew; either between 2020 and 2100
/// (`Timestamp::is_plausible`: a state written at a server's clock reset
/// to 1970 would read later as someone else's data).
fn now(call: &Call, argv: &[&[u8]]) -> Result<u64, RedisError> {
    let now = read_now(call, argv)?;
    if !Timestamp::from_micros(now).is_plausible() {
        return Err(RedisError::String(format!("TOLLGATE_TIME {now}")));
    }
    Ok(now)
}

fn read_now(call: &Call, argv: &[&[u8]]) -> Result<u64, RedisError> {
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

/// Every layer's state, in key order; the first foreign key fails the
/// call (nothing has been written yet).
fn read_states(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
) -> Result<Vec<Option<State>>, RedisError> {
    keys.iter()
        .zip(&call.layers)
        .enumerate()
        .map(|(i, (key, layer))| keyspace::read(ctx, key, layer, i + 1))
        .collect()
}

/// A call's layers with the states read for them, at its instant.
struct Layers<'a> {
    keys: &'a [RedisString],
    call: &'a Call,
    states: &'a [Option<State>],
    now: Timestamp,
}

impl Layers<'_> {
    /// Each layer as the reference takes it: its limit and cost (up to
    /// four inline: no allocation).
    fn limits(&self) -> SmallVec<[(&Limit, u64); 4]> {
        self.call
            .layers
            .iter()
            .map(|l| (&l.limit, l.cost))
            .collect()
    }

    /// The states, as the reference takes them.
    fn states(&self) -> SmallVec<[Option<&State>; 4]> {
        self.states.iter().map(Option::as_ref).collect()
    }

    /// Write what the reference decided for every layer (`None`: leave it).
    fn write(&self, ctx: &Context, layered: &Layered) -> Result<(), RedisError> {
        for (i, stored) in layered.writes.iter().enumerate() {
            if let Some(stored) = stored {
                let layout = self.call.layers[i].layout;
                let before = self.states[i].as_ref();
                keyspace::write(ctx, &self.keys[i], layout, before, stored)?;
            }
        }
        Ok(())
    }
}

/// Decide, reserve, peek or reset.
fn decide(ctx: &Context, at: &Layers<'_>) -> Result<Vec<i64>, RedisError> {
    let (keys, call) = (at.keys, at.call);
    let layered = decide_layers(&at.limits(), &at.states(), at.now);
    let writes = layered.admitted() && matches!(call.mode, Mode::Decide | Mode::Reserve);
    if writes {
        at.write(ctx, &layered)?;
    } else if matches!(call.mode, Mode::Decide | Mode::Reserve) {
        keep_denied(ctx, at, &layered.verdicts)?;
    }
    if call.mode == Mode::Reset {
        keyspace::delete(ctx, keys)?;
    }
    let mut reply = Vec::with_capacity(keys.len() * protocol::RESERVE_FIELDS);
    for (i, layer) in call.layers.iter().enumerate() {
        let verdict = layered.verdicts[i];
        // A peek or reset that every layer admits charged nothing either.
        let verdict = match layered.admitted() && !writes {
            true => verdict.uncharged(layer.cost),
            false => verdict,
        };
        let written = layered.writes.get(i).and_then(Option::as_ref);
        let charge = written.and_then(|w| Charge::of(&layer.limit, &w.state, layer.cost));
        layer_reply(&mut reply, call.mode, &verdict, charge);
    }
    Ok(reply)
}

/// A decision that denied keeps each state a denying layer read
/// ([`tollgate_algorithms::kept_by_denial`]).
fn keep_denied(ctx: &Context, at: &Layers<'_>, verdicts: &[Verdict]) -> Result<(), RedisError> {
    for ((key, state), verdict) in at.keys.iter().zip(at.states).zip(verdicts) {
        if let (Some(kept), Some(_)) = (tollgate_algorithms::kept_by_denial(verdict), state) {
            keyspace::keep_denied(ctx, key, kept)?;
        }
    }
    Ok(())
}

/// One layer's reply: its verdict, and in a `reserve` the charge it made
/// (`0 0`: none).
pub(crate) fn layer_reply(
    reply: &mut Vec<i64>,
    mode: Mode,
    verdict: &Verdict,
    charge: Option<Charge>,
) {
    reply.extend(verdict_fields(verdict));
    if mode == Mode::Reserve {
        let (at, mark) = charge.map_or((0, 0), |c| (c.at, c.mark));
        reply.extend([at as i64, mark as i64]);
    }
}

/// Penalize, reward or block every layer (the cost argument: the units,
/// or the block's length in µs); the reply is each layer's verdict for
/// one unit afterwards.
fn adjust(ctx: &Context, at: &Layers<'_>) -> Result<Vec<i64>, RedisError> {
    let adjustment = at.call.adjustment().map_err(args_error)?;
    let layered = adjust_layers(&at.limits(), &at.states(), at.now, adjustment)
        .map_err(|e| args_error(protocol::ArgsError::new(e)))?;
    at.write(ctx, &layered)?;
    Ok(layered.verdicts.iter().flat_map(verdict_fields).collect())
}

/// Give reservations back: per layer what was given.
fn refund_layers(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Vec<i64>, RedisError> {
    // Keys whose last holder left: one `DEL` replicated for all of them,
    // after the loop (a release adds no holder, so no later write of this
    // call recreates one of them), however the loop ends: an error or a
    // panic of a later layer leaves them deleted on this server.
    let mut deleted = Emptied {
        ctx,
        keys: Vec::new(),
    };
    let emptied = &mut deleted.keys;
    let mut reply = Vec::with_capacity(keys.len());
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        let (state, charge) = match holders(ctx, key, layer, i) {
            Some(Holders::Alone) => {
                // The usual release, one holder at a time: what
                // `release` writes then, without reading the log into a
                // state.
                keyspace::delete_unreplicated(ctx, key)?;
                emptied.push(key);
                reply.push(1);
                continue;
            }
            Some(Holders::Read(state)) => (state, charge_of(layer)),
            None => named_charge(ctx, key, layer, i)?,
        };
        let given = refund_layer(ctx, key, layer, state, charge, now, emptied)?;
        reply.push(given as i64);
    }
    Ok(reply)
}

/// The keys a release deleted, their `DEL` replicated when it is dropped:
/// on every way out of the release, an early error and a panic included.
struct Emptied<'c, 'k> {
    ctx: &'c Context,
    keys: Vec<&'k RedisString>,
}

impl Drop for Emptied<'_, '_> {
    fn drop(&mut self) {
        keyspace::replicate_deletes(self.ctx, &self.keys);
    }
}

/// What a concurrency limit's release finds at `key` (a key that cannot
/// be read holds no state: a release never fails on it); `None` for any
/// other layer.
fn holders(ctx: &Context, key: &RedisString, layer: &protocol::Layer, i: usize) -> Option<Holders> {
    let release = matches!(layer.limit, Limit::Concurrency(_)) && layer.layout == Layout::LogText;
    if !release {
        return None;
    }
    let found = keyspace::find_holders(ctx, key, layer, i + 1);
    Some(found.unwrap_or(Holders::Read(None)))
}

/// Give `charge` back at `key` (the layer's state read as `state`): what
/// was given. A key the release empties is deleted and added to
/// `emptied` (its `DEL` replicated by the caller).
fn refund_layer<'k>(
    ctx: &Context,
    key: &'k RedisString,
    layer: &protocol::Layer,
    state: Option<State>,
    charge: Charge,
    now: u64,
    emptied: &mut Vec<&'k RedisString>,
) -> Result<u64, RedisError> {
    let given = match state {
        Some(State::Log(_)) if layer.layout == Layout::Log => {
            keyspace::remove_newest(ctx, key, layer.cost, layer.at)?
        }
        Some(State::Log(held)) => {
            // A concurrency limit's release: the reference's write,
            // TTL included (until the newest entry left ages out).
            let hold = Hold {
                cost: charge.cost,
                at: charge.at,
            };
            let before = State::Log(held);
            match release(&layer.limit, Some(&before), now, hold) {
                Some(stored) if log_len(&stored.state) == 0 => {
                    keyspace::delete_unreplicated(ctx, key)?;
                    emptied.push(key);
                    log_len(&before)
                }
                Some(stored) => {
                    keyspace::write(ctx, key, layer.layout, Some(&before), &stored)?;
                    log_len(&before) - log_len(&stored.state)
                }
                None => 0,
            }
        }
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
    Ok(given)
}

/// The entries of a log (0 for any other state).
fn log_len(state: &State) -> u64 {
    match state {
        State::Log(entries) => entries.len() as u64,
        _ => 0,
    }
}

/// Renew concurrency holds: per layer the time its hold moved to, or 0
/// when it was lost (`tollgate_algorithms::renew`).
fn renew_layers(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Vec<i64>, RedisError> {
    each_named_charge(ctx, keys, call, |key, layer, state, hold| {
        let renewal = renew(&layer.limit, state.as_ref(), now, hold);
        if let Some(stored) = &renewal.next {
            keyspace::write(ctx, key, layer.layout, state.as_ref(), stored)?;
        }
        Ok(renewal.at as i64)
    })
}

/// `each` layer's answer (its key, its arguments, its state and the
/// charge or hold they name), one per layer in order.
fn each_named_charge<'k>(
    ctx: &Context,
    keys: &'k [RedisString],
    call: &Call,
    mut each: impl FnMut(
        &'k RedisString,
        &protocol::Layer,
        Option<State>,
        Charge,
    ) -> Result<i64, RedisError>,
) -> Result<Vec<i64>, RedisError> {
    let mut reply = Vec::with_capacity(keys.len());
    for (i, (key, layer)) in keys.iter().zip(&call.layers).enumerate() {
        let (state, charge) = named_charge(ctx, key, layer, i)?;
        reply.push(each(key, layer, state, charge)?);
    }
    Ok(reply)
}

/// Layer `i`'s state and the charge (or hold) its arguments name. A
/// missing key or one Tollgate did not write is no state: nothing is
/// given back or renewed there.
fn named_charge(
    ctx: &Context,
    key: &RedisString,
    layer: &protocol::Layer,
    i: usize,
) -> Result<(Option<State>, Charge), RedisError> {
    let state = keyspace::read(ctx, key, layer, i + 1).ok().flatten();
    Ok((state, charge_of(layer)))
}

/// The charge (or hold) a refund's or renewal's layer arguments name.
fn charge_of(layer: &protocol::Layer) -> Charge {
    Charge {
        cost: layer.cost,
        at: layer.at,
        mark: layer.mark,
    }
}
