//! Tollgate's native Redis module (`backends/redis-module`) for tests:
//! the built library, and servers that load it.
//!
//! The library is the one named by `TOLLGATE_REDIS_MODULE` when it is set
//! (a library built elsewhere); otherwise the first use builds it with
//! `cargo build -p tollgate-redis-module` (`--release` in optimized
//! builds, such as benches) in this workspace's target directory (the
//! module's bindings need libclang: `sudo apt-get install libclang-dev`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::redis_cluster::RedisCluster;
use crate::redis_server::RedisServer;

/// The environment variable naming a built module library.
pub const MODULE_ENV: &str = "TOLLGATE_REDIS_MODULE";

/// The path of the module's library (`libtollgate_redis_module.so`),
/// built on first use unless [`MODULE_ENV`] names one.
///
/// # Panics
///
/// When the build fails (the message has cargo's output and the command
/// that installs libclang) or the named file does not exist.
pub fn module_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os(MODULE_ENV) {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{MODULE_ENV}={} is not a file: build the module with `cargo build -p tollgate-redis-module`",
                path.display()
            );
            return path;
        }
        build()
    })
    .clone()
}

/// `cargo build -p tollgate-redis-module` (with `--release` when this
/// code is optimized, as under `cargo bench`: a bench measures the release
/// module), and the library it made.
fn build() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut command = Command::new(&cargo);
    command.args([
        "build",
        "-p",
        "tollgate-redis-module",
        "--message-format=json-render-diagnostics",
    ]);
    if !cfg!(debug_assertions) {
        command.arg("--release");
    }
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "building Tollgate's Redis module failed (it needs libclang: `sudo apt-get install libclang-dev`):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The artifact line of the cdylib names the library file.
    stdout
        .lines()
        .filter(|line| line.contains("\"reason\":\"compiler-artifact\""))
        .filter(|line| {
            line.contains("tollgate-redis-module") || line.contains("tollgate_redis_module")
        })
        .flat_map(|line| line.split('"'))
        .find(|part| {
            part.ends_with("libtollgate_redis_module.so")
                || part.ends_with("libtollgate_redis_module.dylib")
        })
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("cargo built no module library:\n{stdout}"))
}

/// The `--loadmodule` arguments for a server.
fn load_args(path: &str) -> [&str; 2] {
    ["--loadmodule", path]
}

impl RedisServer {
    /// Start a server that loads Tollgate's module, with `extra` arguments
    /// after (see [`start_with_args`](RedisServer::start_with_args)).
    ///
    /// # Panics
    ///
    /// As [`start`](RedisServer::start) and [`module_path()`].
    pub fn start_with_module(extra: &[&str]) -> RedisServer {
        let path = module_path().to_string_lossy().into_owned();
        let mut args = load_args(&path).to_vec();
        args.extend_from_slice(extra);
        RedisServer::start_with_args(&args)
    }

    /// The process-wide server with the module, shared like
    /// [`shared`](RedisServer::shared).
    pub fn shared_with_module() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(|| RedisServer::start_with_module(&[]))
    }
}

impl RedisCluster {
    /// The 3 + 3 cluster of [`start`](RedisCluster::start), every node
    /// loading Tollgate's module, with `extra` `redis-server` arguments
    /// (for example `["--enable-module-command", "yes"]` to unload it from
    /// a node later).
    ///
    /// # Panics
    ///
    /// As [`start`](RedisCluster::start) and [`module_path()`].
    pub fn start_with_module(extra: &[&str]) -> RedisCluster {
        let path = module_path().to_string_lossy().into_owned();
        let mut args = load_args(&path).to_vec();
        args.extend_from_slice(extra);
        RedisCluster::start_with_extra(&args)
    }
}
