//! `tollgate-ratelimit-server --config server.toml`: see the crate docs
//! and `docs/server.md`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::MonotonicClock;
use tollgate_ratelimit_server::Server;

const USAGE: &str = "\
Tollgate rate limit server: Envoy's RateLimitService over gRPC and an HTTP API.

usage: tollgate-ratelimit-server [--config PATH]

  --config PATH   the configuration file (default: server.toml); the
                  library's format with a [server] section (docs/server.md)
  --help          this text

Reloads the file on SIGHUP and when it changes (an invalid file, or one
changing where it listens, is refused and the running limits kept); stops
gracefully on SIGTERM or Ctrl-C (requests in flight finish, 30 s at most).";

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate-ratelimit-server: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = PathBuf::from("server.toml");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" => {
                config = args.next().ok_or("--config needs a path")?.into();
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}\n\n{USAGE}").into()),
        }
    }
    let server = Server::start(&config, Arc::new(MonotonicClock::new()))
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
    server.shutdown().await;
    Ok(())
}
