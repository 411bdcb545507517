//! What a call asks: the Lua path's calling convention
//! (`backends/redis/lua/layered.lua`), with the command in place of
//! `FCALL <function>`:
//!
//! ```text
//! TOLLGATE.DECIDE <numkeys> <key>... <now µs | ""> <max skew µs | ""> <layer>... [mode]
//! layer: <algorithm code> <cost> <p1> <p2> <p3>        (refund: ... <at> <mark>)
//! ```

use std::time::Duration;

use tollgate_limiter::{Adjustment, Builtin, Layout, Limit};

/// What the call does (the last argument; none to decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Decide,
    Reserve,
    Peek,
    Reset,
    Penalize,
    Reward,
    Block,
    Refund,
}

/// One layer of the call.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    /// How its state is kept.
    pub(crate) layout: Layout,
    pub(crate) limit: Limit,
    /// Its cost (penalties and rewards: the units; a block: its length in µs).
    pub(crate) cost: u64,
    /// A refund's charge: the time it charged at and its mark.
    pub(crate) at: u64,
    pub(crate) mark: u64,
}

/// The time the call decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// The server's clock.
    Server,
    /// The caller's clock, checked against the server's when a maximum
    /// skew is given.
    Caller { now: u64, max_skew: Option<u64> },
}

/// A parsed call: the keys are the arguments at `1 + 1 ..= 1 + keys`.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) mode: Mode,
    pub(crate) time: Time,
    pub(crate) layers: Vec<Layer>,
}

/// An argument error, answered as `TOLLGATE_ARGS <why>`.
/// ASCII only, on one line: an error reply is a simple string, and a
/// client may refuse one that is not valid text.
pub(crate) fn args_error(why: impl std::fmt::Display) -> String {
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

/// The number of keys a call names (its first argument after the command),
/// checked against the number of arguments.
pub(crate) fn numkeys(args: &[&[u8]]) -> Result<usize, String> {
    let n = args
        .get(1)
        .and_then(|a| number(a))
        .ok_or_else(|| args_error("numkeys must be a whole number"))? as usize;
    // Checked: numkeys comes from the client, and the key-position
    // callback trusts what this answers.
    if n.checked_add(2).is_none_or(|needed| args.len() < needed) {
        return Err(args_error("numkeys is more than the keys given"));
    }
    Ok(n)
}

fn number(a: &[u8]) -> Option<u64> {
    if a.is_empty() || !a.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(a).ok()?.parse().ok()
}

/// Parse the arguments after the keys (`argv`: the Lua path's ARGV) for
/// `keys` layers.
pub(crate) fn parse(argv: &[&[u8]], keys: usize) -> Result<Call, String> {
    const WORDS: [(&[u8], Mode); 6] = [
        (b"reserve", Mode::Reserve),
        (b"peek", Mode::Peek),
        (b"reset", Mode::Reset),
        (b"penalize", Mode::Penalize),
        (b"reward", Mode::Reward),
        (b"block", Mode::Block),
    ];
    let n = argv.len();
    let last = argv.last().copied().unwrap_or_default();
    let (mode, per_layer) = if n == 2 + 5 * keys {
        (Mode::Decide, 5)
    } else if n == 3 + 5 * keys && WORDS.iter().any(|(w, _)| *w == last) {
        let mode = WORDS.iter().find(|(w, _)| *w == last).map(|(_, m)| *m);
        (mode.unwrap_or(Mode::Decide), 5)
    } else if n == 3 + 7 * keys && last == b"refund" {
        (Mode::Refund, 7)
    } else {
        return Err(args_error("expected 2 arguments and 5 per key"));
    };
    let time = match (argv[0], argv[1]) {
        (b"", _) => Time::Server,
        (now, skew) => Time::Caller {
            now: number(now)
                .ok_or_else(|| args_error("the time must be an integer number of microseconds"))?,
            max_skew: match skew {
                b"" => None,
                s => Some(number(s).ok_or_else(|| args_error("the skew must be a whole number"))?),
            },
        },
    };
    let mut layers = Vec::with_capacity(keys);
    for i in 0..keys {
        let a = &argv[2 + per_layer * i..2 + per_layer * (i + 1)];
        let num = |j: usize| number(a[j]);
        let builtin = num(0).and_then(Builtin::by_code).ok_or_else(|| {
            args_error(format!(
                "unknown algorithm {}",
                String::from_utf8_lossy(a[0])
            ))
        })?;
        let [cost, p1, p2, p3] = [1, 2, 3, 4].map(num);
        let (Some(cost), Some(p1), Some(p2), Some(p3)) = (cost, p1, p2, p3) else {
            return Err(args_error(format!(
                "layer {} has an argument that is not a whole number",
                i + 1
            )));
        };
        let (at, mark) = if per_layer == 7 {
            match (num(5), num(6)) {
                (Some(at), Some(mark)) => (at, mark),
                _ => {
                    return Err(args_error(format!(
                        "layer {}'s charge is not two whole numbers",
                        i + 1
                    )))
                }
            }
        } else {
            (0, 0)
        };
        let limit = Limit::from_args(builtin.code.into(), [p1, p2, p3])
            .map_err(|e| args_error(format!("layer {}: {e}", i + 1)))?;
        let cost = checked_cost(mode, builtin.layout, &limit, cost)
            .map_err(|e| args_error(format!("layer {}: {e}", i + 1)))?;
        layers.push(Layer {
            layout: builtin.layout,
            limit,
            cost,
            at,
            mark,
        });
    }
    Ok(Call { mode, time, layers })
}

/// A layer's cost as the reference algorithms may take it: the store sends
/// nothing else (a policy's cost lies between 1 and its capacity; a block
/// within `Adjustment::check`), and anything else from a client is refused
/// here rather than reaching arithmetic that assumes it.
fn checked_cost(mode: Mode, layout: Layout, limit: &Limit, cost: u64) -> Result<u64, String> {
    let capacity = limit.capacity();
    match mode {
        Mode::Decide | Mode::Reserve | Mode::Peek | Mode::Reset | Mode::Refund => {
            if cost == 0 || cost > capacity {
                return Err(format!(
                    "cost {cost} must be between 1 and the capacity {capacity}"
                ));
            }
            Ok(cost)
        }
        // Units beyond what a layer holds change nothing more for a
        // counter; a log's reward drops at most every entry, however many.
        Mode::Penalize => Ok(cost.min(capacity)),
        Mode::Reward if layout == Layout::Log => Ok(cost),
        Mode::Reward => Ok(cost.min(capacity)),
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
            Builtin::named("gcra").unwrap().layout
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
        let err = parse(&args("- - 3 1 5 0 0"), 1).unwrap_err();
        assert!(
            err.is_ascii() && err.starts_with("TOLLGATE_ARGS layer 1: window: 0ns"),
            "{err}"
        );
        assert_eq!(numkeys(&args("tollgate.decide 2 a b -")), Ok(2));
    }
}
