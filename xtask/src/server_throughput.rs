//! `cargo xtask server-throughput [rounds]`: the rate limit server measured
//! from outside, as its goals are stated (docs/benchmarks.md, "The rate
//! limit server from outside"): the release binary under h2load (4
//! connections × 16 streams, one prebuilt `ShouldRateLimit` frame) on the
//! in-process store and on Redis, with the CPU each process spends per
//! decision; and a real Envoy (one worker) under wrk (16 connections), its
//! rate limit filter calling the server, beside the same Envoy without the
//! filter, same upstream, same run. Rounds interleave; medians are printed
//! as a markdown table.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{cargo, ensure_installed, ensure_redis_server, envoy, on_path, root, run, Result};

/// A child process, killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

fn wait_for(port: u16, what: &str) -> Result {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what} did not listen on port {port} within 30 s"))
}

/// CPU time (user + system) of process `pid` so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime is the 12th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0.0) + fields.get(12).copied().unwrap_or(0.0);
    ticks / 100.0 // USER_HZ is 100 on Linux
}

/// The upstream behind Envoy: HTTP/1.1 keep-alive, 200 with a short body,
/// one thread per connection.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the upstream");
    let port = listener.local_addr().expect("its address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_upstream(stream));
        }
    });
    port
}

fn serve_upstream(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        // Headers until the blank line; requests carry no body.
        let mut length = 0usize;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";
        if writer.write_all(reply).is_err() {
            return;
        }
    }
}

/// The `ShouldRateLimit` frame h2load sends: gRPC's 5-byte prefix and
/// the request (domain `bench`, one descriptor `user_id=u1`), encoded by
/// hand so the xtask needs no protobuf crate.
fn request_frame() -> Vec<u8> {
    fn field(tag: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![tag, u8::try_from(bytes.len()).expect("short")];
        out.extend_from_slice(bytes);
        out
    }
    let entry = [field(0x0a, b"user_id"), field(0x12, b"u1")].concat();
    let descriptor = field(0x0a, &entry);
    let request = [
        field(0x0a, b"bench"),
        field(0x12, &descriptor),
        vec![0x18, 1],
    ]
    .concat();
    let mut frame = vec![0];
    frame.extend_from_slice(&u32::try_from(request.len()).expect("short").to_be_bytes());
    frame.extend_from_slice(&request);
    frame
}

/// The server's file: every decision admitted (one roomy GCRA layer per
/// user), the RateLimit headers sent, on `store`.
fn server_toml(store: &str, grpc: u16, http: u16) -> String {
    format!(
        r#"
{store}

[policies.roomy]
algorithm = "gcra"
rate = 1000000
period = "1s"
burst = 1000000

[routes.api]
layers = [{{ name = "user", scope = "subject", policy = "roomy" }}]

[server]
grpc_listen = "127.0.0.1:{grpc}"
http_listen = "127.0.0.1:{http}"
response_headers = true

[[server.rules]]
name = "api"
domain = "bench"
route = "api"
entries = {{ user_id = "subject" }}
"#
    )
}

/// Envoy (one worker) on `port` in front of the upstream, with the rate
/// limit filter calling the server at `grpc` when `filter` is set.
fn envoy_yaml(port: u16, admin: u16, upstream: u16, grpc: u16, filter: bool) -> String {
    let rate_limit_filter = if filter {
        r#"
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              failure_mode_deny: true
              timeout: 0.25s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: tollgate } }"#
    } else {
        ""
    };
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }}
static_resources:
  listeners:
  - address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bench
          http_filters:{rate_limit_filter}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: backend
                  rate_limits:
                  - actions:
                    - request_headers: {{ header_name: x-user-id, descriptor_key: user_id }}
  clusters:
  - name: backend
    type: STATIC
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }}
  - name: tollgate
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: tollgate
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {grpc} }} }} }}
"#
    )
}

/// What one h2load run measured.
struct Grpc {
    per_second: f64,
    server_us: f64,
    redis_us: f64,
    client_us: f64,
    mean_us: f64,
}

/// h2load's `time for request` mean, in µs, from its report.
fn h2load_mean_us(report: &str) -> f64 {
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("time for request:"))
        .unwrap_or("");
    let mean = line.split_whitespace().nth(5).unwrap_or("0us");
    let (number, unit) =
        mean.split_at(mean.find(|c: char| c.is_alphabetic()).unwrap_or(mean.len()));
    let number: f64 = number.parse().unwrap_or(0.0);
    match unit {
        "ms" => number * 1000.0,
        "s" => number * 1e6,
        _ => number,
    }
}

/// `h2load -n <decisions> -c 4 -m 16` of the frame at `grpc`.
fn h2load(
    frame: &Path,
    grpc: u16,
    decisions: u64,
    server: u32,
    redis: Option<u32>,
) -> std::result::Result<Grpc, String> {
    let url = format!(
        "http://127.0.0.1:{grpc}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    let args = |n: u64| {
        let mut cmd = Command::new("h2load");
        cmd.args(["-n", &n.to_string(), "-c", "4", "-m", "16", "-d"])
            .arg(frame)
            .args([
                "-H",
                "content-type: application/grpc",
                "-H",
                "te: trailers",
                &url,
            ]);
        cmd
    };
    // Warm: connections, the limiter's keys.
    args(2_000).output().map_err(|e| format!("h2load: {e}"))?;
    let (server0, redis0) = (cpu_seconds(server), redis.map_or(0.0, cpu_seconds));
    let started = Instant::now();
    let child = args(decisions)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("h2load: {e}"))?;
    let client = child.id();
    let mut client_cpu = 0.0;
    let output = {
        let mut child = child;
        loop {
            client_cpu = cpu_seconds(client).max(client_cpu);
            if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().map_err(|e| e.to_string())?
    };
    let elapsed = started.elapsed().as_secs_f64();
    let report = String::from_utf8_lossy(&output.stdout).to_string();
    if !report.contains(&format!("{decisions} succeeded")) {
        return Err(format!("h2load did not complete every request:\n{report}"));
    }
    let per = |seconds: f64| seconds * 1e6 / decisions as f64;
    Ok(Grpc {
        per_second: decisions as f64 / elapsed,
        server_us: per(cpu_seconds(server) - server0),
        redis_us: per(redis.map_or(0.0, cpu_seconds) - redis0),
        client_us: per(client_cpu),
        mean_us: h2load_mean_us(&report),
    })
}

/// Requests per second wrk gets from Envoy on `port` in `seconds`.
fn wrk(port: u16, seconds: u32) -> std::result::Result<f64, String> {
    let output = Command::new("wrk")
        .args([
            "-t1",
            "-c16",
            &format!("-d{seconds}s"),
            "-H",
            "x-user-id: u1",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let report = String::from_utf8_lossy(&output.stdout);
    if report.contains("Non-2xx") {
        return Err(format!("Envoy answered other than 200:\n{report}"));
    }
    report
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk's report:\n{report}"))
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn start(what: &str, cmd: &mut Command, port: u16) -> std::result::Result<Process, String> {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{what}: could not start: {e}"))?;
    let process = Process(child);
    wait_for(port, what)?;
    Ok(process)
}

/// What one wrk run through Envoy measured.
struct ThroughEnvoy {
    per_second: f64,
    /// Envoy's CPU per request, and the server's.
    envoy_us: f64,
    server_us: f64,
}

/// One store's figures over the rounds.
#[derive(Default)]
struct Figures {
    grpc: Vec<Grpc>,
    with_filter: Vec<ThroughEnvoy>,
    without: Vec<ThroughEnvoy>,
}

/// `[rounds] [--before <binary>]`: the number of rounds (default 3), and
/// another build of the server to measure beside this one, interleaved.
fn arguments(args: &[String]) -> std::result::Result<(usize, Option<PathBuf>), String> {
    let mut rounds = 3;
    let mut before = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--before" {
            let path = args
                .next()
                .ok_or("--before needs the path of a server binary")?;
            before = Some(PathBuf::from(path));
        } else {
            rounds = arg
                .parse()
                .map_err(|_| format!("{arg:?}: give the number of rounds, or --before <binary>"))?;
        }
    }
    Ok((rounds, before))
}

/// What every measurement shares: the tools, the files, the upstream and
/// the Redis server.
struct Bench {
    envoy: PathBuf,
    dir: PathBuf,
    frame: PathBuf,
    upstream: u16,
    redis_port: u16,
    redis: Process,
}

/// One store: its name, its `[store]` table, and the decisions h2load
/// sends.
type StoreCase = (&'static str, String, u64);

pub fn server_throughput(args: &[String]) -> Result {
    let (rounds, before) = arguments(args)?;
    ensure_redis_server()?;
    ensure_installed(
        "h2load",
        "the gRPC load",
        || on_path("h2load"),
        "nghttp2-client",
        "",
    )?;
    ensure_installed(
        "wrk",
        "the HTTP load through Envoy",
        || on_path("wrk"),
        "wrk",
        "",
    )?;
    envoy::ensure()?;
    run(
        "the server's release build",
        cargo().args(["build", "--release", "-p", "tollgate-ratelimit-server"]),
    )?;
    let mut builds = vec![(
        "now",
        root().join("target/release/tollgate-ratelimit-server"),
    )];
    if let Some(before) = before {
        if !before.is_file() {
            return Err(format!("--before {}: no such file", before.display()));
        }
        builds.insert(0, ("before", before));
    }
    let bench = Bench::start()?;
    let redis_port = bench.redis_port;
    let stores: [StoreCase; 2] = [
        ("in-process", String::new(), 200_000),
        (
            "Redis",
            format!("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{redis_port}\""),
            100_000,
        ),
    ];
    let mut rows = rows(&stores, &builds);
    for round in 0..rounds {
        // Which build goes first alternates with the rounds.
        let mut order: Vec<usize> = (0..builds.len()).collect();
        if !round.is_multiple_of(2) {
            order.reverse();
        }
        for (s, store) in stores.iter().enumerate() {
            for &b in &order {
                let (build, binary) = &builds[b];
                eprintln!("round {}/{rounds}: {}, {build}", round + 1, store.0);
                let figures = &mut rows[s * builds.len() + b].1;
                bench.measure(binary, store, round, figures)?;
            }
        }
    }
    println!("{}", report(&rows, rounds));
    Ok(())
}

impl Bench {
    fn start() -> std::result::Result<Bench, String> {
        let dir = root().join("target/server-throughput");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let frame = dir.join("request.bin");
        std::fs::write(&frame, request_frame()).map_err(|e| e.to_string())?;
        let port = free_port();
        let redis = start(
            "redis-server",
            Command::new("redis-server").args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ]),
            port,
        )?;
        Ok(Bench {
            envoy: envoy::binary()?,
            dir,
            frame,
            upstream: upstream(),
            redis_port: port,
            redis,
        })
    }

    /// One round of `binary` on `store`: h2load, then Envoy with and
    /// without the filter (which goes first alternates with the rounds).
    fn measure(
        &self,
        binary: &Path,
        (_, store, decisions): &StoreCase,
        round: usize,
        figures: &mut Figures,
    ) -> Result {
        let (grpc, http) = (free_port(), free_port());
        let config = self.dir.join("server.toml");
        std::fs::write(&config, server_toml(store, grpc, http)).map_err(|e| e.to_string())?;
        let server = start(
            "the server",
            Command::new(binary).arg("--config").arg(&config),
            grpc,
        )?;
        let redis = (!store.is_empty()).then(|| self.redis.0.id());
        let server_pid = server.0.id();
        figures
            .grpc
            .push(h2load(&self.frame, grpc, *decisions, server_pid, redis)?);
        let order = if round.is_multiple_of(2) {
            [true, false]
        } else {
            [false, true]
        };
        for filter in order {
            let measured = self.through_envoy(grpc, server_pid, filter)?;
            match filter {
                true => figures.with_filter.push(measured),
                false => figures.without.push(measured),
            }
        }
        Ok(())
    }

    /// wrk through a new Envoy (one worker), with the rate limit filter
    /// calling the server at `grpc` when `filter` is set.
    fn through_envoy(
        &self,
        grpc: u16,
        server: u32,
        filter: bool,
    ) -> std::result::Result<ThroughEnvoy, String> {
        let (port, admin) = (free_port(), free_port());
        let yaml = self.dir.join("envoy.yaml");
        std::fs::write(&yaml, envoy_yaml(port, admin, self.upstream, grpc, filter))
            .map_err(|e| e.to_string())?;
        let envoy = start(
            "Envoy",
            Command::new(&self.envoy)
                .args(["--concurrency", "1", "--base-id", &admin.to_string(), "-c"])
                .arg(&yaml),
            port,
        )?;
        wrk(port, 2)?; // warm
        let cpu = || (cpu_seconds(envoy.0.id()), cpu_seconds(server));
        let (envoy0, server0) = cpu();
        let started = Instant::now();
        let rps = wrk(port, 8)?;
        let requests = rps * started.elapsed().as_secs_f64();
        let (envoy1, server1) = cpu();
        Ok(ThroughEnvoy {
            per_second: rps,
            envoy_us: (envoy1 - envoy0) * 1e6 / requests,
            server_us: (server1 - server0) * 1e6 / requests,
        })
    }
}

/// A row for each store and build, named after both when there are two
/// builds, in the order `measure` fills them.
fn rows(stores: &[StoreCase], builds: &[(&str, PathBuf)]) -> Vec<(String, Figures)> {
    let mut rows = Vec::new();
    for (name, _, _) in stores {
        for (build, _) in builds {
            let label = match builds.len() {
                1 => name.to_string(),
                _ => format!("{name}, {build}"),
            };
            rows.push((label, Figures::default()));
        }
    }
    rows
}

fn report(rows: &[(String, Figures)], rounds: usize) -> String {
    let mut out = format!(
        "Medians of {rounds} interleaved rounds.\n\n\
         | store | h2load decisions/s | mean latency µs | server CPU µs per decision | Redis CPU µs | h2load CPU µs | Envoy with the filter req/s | without | ratio | Envoy CPU µs per request with / without | server CPU µs per request through Envoy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (name, f) in rows {
        let m = |get: fn(&Grpc) -> f64| median(f.grpc.iter().map(get).collect());
        let e = |runs: &[ThroughEnvoy], get: fn(&ThroughEnvoy) -> f64| {
            median(runs.iter().map(get).collect())
        };
        let (with, without) = (
            e(&f.with_filter, |r| r.per_second),
            e(&f.without, |r| r.per_second),
        );
        out.push_str(&format!(
            "| {name} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} | {:.1} |\n",
            m(|g| g.per_second),
            m(|g| g.mean_us),
            m(|g| g.server_us),
            m(|g| g.redis_us),
            m(|g| g.client_us),
            with,
            without,
            with / without.max(1.0),
            e(&f.with_filter, |r| r.envoy_us),
            e(&f.without, |r| r.envoy_us),
            e(&f.with_filter, |r| r.server_us),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_is_a_grpc_message_of_the_request() {
        let frame = request_frame();
        let length = u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize;
        assert_eq!(frame[0], 0, "not compressed");
        assert_eq!(frame.len(), 5 + length);
        assert_eq!(&frame[5..12], b"\x0a\x05bench");
    }

    #[test]
    fn h2load_latency_is_read_in_microseconds() {
        let report = "time for request:       24us     23.42ms      1.08ms       647us    84.45%";
        assert_eq!(h2load_mean_us(report), 1080.0);
    }
}
