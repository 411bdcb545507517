//! A log kept in a Redis list (a sliding log's, a long concurrency
//! limit's holders), read through the key API one entry at a time, and the
//! one-layer decision made on it. A decision reads the newest entry and
//! O(log d) of the oldest, d the entries aged out
//! (`tollgate_algorithms::sliding_log_step`), where
//! `LRANGE` of the whole list built a reply for every entry and parsed
//! them all: 13.2–13.7 µs of Redis CPU at about 100 entries against
//! 2.6–3.8 (docs/benchmarks.md, "A sliding log read where the decision
//! looks").
//!
//! `RedisModule_ListGet` has no safe wrapper in the module crate; each
//! use below says why it is sound.

use std::cell::Cell;

use redis_module::{raw, Context, RedisError, RedisString};
use tollgate_algorithms::{log_window, sliding_log_step, LogView};
use tollgate_limiter::{Layout, State};
use tollgate_redis_protocol::{block_end, log_entry, px, Call, Mode, TEXT_LOG_MAX};

use crate::decide::layer_reply;
use crate::key_shape::KeyShape;
use crate::keyspace::{self, Found};

/// What [`decide`] did with a call.
pub(crate) enum Outcome {
    /// Decided it: the reply.
    Decided(Vec<i64>),
    /// Read its one state, which is no list: the caller decides on it.
    Read(Vec<Option<State>>),
    /// Nothing: the caller reads the states whole and decides.
    Unread,
}

/// A one-layer decision, reservation or peek of a log kept as a list,
/// made on the entries it reads by the reference's rule
/// (`sliding_log_step`, which `decide_layers` runs on a whole log).
/// A sliding log is opened as a list first (it is one, or missing); a
/// concurrency limit's holders are text while they are few, so their key
/// is read as usual first, and opened as a list only when it is one: each
/// key is looked up once in the common case. Nothing is decided for any
/// other call, nor for a decision whose holders would shrink back to text
/// (`TEXT_LOG_MAX`, which needs them all): nothing is written then.
/// Only the entries read are checked to be Tollgate's, as on the Lua
/// path for a long log (docs/redis-module.md, "Foreign data is a
/// conflict").
pub(crate) fn decide(
    ctx: &Context,
    keys: &[RedisString],
    call: &Call,
    now: u64,
) -> Result<Outcome, RedisError> {
    let ([key], [layer]) = (keys, call.layers.as_slice()) else {
        return Ok(Outcome::Unread);
    };
    let Some(window) = log_window(&layer.limit) else {
        return Ok(Outcome::Unread);
    };
    if !matches!(call.mode, Mode::Decide | Mode::Reserve | Mode::Peek) {
        return Ok(Outcome::Unread);
    }
    if layer.layout == Layout::LogText {
        if let Found::State(state) = keyspace::find(ctx, key, layer, 1)? {
            return Ok(Outcome::Read(vec![state]));
        }
    }
    let Some(log) = ListLog::open(ctx, key) else {
        return Ok(Outcome::Unread);
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
                return Ok(Outcome::Unread);
            }
            keyspace::append_log(ctx, key, append.drop, append.stamp, push, px(append.ttl))?;
            layer_reply(&mut reply, call.mode, &step.verdict, Some(append.charge()));
        }
        // A peek charges nothing; a denial keeps the log it read.
        _ => {
            if let Some(kept) = tollgate_algorithms::kept_by_denial(&step.verdict) {
                if call.mode != Mode::Peek && len > 0 {
                    keyspace::keep_denied(ctx, key, kept)?;
                }
            }
            layer_reply(
                &mut reply,
                call.mode,
                &step.verdict.uncharged(layer.cost),
                None,
            );
        }
    }
    Ok(Outcome::Decided(reply))
}

/// Entries an open key's list iterator walks, one at a time, to reach
/// another nearby; farther, the key is opened again, which seeks afresh
/// (through the list's nodes, then within one).
const NEAR: usize = 32;

/// The list at a key, opened for reading; closed when dropped.
///
/// `RedisModule_ListGet` keeps an iterator in the open key and walks it
/// entry by entry to the index asked for (Redis 7.0, `module.c`): the
/// newest entry, then the oldest, would walk the whole list. So a read
/// far from the last one opens the key again.
pub(crate) struct ListLog<'k> {
    ctx: *mut raw::RedisModuleCtx,
    name: &'k RedisString,
    key: Cell<*mut raw::RedisModuleKey>,
    /// The index the key's iterator stands at (none before a read).
    at_index: Cell<Option<usize>>,
    len: usize,
    list_get: unsafe extern "C" fn(
        *mut raw::RedisModuleKey,
        std::os::raw::c_long,
    ) -> *mut raw::RedisModuleString,
    /// An item read that is no entry Tollgate wrote.
    foreign: Cell<bool>,
    /// The oldest and the newest entry, once read: a log whose ends are
    /// out of order is no log Tollgate wrote (the Lua's rule).
    ends: Cell<(Option<u64>, Option<u64>)>,
}

impl<'k> ListLog<'k> {
    /// The log in the list at `key` (empty when the key is missing);
    /// `None` when the key holds something else, when the list holds a
    /// block (one item `b<µs>`), or when this server's module API lacks
    /// the list functions (before Redis 7.0): the caller reads the key
    /// whole instead.
    pub(crate) fn open(ctx: &Context, key: &'k RedisString) -> Option<ListLog<'k>> {
        let shape = KeyShape::get()?;
        // SAFETY: reading a `static mut` function pointer that Redis set
        // once, when the module loaded (`RedisModule_Init`), before any
        // command ran; nothing writes it afterwards.
        #[allow(unsafe_code)]
        let list_get = unsafe { raw::RedisModule_ListGet? };
        let handle = raw::open_key(ctx.ctx, key.inner, raw::KeyMode::READ);
        let mut log = ListLog {
            ctx: ctx.ctx,
            name: key,
            key: Cell::new(handle),
            at_index: Cell::new(None),
            len: 0,
            list_get,
            foreign: Cell::new(false),
            ends: Cell::new((None, None)),
        };
        if handle.is_null() {
            // A key opened for reading that does not exist: no entries
            // (one lookup, where the whole-read path would look again).
            return Some(log);
        }
        // SAFETY: `handle` is a key just opened on this command's context,
        // open until `log` is dropped.
        #[allow(unsafe_code)]
        let len = unsafe { shape.length_if(handle, raw::REDISMODULE_KEYTYPE_LIST) }?;
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
        if self.at_index.get().is_some_and(|at| at.abs_diff(i) > NEAR) {
            self.reopen()?;
        }
        self.at_index.set(Some(i));
        if self.key.get().is_null() {
            return None;
        }
        // SAFETY: `self.key` is a key holding a list, opened for reading on
        // this command's context and open while `self` lives (nothing
        // writes while it is); an index out of range answers null. The
        // string answered is the caller's to free, which `RedisString`
        // does when dropped.
        #[allow(unsafe_code)]
        let item = unsafe { (self.list_get)(self.key.get(), index) };
        (!item.is_null()).then(|| RedisString::from_redis_module_string(self.ctx, item))
    }

    /// Close the key and open it again: a new iterator.
    fn reopen(&self) -> Option<()> {
        if !self.key.get().is_null() {
            raw::close_key(self.key.get());
        }
        let handle = raw::open_key(self.ctx, self.name.inner, raw::KeyMode::READ);
        self.key.set(handle);
        // (Nothing was written since it was open, so it still exists.)
        (!handle.is_null()).then_some(())
    }

    /// Whether an entry read was no entry Tollgate wrote, or the ends read
    /// are out of order (the decision made on them is void: a conflict,
    /// nothing written).
    pub(crate) fn foreign(&self) -> bool {
        let out_of_order = matches!(self.ends.get(), (Some(first), Some(last)) if first > last);
        self.foreign.get() || out_of_order
    }
}

impl LogView for ListLog<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn at(&self, i: usize) -> u64 {
        let Some(at) = self.item(i).and_then(|item| log_entry(item.as_slice())) else {
            self.foreign.set(true);
            return 0;
        };
        let (mut first, mut last) = self.ends.get();
        if i == 0 {
            first = Some(at);
        }
        if i + 1 == self.len {
            last = Some(at);
        }
        self.ends.set((first, last));
        at
    }
}

impl Drop for ListLog<'_> {
    fn drop(&mut self) {
        let key = self.key.get();
        if !key.is_null() {
            raw::close_key(key);
        }
    }
}
