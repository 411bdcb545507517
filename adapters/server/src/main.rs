//! `tollgate-ratelimit-server --config server.toml`: see the crate docs
//! and `docs/server.md`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Arg, ArgAction, Command};
use tollgate_limiter::MonotonicClock;
use tollgate_ratelimit_server::Server;

const ABOUT: &str =
    "Tollgate rate limit server: Envoy's RateLimitService over gRPC and an HTTP API.";

const AFTER: &str = "\
Reloads the file on SIGHUP and when it changes (an invalid file, or one
changing where it listens, is refused and the running limits kept); stops
gracefully on SIGTERM or Ctrl-C (requests in flight finish, 30 s at most).
See docs/server.md.";

fn command() -> Command {
    Command::new("tollgate-ratelimit-server")
        .about(ABOUT)
        .after_help(AFTER)
        .arg(
            Arg::new("config")
                .long("config")
                .value_name("PATH")
                .default_value("server.toml")
                .value_parser(clap::value_parser!(PathBuf))
                .help("The configuration file: the library's format with a [server] section"),
        )
        .arg(
            Arg::new("check")
                .long("check")
                .action(ArgAction::SetTrue)
                .help("Check the file (every rule built, its store opened, its certificates read) and exit: 0 when it would start"),
        )
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = command().get_matches();
    let config = args
        .get_one::<PathBuf>("config")
        .expect("a default")
        .clone();
    let result = if args.get_flag("check") {
        check(&config).await
    } else {
        run(&config).await
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-ratelimit-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Start on `config` as a real start does, on ports of its own, and stop.
async fn check(config: &PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let rules = Server::check(config, Arc::new(MonotonicClock::new()))
        .await
        .map_err(|e| format!("{}: {e}", config.display()))?;
    println!("{}: valid ({rules} rules)", config.display());
    Ok(())
}

async fn run(config: &PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let server = Server::start(config, Arc::new(MonotonicClock::new()))
        .await
        .map_err(|e| format!("{}: {e}", config.display()))?;
    println!(
        "tollgate-ratelimit-server: gRPC (Envoy RateLimitService) on {}, HTTP API on http://{} ({})",
        server.grpc_addr(),
        server.http_addr(),
        config.display()
    );
    let report =
        |what: &str, result: Result<(), tollgate_ratelimit_server::ServerError>| match result {
            Ok(()) => eprintln!("{what}: reloaded"),
            Err(e) => eprintln!("{what}: {e} (the running limits are kept)"),
        };
    let _watch = server.watch(Duration::from_secs(1), move |r| report("file changed", r));
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = hangup.recv() => report("SIGHUP", server.reload().await),
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    eprintln!("stopping: finishing the requests in flight");
    // A second signal stops at once (a drain can last minutes).
    tokio::select! {
        () = server.shutdown() => {}
        _ = terminate.recv() => eprintln!("stopped at once: a second signal"),
        _ = tokio::signal::ctrl_c() => eprintln!("stopped at once: a second signal"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_are_well_formed() {
        command().debug_assert();
        let args = command().get_matches_from(["tollgate-ratelimit-server", "--check"]);
        assert!(args.get_flag("check"));
        let config = args.get_one::<PathBuf>("config").unwrap();
        assert_eq!(config, &PathBuf::from("server.toml"));
        assert!(command()
            .try_get_matches_from(["tollgate-ratelimit-server", "--nonsense"])
            .is_err());
    }
}
