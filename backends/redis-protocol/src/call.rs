//! What a call asks, and how it is written:
//!
//! ```text
//! FCALL <function> <numkeys> <key>... <now µs | ""> <max skew µs | ""> <layer>... [mode]
//! TOLLGATE.DECIDE  <numkeys> <key>... <now µs | ""> <max skew µs | ""> <layer>... [mode]
//! layer: <algorithm code> <cost> <p1> <p2> <p3>        (refund, renew: ... <at> <mark>)
//! ```
//!
//! (`EVALSHA <sha> …` as `FCALL`.) The store encodes calls with
//! [`layer_args`] and [`Mode::word`]; the module decodes them with
//! [`numkeys`] and [`parse`]. The Lua code reads the same arguments.

use std::time::Duration;

use tollgate_limiter::{Adjustment, Layout, Limit, StoreError, Timestamp};

use crate::limit_args::{algorithm_of, limit_args, limit_from_args};
use crate::state::digits;

/// Arguments per layer: algorithm code, cost, and the algorithm's three
/// parameters ([`limit_args`]).
pub const LAYER_ARGS: usize = 5;
/// Arguments per layer of a refund: [`LAYER_ARGS`], then the charge's
/// `at` and `mark`.
pub const REFUND_LAYER_ARGS: usize = LAYER_ARGS + 2;

/// What a call does: its last argument ([`word`](Self::word)); none to
/// decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decide every layer, all or nothing.
    Decide,
    /// Decide, and answer each layer's charge (Cluster reservations).
    Reserve,
    /// Judge every layer, write nothing.
    Peek,
    /// Judge as a peek does (a foreign key fails the call first), then
    /// delete every key.
    Reset,
    /// Charge each layer its cost, saturating at empty.
    Penalize,
    /// Give each layer its cost back, never above full.
    Reward,
    /// Block every layer; each layer's cost argument holds the block's
    /// length in µs.
    Block,
    /// Give reservations back; each layer's arguments end with its charge.
    Refund,
    /// Renew concurrency holds; each layer's arguments end with its hold
    /// (the time it was charged or last renewed at, and 0).
    Renew,
}

impl Mode {
    /// Every mode named by a last argument, with its word.
    const WORDS: [(&'static str, Mode); 8] = [
        ("reserve", Mode::Reserve),
        ("peek", Mode::Peek),
        ("reset", Mode::Reset),
        ("penalize", Mode::Penalize),
        ("reward", Mode::Reward),
        ("block", Mode::Block),
        ("refund", Mode::Refund),
        ("renew", Mode::Renew),
    ];

    /// The call's last argument (none to decide).
    ///
    /// ```
    /// use tollgate_redis_protocol::Mode;
    /// assert_eq!(Mode::Decide.word(), None);
    /// assert_eq!(Mode::Peek.word(), Some("peek"));
    /// ```
    pub fn word(self) -> Option<&'static str> {
        Self::WORDS
            .iter()
            .find(|(_, m)| *m == self)
            .map(|(w, _)| *w)
    }

    /// The mode a last argument names.
    fn named(word: &[u8]) -> Option<Mode> {
        Self::WORDS
            .iter()
            .find(|(w, _)| w.as_bytes() == word)
            .map(|(_, m)| *m)
    }

    /// Arguments per layer in this mode.
    pub fn layer_args(self) -> usize {
        match self {
            Mode::Refund | Mode::Renew => REFUND_LAYER_ARGS,
            _ => LAYER_ARGS,
        }
    }

    /// The mode of an operator's `adjustment`, and the cost argument it
    /// sends in place of each layer's cost (a block's length in µs); an
    /// adjustment the protocol does not know is
    /// [`StoreError::UnsupportedOperation`].
    pub fn of(adjustment: Adjustment) -> Result<(Mode, Option<u64>), StoreError> {
        adjustment.check()?;
        Ok(match adjustment {
            Adjustment::Penalize => (Mode::Penalize, None),
            Adjustment::Reward => (Mode::Reward, None),
            Adjustment::Block(d) => (Mode::Block, Some(tollgate_limiter::duration_micros(d))),
            other => return Err(StoreError::UnsupportedOperation(other.name())),
        })
    }

    /// The adjustment a call of this mode makes with `cost` (a block's
    /// length in µs); `None` for the other modes.
    pub fn adjustment(self, cost: u64) -> Option<Adjustment> {
        match self {
            Mode::Penalize => Some(Adjustment::Penalize),
            Mode::Reward => Some(Adjustment::Reward),
            Mode::Block => Some(Adjustment::Block(Duration::from_micros(cost))),
            _ => None,
        }
    }
}

/// One layer's arguments for a decision at `now`: its algorithm's code,
/// `cost` and the algorithm's three parameters (a calendar quota's carry
/// the span holding `now`); `None` for a custom algorithm (the Lua and
/// the module run only the built-ins).
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Limit, Timestamp};
/// let limit = Limit::fixed_window(10, Duration::from_secs(1)).unwrap();
/// let args = tollgate_redis_protocol::layer_args(&limit, 2, Timestamp::EARLIEST);
/// assert_eq!(args, Some([3, 2, 10, 1_000_000, 0]));
/// ```
#[inline]
pub fn layer_args(limit: &Limit, cost: u64, now: Timestamp) -> Option<[u64; LAYER_ARGS]> {
    let (code, [p1, p2, p3]) = limit_args(limit, now)?;
    Some([code.into(), cost, p1, p2, p3])
}

/// One layer of a call.
#[derive(Debug, Clone)]
pub struct Layer {
    /// How its state is kept.
    pub layout: Layout,
    /// Its limit.
    pub limit: Limit,
    /// Its cost (penalties and rewards: the units; a block: its length in µs).
    pub cost: u64,
    /// A refund's charge: the time it charged at.
    pub at: u64,
    /// A refund's charge: its mark.
    pub mark: u64,
}

/// The time the call decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// The server's clock.
    Server,
    /// The caller's clock, checked against the server's when a maximum
    /// skew is given.
    Caller {
        /// The caller's time (µs since the Unix epoch).
        now: u64,
        /// How far it may be from the server's (µs).
        max_skew: Option<u64>,
    },
}

/// A parsed call: the keys are the arguments at `2 ..= 1 + numkeys`.
#[derive(Debug, Clone)]
pub struct Call {
    /// What it does.
    pub mode: Mode,
    /// When it decides.
    pub time: Time,
    /// Its layers, in key order.
    pub layers: Vec<Layer>,
}

impl Call {
    /// The operator's change a `penalize`, `reward` or `block` call makes
    /// (a block's length is each layer's cost argument, the same for
    /// every layer); an error for another mode.
    pub fn adjustment(&self) -> Result<Adjustment, ArgsError> {
        let cost = self.layers.first().map_or(0, |l| l.cost);
        if self.mode == Mode::Block && self.layers.iter().any(|l| l.cost != cost) {
            return Err(ArgsError::new(
                "a block's length must be the same for every layer",
            ));
        }
        self.mode
            .adjustment(cost)
            .ok_or_else(|| ArgsError::new(format!("{:?} is not an adjustment", self.mode)))
    }
}

/// A call the protocol does not understand; its text is the error reply
/// `TOLLGATE_ARGS <why>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ArgsError(String);

impl ArgsError {
    /// The error `TOLLGATE_ARGS <why>`, ASCII only, on one line: an error
    /// reply is a simple string, and a client may refuse one that is not
    /// valid text.
    pub fn new(why: impl std::fmt::Display) -> ArgsError {
        ArgsError(args_error(why))
    }
}

fn args_error(why: impl std::fmt::Display) -> String {
    let why: String = why
        .to_string()
        .replace('\u{b5}', "u")
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    format!("TOLLGATE_ARGS {why}")
}

/// The number of keys a call names (`args`: the command, then its
/// arguments), checked against the number of arguments.
pub fn numkeys(args: &[&[u8]]) -> Result<usize, ArgsError> {
    let n = args
        .get(1)
        .and_then(|a| digits(a))
        .ok_or_else(|| ArgsError::new("numkeys must be a whole number"))? as usize;
    // Checked: numkeys comes from the client, and the key-position
    // callback trusts what this answers.
    if n.checked_add(2).is_none_or(|needed| args.len() < needed) {
        return Err(ArgsError::new("numkeys is more than the keys given"));
    }
    Ok(n)
}

/// Parse the arguments after the keys (`argv`: the Lua code's ARGV) for
/// `keys` layers.
pub fn parse(argv: &[&[u8]], keys: usize) -> Result<Call, ArgsError> {
    let n = argv.len();
    let named = argv.last().and_then(|last| Mode::named(last));
    let mode = match named {
        _ if n == 2 + LAYER_ARGS * keys => Mode::Decide,
        Some(mode) if n == 3 + mode.layer_args() * keys => mode,
        _ => {
            return Err(ArgsError::new(
                "expected 2 arguments and 5 per key (or a mode name last, and 7 per key for refund and renew)",
            ))
        }
    };
    let per_layer = mode.layer_args();
    let time = match (argv[0], argv[1]) {
        (b"", _) => Time::Server,
        (now, skew) => Time::Caller {
            now: digits(now).ok_or_else(|| {
                ArgsError::new("the time must be an integer number of microseconds")
            })?,
            max_skew: match skew {
                b"" => None,
                s => Some(
                    digits(s).ok_or_else(|| ArgsError::new("the skew must be a whole number"))?,
                ),
            },
        },
    };
    let layers = argv[2..]
        .chunks_exact(per_layer)
        .enumerate()
        .map(|(i, args)| parse_layer(mode, i + 1, args))
        .collect::<Result<Vec<Layer>, ArgsError>>()?;
    Ok(Call { mode, time, layers })
}

/// Layer `n`'s arguments (`args`: its code, cost, three parameters, and a
/// refund's charge).
fn parse_layer(mode: Mode, n: usize, args: &[&[u8]]) -> Result<Layer, ArgsError> {
    let num = |j: usize| digits(args[j]);
    let code = num(0);
    let builtin = code.and_then(algorithm_of).ok_or_else(|| {
        ArgsError::new(format!(
            "unknown algorithm {}",
            String::from_utf8_lossy(args[0])
        ))
    })?;
    let [cost, p1, p2, p3] = [1, 2, 3, 4].map(num);
    let (Some(cost), Some(p1), Some(p2), Some(p3)) = (cost, p1, p2, p3) else {
        return Err(ArgsError::new(format!(
            "layer {n} has an argument that is not a whole number"
        )));
    };
    let (at, mark) = match mode {
        Mode::Refund | Mode::Renew => match (num(5), num(6)) {
            (Some(at), Some(mark)) => (at, mark),
            _ => {
                return Err(ArgsError::new(format!(
                    "layer {n}'s charge is not two whole numbers"
                )))
            }
        },
        _ => (0, 0),
    };
    let limit = limit_from_args(code.unwrap_or_default(), [p1, p2, p3])
        .map_err(|e| ArgsError::new(format!("layer {n}: {e}")))?;
    let cost = checked_cost(mode, builtin.layout, &limit, cost)
        .map_err(|e| ArgsError::new(format!("layer {n}: {e}")))?;
    Ok(Layer {
        layout: builtin.layout,
        limit,
        cost,
        at,
        mark,
    })
}

/// A layer's cost as the reference algorithms may take it: the store sends
/// nothing else (a policy's cost lies between 1 and its capacity; a block
/// within `Adjustment::check`), and anything else from a client is refused
/// here rather than reaching arithmetic that assumes it.
fn checked_cost(mode: Mode, layout: Layout, limit: &Limit, cost: u64) -> Result<u64, String> {
    let capacity = limit.capacity();
    match mode {
        Mode::Decide | Mode::Reserve | Mode::Peek | Mode::Reset | Mode::Refund | Mode::Renew => {
            if cost == 0 || cost > capacity {
                return Err(format!(
                    "cost {cost} must be between 1 and the capacity {capacity}"
                ));
            }
            Ok(cost)
        }
        // Units beyond what a layer holds change nothing more for a
        // counter; a log's reward drops at most every entry, however many.
        // A counter's reward may take up to twice its limit: a sliding
        // window holds its current window and the one before, each up to
        // the limit. (Capped at the limit, the module would keep units of
        // the previous window that the Lua code and the reference give
        // back.)
        Mode::Penalize => Ok(cost.min(capacity)),
        Mode::Reward if layout.is_log() => Ok(cost),
        Mode::Reward => Ok(cost.min(capacity.saturating_mul(2))),
        Mode::Block => {
            Adjustment::Block(Duration::from_micros(cost))
                .check()
                .map_err(|e| e.to_string())?;
            Ok(cost)
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_limiter::Gcra;

    use super::*;

    fn args(s: &str) -> Vec<&[u8]> {
        s.split(' ')
            .map(|w| if w == "-" { &b""[..] } else { w.as_bytes() })
            .collect()
    }

    #[test]
    fn calls_parse_as_the_lua_reads_them() {
        let call = parse(&args("- - 2 1 10 1000000 0"), 1).unwrap();
        assert_eq!((call.mode, call.time), (Mode::Decide, Time::Server));
        assert_eq!(
            call.layers[0].layout,
            tollgate_limiter::Builtin::named("gcra").unwrap().layout
        );
        assert_eq!(
            call.layers[0].limit,
            Limit::gcra(1, Duration::from_secs(1), 10).unwrap()
        );
        let call = parse(
            &args("1800000000000000 5000 3 2 5 60000000 0 1 1 10 1 1000000 peek"),
            2,
        )
        .unwrap();
        assert_eq!(call.mode, Mode::Peek);
        assert_eq!(
            call.time,
            Time::Caller {
                now: 1_800_000_000_000_000,
                max_skew: Some(5000)
            }
        );
        assert_eq!(
            call.layers[1].limit,
            Limit::token_bucket(10, 1, Duration::from_secs(1)).unwrap()
        );
        let call = parse(&args("- - 5 2 3 1000 0 17 0 refund"), 1).unwrap();
        assert_eq!(
            (call.mode, call.layers[0].at, call.layers[0].cost),
            (Mode::Refund, 17, 2)
        );
    }

    /// The wire as this release speaks it: the constants the Lua shares
    /// with the module, every mode's word and stride, and the encodings of
    /// a state. A module of another release misreads a call when any of
    /// them changes, so a change must come with a new [`PROTOCOL`] (the
    /// store then refuses a module answering the old one).
    #[test]
    fn the_wire_is_pinned_to_its_protocol_version() {
        let mut wire = crate::lua_constants();
        for (word, mode) in Mode::WORDS {
            wire.push_str(&format!("{word} {}\n", mode.layer_args()));
        }
        let t = 1_800_000_000_000_000;
        let cells = tollgate_limiter::Layout::Cells {
            cells: 3,
            time_cell: 1,
        };
        wire.push_str(&crate::write_cells(cells, [7, t, 9]));
        wire.push_str(&crate::block_text(t));
        wire.push_str(&crate::write_log_text(&[t, t + 1].into()));
        // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
        let digest = wire.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        assert_eq!(
            (crate::PROTOCOL, digest),
            (1, 0xfadb_da86_ac1d_1f2f),
            "the wire changed: bump PROTOCOL, then pin ({}, {digest:#x}) here",
            crate::PROTOCOL + 1
        );
    }

    /// Calls of a shape the Lua refuses too (a count, a mode); the Lua
    /// does not check each layer's arguments as `parse` does.
    #[test]
    fn calls_the_lua_would_refuse_are_refused() {
        for (argv, keys) in [
            ("- - 2 1 10 1000000", 1),
            ("- - 2 1 10 1000000 0 nonsense", 1),
            ("- - 9 1 10 1000000 0", 1),
            ("- - 2 x 10 1000000 0", 1),
            ("soon - 2 1 10 1000000 0", 1),
            ("- - 2 1 10 1000000 0 0 0 refund", 2),
        ] {
            assert!(
                parse(&args(argv), keys)
                    .unwrap_err()
                    .to_string()
                    .starts_with("TOLLGATE_ARGS "),
                "{argv}"
            );
        }
        assert!(numkeys(&args("tollgate.decide 3 a b")).is_err());
        // Intervals below a millisecond are GCRA's own (a rate above 1,000/s).
        let fast = parse(&args("- - 2 1 1 56 0"), 1).unwrap();
        assert_eq!(
            fast.layers[0].limit,
            Limit::Gcra(Gcra::from_interval(1, Duration::from_micros(56)).unwrap())
        );
        let err = parse(&args("- - 3 1 5 0 0"), 1).unwrap_err().to_string();
        assert!(
            err.is_ascii() && err.starts_with("TOLLGATE_ARGS layer 1: window: 0ns"),
            "{err}"
        );
        assert_eq!(numkeys(&args("tollgate.decide 2 a b -")), Ok(2));
    }

    /// What the store writes is what the module reads, in every mode.
    #[test]
    fn what_is_encoded_parses_back() {
        let limit = Limit::sliding_window(9, Duration::from_secs(60)).unwrap();
        let layer = layer_args(&limit, 4, Timestamp::EARLIEST).unwrap();
        for mode in [
            Mode::Decide,
            Mode::Reserve,
            Mode::Peek,
            Mode::Reset,
            Mode::Penalize,
            Mode::Reward,
            Mode::Block,
            Mode::Refund,
            Mode::Renew,
        ] {
            let mut argv: Vec<String> = vec!["1800000000000000".into(), String::new()];
            argv.extend(layer.iter().map(u64::to_string));
            if mode == Mode::Block {
                argv[3] = "5000".into();
            }
            if mode.layer_args() == REFUND_LAYER_ARGS {
                argv.extend(["7".to_string(), "8".to_string()]);
            }
            argv.extend(mode.word().map(str::to_string));
            let raw: Vec<&[u8]> = argv.iter().map(String::as_bytes).collect();
            let call = parse(&raw, 1).unwrap();
            assert_eq!(call.mode, mode);
            assert_eq!(call.layers[0].limit, limit);
            let cost = if mode == Mode::Block { 5000 } else { 4 };
            assert_eq!(call.layers[0].cost, cost, "{mode:?}");
            assert_eq!(
                mode.adjustment(cost).is_some(),
                matches!(mode, Mode::Penalize | Mode::Reward | Mode::Block)
            );
        }
        assert_eq!(
            Mode::of(Adjustment::Block(Duration::from_millis(5))).unwrap(),
            (Mode::Block, Some(5000))
        );
        assert_eq!(Mode::of(Adjustment::Reward).unwrap(), (Mode::Reward, None));
    }
}
