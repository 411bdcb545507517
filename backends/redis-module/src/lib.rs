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
mod key_shape;
mod keyspace;
mod list_log;

use std::panic::AssertUnwindSafe;

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};

pub use tollgate_redis_protocol::PROTOCOL;

fn protocol(_ctx: &Context, _args: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::Integer(PROTOCOL))
}

fn decide_command(ctx: &Context, args: &[RedisString]) -> RedisResult {
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
    match std::panic::catch_unwind(AssertUnwindSafe(|| decide::run(ctx, args))) {
        Ok(Ok(integers)) => {
            reply_integers(ctx, &integers);
            Ok(RedisValue::NoReply)
        }
        Ok(Err(e)) => Err(printable(e)),
        Err(_) => Err(RedisError::Str(
            "TOLLGATE_FAILED the module failed on this call (a bug: please report it with the call's arguments)",
        )),
    }
}

/// `e` as an error reply can carry it: printable ASCII only. An error of a
/// command the module runs inside its own (a renamed `DEL`: "unknown
/// command … with args beginning with: '<key>'") quotes the client's key,
/// and the reply's conversion turns a character past ASCII into a NUL
/// byte and panics outside the guard above, aborting the server.
fn printable(e: RedisError) -> RedisError {
    match e {
        RedisError::String(text) if !text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) => {
            let shown = |c: char| match c {
                ' ' => ' ',
                c if c.is_ascii_graphic() => c,
                _ => '?',
            };
            RedisError::String(text.chars().map(shown).collect())
        }
        other => other,
    }
}

/// Reply an array of `integers`, written straight to the client (no
/// `RedisValue` built for each).
fn reply_integers(ctx: &Context, integers: &[i64]) {
    raw::reply_with_array(ctx.ctx, integers.len() as std::os::raw::c_long);
    for &n in integers {
        raw::reply_with_long_long(ctx.ctx, n);
    }
}

// The module's entry point. `redis_module!` expands to the `unsafe`
// `RedisModule_OnLoad` and command trampolines the module API requires
// (C functions Redis calls with its own pointers); `TOLLGATE.DECIDE` has
// its own (`decide_entry`, which borrows its arguments). The only other
// `unsafe` is the calls the module's safe API lacks: `key_api.rs`'s
// `RedisModule_SetAbsExpire`, in-place string writes, `DeleteKey` on a
// key it opened and `RedisModule_Replicate` with its own format,
// `key_shape.rs`'s type and length reads, and `list_log.rs`'s list reads
// (each block says why it is sound).
#[allow(unsafe_code)]
mod entry {
    use std::mem::ManuallyDrop;
    use std::os::raw::c_int;

    use super::{decide_command, protocol};
    use redis_module::{raw, redis_module, Context, RedisString, Status};

    redis_module! {
        name: "tollgate",
        version: 1,
        // The system allocator: the crate's tests link it outside Redis.
        allocator: (std::alloc::System, std::alloc::System),
        data_types: [],
        init: register_decide,
        commands: [
            ["tollgate.protocol", protocol, "readonly fast", 0, 0, 0],
        ],
    }

    /// Register `TOLLGATE.DECIDE` with its own entry point
    /// ([`decide_entry`]). `getkeys-api`: the keys are declared by
    /// `decide_command` when asked (a count, then the keys, then other
    /// arguments).
    fn register_decide(ctx: &Context, _args: &[RedisString]) -> Status {
        // SAFETY: reading a `static mut` function pointer that Redis set
        // in `RedisModule_Init`, which `RedisModule_OnLoad` ran before
        // this; nothing writes it afterwards.
        let Some(create_command) = (unsafe { raw::RedisModule_CreateCommand }) else {
            return Status::Err;
        };
        // SAFETY: `ctx` is the context Redis passed to `RedisModule_OnLoad`
        // (the one function allowed to create commands); the name and flags
        // are NUL-terminated literals, which Redis copies.
        let created = unsafe {
            create_command(
                ctx.ctx,
                c"tollgate.decide".as_ptr(),
                Some(decide_entry),
                c"write deny-oom getkeys-api".as_ptr(),
                0,
                0,
                0,
            )
        };
        if created == raw::Status::Ok as c_int {
            Status::Ok
        } else {
            Status::Err
        }
    }

    /// `TOLLGATE.DECIDE`'s entry point. `redis_module!`'s own retains each
    /// argument for the call and releases it after (a reference count
    /// taken and given back, through the module API, per argument: 3% of a
    /// decision's instructions); here they are borrowed: Redis owns them,
    /// and they live until the command returns.
    extern "C" fn decide_entry(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> c_int {
        let context = Context::new(ctx);
        let argv: &[*mut raw::RedisModuleString] = match usize::try_from(argc) {
            // SAFETY: Redis passes its `argc` arguments at `argv`, valid
            // and unchanged until this function returns; the slice does
            // not outlive it.
            Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
            _ => &[],
        };
        // Not retained, so never released: the strings stay Redis's (a
        // panic, which would abort the server anyway, leaves them too).
        let args = ManuallyDrop::new(
            argv.iter()
                .map(|&s| RedisString::from_redis_module_string(ctx, s))
                .collect::<Vec<_>>(),
        );
        let reply = decide_command(&context, &args);
        ManuallyDrop::into_inner(args)
            .into_iter()
            .for_each(std::mem::forget);
        context.reply(reply) as c_int
    }
}
