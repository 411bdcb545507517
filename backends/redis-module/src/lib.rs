//! Tollgate's algorithms inside Redis: `TOLLGATE.DECIDE` decides every
//! layer of a request at once, all-or-nothing, with the reference
//! algorithms of `tollgate-algorithms` compiled into the server — the same
//! code as the in-process store, so the two cannot disagree.
//!
//! The command takes the Lua path's arguments, answers its replies and
//! reads and writes its encoding and key layout — all of them
//! `tollgate-redis-protocol`'s — so servers with and without the module,
//! or a Cluster whose masters differ, share states. Writes are replicated as their
//! effects with absolute expiries (see `keyspace.rs`); keys are declared
//! through the module API's key-position callback, so Cluster routing,
//! `CROSSSLOT` checks and ACL key patterns apply.
//!
//! Load it with `loadmodule /path/to/libtollgate_redis_module.so` in
//! redis.conf, `redis-server --loadmodule …` or `MODULE LOAD …`; the Redis
//! store uses it when it finds it (docs/redis-module.md).
//!
//! `TOLLGATE.PROTOCOL` answers [`PROTOCOL`], the calling convention's
//! version: a store only sends `TOLLGATE.DECIDE` to a module that speaks
//! its own.

mod decide;
mod key_api;
mod keyspace;
mod list_log;

use std::panic::AssertUnwindSafe;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

pub use tollgate_redis_protocol::PROTOCOL;

fn protocol(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::Integer(PROTOCOL))
}

fn decide_command(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if ctx.is_keys_position_request() {
        // The keys follow numkeys; a call whose numkeys is more than its
        // arguments declares none (the command then refuses it).
        let raw: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
        if let Ok(n) = tollgate_redis_protocol::numkeys(&raw) {
            for i in 0..n {
                ctx.key_at_pos((2 + i) as i32);
            }
        }
        return Ok(RedisValue::NoReply);
    }
    // A panic unwinding into Redis's C frames would abort the server. None
    // is reachable from a client (arguments and stored numbers are checked
    // before any arithmetic); should one happen, the call fails instead of
    // the server.
    std::panic::catch_unwind(AssertUnwindSafe(|| decide::run(ctx, &args))).unwrap_or_else(|_| {
        Err(RedisError::Str(
            "TOLLGATE_FAILED the module failed on this call (a bug: please report it with the call's arguments)",
        ))
    })
}

// The module's entry point. `redis_module!` expands to the `unsafe`
// `RedisModule_OnLoad` and command trampolines the module API requires
// (C functions Redis calls with its own pointers). The only other
// `unsafe` is the calls the module's safe API lacks: `key_api.rs`'s
// `RedisModule_SetAbsExpire` and in-place string writes, and
// `list_log.rs`'s list reads (each block says why it is sound).
#[allow(unsafe_code)]
mod entry {
    use super::{decide_command, protocol};
    use redis_module::redis_module;

    redis_module! {
        name: "tollgate",
        version: 1,
        // The system allocator: the crate's tests link it outside Redis.
        allocator: (std::alloc::System, std::alloc::System),
        data_types: [],
        commands: [
            // `getkeys-api`: the keys are declared by the callback above
            // (a count, then the keys, then other arguments).
            ["tollgate.decide", decide_command, "write deny-oom getkeys-api", 0, 0, 0],
            ["tollgate.protocol", protocol, "readonly fast", 0, 0, 0],
        ],
    }
}
