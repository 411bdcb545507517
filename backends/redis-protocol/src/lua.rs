//! The constants the Lua code shares with the module, generated from this
//! crate so that the two cannot disagree.

use std::fmt::Write as _;

use crate::{
    LAYER_ARGS, LOG_ENTRY_DIGITS, PUSH_CHUNK, REFUND_LAYER_ARGS, REPLY_FIELDS, RESERVE_FIELDS,
    STORED_TIMES, TEXT_LOG_MAX, TTL_MARGIN_MS,
};

/// Lua `local` definitions of the shared constants: `EARLIEST` and
/// `LATEST` (the [`STORED_TIMES`] bounds, the end excluded),
/// `LATEST_CLOCK` (the latest time a call decides at,
/// [`Timestamp::LATEST`](tollgate_limiter::Timestamp::LATEST)),
/// `TTL_MARGIN_MS`, `PUSH_CHUNK`, `LOG_ENTRY_DIGITS`, `TEXT_LOG_MAX`, and the
/// strides of calls and replies
/// (`LAYER_ARGS`, `REFUND_LAYER_ARGS`, `REPLY_FIELDS`, `RESERVE_FIELDS`),
/// `KEEPS_UNITS`, the flag added to an algorithm's code, the bounds of
/// a state Tollgate writes (`MAX_WINDOW_US`, `MAX_RECORDED_REFILL`,
/// `MAX_EXACT`, `MAX_CALENDAR_SPAN_US`), and `ENDED_RETRY_US`, the retry
/// a calendar quota that ended answers.
/// The Redis store puts them before its Lua files.
///
/// ```
/// let lua = tollgate_redis_protocol::lua_constants();
/// assert!(lua.contains("local TTL_MARGIN_MS = 1\n"));
/// ```
pub fn lua_constants() -> String {
    let mut lua = String::from("-- Shared with the module (tollgate-redis-protocol).\n");
    for (name, value) in [
        ("EARLIEST", STORED_TIMES.start),
        ("LATEST", STORED_TIMES.end),
        (
            "LATEST_CLOCK",
            tollgate_limiter::Timestamp::LATEST.as_micros(),
        ),
        ("TTL_MARGIN_MS", TTL_MARGIN_MS),
        ("PUSH_CHUNK", PUSH_CHUNK),
        ("LOG_ENTRY_DIGITS", LOG_ENTRY_DIGITS as u64),
        ("TEXT_LOG_MAX", TEXT_LOG_MAX as u64),
        ("LAYER_ARGS", LAYER_ARGS as u64),
        ("REFUND_LAYER_ARGS", REFUND_LAYER_ARGS as u64),
        ("REPLY_FIELDS", REPLY_FIELDS as u64),
        ("RESERVE_FIELDS", RESERVE_FIELDS as u64),
        ("KEEPS_UNITS", u64::from(crate::KEEPS_UNITS)),
        (
            "MAX_WINDOW_US",
            tollgate_limiter::duration_micros(tollgate_limiter::MAX_WINDOW),
        ),
        ("MAX_RECORDED_REFILL", tollgate_limiter::MAX_RECORDED_REFILL),
        ("MAX_EXACT", tollgate_limiter::MAX_EXACT),
        (
            "MAX_CALENDAR_SPAN_US",
            tollgate_limiter::MAX_CALENDAR_SPAN_US,
        ),
        (
            "ENDED_RETRY_US",
            tollgate_limiter::duration_micros(tollgate_limiter::CALENDAR_ENDED_RETRY),
        ),
    ] {
        let _ = writeln!(lua, "local {name} = {value}");
    }
    lua
}
