//! What a key holds in Redis, byte for byte with its expiry, and what the
//! Rust reference says it must hold after a write: the keyspace half of
//! the differential tests (the verdicts are the other half).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use tollgate_limiter::{Layout, State, Stored};
use tollgate_redis_protocol::{
    block_text, px, read_cells, read_log_text, write_cells, write_log_text, LogReader, TEXT_LOG_MAX,
};

/// A key's contents as Redis keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raw {
    Missing,
    Text(Vec<u8>),
    List(Vec<Vec<u8>>),
}

/// A key's contents and its absolute expiry (`PEXPIRETIME`: ms since the
/// Unix epoch; −1 without one, −2 when missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub raw: Raw,
    pub expires_ms: i64,
}

/// The wall clock in ms, as Redis reads it for expiries.
pub fn wall_ms() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    now.as_millis() as i64
}

/// What `key` holds now, read atomically (a key expiring between two
/// reads would otherwise read as half of each).
pub async fn held(con: &mut MultiplexedConnection, key: &str) -> Held {
    const READ: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
        local e = redis.call('PEXPIRETIME', KEYS[1]) \
        if t == 'string' then return {t, e, redis.call('GET', KEYS[1])} end \
        if t == 'list' then return {t, e, redis.call('LRANGE', KEYS[1], 0, -1)} end \
        return {t, e}";
    let mut reply: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(READ)
        .arg(1)
        .arg(key)
        .query_async(con)
        .await
        .unwrap();
    let value = (reply.len() == 3).then(|| reply.pop()).flatten();
    let kind: String = redis::from_redis_value(reply[0].clone()).unwrap();
    let expires_ms: i64 = redis::from_redis_value(reply[1].clone()).unwrap();
    let raw = match (kind.as_str(), value) {
        ("none", None) => Raw::Missing,
        ("string", Some(v)) => Raw::Text(redis::from_redis_value(v).unwrap()),
        ("list", Some(v)) => Raw::List(redis::from_redis_value(v).unwrap()),
        (other, _) => panic!("{key} holds a {other}"),
    };
    Held { raw, expires_ms }
}

/// The state `raw` holds for an algorithm kept as `layout` (`None`:
/// missing).
pub fn state_of(layout: Layout, raw: &Raw) -> Option<State> {
    match raw {
        Raw::Missing => None,
        Raw::Text(v) if layout == Layout::LogText => Some(read_log_text(v).unwrap_or_else(|| {
            panic!("{:?} is no log Tollgate writes", String::from_utf8_lossy(v))
        })),
        Raw::Text(v) => Some(read_cells(layout, v).unwrap_or_else(|| {
            panic!(
                "{:?} is no state Tollgate writes as {layout:?}",
                String::from_utf8_lossy(v)
            )
        })),
        Raw::List(items) => {
            let mut log = LogReader::with_capacity(items.len());
            assert!(items.iter().all(|i| log.push(i)), "a log Tollgate wrote");
            Some(log.finish().expect("a log Tollgate wrote, oldest first"))
        }
    }
}

/// What a key holds once `state` is written for an algorithm kept as
/// `layout`.
pub fn raw_of(layout: Layout, state: &State) -> Raw {
    match state {
        State::Cells(cells) => Raw::Text(write_cells(layout, *cells).into_bytes()),
        State::Blocked(until) if layout == Layout::Log => {
            Raw::List(vec![block_text(*until).into_bytes()])
        }
        State::Blocked(until) => Raw::Text(block_text(*until).into_bytes()),
        State::Log(entries) if entries.is_empty() => Raw::Missing,
        State::Log(entries) if layout == Layout::LogText && entries.len() <= TEXT_LOG_MAX => {
            Raw::Text(write_log_text(entries).into_bytes())
        }
        State::Log(entries) => {
            Raw::List(entries.iter().map(|e| e.to_string().into_bytes()).collect())
        }
        other => panic!("no store keeps {other:?}"),
    }
}

/// Check that a key which held `before` holds `after` once a call made
/// between the wall-clock instants `called` (ms, inclusive) wrote what
/// the reference said (`written`; `None`: leave it as it was): the same
/// bytes, expiring `px(ttl)` after the call. A key whose earliest expiry
/// has passed by `read_at` may be gone.
pub fn check_write(
    layout: Layout,
    before: &Held,
    after: &Held,
    written: Option<&Stored>,
    kept: Option<Duration>,
    called: (i64, i64),
    read_at: i64,
) -> Result<(), String> {
    let Some(stored) = written else {
        let expired = after.raw == Raw::Missing && before.expires_ms <= read_at;
        // A denial keeps the state it read until its reset
        // (`tollgate_algorithms::kept_by_denial`): its TTL may only grow,
        // to that reset from the call's clock.
        let kept_longer = kept.is_some_and(|kept| {
            let px = px(kept) as i64;
            after.raw == before.raw
                && after.expires_ms > before.expires_ms
                && (called.0 + px..=called.1 + px).contains(&after.expires_ms)
        });
        return match after == before || expired || kept_longer {
            true => Ok(()),
            false => Err(format!("left alone, yet {before:?} became {after:?}")),
        };
    };
    let raw = raw_of(layout, &stored.state);
    let px = px(stored.ttl) as i64;
    if after.raw == Raw::Missing && called.0 + px <= read_at {
        return Ok(());
    }
    if after.raw != raw {
        return Err(format!(
            "holds {:?}, the reference wrote {raw:?}",
            after.raw
        ));
    }
    if raw != Raw::Missing && !(called.0 + px..=called.1 + px).contains(&after.expires_ms) {
        return Err(format!(
            "expires at {} ms, the reference's TTL {:?} gives {}..={} ms",
            after.expires_ms,
            stored.ttl,
            called.0 + px,
            called.1 + px
        ));
    }
    Ok(())
}
