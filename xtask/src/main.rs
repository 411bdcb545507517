//! Repository automation (the `cargo xtask` pattern).
//!
//! - `cargo xtask test`: the whole test suite. Makes sure `redis-server` is
//!   installed first (the tests start their own servers on free ports): when
//!   it is missing it installs it with apt-get when it can, saying so, or
//!   stops at once with the exact command to run.
//! - `cargo xtask features`: builds (and checks the tests of) every cargo
//!   feature of the `tollgate` crate on its own.
//! - `cargo xtask ci`: what `.ci/run` runs, each step timed.
//! - `cargo xtask bench`: every criterion bench, then the summary report.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};
use std::time::Instant;

/// Features of the `tollgate` facade crate, each built on its own.
const FEATURES: &[&str] = &[
    "memory",
    "redis",
    "metrics",
    "tracing",
    "blocked-cache",
    "tower",
    "axum",
    "actix",
];

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "test" => test(&args[1..]),
        "features" => features(),
        "ci" => ci(),
        "bench" => bench(&args[1..]),
        "redis-check" => ensure_redis_server(),
        _ => {
            eprintln!("usage: cargo xtask <test|features|ci|bench|redis-check>");
            exit(2);
        }
    };
    if let Err(message) = result {
        eprintln!("xtask {task}: {message}");
        exit(1);
    }
}

type Result = std::result::Result<(), String>;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn run(what: &str, cmd: &mut Command) -> Result {
    let start = Instant::now();
    eprintln!("==> {what}");
    let status = cmd
        .status()
        .map_err(|e| format!("{what}: could not start: {e}"))?;
    eprintln!(
        "<== {what}: {} in {:.1}s",
        if status.success() { "ok" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

fn on_path(program: &str) -> bool {
    env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// `redis-server` must exist: tests start their own instances on free ports.
fn ensure_redis_server() -> Result {
    if on_path("redis-server") {
        return Ok(());
    }
    const INSTALL: &str = "sudo apt-get update && sudo apt-get install -y redis-server";
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    if on_path("apt-get") && (is_root || on_path("sudo")) {
        eprintln!(
            "redis-server is not installed; the tests need it (they start their own servers)."
        );
        eprintln!("Installing it now with apt-get (`{INSTALL}`)…");
        let sudo = |args: &[&str]| {
            let mut cmd = if is_root {
                Command::new(args[0])
            } else {
                Command::new("sudo")
            };
            if is_root {
                cmd.args(&args[1..]);
            } else {
                cmd.args(args);
            }
            cmd.env("DEBIAN_FRONTEND", "noninteractive");
            cmd
        };
        run("apt-get update", &mut sudo(&["apt-get", "update", "-q"]))?;
        run(
            "apt-get install redis-server",
            &mut sudo(&["apt-get", "install", "-y", "-q", "redis-server"]),
        )?;
        if on_path("redis-server") {
            return Ok(());
        }
    }
    Err(format!(
        "redis-server is not installed and could not be installed automatically.\n\
         The tests start their own redis-server processes; install it with:\n\n    {INSTALL}\n\n\
         (or put a redis-server 6.2+ binary on PATH), then run `cargo xtask test` again."
    ))
}

/// The whole test suite: every crate, every feature, doc-tests included.
fn test(extra: &[String]) -> Result {
    ensure_redis_server()?;
    run(
        "cargo test --workspace --all-features",
        cargo()
            .args(["test", "--workspace", "--all-features"])
            .args(extra),
    )
}

fn features() -> Result {
    run(
        "tollgate without default features",
        cargo().args([
            "check",
            "-p",
            "tollgate",
            "--no-default-features",
            "--all-targets",
        ]),
    )?;
    for feature in FEATURES {
        run(
            &format!("tollgate with only `{feature}`"),
            cargo().args([
                "check",
                "-p",
                "tollgate",
                "--no-default-features",
                "--features",
                feature,
                "--all-targets",
            ]),
        )?;
    }
    Ok(())
}

fn ci() -> Result {
    let start = Instant::now();
    run(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--check"]),
    )?;
    run(
        "cargo clippy (all targets, all features)",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    test(&[])?;
    features()?;
    run(
        "cargo doc (warnings denied)",
        cargo()
            .args(["doc", "--workspace", "--all-features", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    run(
        "demo self-test (the README's first command, over real HTTP)",
        cargo().args([
            "run",
            "--quiet",
            "--example",
            "demo",
            "--features",
            "axum",
            "--",
            "--selftest",
        ]),
    )?;
    eprintln!(
        "xtask ci: all steps passed in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn bench(extra: &[String]) -> Result {
    run(
        "cargo bench --workspace",
        cargo().args(["bench", "--workspace"]).args(extra),
    )
}
