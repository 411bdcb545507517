//! Reading and writing states in the keyspace of the call, replicating
//! every write as its effect (never the command: a decision depends on the
//! clock, so replaying the command on a replica or from the AOF would
//! decide again, later, differently).

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::key::RedisKey;
use redis_module::{
    CallOptions, CallOptionsBuilder, CallReply, CallResult, Context, KeyType, NotifyEvent,
    RedisError, RedisString, RedisValue,
};
use tollgate_limiter::{Layout, State, Stored};
use tollgate_redis_protocol::{
    block_text, px, read_cells, read_log_text, write_cells, write_log_text, Layer, LogEdit,
    LogReader, PUSH_CHUNK, TEXT_LOG_MAX,
};

/// The server's clock in µs since the Unix epoch: the clock of `TIME`.
pub(crate) fn server_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The conflict error for the `i`-th key (1-based): the Redis store reads
/// it as `StoreError::Conflict` naming the layer's policy.
pub(crate) fn conflict(i: usize, found: &str) -> RedisError {
    RedisError::String(format!("TOLLGATE_CONFLICT {i} {found}"))
}

/// The state of layer `i` (1-based) at `key`: `None` when the key is
/// missing; a conflict when it holds anything Tollgate did not write, or
/// numbers no state of the layer's algorithm could hold (nothing is
/// written then).
pub(crate) fn read(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    i: usize,
) -> Result<Option<State>, RedisError> {
    match find(ctx, key, layer, i)? {
        Found::State(state) => Ok(state),
        Found::List => read_log(ctx, key, i).map(Some),
    }
}

/// What [`find`] found at a layer's key.
pub(crate) enum Found {
    /// Its state, read (`None`: the key is missing).
    State(Option<State>),
    /// A log kept as a list, not read yet.
    List,
}

/// As [`read`], but a log kept as a list is left unread (its caller may
/// read only the entries it needs: `list_log.rs`).
pub(crate) fn find(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    i: usize,
) -> Result<Found, RedisError> {
    found_in(&ctx.open_key(key), layer, i)
}

/// What [`find`] finds in the key `k`, opened.
fn found_in(k: &RedisKey, layer: &Layer, i: usize) -> Result<Found, RedisError> {
    let state = match (k.key_type(), layer.layout) {
        (KeyType::Empty, _) => Ok(None),
        (KeyType::String, layout @ Layout::Cells { .. }) => {
            let v = k.read()?.unwrap_or_default();
            read_cells(layout, v)
                .filter(|state| tollgate_algorithms::within_reach(&layer.limit, state))
                .map(Some)
                .ok_or_else(|| conflict(i, "not_a_state"))
        }
        (KeyType::String, Layout::LogText) => {
            let v = k.read()?.unwrap_or_default();
            read_log_text(v)
                .ok_or_else(|| conflict(i, "not_a_state"))
                .map(Some)
        }
        (KeyType::List, Layout::Log | Layout::LogText) => return Ok(Found::List),
        _ => Err(conflict(i, "wrong_type")),
    };
    state.map(Found::State)
}

/// What a release finds at a concurrency limit's key, looked up once.
pub(crate) enum Holders {
    /// The hold's one entry alone
    /// ([`holds_alone`](tollgate_redis_protocol::holds_alone)): nothing
    /// parsed.
    Alone,
    /// Anything else, read as [`read`] reads it.
    Read(Option<State>),
}

/// What layer `i` (1-based), a concurrency limit's, holds at `key` for a
/// release of its hold (the layer's `at`), with one lookup of the key as
/// a decision makes (`keyspace_hits` counts one per release), and one more
/// for holders kept as a list (read with `LRANGE`).
pub(crate) fn find_holders(
    ctx: &Context,
    key: &RedisString,
    layer: &Layer,
    i: usize,
) -> Result<Holders, RedisError> {
    let k = ctx.open_key(key);
    if k.key_type() == KeyType::String
        && matches!(k.read(), Ok(Some(v)) if tollgate_redis_protocol::holds_alone(v, layer.at))
    {
        return Ok(Holders::Alone);
    }
    match found_in(&k, layer, i)? {
        Found::State(state) => Ok(Holders::Read(state)),
        Found::List => {
            drop(k);
            read_log(ctx, key, i).map(|state| Holders::Read(Some(state)))
        }
    }
}

/// The sliding log (or block) in the list at `key`, read with `LRANGE`
/// and parsed from the reply where it lies.
fn read_log(ctx: &Context, key: &RedisString, i: usize) -> Result<State, RedisError> {
    let options: CallOptions = CallOptionsBuilder::new().errors_as_replies().build();
    let reply: CallResult<'_> =
        ctx.call_ext("LRANGE", &options, &[key.as_slice(), b"0", b"-1"][..]);
    let CallReply::Array(items) = reply.map_err(RedisError::from)? else {
        return Err(RedisError::Str("TOLLGATE_ARGS LRANGE answered a non-list"));
    };
    let mut log = LogReader::with_capacity(items.len());
    for item in items.iter() {
        let taken = match item {
            Ok(CallReply::String(s)) => log.push(s.as_bytes()),
            _ => false,
        };
        if !taken {
            return Err(conflict(i, "not_a_state"));
        }
    }
    log.finish().ok_or_else(|| conflict(i, "not_a_state"))
}

/// The remaining TTL of `key` in ms (-1: none, -2: missing).
pub(crate) fn pttl(ctx: &Context, key: &RedisString) -> Result<i64, RedisError> {
    match ctx.call("PTTL", &[key.as_slice()][..])? {
        RedisValue::Integer(ms) => Ok(ms),
        _ => Err(RedisError::Str("TOLLGATE_ARGS PTTL answered a non-integer")),
    }
}

/// Keep the state at `key`, which a denial read, for `kept` at least
/// (`tollgate_algorithms::kept_by_denial`): a `PEXPIRE`, replicated, only
/// when its TTL is shorter ([`kept_px`](tollgate_redis_protocol::kept_px)).
pub(crate) fn keep_denied(
    ctx: &Context,
    key: &RedisString,
    kept: std::time::Duration,
) -> Result<(), RedisError> {
    if let Some(px) = tollgate_redis_protocol::kept_px(kept, crate::key_api::pttl(ctx, key)?) {
        effect(ctx, "PEXPIRE", &[key.as_slice(), px.to_string().as_bytes()])?;
    }
    Ok(())
}

/// Run a write through Redis, replicated as it ran.
fn effect(ctx: &Context, command: &str, args: &[&[u8]]) -> Result<(), RedisError> {
    let options: CallOptions = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .build();
    let reply: CallResult<'_> = ctx.call_ext(command, &options, args);
    reply.map(|_| ()).map_err(RedisError::from)
}

/// Store counter `cells`, kept as `layout`, at `key` for `ttl_ms`
/// milliseconds.
pub(crate) fn write_counter(
    ctx: &Context,
    key: &RedisString,
    layout: Layout,
    cells: [u64; 3],
    ttl_ms: u64,
) -> Result<(), RedisError> {
    write_string(ctx, key, &write_cells(layout, cells), ttl_ms)
}

/// `text` at `key` for `ttl_ms` from now, written through the key API
/// and replicated as `SET … PXAT` ([`key_api`](crate::key_api)); on
/// a server without that API, `SET key text PX ttl_ms` run through Redis
/// (which propagates the `PXAT` it stored). Either way the primary, its
/// replicas and the AOF agree to the millisecond, and the keyspace events
/// are a client `SET`'s. (Redis keeps the value as a string, not in the
/// compact integer form a client's `SET` of a number gets.)
fn write_string(
    ctx: &Context,
    key: &RedisString,
    text: &str,
    ttl_ms: u64,
) -> Result<(), RedisError> {
    let at_ms = server_micros() / 1_000 + ttl_ms;
    if crate::key_api::set_until(ctx, key, text, at_ms)? {
        return Ok(());
    }
    let ttl = ttl_ms.to_string();
    effect(
        ctx,
        "SET",
        &[key.as_slice(), text.as_bytes(), b"PX", ttl.as_bytes()],
    )
}

/// Store what the reference decided for a layer kept as `layout`, whose
/// state was `before`: counter cells, a block or a log kept as text as a
/// string, a sliding log as a list edited into the next one, each living
/// the state's TTL ([`px`]).
pub(crate) fn write(
    ctx: &Context,
    key: &RedisString,
    layout: Layout,
    before: Option<&State>,
    stored: &Stored,
) -> Result<(), RedisError> {
    let ttl = px(stored.ttl);
    match &stored.state {
        State::Cells(cells) => write_counter(ctx, key, layout, *cells, ttl),
        State::Log(next) if layout == Layout::LogText => write_holders(ctx, key, before, next, ttl),
        State::Blocked(until) if layout == Layout::Log => {
            replace_list(ctx, key, &[block_text(*until)], ttl)
        }
        State::Blocked(until) => write_string(ctx, key, &block_text(*until), ttl),
        State::Log(next) => write_log(ctx, key, before, next, ttl),
        // A state of a later release: written by nothing this module runs.
        _ => Err(RedisError::Str(
            "TOLLGATE_ARGS the algorithms made a state this module cannot store",
        )),
    }
}

/// A concurrency limit's holders `next` at `key`, which held `before`: as
/// text while they are [`TEXT_LOG_MAX`] or fewer, else as a list (the
/// list edited, or made from them when the key held text); an empty log
/// removes the key.
fn write_holders(
    ctx: &Context,
    key: &RedisString,
    before: Option<&State>,
    next: &VecDeque<u64>,
    ttl: u64,
) -> Result<(), RedisError> {
    if next.is_empty() {
        return delete_one(ctx, key);
    }
    if next.len() <= TEXT_LOG_MAX {
        // (A string set through the key API replaces a list.)
        return write_string(ctx, key, &write_log_text(next), ttl);
    }
    if ctx.open_key(key).key_type() == KeyType::String {
        let entries: Vec<String> = next.iter().map(u64::to_string).collect();
        return replace_list(ctx, key, &entries, ttl);
    }
    write_log(ctx, key, before, next, ttl)
}

/// Turn the list at `key`, which held `before`, into the log `next`.
fn write_log(
    ctx: &Context,
    key: &RedisString,
    before: Option<&State>,
    next: &VecDeque<u64>,
    ttl: u64,
) -> Result<(), RedisError> {
    let k = key.as_slice();
    let empty = VecDeque::new();
    let old = match before {
        Some(State::Log(old)) => old,
        // A block (ended) is a list of one item that is no entry: the log
        // is written anew.
        Some(_) if next.is_empty() => return effect(ctx, "DEL", &[k]),
        Some(_) => {
            let entries: Vec<String> = next.iter().map(u64::to_string).collect();
            return replace_list(ctx, key, &entries, ttl);
        }
        None => &empty,
    };
    match LogEdit::between(old, next) {
        LogEdit::Keep => {}
        LogEdit::Delete => return effect(ctx, "DEL", &[k]),
        LogEdit::Truncate { keep } => {
            let end = (keep - 1).to_string();
            effect(ctx, "LTRIM", &[k, b"0", end.as_bytes()])?;
        }
        LogEdit::Append { drop, stamp, push } => {
            return append_log(ctx, key, drop, stamp, push, ttl)
        }
        LogEdit::Remove { value, count } => {
            // The key holds the entries left: it exists when the expiry
            // below is set.
            remove_newest(ctx, key, count as u64, value)?;
        }
        LogEdit::Replace => {
            let entries: Vec<String> = next.iter().map(u64::to_string).collect();
            return replace_list(ctx, key, &entries, ttl);
        }
    }
    effect(ctx, "PEXPIRE", &[k, ttl.to_string().as_bytes()])
}

/// Make the list at `key` hold `entries` alone, living `ttl` ms: through
/// the key API ([`key_api::replace_list_until`](crate::key_api::replace_list_until):
/// no command run through Redis after the delete, which a Cluster slot
/// being migrated would redirect, failing with the state gone); through
/// Redis's commands on a server without that API's absolute expiry.
fn replace_list<T: AsRef<str>>(
    ctx: &Context,
    key: &RedisString,
    entries: &[T],
    ttl: u64,
) -> Result<(), RedisError> {
    let at_ms = server_micros() / 1_000 + ttl;
    let items: Vec<&str> = entries.iter().map(AsRef::as_ref).collect();
    if crate::key_api::replace_list_until(ctx, key, &items, PUSH_CHUNK as usize, at_ms)? {
        return Ok(());
    }
    let k = key.as_slice();
    effect(ctx, "DEL", &[k])?;
    push_entries(ctx, k, &items)?;
    effect(ctx, "PEXPIRE", &[k, ttl.to_string().as_bytes()])
}

/// The list at `key` without its oldest `drop` entries (`LTRIM`, run
/// through Redis: one call however many go), with `push` copies of
/// `stamp` appended and living `ttl` ms (through the key API, replicated
/// as `RPUSH` and `PEXPIREAT`: [`key_api`](crate::key_api)).
pub(crate) fn append_log(
    ctx: &Context,
    key: &RedisString,
    drop: usize,
    stamp: u64,
    push: usize,
    ttl: u64,
) -> Result<(), RedisError> {
    let k = key.as_slice();
    if drop > 0 {
        effect(ctx, "LTRIM", &[k, drop.to_string().as_bytes(), b"-1"])?;
    }
    // One time, written once and pushed `push` times.
    let stamp = stamp.to_string();
    let at_ms = server_micros() / 1_000 + ttl;
    if crate::key_api::push_until(ctx, key, &stamp, push, PUSH_CHUNK as usize, at_ms)? {
        return Ok(());
    }
    push_entries(ctx, k, &vec![stamp.as_str(); push])?;
    effect(ctx, "PEXPIRE", &[k, ttl.to_string().as_bytes()])
}

/// `RPUSH` the decimal `texts` to the list at `k`, [`PUSH_CHUNK`] at a
/// time.
fn push_entries<T: AsRef<[u8]>>(ctx: &Context, k: &[u8], texts: &[T]) -> Result<(), RedisError> {
    for chunk in texts.chunks(PUSH_CHUNK as usize) {
        let mut args: Vec<&[u8]> = Vec::with_capacity(chunk.len() + 1);
        args.push(k);
        args.extend(chunk.iter().map(AsRef::as_ref));
        effect(ctx, "RPUSH", &args)?;
    }
    Ok(())
}

/// Delete `key` through the key API, replicated as `DEL` and with the
/// event a client's `DEL` fires (no client call built for it).
fn delete_one(ctx: &Context, key: &RedisString) -> Result<(), RedisError> {
    delete_unreplicated(ctx, key)?;
    replicate_deletes(ctx, &[key]);
    Ok(())
}

/// Delete `key` through the key API with a client `DEL`'s event, leaving
/// its replication to [`replicate_deletes`]: a release that empties many
/// keys replicates one `DEL` for all of them (each `DEL` replicated alone
/// costs a command lookup and its arguments, about as much as the delete).
pub(crate) fn delete_unreplicated(ctx: &Context, key: &RedisString) -> Result<(), RedisError> {
    ctx.open_key_writable(key).delete()?;
    crate::key_api::notify(ctx, NotifyEvent::GENERIC, c"del", key);
    Ok(())
}

/// Replicate the deletion of `keys` as one `DEL` (none when empty).
pub(crate) fn replicate_deletes(ctx: &Context, keys: &[&RedisString]) {
    if !keys.is_empty() {
        ctx.replicate("DEL", keys);
    }
}

/// Delete `keys`.
pub(crate) fn delete(ctx: &Context, keys: &[RedisString]) -> Result<(), RedisError> {
    let args: Vec<&[u8]> = keys.iter().map(RedisString::as_slice).collect();
    if args.is_empty() {
        return Ok(());
    }
    effect(ctx, "DEL", &args)
}

/// `LREM key -cost at`: up to `cost` entries equal to `at`, newest first;
/// how many went.
pub(crate) fn remove_newest(
    ctx: &Context,
    key: &RedisString,
    cost: u64,
    at: u64,
) -> Result<u64, RedisError> {
    let count = format!("-{cost}");
    let at = at.to_string();
    let options: CallOptions = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .build();
    let reply: CallResult<'_> = ctx.call_ext(
        "LREM",
        &options,
        &[key.as_slice(), count.as_bytes(), at.as_bytes()][..],
    );
    match reply {
        Ok(CallReply::I64(n)) => Ok(n.to_i64().max(0) as u64),
        Ok(_) => Err(RedisError::Str("TOLLGATE_ARGS LREM answered a non-integer")),
        Err(e) => Err(e.into()),
    }
}
