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

/// The `PEXPIRE` that keeps a state `kept` longer, when its key has
/// `pttl` ms left (`PTTL`: −1 without a TTL, −2 missing): `None` when it
/// lives that long already, or has no TTL to extend. A denial keeps the
/// state it read this way (`tollgate_algorithms::kept_by_denial`; the
/// Lua's `keep_denied`).
///
/// ```
/// use std::time::Duration;
/// use tollgate_redis_protocol::kept_px;
/// let minute = Duration::from_secs(60);
/// assert_eq!(kept_px(minute, 150), Some(60_001));
/// assert_eq!(kept_px(minute, 60_000), None);
/// assert_eq!(kept_px(minute, -1), None);
/// ```
pub fn kept_px(kept: Duration, pttl: i64) -> Option<u64> {
    let px = px(kept);
    let lives = u64::try_from(pttl).ok()?;
    (lives < px - TTL_MARGIN_MS).then_some(px)
}
