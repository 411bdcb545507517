//! Without redis-server the harness fails at once, saying how to install it
//! (never a silent skip). Its own test binary: the binary check is cached
//! per process.

use tollgate_testkit::redis_server::{RedisServer, SERVER_ENV};

#[test]
#[should_panic(expected = "sudo apt-get install -y redis-server")]
fn a_missing_redis_server_panics_with_the_install_command() {
    std::env::set_var(SERVER_ENV, "/nonexistent/redis-server");
    let _ = RedisServer::start();
}
