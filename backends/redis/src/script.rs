//! The Lua script and its calling convention.
//!
//! Each algorithm lives in one file under `lua/` (a Lua function, the single
//! source of truth for that algorithm); `layered.lua` is the dispatcher that
//! decides every layer of a request in one call, all-or-nothing. The store
//! runs one script, [`SCRIPT`]: the helpers, the five algorithm functions,
//! their refunds (used by the Cluster store) and the dispatcher,
//! concatenated. A single-policy decision is the same script with one
//! layer. The files' opening comments give the KEYS/ARGV layout.

use std::time::Duration;

use tollgate_limiter::{LayerRequest, Limit, StoreError, Verdict, Verdicts};

use crate::error::RedisStoreError;

/// Helpers shared by every algorithm (exact integer division on doubles,
/// TTL rounding, integer formatting).
pub const COMMON: &str = include_str!("../lua/common.lua");
/// The algorithm codes, named ([`Code`] on this side).
pub const CODES: &str = include_str!("../lua/codes.lua");
/// The token bucket function.
pub const TOKEN_BUCKET: &str = include_str!("../lua/token_bucket.lua");
/// The GCRA function.
pub const GCRA: &str = include_str!("../lua/gcra.lua");
/// The fixed window function.
pub const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");
/// The sliding window counter function.
pub const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");
/// The sliding log function.
pub const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");
/// The refunds of reservations (Redis Cluster: layers on several slots).
pub const REFUND: &str = include_str!("../lua/refund.lua");
/// The dispatcher: reads every layer, decides, writes all or nothing.
pub const LAYERED: &str = include_str!("../lua/layered.lua");

/// The script the store runs: [`COMMON`], [`CODES`], the five algorithms, [`REFUND`]
/// and [`LAYERED`], in that order. Standalone and Cluster stores run the
/// same script.
pub const SCRIPT: &str = concat!(
    include_str!("../lua/common.lua"),
    "\n",
    include_str!("../lua/codes.lua"),
    "\n",
    include_str!("../lua/token_bucket.lua"),
    "\n",
    include_str!("../lua/gcra.lua"),
    "\n",
    include_str!("../lua/fixed_window.lua"),
    "\n",
    include_str!("../lua/sliding_window.lua"),
    "\n",
    include_str!("../lua/sliding_log.lua"),
    "\n",
    include_str!("../lua/refund.lua"),
    "\n",
    include_str!("../lua/layered.lua"),
);

/// The algorithm codes the script knows (`lua/codes.lua` names them the
/// same way; a test checks the two agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Code {
    /// `TOKEN_BUCKET`.
    TokenBucket = 1,
    /// `GCRA`.
    Gcra = 2,
    /// `FIXED_WINDOW`.
    FixedWindow = 3,
    /// `SLIDING_WINDOW`.
    SlidingWindow = 4,
    /// `SLIDING_LOG`.
    SlidingLog = 5,
}

impl Code {
    /// Every code with its name in `codes.lua`.
    pub const ALL: [(Code, &'static str); 5] = [
        (Code::TokenBucket, "TOKEN_BUCKET"),
        (Code::Gcra, "GCRA"),
        (Code::FixedWindow, "FIXED_WINDOW"),
        (Code::SlidingWindow, "SLIDING_WINDOW"),
        (Code::SlidingLog, "SLIDING_LOG"),
    ];
}

/// Arguments before the first layer's: the caller's time and the allowed skew.
pub const HEADER_ARGS: usize = 2;
/// Arguments per layer: algorithm, cost and three parameters.
pub const LAYER_ARGS: usize = 5;
/// Integers per layer in the reply.
pub const REPLY_FIELDS: usize = 5;

/// The SHA-1 of [`SCRIPT`] in hex, as `EVALSHA` expects it.
pub fn sha1() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(SCRIPT).get_hash().to_string())
}

/// One layer's script arguments: algorithm code, cost and the algorithm's
/// three parameters (see `lua/layered.lua`).
///
/// Fails with [`StoreError::Unsupported`] for a custom algorithm (the script
/// runs only the built-ins) and rejects a cost outside `1..=capacity`.
pub fn layer_args(layer: &LayerRequest<'_>) -> Result<[u64; LAYER_ARGS], StoreError> {
    let cost = layer.cost;
    let limit = layer.policy.limit();
    if cost == 0 || cost > limit.capacity() {
        return Err(StoreError::Backend(Box::new(
            RedisStoreError::InvalidCost {
                cost,
                capacity: limit.capacity(),
                policy: layer.policy.name().to_string(),
            },
        )));
    }
    Ok(match limit {
        Limit::TokenBucket(p) => [
            Code::TokenBucket as u64,
            cost,
            p.capacity(),
            p.refill(),
            p.period_us(),
        ],
        Limit::Gcra(p) => [Code::Gcra as u64, cost, p.burst(), p.interval_us(), 0],
        Limit::FixedWindow(p) => [Code::FixedWindow as u64, cost, p.limit(), p.window_us(), 0],
        Limit::SlidingWindow(p) => [
            Code::SlidingWindow as u64,
            cost,
            p.limit(),
            p.window_us(),
            0,
        ],
        Limit::SlidingLog(p) => [Code::SlidingLog as u64, cost, p.limit(), p.window_us(), 0],
        other => return Err(StoreError::Unsupported(other.algorithm_name())),
    })
}

/// Turn the script's reply (5 integers per layer) into one verdict per
/// layer; a reply of another shape is a [`StoreError::Protocol`].
pub fn parse_reply(reply: &[i64], layers: usize) -> Result<Verdicts, StoreError> {
    if reply.len() != layers * REPLY_FIELDS {
        return Err(StoreError::Protocol(format!(
            "the script answered {} integers for {layers} layers",
            reply.len()
        )));
    }
    let unsigned = |v: i64, what: &str| {
        u64::try_from(v)
            .map_err(|_| StoreError::Protocol(format!("the script answered {what} = {v}")))
    };
    reply
        .chunks_exact(REPLY_FIELDS)
        .map(|r| {
            let allowed = match r[0] {
                0 => false,
                1 => true,
                other => {
                    return Err(StoreError::Protocol(format!(
                        "the script answered allowed = {other}"
                    )))
                }
            };
            let retry_after = match r[4] {
                -1 => None,
                v => Some(Duration::from_micros(unsigned(v, "retry_after")?)),
            };
            Ok(Verdict {
                allowed,
                limit: unsigned(r[1], "limit")?,
                remaining: unsigned(r[2], "remaining")?,
                reset_after: Duration::from_micros(unsigned(r[3], "reset_after")?),
                retry_after,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_is_the_concatenation_of_the_files() {
        for part in [
            COMMON,
            CODES,
            TOKEN_BUCKET,
            GCRA,
            FIXED_WINDOW,
            SLIDING_WINDOW,
            SLIDING_LOG,
            REFUND,
            LAYERED,
        ] {
            assert!(SCRIPT.contains(part));
        }
        assert_eq!(sha1().len(), 40);
    }

    /// One code per algorithm, the same number on both sides: `codes.lua`
    /// names exactly the codes of [`Code`], with the same values.
    #[test]
    fn the_lua_codes_are_the_rust_codes() {
        let lua: Vec<(String, u64)> = CODES
            .lines()
            .filter_map(|line| line.strip_prefix("local "))
            .map(|rest| {
                let (name, value) = rest.split_once(" = ").expect("local NAME = N");
                (name.to_string(), value.trim().parse().expect("a number"))
            })
            .collect();
        let rust: Vec<(String, u64)> = Code::ALL
            .iter()
            .map(|&(code, name)| (name.to_string(), code as u64))
            .collect();
        assert_eq!(lua, rust);
        // And the dispatcher names them instead of using numbers.
        for (_, name) in Code::ALL {
            assert!(
                LAYERED.contains(&format!("[{name}] = ")),
                "{name} dispatched"
            );
        }
    }

    #[test]
    fn replies_parse_and_bad_replies_are_protocol_errors() {
        let v = parse_reply(&[1, 10, 9, 100_000, -1, 0, 3, 0, 5, 7], 2).unwrap();
        assert!(v[0].allowed && v[0].retry_after.is_none());
        assert_eq!(v[1].retry_after, Some(Duration::from_micros(7)));
        assert!(matches!(
            parse_reply(&[1, 2, 3], 1),
            Err(StoreError::Protocol(_))
        ));
        assert!(matches!(
            parse_reply(&[2, 1, 1, 1, -1], 1),
            Err(StoreError::Protocol(_))
        ));
    }
}
