//! Tollgate's Redis protocol, without I/O: how the Redis store calls the
//! Lua code or the native module, what they answer, and how states are
//! stored. The store encodes with this crate, the module decodes with it,
//! and the Lua code's constants are generated from it
//! ([`lua_constants`]); the deciding itself is `tollgate-algorithms`'
//! (the module runs it; the Lua code is its port, held to it bit for bit
//! by the differential tests).
//!
//! # Calls
//!
//! ```text
//! FCALL <function> <numkeys> <key>... <now> <max skew> <layer>... [mode]
//! layer: <algorithm code> <cost> <p1> <p2> <p3>        (refund, renew: ... <at> <mark>)
//! ```
//!
//! `EVALSHA <sha>` and `TOLLGATE.DECIDE` (the module) take the same
//! arguments. Key *i* holds the state of layer *i*; the keys are distinct.
//! `now` is the caller's time in µs since the Unix epoch, or the empty
//! string for the server's `TIME` (the default: one clock for every key);
//! with a caller's time, `max skew` is the largest allowed distance in µs
//! from the server's clock, or empty for no check. A layer is its
//! algorithm's code ([`ALGORITHM_CODES`]), its cost and the algorithm's
//! three parameters ([`limit_args`]; the first is its capacity, which a
//! blocked layer reports as its limit). A code with
//! [`KEEPS_UNITS`] (0x80) added is a plan's token bucket or GCRA: its state
//! records the rate it was written at, and a state of another rate is read
//! as the units it used ([`Limit::keeping_units`](tollgate_limiter::Limit::keeping_units)).
//!
//! The last argument selects a [`Mode`]; without it the call decides:
//! every layer is judged against its state, and only if every layer admits
//! is every layer written, each with its TTL ([`px`]). Otherwise no state
//! is written, and the admitting layers report remaining + cost, capped at
//! the limit (`Verdict::uncharged`); a denying layer's key whose TTL ends
//! before its verdict's reset is given that TTL (`PEXPIRE`, [`kept_px`]):
//! a policy made longer since the last write counts the state for longer.
//!
//! - `reserve` decides, and answers each layer's charge after its verdict
//!   ([`RESERVE_FIELDS`]): its `at` and `mark`, what `refund` takes back
//!   (`tollgate_algorithms::Charge`: per algorithm, a time, a remainder or
//!   a TAT, and `at` is 0 for GCRA even when it charged). A layer not
//!   charged answers `0 0`; `0 0` alone does not say nothing was charged.
//! - `peek` judges and writes nothing; `reset` judges as a peek does, then
//!   deletes every key.
//! - `penalize`, `reward` and `block` are an operator's change to every
//!   layer, as `tollgate_algorithms::adjust` makes it: every key is judged
//!   first (a foreign one fails the call unchanged), then each layer is
//!   charged its cost (saturating at empty), given its cost back (never
//!   above full), or blocked (the cost argument holds the block's length
//!   in µs). The state written carries the reference's TTL. The reply is
//!   each layer's verdict for one unit afterwards, as a peek gives it.
//! - `refund` gives reservations back; each layer's arguments end with the
//!   charge's `at` and `mark`, and the reply is what each layer got back.
//!   Not idempotent: the store sends a refund at most once. A counter
//!   keeps its expiry. A concurrency limit's release is its refund
//!   (`tollgate_algorithms::release`): the hold's entries go, and the
//!   log lives until its newest entry's lease ends.
//! - `renew` renews concurrency holds (`tollgate_algorithms::renew`):
//!   each layer's arguments end with the hold's `at` and 0, and the reply
//!   is each hold's new `at`, or 0 when it was lost.
//!
//! # Replies
//!
//! Five integers per layer ([`REPLY_FIELDS`], [`verdict_fields`],
//! [`parse_reply`]): allowed (1/0), limit, remaining, reset_after µs,
//! retry_after µs (−1 when the layer admits).
//!
//! # Errors
//!
//! - `TOLLGATE_CONFLICT <i> not_a_state`: key *i* (from 1) holds a value
//!   Tollgate did not write; `TOLLGATE_CONFLICT <i> wrong_type` from the
//!   module for a key of a type no state has (the Lua answers Redis's own
//!   `WRONGTYPE`). Nothing is written, the key is left as it was.
//! - `TOLLGATE_SKEW <caller µs> <server µs> <max skew µs>`: the caller's
//!   clock is too far from the server's.
//! - `TOLLGATE_TIME <µs>`: the call's time (the server's clock, or the
//!   caller's) is before 2020 or after 2100
//!   (`Timestamp::is_plausible`); nothing is written.
//! - `TOLLGATE_ARGS <why>`: arguments the code does not understand
//!   ([`ArgsError`]). The module checks every argument ([`parse`]); the
//!   Lua checks the call's shape (its count, its mode, the time) and
//!   trusts each layer's arguments, which the store checks before it
//!   sends them. A caller of the function library of its own must send
//!   what the store would (a cost of 1 to the capacity, plain digits).
//!
//! # Stored states
//!
//! Counter algorithms keep a string of decimal cells ([`read_cells`],
//! [`write_cells`]); the sliding log keeps a list of timestamps, oldest
//! first ([`LogReader`], [`LogEdit`]); the concurrency limit keeps its
//! log in one string, fixed-width timestamps separated by a space
//! ([`read_log_text`], [`write_log_text`]), or as a list once it holds
//! more than [`TEXT_LOG_MAX`] entries; a block is the string
//! `b<µs>`, or a list of that one item for the sliding log
//! ([`block_text`]). Only values whose
//! times lie in [`STORED_TIMES`] are states, a log's oldest entry not
//! after its newest, and a counter's only when its algorithm could have
//! written its cells (`tollgate_algorithms::within_reach`: counts below
//! 2^53, a recorded rate a policy has, a calendar span): anything else is
//! someone else's data, never overwritten.

mod call;
mod expiry;
mod limit_args;
mod log_edit;
mod lua;
mod reply;
mod state;

pub use call::{
    layer_args, numkeys, parse, ArgsError, Call, Layer, Mode, Time, LAYER_ARGS, REFUND_LAYER_ARGS,
};
pub use expiry::{kept_px, px, PUSH_CHUNK, TTL_MARGIN_MS};
pub use limit_args::{
    algorithm_code, algorithm_of, limit_args, limit_from_args, ALGORITHM_CODES, KEEPS_UNITS,
};
pub use log_edit::LogEdit;
pub use lua::lua_constants;
pub use reply::{
    parse_renewed, parse_reply, parse_reserve, verdict_fields, Charged, REPLY_FIELDS,
    RESERVE_FIELDS,
};
pub use state::{
    block_end, block_text, holds_alone, log_entry, read_cells, read_log_text, write_cells,
    write_log_text, LogReader, LOG_ENTRY_DIGITS, STORED_TIMES, TEXT_LOG_MAX,
};

/// The calling convention's version (arguments, modes, replies and
/// encodings). The Redis store sends `TOLLGATE.DECIDE` only to a module
/// answering its own version to `TOLLGATE.PROTOCOL`. A test pins the wire
/// (the shared constants, the modes, the encodings) to this number: a
/// change to the wire fails it until the number is raised.
pub const PROTOCOL: i64 = 1;
