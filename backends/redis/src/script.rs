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

use tollgate_limiter::{Builtin, Clock, LayerRequest, Layout, StoreError, SystemClock, Timestamp};
use tollgate_redis_protocol::algorithm_code;
pub use tollgate_redis_protocol::{parse_reply, Mode, LAYER_ARGS};

use crate::engine::CallCommand;
use crate::error::RedisStoreError;

/// Every built-in algorithm's Lua file, from the list of built-ins.
macro_rules! algorithm_files {
    ($( $(#[$doc:meta])* $variant:ident($module:ident, $spec:ident), )*) => {
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
        body.push('\n');
        body.push_str(&tollgate_redis_protocol::lua_constants());
        body.push_str(
            "\n-- The algorithms' codes (src/script.rs, from tollgate-redis-protocol).\n",
        );
        for b in Builtin::all() {
            let _ = writeln!(
                body,
                "local {} = {}",
                b.name.to_uppercase(),
                algorithm_code(b)
            );
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
                Layout::Log | Layout::LogText => None,
            })
            .collect();
        lua_table(
            &mut body,
            "ALGORITHMS",
            all.iter().map(|b| (algorithm_code(b), b.name.to_string())),
        );
        for function in ["refund", "reward", "charge"] {
            let name = format!("{}S", function.to_uppercase());
            let entries = counters
                .iter()
                .map(|(b, _, _)| (algorithm_code(b), format!("{function}_{}", b.name)));
            lua_table(&mut body, &name, entries);
        }
        lua_table(
            &mut body,
            "CELLS",
            counters
                .iter()
                .map(|(b, cells, _)| (algorithm_code(b), cells.to_string())),
        );
        // From 1, as Lua counts.
        let time_cells = counters
            .iter()
            .map(|(b, _, time)| (algorithm_code(b), (time + 1).to_string()));
        lua_table(&mut body, "TIME_CELL", time_cells);
        let logs = all.iter().filter(|b| b.layout.is_log());
        lua_table(
            &mut body,
            "LOGS",
            logs.map(|b| (algorithm_code(b), "true".into())),
        );
        let texts = all.iter().filter(|b| b.layout == Layout::LogText);
        lua_table(
            &mut body,
            "TEXT_LOGS",
            texts.map(|b| (algorithm_code(b), "true".into())),
        );
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
/// [`Engine::Eval`](crate::Engine::Eval)): the code, then a call of
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

impl TimeArgs {
    /// The instant calendar quotas take their span at: the caller's time,
    /// or this machine's clock when the server's `TIME` decides (the span
    /// is then off at a boundary by at most the two clocks' skew; a state
    /// holding a later span wins, see `lua/calendar.lua`).
    pub(crate) fn spans_at(&self) -> Timestamp {
        self.now
            .map_or_else(|| SystemClock.now(), Timestamp::from_micros)
    }
}

/// Room for a rendered key in a call's buffer (a key longer than this
/// makes the buffer grow once).
const KEY_BYTES: usize = 96;

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
        style: CallCommand,
        keys: impl ExactSizeIterator<Item = K>,
        time: &TimeArgs,
    ) -> Self {
        // Sized for the whole call up front: a command grown argument by
        // argument reallocates about ten times, and on a multi-threaded
        // runtime those reallocations contend for the allocator's lock.
        let layers = keys.len();
        let mut cmd = redis::Cmd::with_capacity(
            6 + layers * (LAYER_ARGS + 4),
            96 + layers * (KEY_BYTES + LAYER_ARGS * 20),
        );
        match style {
            CallCommand::Module => cmd.arg("TOLLGATE.DECIDE"),
            CallCommand::Fcall => cmd.arg("FCALL").arg(function_name()),
            CallCommand::Evalsha => cmd.arg("EVALSHA").arg(sha1()),
        };
        cmd.arg(layers);
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

/// One layer's arguments for a decision at `now`
/// ([`tollgate_redis_protocol::layer_args`]).
///
/// Fails with [`StoreError::Unsupported`] for a custom algorithm (the script
/// runs only the built-ins) and rejects a cost outside `1..=capacity`.
pub fn layer_args(
    layer: &LayerRequest<'_>,
    now: Timestamp,
) -> Result<[u64; LAYER_ARGS], StoreError> {
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
    tollgate_redis_protocol::layer_args(limit, cost, now)
        .ok_or(StoreError::Unsupported(limit.algorithm_name()))
}

/// A layer's arguments as `block` sends them: a block's length (µs) in
/// the cost's place.
pub(crate) fn with_block(mut args: [u64; LAYER_ARGS], block: Option<u64>) -> [u64; LAYER_ARGS] {
    if let Some(us) = block {
        args[1] = us;
    }
    args
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
        assert!(
            body().contains(&tollgate_redis_protocol::lua_constants()),
            "the constants shared with the module"
        );
        // Defined there only: no Lua file has a copy of its own.
        for line in tollgate_redis_protocol::lua_constants().lines().skip(1) {
            let name = line.split(" = ").next().unwrap();
            assert_eq!(body().matches(&format!("{name} =")).count(), 1, "{name}");
        }
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
            let code = format!("local {} = {}\n", b.name.to_uppercase(), algorithm_code(b));
            assert!(body().contains(&code), "{code}");
            assert!(table("ALGORITHMS").contains(&format!(
                " [{}] = {},",
                algorithm_code(b),
                b.name
            )));
            let mut functions = vec![b.name.to_string()];
            if b.layout.is_log() {
                // A list's refund is the log's LREM (`refund_sliding_log`),
                // a text's layered.lua's own cut.
                assert!(table("LOGS").contains(&format!(" [{}] = true,", algorithm_code(b))));
                let text =
                    table("TEXT_LOGS").contains(&format!(" [{}] = true,", algorithm_code(b)));
                assert_eq!(text, b.layout == Layout::LogText, "{}", b.name);
            }
            if let Layout::Cells { cells, time_cell } = b.layout {
                functions.push(format!("refund_{}", b.name));
                functions.push(format!("reward_{}", b.name));
                functions.push(format!("charge_{}", b.name));
                let entry = |value: String| format!(" [{}] = {value},", algorithm_code(b));
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
                // A function of its own, or another's under its name.
                let defined = file.contains(&format!("local function {f}("))
                    || file.contains(&format!("local {f} = "));
                assert!(defined, "{f}");
            }
        }
    }
}
