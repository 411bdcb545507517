//! The Lua script and its calling convention.
//!
//! Each algorithm lives in one file under `lua/` (its function, its refund,
//! its reward: the Lua port of its Rust reference); `layered.lua` is the
//! dispatcher that decides every layer of a request in one call,
//! all-or-nothing. The store runs one code ([`eval_script`] or
//! [`function_library`]): the helpers, the algorithm files, the codes and
//! tables generated from the list of built-ins, and the dispatcher. A
//! single-policy decision is the same code with one layer. The files'
//! opening comments give the KEYS/ARGV layout.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use tollgate_limiter::{Builtin, LayerRequest, Layout, StoreError, Verdict, Verdicts};

use crate::error::RedisStoreError;
use crate::scripting::Style;

/// Every built-in algorithm's Lua file, from the list of built-ins.
macro_rules! algorithm_files {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident) = $code:literal, )*) => {
        /// Every built-in algorithm's Lua file (`lua/<name>.lua`), in the
        /// registry's order.
        const ALGORITHM_FILES: &[&str] = &[$(
            include_str!(concat!("../lua/", stringify!($module), ".lua")),
        )*];
    };
}
tollgate_limiter::builtin_algorithms!(algorithm_files);

/// The code both forms run: the helpers of `common.lua`, each algorithm's
/// code (`local TOKEN_BUCKET = 1`, …), the algorithm files, the tables
/// that find each one's functions by its code (see `lua/layered.lua`) and
/// the dispatcher `layered.lua`, which defines `decide(KEYS, ARGV)`. The
/// codes and tables are generated from the list of built-ins, so the Lua
/// cannot disagree with the Rust about them.
fn body() -> &'static str {
    static BODY: OnceLock<String> = OnceLock::new();
    BODY.get_or_init(|| {
        let mut body = String::from(include_str!("../lua/common.lua"));
        body.push_str("\n-- The algorithms' codes (src/script.rs, from the list of built-ins).\n");
        for b in Builtin::all() {
            let _ = writeln!(body, "local {} = {}", b.name.to_uppercase(), b.code);
        }
        for file in ALGORITHM_FILES {
            body.push('\n');
            body.push_str(file);
        }
        body.push_str(
            "\n-- Each algorithm's functions and state cells, by code (src/script.rs).\n",
        );
        let all = Builtin::all();
        let counters: Vec<(&Builtin, usize, usize)> = all
            .iter()
            .filter_map(|b| match b.layout {
                Layout::Cells { cells, time_cell } => Some((b, cells, time_cell)),
                Layout::Log => None,
            })
            .collect();
        lua_table(
            &mut body,
            "ALGORITHMS",
            all.iter().map(|b| (b.code, b.name.to_string())),
        );
        for function in ["refund", "reward", "charge"] {
            let name = format!("{}S", function.to_uppercase());
            let entries = counters
                .iter()
                .map(|(b, _, _)| (b.code, format!("{function}_{}", b.name)));
            lua_table(&mut body, &name, entries);
        }
        lua_table(
            &mut body,
            "CELLS",
            counters
                .iter()
                .map(|(b, cells, _)| (b.code, cells.to_string())),
        );
        // From 1, as Lua counts.
        let time_cells = counters
            .iter()
            .map(|(b, _, time)| (b.code, (time + 1).to_string()));
        lua_table(&mut body, "TIME_CELL", time_cells);
        body.push('\n');
        body.push_str(include_str!("../lua/layered.lua"));
        body
    })
}

/// Append the Lua table `name` = `{ [code] = value, … }` to `body`, on one
/// line.
fn lua_table(body: &mut String, name: &str, entries: impl Iterator<Item = (u8, String)>) {
    let _ = write!(body, "local {name} = {{");
    for (code, value) in entries {
        let _ = write!(body, " [{code}] = {value},");
    }
    body.push_str(" }\n");
}

/// The script form, for `EVALSHA` (Redis before 7.0, or
/// [`Scripting::Eval`](crate::Scripting::Eval)): the code, then a call of
/// `decide`. Standalone and Cluster stores run the same code.
pub fn eval_script() -> &'static str {
    static SCRIPT: OnceLock<String> = OnceLock::new();
    SCRIPT.get_or_init(|| format!("{}\nreturn decide(KEYS, ARGV)\n", body()))
}

/// The function library form, for `FUNCTION LOAD` and `FCALL` (Redis 7.0
/// and later): the same code, registering `decide` as the function
/// [`function_name`]. Its library is named [`library_name`].
///
/// A store loads it itself (`FUNCTION LOAD REPLACE`); it is public for
/// operators who load it ahead of time, for example where the store's user
/// may call functions but not load them.
pub fn function_library() -> &'static str {
    static LIBRARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(|| {
        format!(
            "#!lua name={}\n{}\nredis.register_function('{}', decide)\n",
            library_name(),
            body(),
            function_name()
        )
    })
}

/// The function library's name: `tollgate_` and the first 16 hex digits
/// of the SHA-1 of its code, so each release's code has its own name and
/// processes of two releases sharing a Redis each call their own.
pub fn library_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let sha = redis::Script::new(body()).get_hash().to_string();
        format!("tollgate_{}", &sha[..16])
    })
}

/// The function that decides: `tollgate_decide_` and the same digits.
pub fn function_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("tollgate_decide_{}", &library_name()["tollgate_".len()..]))
}

/// Arguments per layer: algorithm, cost and three parameters.
pub const LAYER_ARGS: usize = 5;
/// Integers per layer in the reply.
pub const REPLY_FIELDS: usize = 5;

/// The SHA-1 of [`eval_script`] in hex, as `EVALSHA` expects it.
pub fn sha1() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(eval_script()).get_hash().to_string())
}

/// The caller's time and skew arguments of a call (empty: the server's
/// `TIME`).
#[derive(Debug, Clone, Default)]
pub(crate) struct TimeArgs {
    pub(crate) now: Option<u64>,
    pub(crate) max_skew: Option<u64>,
}

/// What a call asks of the script (`lua/layered.lua`'s last argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Decide, all or nothing (no argument).
    Decide,
    /// Decide, and report each layer's charge (Cluster reservations).
    #[cfg(feature = "cluster")]
    Reserve,
    /// Judge without charging.
    Peek,
    /// Judge, then delete every key (a foreign key fails the call first).
    Reset,
    /// Give back charges; each layer's arguments end with its charge.
    #[cfg(feature = "cluster")]
    Refund,
    /// Charge each layer its cost, saturating at empty.
    Penalize,
    /// Give each layer its cost back, never above full.
    Reward,
    /// Block every layer for this many µs (sent in the cost's place).
    Block(u64),
}

impl Mode {
    /// The mode of an operator's `adjustment` (an adjustment the script
    /// does not know is [`StoreError::UnsupportedOperation`]).
    pub(crate) fn of(adjustment: tollgate_limiter::Adjustment) -> Result<Mode, StoreError> {
        use tollgate_limiter::Adjustment;
        adjustment.check()?;
        Ok(match adjustment {
            Adjustment::Penalize => Mode::Penalize,
            Adjustment::Reward => Mode::Reward,
            Adjustment::Block(d) => Mode::Block(tollgate_limiter::duration_micros(d)),
            other => return Err(StoreError::UnsupportedOperation(other.name())),
        })
    }

    /// A layer's arguments as this mode sends them.
    pub(crate) fn layer(self, mut args: [u64; LAYER_ARGS]) -> [u64; LAYER_ARGS] {
        if let Mode::Block(us) = self {
            args[1] = us;
        }
        args
    }
}

/// One call of the code (`FCALL` of the function or `EVALSHA` of the
/// script): every store builds its calls here, so the argument layout is
/// written once.
///
/// `FCALL <function> <numkeys> <keys…> <now> <max_skew> <layer args…> [mode]`
/// (`EVALSHA <sha> …` the same way).
pub(crate) struct ScriptCall(redis::Cmd);

impl ScriptCall {
    /// A call over `keys` (rendered Redis keys, one per layer) at `time`.
    pub(crate) fn new<K: redis::ToRedisArgs>(
        style: Style,
        keys: impl ExactSizeIterator<Item = K>,
        time: &TimeArgs,
    ) -> Self {
        let mut cmd = match style {
            Style::Module => redis::cmd("TOLLGATE.DECIDE"),
            Style::Fcall => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(function_name());
                cmd
            }
            Style::Evalsha => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha1());
                cmd
            }
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(key);
        }
        match time.now {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        match (time.now, time.max_skew) {
            (Some(_), Some(skew)) => cmd.arg(skew),
            _ => cmd.arg(""),
        };
        ScriptCall(cmd)
    }

    /// The next layer's arguments, in key order.
    pub(crate) fn layer(mut self, args: &[u64]) -> Self {
        for a in args {
            self.0.arg(*a);
        }
        self
    }

    /// The command, asking for `mode`.
    pub(crate) fn mode(self, mode: Mode) -> redis::Cmd {
        let ScriptCall(mut cmd) = self;
        if let Some(word) = mode.word() {
            cmd.arg(word);
        }
        cmd
    }
}

impl Mode {
    /// The call's last argument (none to decide).
    fn word(self) -> Option<&'static str> {
        match self {
            Mode::Decide => None,
            #[cfg(feature = "cluster")]
            Mode::Reserve => Some("reserve"),
            Mode::Peek => Some("peek"),
            Mode::Reset => Some("reset"),
            #[cfg(feature = "cluster")]
            Mode::Refund => Some("refund"),
            Mode::Penalize => Some("penalize"),
            Mode::Reward => Some("reward"),
            Mode::Block(_) => Some("block"),
        }
    }
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
    match limit.args() {
        Some((code, [p1, p2, p3])) => Ok([code.into(), cost, p1, p2, p3]),
        None => Err(StoreError::Unsupported(limit.algorithm_name())),
    }
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

    const LAYERED: &str = include_str!("../lua/layered.lua");

    #[test]
    fn the_digest_is_the_scripts() {
        assert_eq!(sha1().len(), 40);
        assert!(
            eval_script().contains(LAYERED)
                && ALGORITHM_FILES.iter().all(|f| eval_script().contains(f))
        );
        assert!(eval_script().ends_with("return decide(KEYS, ARGV)\n"));
    }

    /// The library is the script's code under a name made from it, and
    /// registers the function the calls name.
    #[test]
    fn the_library_holds_the_same_code() {
        let library = function_library();
        assert!(library.starts_with(&format!("#!lua name={}\n", library_name())));
        assert!(library.contains(body()) && eval_script().starts_with(body()));
        assert!(library.contains(&format!("register_function('{}', decide)", function_name())));
        assert_eq!(library_name().len(), "tollgate_".len() + 16);
        assert!(library_name()
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    }

    /// The generated line defining the Lua table `name`.
    fn table(name: &str) -> &'static str {
        let start = format!("local {name} = {{");
        body().lines().find(|l| l.starts_with(&start)).expect(name)
    }

    /// Every algorithm's code and functions reach the Lua under its code,
    /// and each file defines the functions its table entries name.
    #[test]
    fn the_lua_finds_every_algorithm_by_its_code() {
        for (b, file) in Builtin::all().iter().zip(ALGORITHM_FILES) {
            let code = format!("local {} = {}\n", b.name.to_uppercase(), b.code);
            assert!(body().contains(&code), "{code}");
            assert!(table("ALGORITHMS").contains(&format!(" [{}] = {},", b.code, b.name)));
            let mut functions = vec![b.name.to_string(), format!("refund_{}", b.name)];
            if let Layout::Cells { cells, time_cell } = b.layout {
                functions.push(format!("reward_{}", b.name));
                functions.push(format!("charge_{}", b.name));
                let entry = |value: String| format!(" [{}] = {value},", b.code);
                assert!(table("CELLS").contains(&entry(cells.to_string())));
                assert!(table("TIME_CELL").contains(&entry((time_cell + 1).to_string())));
                for f in ["refund", "reward", "charge"] {
                    let t = table(&format!("{}S", f.to_uppercase()));
                    assert!(
                        t.contains(&entry(format!("{f}_{}", b.name))),
                        "{f}_{}",
                        b.name
                    );
                }
            }
            for f in functions {
                assert!(file.contains(&format!("local function {f}(")), "{f}");
            }
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
