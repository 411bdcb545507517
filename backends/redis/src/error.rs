//! Failures specific to the Redis store, carried inside
//! [`StoreError::Backend`](tollgate_limiter::StoreError::Backend).

use std::time::Duration;

use tollgate_limiter::{StoreError, Timestamp};

/// What the Redis store rejects on its own account.
///
/// Store calls return these boxed in
/// [`StoreError::Backend`]; use [`RedisStoreError::of`] to look inside.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The connection URL does not parse (the URL itself is not repeated:
    /// it may hold a password).
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(String),
    /// A builder setting that does not fit the store (a Sentinel-only
    /// setter on a URL store, a pool for a Sentinel store, no sentinels).
    #[error("invalid Redis store setting: {0}")]
    InvalidSetting(String),
    /// The key prefix would change key layout or the Cluster hash tag.
    #[error("invalid key prefix {0:?}: use 1-64 characters of A-Z a-z 0-9 _ - . : (no braces, which would change the Redis Cluster hash tag)")]
    InvalidPrefix(String),
    /// The caller-supplied time is further from the server's `TIME` than
    /// the configured `max_skew`.
    #[error("the caller-supplied time ({caller}µs) is {skew:?} away from the Redis server's TIME ({server}µs), more than max_skew {max_skew:?}; fix the clocks (NTP) or raise max_skew")]
    ClockSkew {
        /// The caller's time in µs since the Unix epoch.
        caller: u64,
        /// The server's time in µs since the Unix epoch.
        server: u64,
        /// The distance between them.
        skew: Duration,
        /// The configured bound.
        max_skew: Duration,
    },
    /// The store was built with
    /// [`Engine::Functions`](crate::Engine::Functions) and the server
    /// has no Redis Functions (before Redis 7.0).
    #[error("this Redis server has no Redis Functions (FUNCTION LOAD and FCALL came with Redis 7.0): upgrade Redis, or build the store with Engine::Auto or Engine::Eval to run the same code with EVALSHA")]
    NoFunctions,
    /// The store was built with
    /// [`Engine::PreloadedFunctions`](crate::Engine::PreloadedFunctions)
    /// and the server lacks this release's function library (a new server,
    /// a `FUNCTION FLUSH`, an upgrade of Tollgate): an administrator loads
    /// it; the store never does.
    #[error("this Redis server lacks Tollgate's function library {0}, which an administrator loads (the store's user may not): `cargo run -q -p tollgate-redis --example function-library | redis-cli -u <admin URL> -x FUNCTION LOAD REPLACE` (docs/operations.md, \"Least privilege\")")]
    LibraryNotLoaded(String),
    /// The store was built with [`Engine::Module`](crate::Engine::Module)
    /// and the server has not loaded Tollgate's module, or one of another
    /// protocol.
    #[error("this Redis server has no Tollgate module speaking this store's protocol ({0}): load backends/redis-module's library (loadmodule in redis.conf or MODULE LOAD; see docs/redis-module.md), or build the store with Engine::Auto to use Redis Functions without it")]
    NoModule(String),
    /// A charge was not acknowledged by enough replicas within the
    /// [`replica_ack`](crate::RedisStore::builder) timeout: it is on the
    /// primary, and would be lost if the primary died now.
    #[error("the charge was acknowledged by {acknowledged} of the {wanted} replicas replica_ack asks for within {timeout:?}: check the replicas' health and link (INFO replication), or lower replica_ack")]
    NotReplicated {
        /// Replicas that acknowledged in time.
        acknowledged: u64,
        /// Replicas asked for.
        wanted: u32,
        /// How long the store waited.
        timeout: Duration,
    },
    /// The `replica_ack` setting cannot be honoured.
    #[error("invalid replica_ack: {0}")]
    InvalidReplicaAck(String),
    /// The Redis user lacks a permission Tollgate needs (found at connect,
    /// where the store tries every command it uses on a key under its
    /// prefix).
    #[error("the Redis user lacks a permission Tollgate needs ({0}); grant the rule in docs/operations.md, \"Redis in production\", for this key prefix")]
    NoPermission(String),
    /// The TLS handshake failed: what rustls named (a server certificate
    /// signed by a CA the store does not trust, expired, or for another
    /// host; a client certificate missing or refused), and what to do
    /// about that cause.
    #[error("TLS with Redis failed: {0}")]
    Tls(String),
    /// No Sentinel named a reachable primary for the service.
    #[error("no Sentinel named a reachable primary for service {service:?}: {detail}")]
    NoPrimary {
        /// The Sentinel service (master) name.
        service: String,
        /// What the last attempt found.
        detail: String,
    },
    /// A layer's cost is outside `1..=capacity` (the limiter checks this
    /// before calling a store; other callers must too).
    #[error("cost {cost} is outside 1..={capacity} for policy {policy:?}")]
    InvalidCost {
        /// The requested cost.
        cost: u64,
        /// The policy's capacity.
        capacity: u64,
        /// The policy's name.
        policy: String,
    },
}

impl RedisStoreError {
    /// The Redis store's own error inside `error`, if that is what it holds.
    pub fn of(error: &StoreError) -> Option<&RedisStoreError> {
        match error {
            StoreError::Backend(inner) | StoreError::ClockSkew(inner) => {
                inner.downcast_ref::<RedisStoreError>()
            }
            _ => None,
        }
    }
}

impl From<RedisStoreError> for StoreError {
    fn from(e: RedisStoreError) -> Self {
        StoreError::Backend(Box::new(e))
    }
}

/// A caller-supplied time Tollgate accepts.
pub(crate) fn check_plausible(now: Timestamp) -> Result<(), StoreError> {
    if !now.is_plausible() {
        return Err(StoreError::ImplausibleTime(now));
    }
    Ok(())
}

/// A Redis client error as a store error. The text of a Redis error never
/// holds key names or arguments here (the script reports its own errors
/// with numbers only), so it is safe to log.
pub(crate) fn from_redis(e: redis::RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind};
    match e.kind() {
        ErrorKind::Extension if e.code() == Some("TOLLGATE_SKEW") => skew_error(&e),
        ErrorKind::Extension if e.code() == Some("TOLLGATE_TIME") => time_error(&e),
        ErrorKind::Extension if e.code() == Some("TOLLGATE_CONFLICT") => conflict_error(&e),
        ErrorKind::Extension if e.code() == Some("WRONGTYPE") => crate::conflicts::unlocated(),
        _ if is_wrapped_wrongtype(&e) => crate::conflicts::unlocated(),
        _ if is_read_only(&e) => StoreError::Unavailable(e.to_string()),
        ErrorKind::Client if e.detail() == Some(crate::engine::NO_FUNCTIONS) => {
            RedisStoreError::NoFunctions.into()
        }
        ErrorKind::Client if e.detail() == Some(crate::engine::NOT_LOADED) => {
            RedisStoreError::LibraryNotLoaded(crate::script::library_name().to_string()).into()
        }
        ErrorKind::Client
            if e.detail()
                .is_some_and(|d| d.starts_with(crate::engine::NO_MODULE)) =>
        {
            RedisStoreError::NoModule(e.detail().unwrap_or_default().to_string()).into()
        }
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::NoPerm,
        ) => StoreError::Unavailable(e.to_string()),
        // A busy server (long script), out of memory, refused writes after
        // a failed save, or missing authentication: the store cannot decide
        // now, but it is not speaking another protocol.
        ErrorKind::Extension
            if matches!(
                e.code(),
                Some("BUSY" | "OOM" | "MISCONF" | "NOAUTH" | "WRONGPASS" | "LOADING")
            ) =>
        {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Protocol(without_arguments(&e.to_string())),
    }
}

/// `TOLLGATE_TIME <µs>`: the call's time (the server's clock, unless the
/// store sent its own) is before 2020 or after 2100.
fn time_error(e: &redis::RedisError) -> StoreError {
    match e.detail().and_then(|d| d.trim().parse::<u64>().ok()) {
        Some(us) => StoreError::ImplausibleTime(Timestamp::from_micros(us)),
        None => StoreError::Protocol(e.to_string()),
    }
}

/// A server that is no longer a primary (`READONLY`: a failover demoted
/// it), as Redis 7 reports it and as Redis 6.2 wraps it when a script's
/// write meets it: the connection must go to the primary.
pub(crate) fn is_read_only(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    matches!(e.kind(), ErrorKind::Server(ServerErrorKind::ReadOnly))
        || raised_in_script(e, "READONLY You can't write against a read only replica")
}

/// A `WRONGTYPE` raised inside a script before Redis 7.0, which wraps it.
/// A key of another type is a conflict on every version, never a protocol
/// failure (which the breaker counts as an outage).
fn is_wrapped_wrongtype(e: &redis::RedisError) -> bool {
    raised_in_script(e, ": WRONGTYPE Operation against a key")
}

/// Whether `e` is a server error raised inside a script, which Redis
/// before 7.0 wraps as `ERR Error running script (call to f_…):
/// @user_script:12: <the error>`, and the error holds `inner`.
fn raised_in_script(e: &redis::RedisError, inner: &str) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Error running script") && d.contains(inner))
}

/// A server's error text without the arguments it may repeat (`unknown
/// command '…', with args beginning with: '…'`): they hold the call's keys,
/// and a key holds a subject (a client's address), which stays out of logs.
fn without_arguments(text: &str) -> String {
    const ARGUMENTS: &str = ", with args beginning with:";
    match text.find(ARGUMENTS) {
        Some(at) => format!("{} (its arguments left out)", &text[..at]),
        None => text.to_string(),
    }
}

/// `TOLLGATE_CONFLICT <i> <found>`: the script's i-th key (1-based) holds
/// data Tollgate did not write. The script knows keys, not policies: the
/// conflict carries the key's position until [`name_conflict`] names it.
fn conflict_error(e: &redis::RedisError) -> StoreError {
    let mut words = e.detail().unwrap_or_default().split_whitespace();
    match (words.next(), words.next()) {
        (Some(i), Some(found)) if i.parse::<usize>().is_ok() => StoreError::Conflict {
            policy: i.to_string(),
            found: found.replace('_', " "),
        },
        _ => StoreError::Protocol(e.to_string()),
    }
}

/// A conflict from a script call names the policy of its key: `policy_of`
/// maps the call's key position (0-based) to the policy's name.
pub(crate) fn name_conflict<'a>(
    error: StoreError,
    policy_of: impl Fn(usize) -> Option<&'a str>,
) -> StoreError {
    match error {
        // Not located yet (WRONGTYPE): the store asks the keys' types.
        StoreError::Conflict { policy, found } if policy.is_empty() => {
            StoreError::Conflict { policy, found }
        }
        StoreError::Conflict { policy, found } => {
            let named = policy
                .parse::<usize>()
                .ok()
                .and_then(|i| policy_of(i.checked_sub(1)?));
            match named {
                Some(name) => StoreError::Conflict {
                    policy: name.to_string(),
                    found,
                },
                None => StoreError::Protocol(format!("a conflict at key {policy} of the call")),
            }
        }
        other => other,
    }
}

fn skew_error(e: &redis::RedisError) -> StoreError {
    let numbers: Vec<u64> = e
        .detail()
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        // A wrong clock, not an outage: the breaker does not count it.
        [caller, server, max] => StoreError::ClockSkew(Box::new(RedisStoreError::ClockSkew {
            caller,
            server,
            skew: Duration::from_micros(caller.abs_diff(server)),
            max_skew: Duration::from_micros(max),
        })),
        _ => StoreError::Protocol(e.to_string()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A server's error reply, as redis-rs reports it.
    pub(crate) fn server_error(reply: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    /// A key of another type met inside a script is a conflict, as
    /// Redis 7 reports it and as Redis 6.2 wraps it.
    #[test]
    fn a_wrong_type_is_a_conflict_on_every_version() {
        let parsed = |reply: &str| from_redis(server_error(reply));
        let seven = parsed("WRONGTYPE Operation against a key holding the wrong kind of value");
        let six = parsed(
            "ERR Error running script (call to f_9c5c1c3b): @user_script:143: WRONGTYPE \
             Operation against a key holding the wrong kind of value",
        );
        for e in [seven, six] {
            assert!(crate::conflicts::is_unlocated(&e), "{e:?}");
        }
        let other = parsed("ERR Error running script (call to f_9c5c1c3b): @user_script:1: oops");
        assert!(matches!(other, StoreError::Protocol(_)), "{other:?}");
    }

    /// A demoted server's `READONLY` is one on every version: the
    /// connection goes to the primary, and the decision is an outage.
    #[test]
    fn a_read_only_replica_is_one_on_every_version() {
        let error = server_error;
        let seven = error("READONLY You can't write against a read only replica.");
        let six = error(
            "ERR Error running script (call to f_9c5c1c3b): @user_script:143: @user_script: \
             143: -READONLY You can't write against a read only replica.",
        );
        for e in [seven, six] {
            assert!(is_read_only(&e), "{e:?}");
            assert!(matches!(from_redis(e), StoreError::Unavailable(_)));
        }
        assert!(!is_read_only(&error(
            "ERR Error running script (call to f_1): oops"
        )));
    }

    /// The server's clock before 2020 is the implausible time it is, not
    /// a protocol failure.
    #[test]
    fn an_implausible_server_time_is_named() {
        let e = from_redis(server_error("TOLLGATE_TIME 1000000"));
        assert!(
            matches!(e, StoreError::ImplausibleTime(t) if t.as_micros() == 1_000_000),
            "{e:?}"
        );
    }

    /// An unknown command's arguments (the call's keys) never reach the
    /// error, and so never a log.
    #[test]
    fn a_servers_error_repeats_no_key() {
        let e = redis::RedisError::from((
            redis::ErrorKind::Client,
            "An error was signalled by the server",
            "unknown command 'EVALSHA', with args beginning with: 'f00' '1' 'tollgate:{ip:203.0.113.7/32}:api'".to_string(),
        ));
        let StoreError::Protocol(text) = from_redis(e) else {
            panic!("a protocol error");
        };
        assert!(!text.contains("203.0.113.7"), "{text}");
        assert!(
            text.contains("unknown command 'EVALSHA' (its arguments left out)"),
            "{text}"
        );
    }
}
