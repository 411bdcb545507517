//! A log kept in a Redis list (a sliding log's, a long concurrency
//! limit's holders), read through the key API one entry at a time, and the
//! one-layer decision made on it. A decision reads the newest entry and
//! O(log n) others (`tollgate_algorithms::sliding_log_step`), where
//! `LRANGE` of the whole list built a reply for every entry and parsed
//! them all: 13.1–13.7 µs of Redis CPU at 70–130 entries against 5.3–7.0
//! (docs/benchmarks.md, "A sliding log read where the decision looks").
//!
//! `RedisModule_ListGet` and `RedisModule_ValueLength` have no safe
//! wrapper in the module crate; each use below says why it is sound.

use std::cell::Cell;

use redis_module::{raw, Context, RedisError, RedisString};
use tollgate_algorithms::{log_window, sliding_log_step, LogView};
use tollgate_limiter::Layout;
use tollgate_redis_protocol::{block_end, log_entry, px, Call, Mode, TEXT_LOG_MAX};

use crate::decide::layer_reply;
use crate::keyspace;

/// A one-layer decision, reservation or peek of a log kept as a list,
/// made on the entries it reads by the reference's rule
/// (`sliding_log_step`, which `decide_layers` runs on a whole log).
/// `None` for any other call, and for a decision whose holders would
/// shrink back to text (`TEXT_LOG_MAX`, which needs them all): nothing
/// is written then, and the caller reads the states whole.
pub(crate) fn decide(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Option<Vec<i64>>, RedisError> {
    let ([key], [layer]) = (keys, call.layers.as_slice()) else {
        return Ok(None);
    };
    let Some(window) = log_window(&layer.limit) else {
        return Ok(None);
    };
    if !matches!(call.mode, Mode::Decide | Mode::Reserve | Mode::Peek) {
        return Ok(None);
    }
    let Some(log) = ListLog::open(ctx, key) else {
        return Ok(None);
    };
    let step = sliding_log_step(window, &log, now, layer.cost);
    if log.foreign() {
        return Err(keyspace::conflict(1, "not_a_state"));
    }
    let len = log.len;
    drop(log);
    let mut reply = Vec::with_capacity(tollgate_redis_protocol::RESERVE_FIELDS);
    match step.append {
        Some(append) if call.mode != Mode::Peek => {
            let push = usize::try_from(append.push).unwrap_or(usize::MAX);
            if layer.layout == Layout::LogText
                && (len - append.drop).saturating_add(push) <= TEXT_LOG_MAX
            {
                return Ok(None);
            }
            keyspace::append_log(
                ctx,
                key.as_slice(),
                append.drop,
                append.stamp,
                push,
                px(append.ttl),
            )?;
            layer_reply(&mut reply, call.mode, &step.verdict, Some(append.charge()));
        }
        // A peek charges nothing.
        _ => layer_reply(
            &mut reply,
            call.mode,
            &step.verdict.uncharged(layer.cost),
            None,
        ),
    }
    Ok(Some(reply))
}

/// The list at a key, opened for reading; closed when dropped.
pub(crate) struct ListLog {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
    len: usize,
    list_get: unsafe extern "C" fn(
        *mut raw::RedisModuleKey,
        std::os::raw::c_long,
    ) -> *mut raw::RedisModuleString,
    /// An item read that is no entry Tollgate wrote.
    foreign: Cell<bool>,
}

impl ListLog {
    /// The log in the list at `key`; `None` when the key holds no list,
    /// when the list holds a block (one item `b<µs>`), or when this
    /// server's module API lacks the list functions (before Redis 7.0):
    /// the caller reads the key whole instead.
    pub(crate) fn open(ctx: &Context, key: &RedisString) -> Option<ListLog> {
        // SAFETY: reading `static mut` function pointers that Redis set
        // once, when the module loaded (`RedisModule_Init`), before any
        // command ran; nothing writes them afterwards.
        #[allow(unsafe_code)]
        let (key_type, value_length, list_get) = unsafe {
            (
                raw::RedisModule_KeyType?,
                raw::RedisModule_ValueLength?,
                raw::RedisModule_ListGet?,
            )
        };
        let handle = raw::open_key(ctx.ctx, key.inner, raw::KeyMode::READ);
        if handle.is_null() {
            // A key opened for reading that does not exist.
            return None;
        }
        let mut log = ListLog {
            ctx: ctx.ctx,
            key: handle,
            len: 0,
            list_get,
            foreign: Cell::new(false),
        };
        // SAFETY: `handle` is a key just opened on this command's context,
        // open until `log` is dropped.
        #[allow(unsafe_code)]
        let is_list = unsafe { key_type(handle) } == raw::REDISMODULE_KEYTYPE_LIST as i32;
        if !is_list {
            return None;
        }
        // SAFETY: as above; the key holds a list.
        #[allow(unsafe_code)]
        let len = unsafe { value_length(handle) };
        log.len = len;
        if len == 1
            && log
                .item(0)
                .is_some_and(|item| block_end(item.as_slice()).is_some())
        {
            return None;
        }
        Some(log)
    }

    /// Item `i` of the list.
    fn item(&self, i: usize) -> Option<RedisString> {
        let index = std::os::raw::c_long::try_from(i).ok()?;
        // SAFETY: `self.key` is a key holding a list, opened for reading on
        // this command's context and open while `self` lives; an index out
        // of range answers null. The string answered is the caller's to
        // free, which `RedisString` does when dropped.
        #[allow(unsafe_code)]
        let item = unsafe { (self.list_get)(self.key, index) };
        (!item.is_null()).then(|| RedisString::from_redis_module_string(self.ctx, item))
    }

    /// Whether an entry read was no entry Tollgate wrote (the decision
    /// made on them is void: a conflict, nothing written).
    pub(crate) fn foreign(&self) -> bool {
        self.foreign.get()
    }
}

impl LogView for ListLog {
    fn len(&self) -> usize {
        self.len
    }

    fn at(&self, i: usize) -> u64 {
        match self.item(i).and_then(|item| log_entry(item.as_slice())) {
            Some(at) => at,
            None => {
                self.foreign.set(true);
                0
            }
        }
    }
}

impl Drop for ListLog {
    fn drop(&mut self) {
        raw::close_key(self.key);
    }
}
