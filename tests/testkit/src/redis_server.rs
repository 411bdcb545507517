//! Real `redis-server` processes for tests.
//!
//! [`RedisServer::start`] runs a fresh server on a free loopback port, in its
//! own temporary directory, without persistence (`--save ""`,
//! `--appendonly no`); the process is stopped when the value is dropped.
//! [`RedisServer::shared`] is one process-wide server for tests that only
//! need isolation by key prefix.
//!
//! Tests never mock Redis and are never skipped: when `redis-server` is not
//! installed, starting a server panics at once with the command that
//! installs it.
//!
//! Every server runs under a small `sh` watchdog that holds the read end of
//! a pipe whose write end only this process has. When the test process exits
//! for any reason (even a `SIGKILL`, and for [`shared`](RedisServer::shared),
//! which is never dropped), the pipe closes and the watchdog stops the
//! server, so no `redis-server` outlives its tests.
//!
//! ```no_run
//! use tollgate_testkit::redis_server::RedisServer;
//!
//! let server = RedisServer::start();
//! let url = server.url(); // "redis://127.0.0.1:<port>/"
//! # let _ = url;
//! ```

use std::fmt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::tls_certificates::TestCertificates;

/// The environment variable naming the `redis-server` binary to run
/// (default: `redis-server` from `PATH`).
pub const SERVER_ENV: &str = "TOLLGATE_REDIS_SERVER";

/// The command that installs `redis-server` (Debian and Ubuntu).
pub const INSTALL_HINT: &str = "sudo apt-get install -y redis-server";

/// How long a server may take to answer its first PING.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Attempts before giving up when the chosen port is taken by someone else
/// between choosing it and the server binding it.
const START_ATTEMPTS: usize = 5;

/// Starts `redis-server` (`$1`) with the arguments after its working
/// directory (`$2`), prints its pid, and when standard input closes (this
/// process exited or dropped the handle) stops it and removes the directory
/// (`SIGCONT` after the `SIGTERM`: a server a test froze with `SIGSTOP`
/// acts on it only once continued).
/// Redis runs in the background of a non-interactive shell, so its own
/// standard input is `/dev/null`: only the watchdog holds the pipe.
/// The watchdog ignores `SIGINT` (a Ctrl-C reaches the whole foreground
/// group): it outlives the test process, and cleans up at the pipe's end.
const WATCHDOG: &str = r#"trap '' INT
server="$1"; dir="$2"; shift 2
"$server" "$@" </dev/null >/dev/null 2>&1 &
pid=$!
echo "$pid"
while read -r _; do :; done
kill "$pid" 2>/dev/null
kill -CONT "$pid" 2>/dev/null
wait "$pid"
rm -rf "$dir"
"#;

/// A running `redis-server`, stopped on drop.
pub struct RedisServer {
    watchdog: Child,
    stdin: Option<ChildStdin>,
    pid: u32,
    port: u16,
    dir: PathBuf,
    url: String,
    /// The extra arguments it was started with, for [`restart`](RedisServer::restart).
    extra: Vec<String>,
    /// The configuration file's text it was started with (sentinels need one).
    config: Option<String>,
    /// The TLS port, for servers started with [`start_tls`](RedisServer::start_tls).
    tls_port: Option<u16>,
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("url", &self.url)
            .field("pid", &self.pid)
            .finish()
    }
}

impl RedisServer {
    /// Start a standalone server on a free loopback port.
    ///
    /// # Panics
    ///
    /// When `redis-server` is not installed (the message gives the install
    /// command), or the server does not answer PING within 20 seconds.
    pub fn start() -> RedisServer {
        RedisServer::start_with_args(&[])
    }

    /// Start a server with extra `redis-server` arguments (for example
    /// `["--maxmemory", "10mb"]`, or cluster options), after the defaults:
    /// `--bind 127.0.0.1 --port <free port> --save "" --appendonly no
    /// --repl-diskless-sync-delay 0` and its own temporary working
    /// directory.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisServer::start).
    pub fn start_with_args(extra: &[&str]) -> RedisServer {
        RedisServer::start_configured(extra, None)
    }

    /// Start a server that also listens with TLS on a second free port
    /// (see [`tls_url`](RedisServer::tls_url)), presenting `certs`' server
    /// certificate and trusting its CA, with `extra` arguments after (for
    /// example `["--tls-auth-clients", "no"]`; Redis's default asks every
    /// TLS client for a certificate). The plain port stays open, for the
    /// harness and for tests that look at what a store wrote.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisServer::start); also when this `redis-server` was
    /// built without TLS.
    pub fn start_tls(certs: &TestCertificates, extra: &[&str]) -> RedisServer {
        RedisServer::start_tls_configured(certs, extra, None)
    }

    /// [`start_tls`](RedisServer::start_tls) with a configuration file,
    /// as [`start_configured`](RedisServer::start_configured) (a sentinel
    /// speaking TLS).
    ///
    /// # Panics
    ///
    /// As [`start_tls`](RedisServer::start_tls).
    pub fn start_tls_configured(
        certs: &TestCertificates,
        extra: &[&str],
        config: Option<&str>,
    ) -> RedisServer {
        let cert_args = certs.server_args();
        // A TLS port of its own for each attempt: one taken meanwhile
        // would fail every attempt.
        RedisServer::start_attempts(config, || {
            let tls_port = free_port();
            let mut args = vec!["--tls-port".to_string(), tls_port.to_string()];
            args.extend(cert_args.iter().cloned());
            args.extend(extra.iter().map(|a| a.to_string()));
            (args, Some(tls_port))
        })
    }

    /// Start a server with `config` as its configuration file (written in
    /// its working directory and given first, as `redis-server --sentinel`
    /// needs) and `extra` arguments after the defaults.
    ///
    /// # Panics
    ///
    /// As [`start`](RedisServer::start).
    pub fn start_configured(extra: &[&str], config: Option<&str>) -> RedisServer {
        RedisServer::start_attempts(config, || {
            (extra.iter().map(|a| a.to_string()).collect(), None)
        })
    }

    /// Start a server on a free port, with the arguments (and the TLS port
    /// they name) `args` gives for each attempt, until one starts.
    fn start_attempts(
        config: Option<&str>,
        args: impl Fn() -> (Vec<String>, Option<u16>),
    ) -> RedisServer {
        let binary = server_binary();
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let (extra, tls_port) = args();
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            match RedisServer::try_start(&binary, port, &extra, config) {
                Ok(mut server) => {
                    server.tls_port = tls_port;
                    return server;
                }
                Err(e) => last_error = e,
            }
        }
        panic!("could not start {binary} after {START_ATTEMPTS} attempts: {last_error}");
    }

    /// The process-wide server shared by every test of this process that
    /// only needs isolation by key prefix. Started on first use; stopped
    /// when the process exits.
    ///
    /// Tests that change server state (`SCRIPT FLUSH`, `CONFIG SET`, killing
    /// or pausing it) or read server-wide statistics must
    /// [`start`](RedisServer::start) their own.
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        SHARED.get_or_init(RedisServer::start)
    }

    fn try_start(
        binary: &str,
        port: u16,
        extra: &[&str],
        config: Option<&str>,
    ) -> Result<RedisServer, String> {
        let dir = temp_dir(port)?;
        let port_text = port.to_string();
        let dir_text = dir.to_string_lossy().into_owned();
        let log = dir.join("redis.log");
        let log_text = log.to_string_lossy().into_owned();
        let config_file = dir.join("redis.conf");
        let config_text = config_file.to_string_lossy().into_owned();
        let mut args: Vec<&str> = Vec::new();
        if let Some(text) = config {
            std::fs::write(&config_file, text)
                .map_err(|e| format!("cannot write {config_text}: {e}"))?;
            args.push(&config_text);
        }
        args.extend([
            "--bind",
            "127.0.0.1",
            "--port",
            &port_text,
            "--save",
            "",
            "--appendonly",
            "no",
            // A replica's first sync starts at once, not after Redis's
            // default five seconds of waiting for more replicas.
            "--repl-diskless-sync-delay",
            "0",
            "--daemonize",
            "no",
            "--dir",
            &dir_text,
            "--logfile",
            &log_text,
        ]);
        args.extend_from_slice(extra);
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("tollgate-redis-watchdog")
            .arg(binary)
            .arg(&dir)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run sh to start {binary}: {e}"))?;
        let stdin = watchdog.stdin.take();
        let mut line = String::new();
        if let Some(stdout) = watchdog.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let pid = line
            .trim()
            .parse::<u32>()
            .map_err(|_| format!("the watchdog did not report the server's pid (got {line:?})"))?;
        let mut server = RedisServer {
            watchdog,
            stdin,
            pid,
            port,
            url: format!("redis://127.0.0.1:{port}/"),
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            config: config.map(str::to_string),
            tls_port: None,
        };
        match server.wait_ready() {
            Ok(()) => Ok(server),
            Err(e) => {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                server.stop();
                Err(format!(
                    "{e}; server log (last lines, newest first):\n{}",
                    tail.join("\n")
                ))
            }
        }
    }

    /// Poll with `PING` until the server answers `+PONG`.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if ping(self.addr()).is_ok() {
                // A port taken between choosing it and binding it answers
                // for another test's server: this one failed to bind.
                return match answering_pid(self.addr()) {
                    Some(pid) if pid == self.pid => Ok(()),
                    other => Err(format!(
                        "port {} answers for process {other:?}, not this server ({})",
                        self.port, self.pid
                    )),
                };
            }
            if let Ok(Some(status)) = self.watchdog.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited ({status})",
                    self.port
                ));
            }
            if !process_alive(self.pid) {
                return Err(format!("redis-server on port {} exited", self.port));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "redis-server on port {} did not answer PING within {START_TIMEOUT:?}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The URL to connect to, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The TLS URL, `rediss://127.0.0.1:<tls port>/`, for a server from
    /// [`start_tls`](RedisServer::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port
            .map(|port| format!("rediss://127.0.0.1:{port}/"))
    }

    /// The TLS port, for a server from [`start_tls`](RedisServer::start_tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The server's loopback address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The `redis-server` process id (for fault tests: `kill -STOP`, …).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's working directory (its log is `redis.log` in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Send one command over a fresh plain connection (setup in tests:
    /// `ACL SETUSER`, `CONFIG SET`, …); an error reply is a
    /// [`Reply::Error`](crate::resp::Reply::Error).
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> crate::resp::Reply {
        crate::resp::call(self.addr(), args)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port))
    }

    /// Whether the server answers `PING` now.
    pub fn is_up(&self) -> bool {
        ping(self.addr()).is_ok()
    }

    /// Send `signal` (`"KILL"`, `"STOP"`, `"CONT"`, …) to the server process.
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run or refuses.
    pub fn signal(&self, signal: &str) {
        // The shell's builtin `kill`: no procps needed.
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -{signal} {}", self.pid))
            .status()
            .expect("run sh");
        assert!(
            status.success(),
            "kill -{signal} {} failed: {status}",
            self.pid
        );
    }

    /// Kill the server at once (`SIGKILL`): connections drop, the port closes.
    pub fn kill(&self) {
        self.signal("KILL");
    }

    /// Freeze the server (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Thaw a paused server (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kill the server and start a fresh, empty one on the same port with
    /// the same arguments (what an operator's restart without persistence
    /// looks like to clients).
    ///
    /// # Panics
    ///
    /// When the new server does not come up.
    pub fn restart(&mut self) {
        self.signal("KILL");
        self.stop();
        let binary = server_binary();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            match RedisServer::try_start(&binary, self.port, &extra, self.config.as_deref()) {
                Ok(mut fresh) => {
                    fresh.tls_port = self.tls_port;
                    // The old watchdog has finished, so dropping the old
                    // value (stopping it again) does nothing more.
                    drop(std::mem::replace(self, fresh));
                    return;
                }
                Err(e) => {
                    last_error = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        panic!(
            "could not restart redis-server on port {}: {last_error}",
            self.port
        );
    }

    fn stop(&mut self) {
        // Closing the pipe makes the watchdog kill the server and wait for it.
        drop(self.stdin.take());
        let _ = self.watchdog.wait();
        // The watchdog removes the directory; this covers a watchdog that
        // could not run to its end.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The binary to run, checked once: panics with the install command when
/// it is missing.
fn server_binary() -> String {
    static CHECKED: OnceLock<String> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let binary = std::env::var(SERVER_ENV).unwrap_or_else(|_| "redis-server".to_string());
            match Command::new(&binary)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
            {
                Ok(out) if out.status.success() => binary,
                Ok(out) => panic!(
                    "`{binary} --version` failed ({}); the Redis tests need a working redis-server. \
                     Install it with: {INSTALL_HINT}",
                    out.status
                ),
                Err(e) => panic!(
                    "redis-server was not found ({binary}: {e}); the Redis tests start real \
                     redis-server processes and are never skipped. Install it with: {INSTALL_HINT} \
                     (or set {SERVER_ENV} to its path)"
                ),
            }
        })
        .clone()
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral loopback port");
    listener.local_addr().expect("local address").port()
}

/// A fresh directory for one server's files.
fn temp_dir(port: u16) -> Result<PathBuf, String> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-redis-{}-{port}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// One `PING` over plain TCP (inline command syntax).
fn ping(addr: SocketAddr) -> std::io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(std::io::Error::other("unexpected reply to PING"))
    }
}

/// The `process_id` of the server answering on `addr` (`INFO server`).
fn answering_pid(addr: SocketAddr) -> Option<u32> {
    let info = crate::resp::call(addr, &["INFO", "server"]).ok()?.text()?;
    info.lines()
        .find_map(|line| line.trim().strip_prefix("process_id:")?.parse().ok())
}

/// Whether a process is running. On Linux, from `/proc/<pid>/stat` (an
/// exited server stays a zombie until the watchdog reaps it, so the state
/// letter matters); elsewhere assume yes and rely on the PING deadline.
fn process_alive(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
