//! How a store has the server decide: with Tollgate's native module
//! (`TOLLGATE.DECIDE`, where the server loaded it), as a function library
//! (`FCALL`, Redis 7.0 and later) or as a script (`EVALSHA`), chosen by
//! [`Engine`] and, in the default [`Engine::Auto`], by what the
//! server answers; and loading the code where a server lost it.

use std::sync::atomic::{AtomicU8, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind};

use crate::script::{eval_script, function_library, library_name, sha1};

/// How a store has the server decide; see
/// [`RedisStoreBuilder::engine`](crate::RedisStoreBuilder::engine).
///
/// Every way decides alike: the module runs the reference algorithms the
/// Lua code is held to bit for bit, with the same arguments, replies,
/// encodings and keys (docs/redis-module.md). The module costs Redis the
/// least CPU per decision; a function library is defined once per load, so
/// each call skips re-creating the code's helpers and tables: it costs
/// Redis less than the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
#[non_exhaustive]
pub enum Engine {
    /// The fastest way the server offers: Tollgate's module where the
    /// server loaded it (and it speaks this store's protocol), else a
    /// function library where the server has Redis Functions (Redis 7.0
    /// and later), else `EVALSHA` of the script. The store finds out when
    /// it connects (or at its first call) and again whenever the server
    /// lost what it used (a restart, a failover, `FUNCTION FLUSH`, a
    /// module unloaded). The default.
    #[default]
    Auto,
    /// Tollgate's module only: a server without it (or with a module of
    /// another protocol) fails the connection and every decision with
    /// [`RedisStoreError::NoModule`](crate::RedisStoreError::NoModule).
    Module,
    /// A function library only: a server without Redis Functions fails
    /// the connection (and every decision) with
    /// [`RedisStoreError::NoFunctions`](crate::RedisStoreError::NoFunctions).
    Functions,
    /// `EVALSHA` of the script only, as on Redis 6.2 (for a user allowed
    /// `EVALSHA` and `SCRIPT LOAD` but not `FCALL` and `FUNCTION LOAD`).
    Eval,
    /// The function library, loaded beforehand by an administrator
    /// (`cargo run -p tollgate-redis --example function-library` prints
    /// it; see docs/operations.md): the store sends `FCALL` only and never
    /// `FUNCTION LOAD`, so its Redis user needs `+fcall` and cannot replace
    /// any library (`FUNCTION LOAD REPLACE` of another application's
    /// code, which an ACL cannot limit to Tollgate's). A server without
    /// this release's library — a new server, a `FUNCTION FLUSH`, an
    /// upgrade — fails the connection and every decision with
    /// [`RedisStoreError::LibraryNotLoaded`](crate::RedisStoreError::LibraryNotLoaded)
    /// until an administrator loads it; the store never falls back to a
    /// way that needs more.
    PreloadedFunctions,
}

/// The command a call is sent as, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CallCommand {
    /// `TOLLGATE.DECIDE`, the module's command.
    Module = 0,
    /// `FCALL` of the library's function.
    Fcall = 1,
    /// `EVALSHA` of the script.
    Evalsha = 2,
}

impl CallCommand {
    fn from_u8(n: u8) -> CallCommand {
        match n {
            0 => CallCommand::Module,
            1 => CallCommand::Fcall,
            _ => CallCommand::Evalsha,
        }
    }
}

/// The module's calling convention this store speaks: it sends
/// `TOLLGATE.DECIDE` only to a module answering this to
/// `TOLLGATE.PROTOCOL` (both take it from `tollgate-redis-protocol`).
pub const MODULE_PROTOCOL: i64 = tollgate_redis_protocol::PROTOCOL;

/// Loads a call may need in a row before its error is reported (see
/// [`Runner::call`]).
const LOADS: usize = 3;

/// What a store knows of how to call its server, shared by its clones.
#[derive(Debug)]
pub(crate) struct Runner {
    engine: Engine,
    /// An `Auto` store's current way ([`CallCommand`] as a number): the module
    /// until the server shows it has none, then functions, then the
    /// script. Every load looks again from the module and publishes what
    /// it found ([`settle`](Self::settle)).
    auto: AtomicU8,
}

impl Runner {
    pub(crate) fn new(engine: Engine) -> Self {
        Runner {
            engine,
            auto: AtomicU8::new(CallCommand::Module as u8),
        }
    }

    /// How to send the next call.
    pub(crate) fn call_command(&self) -> CallCommand {
        match self.engine {
            Engine::Eval => CallCommand::Evalsha,
            Engine::Functions | Engine::PreloadedFunctions => CallCommand::Fcall,
            Engine::Module => CallCommand::Module,
            Engine::Auto => CallCommand::from_u8(self.auto.load(Ordering::Relaxed)),
        }
    }

    /// The way a load tries first: the module for an `Auto` store (every
    /// load looks again), else the store's own.
    pub(crate) fn first_call_command(&self) -> CallCommand {
        match self.engine {
            Engine::Auto => CallCommand::Module,
            _ => self.call_command(),
        }
    }

    /// Send calls as `style` from now on: what an `Auto` store's load
    /// found. Only a finished load publishes its way, so calls sent while
    /// another task loads never see the ways it tries on the way down.
    pub(crate) fn settle(&self, style: CallCommand) {
        if self.engine == Engine::Auto {
            self.auto.store(style as u8, Ordering::Relaxed);
        }
    }

    /// The load command for `style`: `TOLLGATE.PROTOCOL` (the module is
    /// loaded by the server's operator: this asks which one it is),
    /// `FUNCTION LOAD REPLACE <library>` or `SCRIPT LOAD <script>`.
    pub(crate) fn load_command(style: CallCommand) -> Cmd {
        match style {
            CallCommand::Module => redis::cmd("TOLLGATE.PROTOCOL"),
            CallCommand::Fcall => {
                let mut cmd = redis::cmd("FUNCTION");
                cmd.arg("LOAD").arg("REPLACE").arg(function_library());
                cmd
            }
            CallCommand::Evalsha => {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(eval_script());
                cmd
            }
        }
    }

    /// Find the fastest way the server of `con` offers and load the code
    /// there the way calls will run it (an `Auto` store starts from the
    /// module and falls back to functions, then the script), checking what
    /// the server answered; the way found.
    pub(crate) async fn load<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
    ) -> RedisResult<CallCommand> {
        if self.preloaded() {
            return Self::preloaded_check()
                .query_async::<redis::Value>(con)
                .await
                .map(|_| CallCommand::Fcall)
                .map_err(Self::preloaded_error);
        }
        let mut style = self.first_call_command();
        loop {
            let answer = Self::load_command(style).query_async::<String>(con).await;
            match answer.and_then(|a| check_load(style, &a)) {
                Ok(()) => {
                    self.settle(style);
                    return Ok(style);
                }
                Err(e) => style = self.next_style(style, e)?,
            }
        }
    }

    /// Whether an administrator loads the library (the store never does).
    pub(crate) fn preloaded(&self) -> bool {
        self.engine == Engine::PreloadedFunctions
    }

    /// What a preloaded store sends instead of a load: a call of no layers
    /// (it reads the server's time and decides nothing), which finds the
    /// function or not.
    pub(crate) fn preloaded_check() -> Cmd {
        let keyless: [&str; 0] = [];
        crate::script::ScriptCall::new(CallCommand::Fcall, keyless.iter(), &Default::default())
            .mode(crate::script::Mode::Decide)
    }

    /// The answer to [`preloaded_check`](Self::preloaded_check) failing
    /// with `e`: the library missing, no functions at all, or `e` itself.
    pub(crate) fn preloaded_error(e: RedisError) -> RedisError {
        if is_missing_function(&e) {
            not_loaded()
        } else if is_unknown(&e, "fcall") {
            no_functions()
        } else {
            e
        }
    }

    /// After a load command or a call sent as `style` failed with `e`: the
    /// next way to try (an `Auto` store whose server has no module, or no
    /// functions), or the error to report. Changes nothing shared; every
    /// store's fallback goes through here.
    pub(crate) fn next_style(&self, style: CallCommand, e: RedisError) -> RedisResult<CallCommand> {
        let lacks = match style {
            // No module, a module of another protocol, or a user not
            // allowed its commands: the next way may do.
            CallCommand::Module => {
                is_unknown_command(&e)
                    || is_other_protocol(&e)
                    || e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
            }
            // `FCALL` or the load, `FUNCTION LOAD`, refused as unknown.
            CallCommand::Fcall => is_unknown(&e, "fcall") || is_unknown(&e, "function"),
            CallCommand::Evalsha => false,
        };
        if !lacks {
            return Err(e);
        }
        if self.engine == Engine::Auto && style != CallCommand::Evalsha {
            return Ok(CallCommand::from_u8(style as u8 + 1));
        }
        Err(match style {
            CallCommand::Module if is_unknown_command(&e) || is_other_protocol(&e) => no_module(&e),
            CallCommand::Module => e,
            _ => no_functions(),
        })
    }

    /// A call sent as `style` failed with `e`: `Ok` when the store goes on
    /// with the next way from now on (see [`next_style`](Self::next_style)),
    /// or the error to report.
    #[cfg(feature = "cluster")]
    pub(crate) fn fall_back_on(&self, style: CallCommand, e: RedisError) -> RedisResult<()> {
        let next = self.next_style(style, e)?;
        // Never back up: a concurrent load may have settled further down.
        self.auto.fetch_max(next as u8, Ordering::Relaxed);
        Ok(())
    }

    /// Send `cmd`, a call built as `style`; when the server lost the code
    /// (restart, failover, `FUNCTION FLUSH`, `SCRIPT FLUSH`, `MODULE
    /// UNLOAD`) or has no functions, load it and send the call again (as
    /// `rebuild` makes it, if the store changed its way meanwhile). Up to
    /// [`LOADS`] times in a row: code flushed again while a call was
    /// reloaded and resent gets another load, never an endless one. A
    /// resend is safe: every error that asks for a load means the call
    /// did not run.
    pub(crate) async fn call<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        cmd: &Cmd,
        style: CallCommand,
        rebuild: impl Fn(CallCommand) -> Cmd,
    ) -> RedisResult<Vec<i64>> {
        let mut sent = style;
        let mut result = cmd.query_async::<Vec<i64>>(con).await;
        for _ in 0..LOADS {
            match &result {
                Err(e) if needs_load(e, sent) => {}
                _ => break,
            }
            // Resent the way this load checked (another task's load may
            // settle the shared way differently meanwhile).
            sent = self.load(con).await?;
            result = if sent == style {
                cmd.query_async(con).await
            } else {
                rebuild(sent).query_async(con).await
            };
        }
        result
    }
}

/// Whether `answer` to the load command of `style` names the store's code:
/// the module's protocol (`TOLLGATE.PROTOCOL`), the library's name
/// (`FUNCTION LOAD`) or the script's SHA-1 (`SCRIPT LOAD`).
pub(crate) fn check_load(style: CallCommand, answer: &str) -> RedisResult<()> {
    let protocol = MODULE_PROTOCOL.to_string();
    let (expected, mismatch) = match style {
        CallCommand::Module => (protocol.as_str(), OTHER_PROTOCOL),
        CallCommand::Fcall => (
            library_name(),
            "FUNCTION LOAD answered another library name than the library's",
        ),
        CallCommand::Evalsha => (
            sha1(),
            "SCRIPT LOAD answered another digest than the script's SHA-1",
        ),
    };
    if answer != expected {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            mismatch,
            answer.to_string(),
        )));
    }
    Ok(())
}

/// Whether `e`, the answer to a call of `style`, says the server lacks the
/// code (and a load may fix it).
pub(crate) fn needs_load(e: &RedisError, style: CallCommand) -> bool {
    match style {
        CallCommand::Module => is_module_missing(e),
        CallCommand::Evalsha => e.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
        CallCommand::Fcall => is_missing_function(e) || is_unknown(e, "fcall"),
    }
}

/// What a module answering another protocol is told apart by.
const OTHER_PROTOCOL: &str = "TOLLGATE.PROTOCOL answered another protocol than the store's";

/// Whether `e` says the server's module speaks another protocol.
fn is_other_protocol(e: &RedisError) -> bool {
    e.kind() == ErrorKind::UnexpectedReturnType && e.to_string().contains(OTHER_PROTOCOL)
}

/// The detail of [`no_module`], by which `from_redis` knows it.
pub(crate) const NO_MODULE: &str = "the server has no Tollgate module of this store's protocol";

/// The error of a `Module` store whose server lacks the module, naming
/// only the code of the server's answer: its text may repeat the call's
/// arguments, keys included (`unknown command …, with args beginning
/// with: …`).
pub(crate) fn no_module(e: &RedisError) -> RedisError {
    let answered = e.code().unwrap_or("no error code");
    RedisError::from((
        ErrorKind::Client,
        "Tollgate's Redis module required",
        format!("{NO_MODULE} (the server answered {answered})"),
    ))
}

/// `ERR Function not found`: the server has functions but not this one.
pub(crate) fn is_missing_function(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// `ERR unknown command`: the server has no `FCALL` / `FUNCTION` (before
/// Redis 7.0).
pub(crate) fn is_unknown_command(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && e.detail()
            .is_some_and(|d| d.to_ascii_lowercase().starts_with("unknown command"))
}

/// Whether `e`, the answer to a module call, says the server has no
/// `TOLLGATE.DECIDE`. Only that command's name counts: an "unknown
/// command" naming another one (say, a `RPUSH` an operator renamed away)
/// comes from inside a call that may have written, and must never make it
/// be sent again.
pub(crate) fn is_module_missing(e: &RedisError) -> bool {
    is_unknown(e, "tollgate.decide")
}

/// `ERR unknown command '<name>'…` (before Redis 7.0, `` `<name>` ``):
/// the server has no command `name`, and refused the call before running
/// anything. Only the call's own command counts: an "unknown command" met
/// inside a call that may have written (a command an operator renamed
/// away; Valkey words it `Unknown command called from script`) must never
/// make the call be sent again.
pub(crate) fn is_unknown(e: &RedisError, name: &str) -> bool {
    is_unknown_command(e)
        && e.detail().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            let Some(quoted) = d.strip_prefix("unknown command ") else {
                return false;
            };
            ['\'', '`'].into_iter().any(|quote| {
                quoted
                    .strip_prefix(quote)
                    .and_then(|rest| rest.strip_prefix(name))
                    .is_some_and(|rest| rest.starts_with(quote))
            })
        })
}

/// The detail of [`not_loaded`], by which `from_redis` knows it.
pub(crate) const NOT_LOADED: &str = "the administrator-loaded function library is missing";

/// The error of a preloaded store whose server lacks the library (as a
/// Redis client error, so it travels the call's path; the store reports
/// it as [`RedisStoreError::LibraryNotLoaded`](crate::RedisStoreError::LibraryNotLoaded)).
pub(crate) fn not_loaded() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "Tollgate's function library not loaded",
        NOT_LOADED.to_string(),
    ))
}

/// The detail of [`no_functions`], by which `from_redis` knows it.
pub(crate) const NO_FUNCTIONS: &str = "the server has no FUNCTION/FCALL";

/// The error of a `Functions` store whose server has none (as a Redis
/// client error, so it travels the call's path; the store reports it as
/// [`RedisStoreError::NoFunctions`](crate::RedisStoreError::NoFunctions)).
pub(crate) fn no_functions() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "Redis Functions required",
        NO_FUNCTIONS.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::error::tests::server_error;

    /// Only an unknown `FCALL` itself asks for the library (and an unknown
    /// `TOLLGATE.DECIDE` for the module): an unknown command met inside a
    /// call that may have written (Valkey's words) is reported, never
    /// answered by a load and the call sent again (a double charge).
    #[test]
    fn only_the_calls_own_unknown_command_asks_for_a_load() {
        let fcall =
            server_error("ERR unknown command 'FCALL', with args beginning with: 'tollgate' ");
        let inside = server_error(
            "ERR Unknown command called from script script: 1f2e, on @user_script:12.",
        );
        let module =
            server_error("ERR unknown command 'TOLLGATE.DECIDE', with args beginning with: ");
        assert!(needs_load(&fcall, CallCommand::Fcall));
        assert!(!needs_load(&inside, CallCommand::Fcall));
        assert!(!needs_load(&module, CallCommand::Fcall));
        assert!(needs_load(&module, CallCommand::Module));
        assert!(!needs_load(&inside, CallCommand::Module));
        assert!(!needs_load(&fcall, CallCommand::Module));
        let runner = Runner::new(Engine::Auto);
        assert!(runner.next_style(CallCommand::Fcall, fcall).is_ok());
        assert!(runner.next_style(CallCommand::Fcall, inside).is_err());
    }

    /// Redis before 7.0 quotes an unknown command in backticks: the
    /// automatic engine still moves on from the module to functions, and
    /// from functions to the script (it failed the connection there).
    #[test]
    fn an_unknown_command_in_backticks_is_unknown() {
        let function = server_error(
            "ERR unknown command `FUNCTION`, with args beginning with: `LOAD`, `REPLACE`, ",
        );
        let module =
            server_error("ERR unknown command `TOLLGATE.DECIDE`, with args beginning with: ");
        assert!(needs_load(&module, CallCommand::Module));
        let runner = Runner::new(Engine::Auto);
        assert!(matches!(
            runner.next_style(CallCommand::Fcall, function),
            Ok(CallCommand::Evalsha)
        ));
        let mixed = server_error("ERR unknown command 'FUNCTION`, with args beginning with: ");
        assert!(!is_unknown(&mixed, "function"));
    }

    #[test]
    fn a_load_is_checked_against_the_code_it_loads() {
        assert!(check_load(CallCommand::Evalsha, sha1()).is_ok());
        assert!(check_load(CallCommand::Evalsha, &"0".repeat(40)).is_err());
        assert!(check_load(CallCommand::Fcall, library_name()).is_ok());
        assert!(check_load(CallCommand::Fcall, "tollgate_0").is_err());
        // A digest is not a library name, nor the other way round.
        assert!(check_load(CallCommand::Fcall, sha1()).is_err());
        assert!(check_load(CallCommand::Evalsha, library_name()).is_err());
    }
}
