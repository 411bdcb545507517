//! Tollgate's demo: an axum server on the in-process store, with a route per
//! algorithm and a layered route. Its limits come from a configuration file,
//! `examples/demo/demo.toml` (see `docs/configuration.md`).
//!
//! ```sh
//! cargo run -p tollgate-demo                        # serves 127.0.0.1:3000
//! cargo run -p tollgate-demo -- --help              # usage
//! cargo run -p tollgate-demo -- --port 8080         # or PORT=8080
//! cargo run -p tollgate-demo -- --config my.toml    # other limits
//! cargo run -p tollgate-demo -- --selftest          # bursts over real HTTP, then exits
//! TOLLGATE_REDIS_URL=redis://127.0.0.1:6379/ cargo run -p tollgate-demo --features redis   # on Redis
//! ```
//!
//! With `examples/demo/demo.toml` as shipped:
//!
//! | route | algorithm | counted per |
//! |---|---|---|
//! | `GET /search` | token bucket: 5, refilled 1 per second | API key (hashed) |
//! | `POST /login` | sliding log: 3 per minute | client IP |
//! | `POST /login`, inside | the login recipe (`docs/login.md`): 3 attempts per minute, then blocks of 1 min, 10 min, 1 h | account |
//! | `GET /export` | GCRA per key, fixed window per tenant, sliding window for everyone, decided together | key, tenant, global |
//!
//! `--selftest` runs the server on a free port with a manual clock, fires
//! bursts at every route with a real HTTP client, prints what came back, and
//! exits non-zero if anything differs from what the policies promise.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tollgate::config::LiveConfig;
use tollgate::tower::{
    single_header_value, ClientIp, HeaderStyle, Identity, RateLimitLayer, Reply,
};
use tollgate::{
    Clock, Context, Decision, Escalation, HashKey, Limit, LoginGuard, ManualClock, MonotonicClock,
    PlanName, Policy, Subject, Timestamp,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The demo's API keys: key, user, tenant, plan. Alice and Bob share a
/// tenant; Carol pays for the pro plan (demo.toml's `[plans]`).
const KEYS: &[(&str, &str, &str, &str)] = &[
    ("demo-key-alice", "alice", "acme", "free"),
    ("demo-key-bob", "bob", "acme", "free"),
    ("demo-key-carol", "carol", "globex", "pro"),
];

/// The key API keys are hashed with. A real server loads it from its secret
/// store; it only has to stay the same across restarts and instances.
const HASH_KEY: &[u8] = b"tollgate-demo-hash-key, not a secret";

/// Known API keys, already hashed: the stand-in for an authentication layer.
#[derive(Clone)]
struct Keys {
    hash_key: HashKey,
    /// Hashed key → (tenant, plan).
    known: Arc<HashMap<Subject, (Subject, PlanName)>>,
}

impl Keys {
    fn new() -> Self {
        let hash_key = HashKey::new(HASH_KEY).expect("16+ bytes");
        let known = KEYS
            .iter()
            .map(|(key, _, tenant, plan)| {
                let tenant = Subject::new(tenant).expect("valid tenant");
                let plan = PlanName::new(plan).expect("valid plan");
                (Subject::hashed(key, &hash_key), (tenant, plan))
            })
            .collect();
        Keys {
            hash_key,
            known: Arc::new(known),
        }
    }
}

/// The demo's accounts and their passwords. A real server keeps password
/// hashes, and checks them in constant time.
const ACCOUNTS: &[(&str, &str)] = &[("dave", "correct horse"), ("erin", "battery staple")];

/// The login recipe (`docs/login.md`): per account, 3 attempts a minute,
/// then blocks of 1 minute, 10 minutes and an hour, forgotten after a
/// quiet day — on the configuration's store.
fn login_guard(live: &LiveConfig) -> Result<LoginGuard, Error> {
    let minute = Duration::from_secs(60);
    Ok(LoginGuard::new(
        live.store(),
        Policy::new("login-failures", Limit::sliding_log(3, minute)?)?,
        Escalation::new([minute, 10 * minute, 60 * minute], 24 * 60 * minute)?,
    )?)
}

/// `POST /login` with a form `user=…&password=…`: 200 and the failures
/// forgotten for the right password, 401 for a wrong one, 429 with the
/// block's end once the account is blocked (the attempt is then not even
/// checked), 400 for a form without both fields.
async fn login(State(guard): State<LoginGuard>, form: String) -> Response {
    let field = |name: &str| {
        form.split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(form_decode)
    };
    let (Some(user), Some(password)) = (field("user"), field("password")) else {
        return plain(400, "send a form: user=NAME&password=PASSWORD\n");
    };
    // The account name is the subject (this demo's names are plain words).
    let Ok(subject) = Subject::new(user.as_str()) else {
        return plain(401, "wrong user or password\n");
    };
    let ctx = Context::for_subject(subject);
    let right = ACCOUNTS.iter().any(|&(u, p)| u == user && p == password);
    match attempt(&guard, &ctx, right).await {
        Ok(response) => response,
        Err(e) => {
            eprintln!("login: {e}");
            plain(503, "try again later\n")
        }
    }
}

async fn attempt(
    guard: &LoginGuard,
    ctx: &Context,
    right: bool,
) -> Result<Response, tollgate::Error> {
    let attempt = guard.attempt(ctx).await?;
    if !attempt.is_allowed() {
        return Ok(too_many_requests(&attempt));
    }
    if right {
        guard.succeeded(ctx).await?;
        return Ok(plain(200, "welcome\n"));
    }
    let after = guard.failed(ctx, &attempt).await?;
    Ok(if after.is_allowed() {
        plain(401, "wrong user or password\n")
    } else {
        too_many_requests(&after)
    })
}

/// A form value as a browser sends it (`+` for a space, `%XX` for a
/// byte); `None` when it does not decode to UTF-8.
fn form_decode(value: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// The limiter's own 429: problem+json, `Retry-After`, `RateLimit`.
fn too_many_requests(decision: &Decision) -> Response {
    response(Reply::too_many_requests(decision, HeaderStyle::default()))
}

fn plain(status: u16, body: &'static str) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = axum::http::StatusCode::from_u16(status).expect("a status");
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn response(reply: Reply) -> Response {
    let (status, headers, body) = reply.into_parts();
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = axum::http::StatusCode::from_u16(status).expect("a status");
    tollgate::tower::apply_headers(&headers, response.headers_mut());
    response
}

/// The `WWW-Authenticate` challenge of the demo's API keys.
const CHALLENGE: &str = "ApiKey header=\"x-api-key\"";

/// Authentication: reject unknown API keys (so made-up keys cannot mint
/// fresh buckets), and record who the caller is for the rate limiter. The
/// key is read exactly as the limiter reads it (one `x-api-key` field, so a
/// duplicated header is refused by both), and a refusal is the same 401
/// the limiter sends.
async fn authenticate(State(keys): State<Keys>, mut request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let key = single_header_value(&parts, "x-api-key").map(|v| Subject::hashed(v, &keys.hash_key));
    request = Request::from_parts(parts, body);
    match key.and_then(|k| keys.known.get(&k).map(|known| (k, known.clone()))) {
        Some((key, (tenant, plan))) => {
            // The plan is the account's, never the client's to choose:
            // every route decides under it, whatever identifies the caller.
            request.extensions_mut().insert(plan);
            request
                .extensions_mut()
                .insert(Context::for_subject(key).with_tenant(tenant));
            next.run(request).await
        }
        None => response(Reply::unidentified(CHALLENGE)),
    }
}

/// The route `name` of the running configuration, as a tower layer
/// identified by `identity`. The layer reads the route's limits and cost
/// from the configuration for every request, so a reload changes them.
fn limit(live: &LiveConfig, name: &str, identity: Identity) -> Result<RateLimitLayer, Error> {
    let route = live
        .route(name)
        .map_err(|e| format!("{e}; the demo needs routes search, login and export"))?;
    Ok(RateLimitLayer::builder(route)
        .identity(identity)
        .unauthorized_challenge(CHALLENGE)
        .build()
        .map_err(|e| format!("routes.{name}: {e}"))?)
}

/// The demo application, rate limited by the running configuration. Every
/// limiter sits on its method route (`MethodRouter::route_layer`): a
/// request the router answers 404 or 405 never reaches it, so it is not
/// charged.
fn app(limiters: &LiveConfig) -> Result<Router, Error> {
    let keys = Keys::new();
    // The API key itself, hashed (authentication already vetted it).
    let search = limit(
        limiters,
        "search",
        Identity::new().api_key("x-api-key", keys.hash_key.clone()),
    )?;
    // Key and tenant as authentication recorded them.
    let export = limit(limiters, "export", Identity::new().extension())?;
    // The socket peer: this demo trusts no proxy.
    let per_ip = limit(
        limiters,
        "login",
        Identity::new().client_ip(ClientIp::direct()),
    )?;

    let authenticated = Router::new()
        .route(
            "/search",
            get(|| async { "search results\n" }).route_layer(search),
        )
        .route(
            "/export",
            get(|| async { "export ready\n" }).route_layer(export),
        )
        .route_layer(middleware::from_fn_with_state(keys, authenticate));
    let public = Router::new()
        .route("/login", post(login).route_layer(per_ip))
        .with_state(login_guard(limiters)?);
    Ok(Router::new()
        .route(
            "/",
            get(|| async { "Tollgate demo: GET /search, POST /login, GET /export\n" }),
        )
        .merge(authenticated)
        .merge(public))
}

const USAGE: &str = "\
Tollgate demo: an HTTP server whose routes are rate limited by a configuration file.

usage: tollgate-demo [--port N] [--config PATH] [--selftest]

  --port N        listen on 127.0.0.1:N (default: $PORT, else 3000)
  --config PATH   the limits (default: examples/demo/demo.toml)
  --selftest      serve on a free port, fire bursts at every route over
                  real HTTP, print what came back, and exit (non-zero if
                  anything differs from what the policies promise)
  --help          this text

TOLLGATE_REDIS_URL=redis://HOST:PORT/ runs on Redis (build with --features redis).";

/// The command line, checked: every flag known, every value valid.
struct Args {
    port: Option<u16>,
    config: std::path::PathBuf,
    selftest: bool,
    help: bool,
}

impl Args {
    fn parse(args: &[String]) -> Result<Args, Error> {
        let mut parsed = Args {
            port: None,
            config: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("demo.toml"),
            selftest: false,
            help: false,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--help" | "-h" => parsed.help = true,
                "--selftest" => parsed.selftest = true,
                "--port" => {
                    let value = args
                        .next()
                        .ok_or("--port needs a number, like --port 8080")?;
                    parsed.port =
                        Some(value.parse().map_err(|_| {
                            format!("--port {value:?}: not a port number (1-65535)")
                        })?);
                }
                "--config" => {
                    let value = args
                        .next()
                        .ok_or("--config needs a file, like --config demo.toml")?;
                    parsed.config = value.into();
                }
                other => return Err(format!("unknown argument {other:?}; see --help").into()),
            }
        }
        Ok(parsed)
    }
}

/// The configuration at `path`, running over the configured store — or
/// over Redis when `TOLLGATE_REDIS_URL` is set (which needs the `redis`
/// feature: `cargo run -p tollgate-demo --features redis`).
async fn limiters(path: &std::path::Path, clock: Arc<dyn Clock>) -> Result<LiveConfig, Error> {
    let in_file = |e| format!("--config {}: {e}", path.display());
    let Some(url) = std::env::var_os("TOLLGATE_REDIS_URL") else {
        return LiveConfig::load(path, clock)
            .await
            .map_err(|e| in_file(e).into());
    };
    #[cfg(feature = "redis")]
    {
        let url = url
            .into_string()
            .map_err(|_| "TOLLGATE_REDIS_URL is not UTF-8")?;
        let store = tollgate::redis::RedisStore::builder(url)
            .prefix("tollgate-demo")
            .connect()
            .await
            .map_err(|e| format!("TOLLGATE_REDIS_URL: cannot use that Redis: {e}"))?;
        LiveConfig::load_on(path, Arc::new(store), clock)
            .await
            .map_err(|e| in_file(e).into())
    }
    #[cfg(not(feature = "redis"))]
    {
        let _ = url;
        Err("TOLLGATE_REDIS_URL is set, but this build has no Redis store: run `cargo run -p tollgate-demo --features redis`".into())
    }
}

async fn listen(addr: SocketAddr, app: Router) -> Result<SocketAddr, Error> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let service = app.into_make_service_with_connect_info::<SocketAddr>();
        if let Err(e) = axum::serve(listener, service).await {
            eprintln!("server stopped: {e}");
        }
    });
    Ok(addr)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Error> {
    let args = Args::parse(&std::env::args().skip(1).collect::<Vec<_>>())?;
    if args.help {
        println!("{USAGE}");
        return Ok(());
    }
    if args.selftest {
        return selftest(&args.config).await;
    }
    let port = match (args.port, std::env::var("PORT")) {
        (Some(port), _) => port,
        (None, Ok(port)) => port
            .parse()
            .map_err(|_| format!("PORT={port:?}: not a port number (1-65535)"))?,
        (None, Err(_)) => 3000,
    };
    let limiters = limiters(&args.config, Arc::new(MonotonicClock::new())).await?;
    let addr = listen(SocketAddr::from(([127, 0, 0, 1], port)), app(&limiters)?).await?;
    for route in limiters.unbound_routes() {
        eprintln!("warning: [routes.{route}] is configured but no handler uses it");
    }
    // Reload on SIGHUP, and whenever the file changes.
    let _watch = limiters.watch(Duration::from_secs(1), report)?;
    let on_hangup = limiters.clone();
    tokio::spawn(async move {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        while hangups.recv().await.is_some() {
            report(on_hangup.reload().await);
        }
    });
    let base = format!("http://{addr}");
    println!(
        "Tollgate demo on {base} ({} store, limits from the configuration file). Try:\n",
        limiters.store().kind()
    );
    let tries = [
        ("token bucket per API key: 5, then 1 per second", format!("curl -i -H 'x-api-key: demo-key-alice' {base}/search")),
        ("a burst of 8: five 200s, then 429s", format!("for i in $(seq 8); do curl -s -o /dev/null -w '%{{http_code}} ' -H 'x-api-key: demo-key-alice' {base}/search; done; echo")),
        ("login: 3 per minute per client IP; dave's right password is 'correct horse'", format!("curl -i -d 'user=dave&password=correct+horse' {base}/login")),
        ("a minute later (so that the client IP's limit of 3 logins a minute is not what answers), 3 wrong passwords block dave for 1 min (then 10 min, 1 h)", format!("for i in 1 2 3; do curl -s -o /dev/null -w '%{{http_code}} ' -d 'user=dave&password=guess' {base}/login; done; echo")),
        ("per key, per tenant and global together (alice and bob share tenant acme)", format!("curl -i -H 'x-api-key: demo-key-bob' {base}/export")),
        ("no key: 401", format!("curl -i {base}/search")),
    ];
    for (what, command) in tries {
        println!("  # {what}\n  {command}\n");
    }
    println!("Keys: demo-key-alice, demo-key-bob (tenant acme, plan free), demo-key-carol (tenant globex, plan pro: 10 searches).");
    println!(
        "\nLimits reload without a restart: edit {} (say, `capacity = 10` under [policies.search]) and save,\nor send SIGHUP: kill -HUP {}. An invalid file keeps the running limits and says why. Ctrl-C stops.",
        args.config.display(),
        std::process::id()
    );
    std::future::pending::<()>().await;
    Ok(())
}

/// Print what a reload did.
fn report(result: Result<tollgate::config::ReloadReport, tollgate::config::ReloadError>) {
    match result {
        Ok(report) => {
            println!("configuration reloaded; new limits in force");
            for route in report.unbound_routes {
                eprintln!("warning: [routes.{route}] is configured but no handler uses it");
            }
        }
        Err(e) => eprintln!("{e}\n(the running limits are unchanged)"),
    }
}

/// What one request got back.
struct Got {
    status: u16,
    content_type: String,
    www_authenticate: String,
    ratelimit: String,
    retry_after: String,
    violated: String,
}

/// A real HTTP client aimed at the demo server, keeping score.
struct Tester {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    all_as_promised: bool,
    /// The form every POST sends (`user=…&password=…`).
    form: String,
}

impl Tester {
    async fn fire(&self, method: &str, path: &str, key: Option<&str>) -> Result<Got, Error> {
        let headers: Vec<(&str, &str)> = key.map(|k| ("x-api-key", k)).into_iter().collect();
        self.send(method, path, &headers).await
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Result<Got, Error> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = if method == "POST" {
            Bytes::from(self.form.clone())
        } else {
            Bytes::new()
        };
        let response = self.client.request(request.body(Full::new(body))?).await?;
        let header = |name: &str| {
            let values: Vec<&str> = response
                .headers()
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            values.join(", ")
        };
        let status = response.status().as_u16();
        let content_type = header("content-type");
        let www_authenticate = header("www-authenticate");
        let ratelimit = header("ratelimit");
        let retry_after = header("retry-after");
        let body = response.into_body().collect().await?.to_bytes();
        let body = String::from_utf8_lossy(&body);
        // Just the list from the problem document, without a JSON parser.
        let violated = body
            .split_once("\"violated-policies\":")
            .map(|(_, rest)| rest.trim_end_matches('}').to_string())
            .unwrap_or_default();
        Ok(Got {
            status,
            content_type,
            www_authenticate,
            ratelimit,
            retry_after,
            violated,
        })
    }

    /// Print `label` and whether `ok` held.
    fn check(&mut self, label: &str, ok: bool) {
        if !ok {
            self.all_as_promised = false;
        }
        println!(
            "  {label:<71} {}",
            if ok { "as promised" } else { "<-- UNEXPECTED" }
        );
    }

    /// Fire `n` requests (`route` is `"METHOD /path"`), print them, and check
    /// that `expected_ok` were admitted.
    async fn burst(
        &mut self,
        label: &str,
        route: &str,
        key: Option<&str>,
        n: usize,
        expected_ok: usize,
    ) -> Result<(), Error> {
        let (method, path) = route.split_once(' ').ok_or("route is \"METHOD /path\"")?;
        let mut got = Vec::with_capacity(n);
        for _ in 0..n {
            got.push(self.fire(method, path, key).await?);
        }
        let statuses: Vec<String> = got.iter().map(|g| g.status.to_string()).collect();
        let ok = got.iter().filter(|g| g.status == 200).count();
        let mark = if ok == expected_ok {
            ""
        } else {
            self.all_as_promised = false;
            "   <-- UNEXPECTED"
        };
        println!(
            "  {label:<30} {:<40} {ok} of {n} admitted{mark}",
            statuses.join(" ")
        );
        // The first admitted response and the last one show the numbers moving.
        let first_ok = got.iter().position(|g| g.status == 200);
        let shown = first_ok
            .into_iter()
            .chain(Some(n - 1).filter(|last| Some(*last) != first_ok));
        for g in shown.map(|i| &got[i]) {
            let mut line = format!("      {}", g.status);
            if !g.ratelimit.is_empty() {
                line += &format!(" RateLimit: {}", g.ratelimit);
            }
            if !g.retry_after.is_empty() {
                line += &format!("  Retry-After: {}", g.retry_after);
            }
            if !g.violated.is_empty() {
                line += &format!("  violated-policies: {}", g.violated);
            }
            println!("{line}");
        }
        Ok(())
    }
}

/// The login recipe over HTTP: failures blocked for longer and longer,
/// the right password refused while blocked, a success forgetting it all.
async fn login_recipe(t: &mut Tester, clock: &ManualClock) -> Result<(), Error> {
    println!("\nPOST /login as dave: 3 attempts per minute, then blocks of 1 min, 10 min, 1 h");
    let wrong = "user=dave&password=guess";
    let right = "user=dave&password=correct+horse";
    // Each round fits the route's own limit (6 per minute per IP by now).
    clock.advance(Duration::from_secs(60));
    for (round, block) in [(1, "60"), (2, "600"), (3, "3600")] {
        t.form = wrong.into();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(t.fire("POST", "/login", None).await?);
        }
        let statuses: Vec<u16> = got.iter().map(|g| g.status).collect();
        t.check(
            &format!(
                "round {round}, 3 wrong passwords: {statuses:?}, Retry-After: {}",
                got[2].retry_after
            ),
            statuses == [401, 401, 429]
                && got[2].retry_after == block
                && !got[2].ratelimit.is_empty(),
        );
        t.form = right.into();
        let blocked = t.fire("POST", "/login", None).await?;
        t.check(
            &format!(
                "  the right password while blocked: {} (not checked)",
                blocked.status
            ),
            blocked.status == 429,
        );
        clock.advance(Duration::from_secs(block.parse()?));
    }
    let welcome = t.fire("POST", "/login", None).await?;
    t.check(
        &format!("the block over, the right password: {}", welcome.status),
        welcome.status == 200,
    );
    t.form = wrong.into();
    let mut last = 0;
    let mut retry = String::new();
    for _ in 0..3 {
        let got = t.fire("POST", "/login", None).await?;
        last = got.status;
        retry = got.retry_after;
    }
    t.check(
        &format!("after a success, 3 failures block for {retry} s again ({last})"),
        last == 429 && retry == "60",
    );
    t.form = "user=dave".into();
    let bad = t.fire("POST", "/login", None).await?;
    t.check("a form without a password: 400", bad.status == 400);
    Ok(())
}

/// A file removed when this is dropped: the self-test's copy of the
/// configuration goes whichever way the test ends.
struct RemovedOnDrop(std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The server on a free port with a manual clock, bursts at every route,
/// then a reload of a changed file and of an invalid one.
async fn selftest(path: &std::path::Path) -> Result<(), Error> {
    let clock = ManualClock::new(Timestamp::from_micros(1_779_999_960_000_000));
    // A copy of the file, which the self-test edits to reload it.
    let copy = std::env::temp_dir().join(format!("tollgate-demo-{}.toml", std::process::id()));
    let original =
        std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    std::fs::write(&copy, &original)?;
    let _removed = RemovedOnDrop(copy.clone());
    // Always the in-process store: the checks below move its clock.
    let live = LiveConfig::load(&copy, Arc::new(clock.clone()))
        .await
        .map_err(|e| format!("--config {}: {e}", path.display()))?;
    let addr = listen(SocketAddr::from(([127, 0, 0, 1], 0)), app(&live)?).await?;
    let mut t = Tester {
        client: Client::builder(TokioExecutor::new()).build_http(),
        base: format!("http://{addr}"),
        all_as_promised: true,
        form: "user=erin&password=battery staple".into(),
    };
    println!(
        "Tollgate demo self-test: {}, in-process store, clock moved by hand.\n",
        t.base
    );
    let alice = Some("demo-key-alice");
    let bob = Some("demo-key-bob");
    let carol = Some("demo-key-carol");

    println!("GET /search: token bucket, 5 per key, refilled 1/s");
    t.burst("alice, 8 at t=0", "GET /search", alice, 8, 5)
        .await?;
    t.burst("bob, 2 at t=0 (own bucket)", "GET /search", bob, 2, 2)
        .await?;
    t.burst(
        "carol (plan pro: 10), 12 at t=0",
        "GET /search",
        carol,
        12,
        10,
    )
    .await?;
    clock.advance(Duration::from_millis(2_500));
    t.burst("alice, 4 at t=2.5s", "GET /search", alice, 4, 2)
        .await?;
    t.burst("no key", "GET /search", None, 1, 0).await?;
    t.burst("made-up key", "GET /search", Some("guess"), 1, 0)
        .await?;
    // Every 401 has one shape: problem+json with the challenge, whether the
    // key is missing, unknown or sent twice.
    let twice = t
        .send(
            "GET",
            "/search",
            &[("x-api-key", "demo-key-carol"), ("x-api-key", "guess")],
        )
        .await?;
    for (label, got) in [
        (
            "no key: 401 problem+json with WWW-Authenticate",
            t.fire("GET", "/search", None).await?,
        ),
        ("key sent twice: the same 401", twice),
    ] {
        let ok = got.status == 401
            && got.content_type == "application/problem+json"
            && got.www_authenticate == CHALLENGE;
        t.check(label, ok);
    }

    println!("\nPOST /login: sliding log, 3 per minute per client IP");
    // A browser's CORS preflight and a wrong method are not charged: the
    // five POSTs below still find the full budget.
    let preflight = [
        ("origin", "https://app.example"),
        ("access-control-request-method", "POST"),
    ];
    let mut free = true;
    for _ in 0..3 {
        let got = t.send("OPTIONS", "/login", &preflight).await?;
        free &= got.status != 429 && got.ratelimit.is_empty();
        let got = t.send("GET", "/login", &[]).await?;
        free &= got.status == 405 && got.ratelimit.is_empty();
    }
    t.check("3 CORS preflights and 3 GETs (405): not charged", free);
    t.burst("5 at t=2.5s", "POST /login", None, 5, 3).await?;
    clock.advance(Duration::from_secs(60));
    t.burst("2 a minute later", "POST /login", None, 2, 2)
        .await?;

    println!("\nGET /export: GCRA 3 per key, 5 per tenant per minute, 20 for everyone");
    t.burst("alice (acme), 4", "GET /export", alice, 4, 3)
        .await?;
    t.burst("bob (acme), 3", "GET /export", bob, 3, 2).await?;
    t.burst("carol (globex), 2", "GET /export", carol, 2, 2)
        .await?;
    println!("  bob's last request was denied by the tenant layer: all layers decide together.");

    println!("\nReload: the file changed while the server runs");
    let raised = original.replacen(
        "limit = 3\nwindow = \"1m\"",
        "limit = 6\nwindow = \"1m\"",
        1,
    );
    if raised == original {
        return Err("self-test: the configuration has no `limit = 3` login policy to raise".into());
    }
    std::fs::write(&copy, &raised)?;
    let reloaded = live.reload().await;
    t.check("login 3 -> 6 per minute: reloaded", reloaded.is_ok());
    // Same algorithm, new limit: the counter is kept (2 used this minute).
    t.burst("POST /login, 5 after the reload", "POST /login", None, 5, 4)
        .await?;
    std::fs::write(&copy, raised.replace("limit = 6", "limit = 0"))?;
    let refused = live.reload().await;
    t.check(
        "an invalid file (limit = 0): refused, the running limits kept",
        refused.is_err(),
    );
    clock.advance(Duration::from_secs(60));
    t.burst("POST /login, 7 a minute later", "POST /login", None, 7, 6)
        .await?;

    login_recipe(&mut t, &clock).await?;

    if t.all_as_promised {
        println!("\nself-test passed");
        Ok(())
    } else {
        Err("self-test: some bursts were not admitted as the policies promise".into())
    }
}
