//! How long a written state lives in Redis.

use std::time::Duration;

/// Added to every TTL a write sets. Redis counts a relative TTL from its
/// clock truncated to the millisecond, so `PX n` lives between n − 1 and
/// n ms (and `PX 1` can expire at once); the extra millisecond keeps
/// every state until the algorithm says it is as good as new, never
/// shorter.
pub const TTL_MARGIN_MS: u64 = 1;

/// The most entries one `RPUSH` carries (the Lua code's `unpack` has a
/// stack limit; the module pushes in the same chunks).
pub const PUSH_CHUNK: u64 = 1000;

/// The `PX` a write of a state living `ttl` sets: whole milliseconds,
/// rounded up, at least one, plus [`TTL_MARGIN_MS`].
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis_protocol::px;
/// assert_eq!(px(Duration::from_micros(1_500)), 3);
/// assert_eq!(px(Duration::ZERO), 2);
/// ```
pub fn px(ttl: Duration) -> u64 {
    let micros = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
    micros.div_ceil(1000).max(1).saturating_add(TTL_MARGIN_MS)
}
