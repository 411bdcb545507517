//! The redis-server harness: starts, answers, and is gone after drop.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use tollgate_testkit::redis_server::RedisServer;

#[test]
fn a_server_answers_and_stops_on_drop() {
    let server = RedisServer::start();
    assert!(server.is_up());
    assert!(server.url().starts_with("redis://127.0.0.1:"));
    assert!(server.dir().exists());
    let (addr, pid, dir) = (server.addr(), server.pid(), server.dir().to_path_buf());
    drop(server);
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err(),
        "nothing listens after drop"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || !cfg!(target_os = "linux"),
        "the process is gone"
    );
    assert!(!dir.exists(), "its directory is removed");
}

#[test]
fn servers_are_independent_and_the_shared_one_is_shared() {
    let a = RedisServer::start();
    let b = RedisServer::start();
    assert_ne!(a.port(), b.port());
    assert_eq!(RedisServer::shared().port(), RedisServer::shared().port());
    assert!(RedisServer::shared().is_up());
}

#[test]
fn extra_arguments_reach_the_server() {
    let started = Instant::now();
    let server = RedisServer::start_with_args(&["--databases", "4"]);
    assert!(server.is_up());
    assert!(started.elapsed() < Duration::from_secs(20));
    let log = std::fs::read_to_string(server.dir().join("redis.log")).unwrap_or_default();
    assert!(log.contains("Ready to accept connections"), "{log}");
}
