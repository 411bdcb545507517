//! `cargo xtask valkey`: the Redis suites that matter most for another
//! server — the conformance suite, the differential (script, functions,
//! module) and the module's tests, failover and AOF included — run
//! against Valkey instead of Redis (`TOLLGATE_REDIS_SERVER` names the
//! binary the testkit starts). The differential's sequences are shorter
//! there (2,500 operations, not 10,000): see [`DIFFERENTIAL_OPS`].
//!
//! Valkey is built once from its source release, with `make`, in the
//! user's cache (`$XDG_CACHE_HOME` or `~/.cache`, `tollgate/valkey-<version>`),
//! and reused. The source is the release tarball named by
//! `TOLLGATE_VALKEY_SOURCE`, or a `shared/vendor/valkey-<version>.tar.gz`
//! beside a directory above the repository (where the development machine
//! keeps its vendored sources). `TOLLGATE_VALKEY_SERVER` names a built
//! `valkey-server` instead.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{root, run, workspace_tests, Result};

/// The Valkey release the suites run against.
pub const VERSION: &str = "8.0.1";

/// The modules of `tollgate-redis`'s test binary run against Valkey (test
/// names are filtered by substring: `cluster::conformance::…` would match,
/// hence [`SKIPPED`]).
const SUITES: &[&str] = &["conformance::", "differential::", "module::"];

/// The modules left out, which [`SUITES`]' filters would otherwise pick:
/// the Cluster, Sentinel and TLS suites each hold a conformance submodule
/// (this run is standalone Valkey, and Valkey is built without TLS).
const SKIPPED: &[&str] = &["cluster::", "sentinel::", "tls::"];

/// Operations per differential sequence on Valkey: a quarter of the
/// Redis run's 10,000. What this run looks for is where the server
/// differs (its clock inside a transaction, its replies, its module API),
/// which shows in the first steps of a sequence; the algorithms' long
/// sequences against the reference are the Redis run's, and the same Lua
/// and module decide on both servers.
const DIFFERENTIAL_OPS: &str = "2500";

/// The source tarball: `TOLLGATE_VALKEY_SOURCE`, or the vendored one in a
/// `shared/vendor/` beside the repository or a directory above it.
fn source() -> Option<PathBuf> {
    if let Some(path) = env::var_os("TOLLGATE_VALKEY_SOURCE") {
        return Some(PathBuf::from(path));
    }
    let name = format!("shared/vendor/valkey-{VERSION}.tar.gz");
    // Above this checkout, or above the one it was cloned from (a fresh
    // clone elsewhere, as CI makes).
    let mut tops = vec![root()];
    tops.extend(origin());
    tops.iter()
        .flat_map(|top| top.ancestors())
        .map(|dir| dir.join(&name))
        .find(|candidate| candidate.is_file())
}

/// The local repository this checkout was cloned from, if it was.
fn origin() -> Option<PathBuf> {
    let out = Command::new("git")
        .args(["remote", "get-url", "origin"])
        .current_dir(root())
        .output()
        .ok()?;
    let url = String::from_utf8(out.stdout).ok()?;
    let path = PathBuf::from(url.trim().trim_start_matches("file://"));
    path.is_dir().then_some(path)
}

/// A `valkey-server` binary: `TOLLGATE_VALKEY_SERVER`, the cached build,
/// or one built now from the source release.
fn server() -> std::result::Result<PathBuf, String> {
    if let Some(path) = env::var_os("TOLLGATE_VALKEY_SERVER") {
        return Ok(PathBuf::from(path));
    }
    // Unpacked and built there, in the release's own `valkey-<version>/`.
    let dir = crate::tool_cache().ok_or("neither XDG_CACHE_HOME nor HOME is set")?;
    let binary = dir.join(format!("valkey-{VERSION}/src/valkey-server"));
    if binary.is_file() {
        return Ok(binary);
    }
    let tarball = source().ok_or_else(|| {
        format!(
            "no Valkey {VERSION}: set TOLLGATE_VALKEY_SOURCE to its source release \
             (valkey-{VERSION}.tar.gz), or TOLLGATE_VALKEY_SERVER to a built valkey-server"
        )
    })?;
    build(&tarball, &dir)?;
    Ok(binary)
}

/// Unpack `tarball` into `dir` and build the server there (about three
/// minutes on two cores; without TLS, which needs libssl-dev).
fn build(tarball: &Path, dir: &Path) -> Result {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    run(
        &format!("unpack {}", tarball.display()),
        Command::new("tar").arg("xzf").arg(tarball).current_dir(dir),
    )?;
    run(
        &format!("build Valkey {VERSION} (make, once)"),
        Command::new("make")
            .args(["-j2", "BUILD_TLS=no"])
            .current_dir(dir.join(format!("valkey-{VERSION}"))),
    )
}

pub fn valkey() -> Result {
    let server = server()?;
    let mut cmd = workspace_tests();
    cmd.args(["--test", "redis", "--"]).args(SUITES);
    for skipped in SKIPPED {
        cmd.args(["--skip", skipped]);
    }
    cmd.env("TOLLGATE_REDIS_SERVER", &server)
        .env("TOLLGATE_DIFFERENTIAL_OPS", DIFFERENTIAL_OPS);
    run(
        &format!(
            "the Redis suites against Valkey {VERSION} ({})",
            SUITES.join(", ")
        ),
        &mut cmd,
    )
}
