//! Writes through the module key API, with an absolute expiry: what
//! `SET key value PXAT at` and `RPUSH key …` then `PEXPIREAT key at` do,
//! without running those commands through `RedisModule_Call` (which
//! builds a client call — argument objects, a command lookup, a reply —
//! for every write; without it a token-bucket decision costs Redis about
//! 0.86× as much, see docs/benchmarks.md, "The native module").
//!
//! A string that keeps its length is written over in place
//! ([`OpenKey::overwrite`]): the key stays where it is in the keyspace.
//!
//! Each write is replicated explicitly as those same commands, so
//! replicas and the AOF hold the primary's value and expiry to the
//! millisecond, and fires the keyspace events a client's commands fire.

use std::ffi::CStr;

use redis_module::{raw, Context, NotifyEvent, RedisError, RedisString};

use crate::key_shape::KeyShape;

/// Set `key` to `value`, expiring at `at_ms` (Unix ms). `false` when this
/// server's module API lacks `SetAbsExpire` (before Redis 7.0): nothing
/// was written, and the caller writes through `SET` instead.
pub(crate) fn set_until(
    ctx: &Context,
    key: &RedisString,
    value: &str,
    at_ms: u64,
) -> Result<bool, RedisError> {
    let Some(expiry) = expiry(at_ms)? else {
        return Ok(false);
    };
    let handle = OpenKey::writable(ctx, key)?;
    if handle.overwrite(value.as_bytes())? == Overwritten::No
        && !handle.create_plain(value.as_bytes())?
    {
        let value = text(ctx, value.as_bytes());
        if raw::string_set(handle.0, value.inner) == raw::Status::Err {
            return Err(RedisError::Str(
                "TOLLGATE_FAILED the key API refused a write",
            ));
        }
    }
    handle.expire_at(expiry)?;
    drop(handle);
    replicate_set(ctx, key, value.as_bytes(), expiry.at);
    notify(ctx, NotifyEvent::STRING, c"set", key);
    notify(ctx, NotifyEvent::GENERIC, c"expire", key);
    Ok(true)
}

/// Append `push` copies of `stamp` (none: only the expiry) to the list at
/// `key` (created when missing; it must hold a list afterwards), expiring
/// at `at_ms`; replicated as `RPUSH`es of at most `chunk` items each, then
/// `PEXPIREAT`. `false` when this server's
/// module API lacks `SetAbsExpire`: nothing was written, and the caller
/// writes through the commands instead.
pub(crate) fn push_until(
    ctx: &Context,
    key: &RedisString,
    stamp: &str,
    push: usize,
    chunk: usize,
    at_ms: u64,
) -> Result<bool, RedisError> {
    let stamp = [text(ctx, stamp.as_bytes())];
    let items = (0..push).map(|_| &stamp[0]);
    write_list_until(ctx, key, Start::AtTheEnd, items, chunk, at_ms)
}

/// Make the list at `key` hold `items` alone (whatever the key held
/// before is deleted), expiring at `at_ms`; replicated as `DEL`, `RPUSH`es
/// of at most `chunk` items each, then `PEXPIREAT`. Through the key API,
/// never a command run through Redis: in a Cluster slot being migrated,
/// Redis redirects such a command on a key that is missing, so one run
/// after the delete would fail with the state already gone. `false` as
/// [`push_until`] says.
pub(crate) fn replace_list_until(
    ctx: &Context,
    key: &RedisString,
    items: &[&str],
    chunk: usize,
    at_ms: u64,
) -> Result<bool, RedisError> {
    let items: Vec<RedisString> = items.iter().map(|i| text(ctx, i.as_bytes())).collect();
    write_list_until(ctx, key, Start::Anew, items.iter(), chunk, at_ms)
}

/// Where [`write_list_until`] puts its items.
#[derive(PartialEq, Eq)]
enum Start {
    /// After the list's own.
    AtTheEnd,
    /// In place of whatever the key held.
    Anew,
}

/// Push `items` to the list at `key` (`start`: after its own, or anew),
/// expiring at `at_ms`, as [`push_until`] and [`replace_list_until`] say.
fn write_list_until<'a>(
    ctx: &Context,
    key: &RedisString,
    start: Start,
    items: impl ExactSizeIterator<Item = &'a RedisString> + Clone,
    chunk: usize,
    at_ms: u64,
) -> Result<bool, RedisError> {
    let Some(expiry) = expiry(at_ms)? else {
        return Ok(false);
    };
    let handle = OpenKey::writable(ctx, key)?;
    // (A key that held nothing is not deleted, as a client's `DEL` of it
    // replicates nothing and fires no event.)
    let deleted = start == Start::Anew && !handle.is_empty()?;
    if deleted {
        handle.delete()?;
    }
    for item in items.clone() {
        // (Redis copies the item's bytes into the list.)
        if raw::list_push(handle.0, raw::Where::ListTail, item.inner) == raw::Status::Err {
            // Only a key of another type refuses, which the caller read
            // as a list (or deleted) before anything was written.
            return Err(RedisError::Str(
                "TOLLGATE_FAILED the key API refused a list write",
            ));
        }
    }
    let push = items.len();
    if push > 0 || start == Start::AtTheEnd {
        handle.expire_at(expiry)?;
    }
    drop(handle);
    if deleted {
        ctx.replicate("DEL", &[key][..]);
        notify(ctx, NotifyEvent::GENERIC, c"del", key);
    }
    if start == Start::Anew && push == 0 {
        return Ok(true);
    }
    // One `RPUSH` replicated, and its event fired, per chunk (as the
    // commands run through Redis did); none when nothing was pushed.
    let items: Vec<&RedisString> = items.collect();
    for part in items.chunks(chunk.max(1)) {
        let mut args: Vec<&RedisString> = Vec::with_capacity(part.len() + 1);
        args.push(key);
        args.extend_from_slice(part);
        ctx.replicate("RPUSH", &args[..]);
        notify(ctx, NotifyEvent::LIST, c"rpush", key);
    }
    let at = text(ctx, at_ms.to_string().as_bytes());
    ctx.replicate("PEXPIREAT", &[key, &at][..]);
    notify(ctx, NotifyEvent::GENERIC, c"expire", key);
    Ok(true)
}

/// Replicate `SET key value PXAT at_ms`. Called through the module API's
/// own format (`s`: the key's string; `b`: the value's bytes; `c`, `l`:
/// the option and the time) rather than `Context::replicate`, which
/// allocates a C string of the command's name and a vector of arguments,
/// and would need Redis strings made of the value and the time first:
/// four allocations of Redis's allocator per decision.
fn replicate_set(ctx: &Context, key: &RedisString, value: &[u8], at_ms: raw::mstime_t) {
    // SAFETY: reading a `static mut` function pointer that Redis set once,
    // when the module loaded (`RedisModule_Init`), before any command ran;
    // nothing writes it afterwards.
    #[allow(unsafe_code)]
    let Some(replicate) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let at: std::ffi::c_longlong = at_ms;
    // SAFETY: `ctx` is this command's context; the format names exactly
    // the arguments that follow, in order and of the C types Redis reads
    // them as (`moduleCreateArgvFromUserFormat`): `s` a module string
    // (`key.inner`, alive for the call; Redis takes its own reference),
    // `b` a pointer and a `size_t` length (`value`, read and copied before
    // the call returns), `c` a NUL-terminated C string (static), `l` a
    // `long long`. Both C strings are NUL-terminated literals.
    #[allow(unsafe_code)]
    unsafe {
        replicate(
            ctx.ctx,
            c"SET".as_ptr(),
            c"sbcl".as_ptr(),
            key.inner,
            value.as_ptr(),
            value.len(),
            c"PXAT".as_ptr(),
            at,
        );
    }
}

/// Fire the keyspace event `event` of `kind` on `key`, as the client
/// command it stands for would. (The `redis-module` crate's
/// `notify_keyspace_event` copies the event's name into a new C string at
/// every call: an allocation per event, two per decision.)
pub(crate) fn notify(ctx: &Context, kind: NotifyEvent, event: &CStr, key: &RedisString) {
    // SAFETY: reading a `static mut` function pointer that Redis set once,
    // when the module loaded (`RedisModule_Init`), before any command ran;
    // nothing writes it afterwards.
    #[allow(unsafe_code)]
    let Some(notify) = (unsafe { raw::RedisModule_NotifyKeyspaceEvent }) else {
        return;
    };
    // SAFETY: `ctx` is this command's context and `key` a string alive for
    // the call; `event` is NUL-terminated and outlives the call (Redis
    // copies what it passes on).
    #[allow(unsafe_code)]
    unsafe {
        notify(ctx.ctx, kind.bits(), event.as_ptr(), key.inner);
    }
}

/// A Redis string of `bytes` (made from the slice: `RedisString::create`
/// copies its text into a `CString` first, one allocation more per
/// string).
fn text(ctx: &Context, bytes: &[u8]) -> RedisString {
    RedisString::create_from_slice(ctx.ctx, bytes)
}

/// The ms `key` has left to live, as `PTTL` answers it (−1: no TTL, or
/// no value; −2: missing), read through the key API: a denial asks it of
/// every key it read, and `PTTL` through `RedisModule_Call` cost it about
/// 0.9 µs of Redis CPU (a third of a decision; docs/benchmarks.md).
pub(crate) fn pttl(ctx: &Context, key: &RedisString) -> Result<i64, RedisError> {
    // SAFETY: reading a `static mut` function pointer that Redis set once,
    // when the module loaded (`RedisModule_Init`), before any command ran;
    // nothing writes it afterwards.
    #[allow(unsafe_code)]
    let get_expire = unsafe { raw::RedisModule_GetExpire }.ok_or(RedisError::Str(
        "TOLLGATE_FAILED this server's module API lacks GetExpire",
    ))?;
    // Opened for reading: closing it signals no change to the key (a key
    // opened for writing does, which a `WATCH` would see).
    let handle = OpenKey(raw::open_key(ctx.ctx, key.inner, raw::KeyMode::READ));
    if handle.0.is_null() {
        return Ok(-2);
    }
    // SAFETY: `handle.0` is a key opened on this command's context, open
    // until `handle` is dropped after this call; GetExpire only reads it.
    #[allow(unsafe_code)]
    let ms = unsafe { get_expire(handle.0) };
    Ok(ms)
}

/// An absolute expiry as the key API sets it.
#[derive(Clone, Copy)]
struct Expiry {
    set_abs_expire: unsafe extern "C" fn(*mut raw::RedisModuleKey, raw::mstime_t) -> i32,
    at: raw::mstime_t,
}

/// The expiry at `at_ms` (Unix ms); `None` when this server lacks
/// `SetAbsExpire`.
fn expiry(at_ms: u64) -> Result<Option<Expiry>, RedisError> {
    let at =
        i64::try_from(at_ms).map_err(|_| RedisError::Str("TOLLGATE_ARGS expiry out of range"))?;
    // SAFETY: reading a `static mut` function pointer that Redis set once,
    // when the module loaded (`RedisModule_Init`), before any command ran;
    // nothing writes it afterwards.
    #[allow(unsafe_code)]
    let set_abs_expire = unsafe { raw::RedisModule_SetAbsExpire };
    Ok(set_abs_expire.map(|set_abs_expire| Expiry { set_abs_expire, at }))
}

/// A key opened through the module API, closed when dropped (which also
/// tells Redis the key changed: `WATCH` and client-side caching see it).
struct OpenKey(*mut raw::RedisModuleKey);

/// What [`OpenKey::overwrite`] did.
#[derive(PartialEq, Eq)]
enum Overwritten {
    InPlace,
    No,
}

impl OpenKey {
    fn writable(ctx: &Context, key: &RedisString) -> Result<OpenKey, RedisError> {
        let handle = OpenKey(raw::open_key(ctx.ctx, key.inner, raw::KeyMode::WRITE));
        if handle.0.is_null() {
            // Opened for writing, a key always has a handle; should that
            // ever change, nothing is written.
            return Err(RedisError::Str("TOLLGATE_FAILED the key API opened no key"));
        }
        Ok(handle)
    }

    /// Write `bytes` over the key's string in place when it holds a
    /// string of that length (`No`: it does not, nothing was written).
    ///
    /// Why: Redis keeps a string set through `StringSet` in its compact
    /// embedded form, which the next read through `StringDMA` copies into
    /// a plain string and swaps into the keyspace (Redis 7.0 and Valkey
    /// 8.0, `module.c`), and the next `StringSet` deletes the key and adds
    /// it again. A plain string written over through `StringDMA` moves
    /// nothing: a decision on a key that lives on costs 0.87–0.89× the
    /// instructions (docs/benchmarks.md). It takes as much memory as
    /// the embedded form (`MEMORY USAGE`: a 16-byte object and an
    /// exact-size buffer, against one allocation of both). A string of
    /// another length is set whole: a plain string is never grown in place
    /// (Redis would keep spare room in it). A new key is made plain by
    /// [`create_plain`](Self::create_plain).
    fn overwrite(&self, bytes: &[u8]) -> Result<Overwritten, RedisError> {
        let shape = KeyShape::get().ok_or(RedisError::Str(
            "TOLLGATE_FAILED this server's module API lacks KeyType or ValueLength",
        ))?;
        // SAFETY: `self.0` is a key opened for writing on this command's
        // context, open until `self` is dropped.
        #[allow(unsafe_code)]
        let length = unsafe { shape.length_if(self.0, raw::REDISMODULE_KEYTYPE_STRING) };
        let same_length = length == Some(bytes.len());
        if !same_length {
            return Ok(Overwritten::No);
        }
        let mut len = 0;
        // (Makes the string plain first when it is not: once per key.)
        let buffer = raw::string_dma(self.0, &mut len, raw::KeyMode::WRITE);
        if buffer.is_null() || len != bytes.len() {
            return Err(RedisError::Str(
                "TOLLGATE_FAILED the key API refused a write",
            ));
        }
        // SAFETY: `buffer` is the string's own buffer of `len` bytes,
        // writable until the key is closed or written otherwise (neither
        // happens before this copy), and `len == bytes.len()`; `bytes`
        // borrows memory of the caller's, never a key's buffer, so the
        // two do not overlap.
        #[allow(unsafe_code)]
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), len);
        }
        Ok(Overwritten::InPlace)
    }

    /// Give a key that holds nothing the string `bytes` in the plain form
    /// [`overwrite`](Self::overwrite) writes over (`false`: the key holds
    /// something, nothing was written).
    ///
    /// Why: a string set through `StringSet` is kept embedded, and the
    /// next read through `StringDMA` copies it into a plain string and
    /// swaps that into the keyspace (an allocation, a lookup and a free):
    /// a concurrency limit's holder is written to a new key and read once,
    /// by its release, so every release paid that copy.
    fn create_plain(&self, bytes: &[u8]) -> Result<bool, RedisError> {
        if bytes.is_empty() || !self.is_empty()? {
            return Ok(false);
        }
        // (On an empty key, Redis creates a plain string of that many
        // zero bytes, `module.c`.)
        if raw::string_truncate(self.0, bytes.len()) == raw::Status::Err {
            return Err(RedisError::Str(
                "TOLLGATE_FAILED the key API refused a write",
            ));
        }
        match self.overwrite(bytes) {
            Ok(Overwritten::InPlace) => Ok(true),
            // The key now holds zero bytes, which no state reads as: it
            // goes, so that no later call finds it a conflict.
            written => {
                self.delete()?;
                written.and(Err(RedisError::Str(
                    "TOLLGATE_FAILED the key API refused a write",
                )))
            }
        }
    }

    /// Whether the key holds nothing.
    fn is_empty(&self) -> Result<bool, RedisError> {
        let shape = KeyShape::get().ok_or(RedisError::Str(
            "TOLLGATE_FAILED this server's module API lacks KeyType or ValueLength",
        ))?;
        // SAFETY: `self.0` is a key opened for writing on this command's
        // context, open until `self` is dropped.
        #[allow(unsafe_code)]
        let empty = unsafe { shape.length_if(self.0, raw::REDISMODULE_KEYTYPE_EMPTY) };
        Ok(empty.is_some())
    }

    /// Delete the key's value (a key without one is left as it is).
    fn delete(&self) -> Result<(), RedisError> {
        // SAFETY: reading a `static mut` function pointer that Redis set
        // once, when the module loaded; nothing writes it afterwards.
        #[allow(unsafe_code)]
        let Some(delete_key) = (unsafe { raw::RedisModule_DeleteKey }) else {
            return Err(RedisError::Str(
                "TOLLGATE_FAILED this server's module API lacks DeleteKey",
            ));
        };
        // SAFETY: `self.0` is a key opened for writing on this command's
        // context, open until `self` is dropped.
        #[allow(unsafe_code)]
        unsafe {
            delete_key(self.0);
        }
        Ok(())
    }

    /// Expire the key as `expiry` says; it must hold a value.
    fn expire_at(&self, expiry: Expiry) -> Result<(), RedisError> {
        // SAFETY: `self.0` is a key opened for writing on this command's
        // context, just given a value (so it is not empty, as
        // SetAbsExpire requires), and still open: `self` closes it when
        // dropped, after this call. `at` is a plain integer.
        #[allow(unsafe_code)]
        let set = unsafe { (expiry.set_abs_expire)(self.0, expiry.at) };
        if set != raw::REDISMODULE_OK as i32 {
            return Err(RedisError::Str(
                "TOLLGATE_FAILED the key API refused an expiry",
            ));
        }
        Ok(())
    }
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        if !self.0.is_null() {
            raw::close_key(self.0);
        }
    }
}
