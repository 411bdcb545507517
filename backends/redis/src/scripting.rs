//! How a store runs its Lua code on the server: as a function library
//! (`FCALL`, Redis 7.0 and later) or as a script (`EVALSHA`), chosen by
//! [`Scripting`] and, in the default [`Scripting::Auto`], by what the
//! server answers; and loading the code where a server lost it.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind};

use crate::script::{function_library, library_name, sha1, SCRIPT};

/// How a store runs its Lua code; see
/// [`RedisStoreBuilder::scripting`](crate::RedisStoreBuilder::scripting).
///
/// Both ways run the same code and decide alike. A function library is
/// defined once per load, so each call skips re-creating the code's
/// helpers and tables: it costs Redis less CPU per decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Scripting {
    /// A function library where the server has Redis Functions (Redis 7.0
    /// and later), `EVALSHA` of the script otherwise: the store finds out
    /// when it connects (or at its first call), from the server's answer to
    /// `FUNCTION LOAD`. The default.
    #[default]
    Auto,
    /// A function library only: a server without Redis Functions fails
    /// the connection (and every decision) with
    /// [`RedisStoreError::NoFunctions`](crate::RedisStoreError::NoFunctions).
    Functions,
    /// `EVALSHA` of the script only, as on Redis 6.2 (for a user allowed
    /// `EVALSHA` and `SCRIPT LOAD` but not `FCALL` and `FUNCTION LOAD`).
    Eval,
}

/// The command a call is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// `FCALL` of the library's function.
    Fcall,
    /// `EVALSHA` of the script.
    Evalsha,
}

/// What a store knows of how to call its server, shared by its clones.
#[derive(Debug)]
pub(crate) struct Runner {
    scripting: Scripting,
    /// Set once an `Auto` store found that its server has no functions.
    fell_back: AtomicBool,
}

impl Runner {
    pub(crate) fn new(scripting: Scripting) -> Self {
        Runner {
            scripting,
            fell_back: AtomicBool::new(false),
        }
    }

    /// How to send the next call.
    pub(crate) fn style(&self) -> Style {
        match self.scripting {
            Scripting::Eval => Style::Evalsha,
            Scripting::Functions => Style::Fcall,
            Scripting::Auto if self.fell_back.load(Ordering::Relaxed) => Style::Evalsha,
            Scripting::Auto => Style::Fcall,
        }
    }

    /// After the server said it has no functions: whether to go on with
    /// `EVALSHA` (only `Auto` does; from then on every call is `EVALSHA`).
    fn fall_back(&self) -> bool {
        if self.scripting == Scripting::Auto {
            self.fell_back.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The load command for `style`: `FUNCTION LOAD REPLACE <library>` or
    /// `SCRIPT LOAD <script>`.
    pub(crate) fn load_command(style: Style) -> Cmd {
        match style {
            Style::Fcall => {
                let mut cmd = redis::cmd("FUNCTION");
                cmd.arg("LOAD").arg("REPLACE").arg(function_library());
                cmd
            }
            Style::Evalsha => {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(SCRIPT);
                cmd
            }
        }
    }

    /// Load the code on the server of `con` the way calls will run it
    /// (falling back to the script when an `Auto` store's server has no
    /// functions), checking what the server answered.
    pub(crate) async fn load<C: ConnectionLike + Send>(&self, con: &mut C) -> RedisResult<()> {
        loop {
            let style = self.style();
            match Self::load_command(style).query_async::<String>(con).await {
                Ok(answer) => return check_load(style, &answer),
                Err(e) => self.fall_back_on(style, e)?,
            }
        }
    }

    /// After a load command or a call sent as `style` failed with `e`:
    /// `Ok` to go on with the script (an `Auto` store whose server has no
    /// functions just fell back to it), or the error to report. Every
    /// store's fallback goes through here.
    pub(crate) fn fall_back_on(&self, style: Style, e: RedisError) -> RedisResult<()> {
        if style == Style::Fcall && is_unknown_command(&e) {
            return if self.fall_back() {
                Ok(())
            } else {
                Err(no_functions())
            };
        }
        Err(e)
    }

    /// Send `cmd`, a call built as `style`; when the server lost the code
    /// (restart, failover, `FUNCTION FLUSH`, `SCRIPT FLUSH`) or has no
    /// functions, load it and send the call once more (as `rebuild` makes
    /// it, if the store fell back to the script meanwhile).
    pub(crate) async fn call<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        cmd: &Cmd,
        style: Style,
        rebuild: impl FnOnce(Style) -> Cmd,
    ) -> RedisResult<Vec<i64>> {
        match cmd.query_async::<Vec<i64>>(con).await {
            Err(e) if needs_load(&e, style) => {
                self.load(con).await?;
                match self.style() {
                    now if now == style => cmd.query_async(con).await,
                    now => rebuild(now).query_async(con).await,
                }
            }
            other => other,
        }
    }
}

/// Whether `answer` to the load command of `style` names the store's code:
/// the library's name (`FUNCTION LOAD`) or the script's SHA-1 (`SCRIPT
/// LOAD`).
pub(crate) fn check_load(style: Style, answer: &str) -> RedisResult<()> {
    let (expected, mismatch) = match style {
        Style::Fcall => (
            library_name(),
            "FUNCTION LOAD answered another library name than the library's",
        ),
        Style::Evalsha => (
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
pub(crate) fn needs_load(e: &RedisError, style: Style) -> bool {
    match style {
        Style::Evalsha => e.kind() == ErrorKind::Server(ServerErrorKind::NoScript),
        Style::Fcall => is_missing_function(e) || is_unknown_command(e),
    }
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

    #[test]
    fn a_load_is_checked_against_the_code_it_loads() {
        assert!(check_load(Style::Evalsha, sha1()).is_ok());
        assert!(check_load(Style::Evalsha, &"0".repeat(40)).is_err());
        assert!(check_load(Style::Fcall, library_name()).is_ok());
        assert!(check_load(Style::Fcall, "tollgate_0").is_err());
        // A digest is not a library name, nor the other way round.
        assert!(check_load(Style::Fcall, sha1()).is_err());
        assert!(check_load(Style::Evalsha, library_name()).is_err());
    }
}
