//! A string value written through the module key API, with an absolute
//! expiry: what `SET key value PXAT at` does, without running `SET`
//! through `RedisModule_Call` (which builds a client call — argument
//! objects, a command lookup, a reply — for every write; without it a
//! token-bucket decision costs Redis about 0.86× as much, see
//! docs/benchmarks.md, "The native module").
//!
//! The write is replicated explicitly as that same `SET … PXAT at`, so
//! replicas and the AOF hold the primary's value and expiry to the
//! millisecond, and fires the keyspace events a client's `SET … PX`
//! fires (`set`, then `expire`).

use redis_module::{raw, Context, NotifyEvent, RedisError, RedisString};

/// Set `key` to `value`, expiring at `at_ms` (Unix ms). `false` when this
/// server's module API lacks `SetAbsExpire` (before Redis 7.0): nothing
/// was written, and the caller writes through `SET` instead.
pub(crate) fn set_until(
    ctx: &Context,
    key: &RedisString,
    value: &str,
    at_ms: u64,
) -> Result<bool, RedisError> {
    let at =
        i64::try_from(at_ms).map_err(|_| RedisError::Str("TOLLGATE_ARGS expiry out of range"))?;
    // SAFETY: reading a `static mut` function pointer that Redis set once,
    // when the module loaded (`RedisModule_Init`), before any command ran;
    // nothing writes it afterwards.
    #[allow(unsafe_code)]
    let Some(set_abs_expire) = (unsafe { raw::RedisModule_SetAbsExpire }) else {
        return Ok(false);
    };
    let value = RedisString::create(std::ptr::NonNull::new(ctx.ctx), value);
    let handle = OpenKey(raw::open_key(ctx.ctx, key.inner, raw::KeyMode::WRITE));
    if handle.0.is_null() {
        // Opened for writing, a key always has a handle; should that ever
        // change, nothing is written.
        return Err(RedisError::Str("TOLLGATE_FAILED the key API opened no key"));
    }
    if raw::string_set(handle.0, value.inner) == raw::Status::Err {
        return Err(RedisError::Str(
            "TOLLGATE_FAILED the key API refused a write",
        ));
    }
    // SAFETY: `handle.0` is a key opened for writing on this command's
    // context, just given a value (so it is not empty, as SetAbsExpire
    // requires), and still open: `handle` closes it when dropped, after
    // this call. `at` is a plain integer.
    #[allow(unsafe_code)]
    let set = unsafe { set_abs_expire(handle.0, at) };
    if set != raw::REDISMODULE_OK as i32 {
        return Err(RedisError::Str(
            "TOLLGATE_FAILED the key API refused an expiry",
        ));
    }
    drop(handle);
    // Passed as the module's strings: the key and the value are not
    // copied again for the replication stream.
    let pxat = RedisString::create(std::ptr::NonNull::new(ctx.ctx), "PXAT");
    let at = RedisString::create(std::ptr::NonNull::new(ctx.ctx), at_ms.to_string());
    ctx.replicate("SET", &[key, &value, &pxat, &at][..]);
    ctx.notify_keyspace_event(NotifyEvent::STRING, "set", key);
    ctx.notify_keyspace_event(NotifyEvent::GENERIC, "expire", key);
    Ok(true)
}

/// A key opened through the module API, closed when dropped (which also
/// tells Redis the key changed: `WATCH` and client-side caching see it).
struct OpenKey(*mut raw::RedisModuleKey);

impl Drop for OpenKey {
    fn drop(&mut self) {
        if !self.0.is_null() {
            raw::close_key(self.0);
        }
    }
}
