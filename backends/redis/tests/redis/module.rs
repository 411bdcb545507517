//! The store with Tollgate's native module (`backends/redis-module`) on real
//! servers: found and used when loaded, left when not, replaced by the
//! function library when it goes away, its writes replicated as effects
//! (a replica and an AOF replay hold the primary's states), and its
//! states the same bytes as the Lua path's, so both paths share them.
//!
//! The conformance, differential, refund and adjustment suites run the
//! module too (`conformance.rs`, `differential.rs`, `refund.rs`,
//! `adjust.rs`); the Cluster's are in `cluster.rs`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_limiter::{
    Clock, LayerRequest, Limit, ManualClock, Policy, Store, StoreKey, SystemClock,
};
use tollgate_redis::{ConnectionMode, Engine, RedisStore, RedisStoreError, MODULE_PROTOCOL};
use tollgate_testkit::conformance::{unique, START};
use tollgate_testkit::redis_server::RedisServer;
use tollgate_testkit::resp::Reply;

fn text(reply: Reply) -> String {
    match reply {
        Reply::Bulk(Some(b)) => String::from_utf8(b).expect("text"),
        Reply::Status(s) => s,
        Reply::Int(n) => n.to_string(),
        other => panic!("not a text: {other:?}"),
    }
}

fn int(reply: Reply) -> i64 {
    match reply {
        Reply::Int(n) => n,
        other => panic!("not an integer: {other:?}"),
    }
}

/// The first word of `ROLE`.
fn role(server: &RedisServer) -> String {
    match server.command(&["ROLE"]) {
        Reply::Array(Some(mut items)) if !items.is_empty() => text(items.remove(0)),
        other => panic!("ROLE answered {other:?}"),
    }
}

/// A replica (without the module) of `primary`, in sync.
fn replica_of(primary: &RedisServer) -> RedisServer {
    let port = primary.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
    for _ in 0..200 {
        if role(&replica) == "slave" && int(primary.command(&["WAIT", "1", "0"])) == 1 {
            return replica;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the replica on port {} never synced", replica.port());
}

/// Wait until `replica` has applied everything `primary` replicated so
/// far. (`WAIT` on the harness's fresh connection is no barrier: it waits
/// for that connection's own writes only, and it wrote none.)
fn caught_up(primary: &RedisServer, replica: &RedisServer) {
    let offset = |server: &RedisServer| info_number(server, "replication", "master_repl_offset");
    let target = offset(primary);
    let deadline = Instant::now() + Duration::from_secs(5);
    while offset(replica) < target {
        assert!(
            Instant::now() < deadline,
            "the replica on port {} did not catch up with offset {target}",
            replica.port()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A store on `url` deciding at the server's clock (what replicas must
/// follow without a manual clock's help).
async fn server_clock_store(url: &str, prefix: &str, engine: Engine) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .clock(Arc::new(SystemClock) as Arc<dyn Clock>)
        .engine(engine)
        .connect()
        .await
        .expect("connect")
}

/// Hour-long, so that no state a test writes at the server's clock expires
/// (or refills) while a loaded machine runs it.
fn policies() -> Vec<Policy> {
    let hour = Duration::from_secs(3600);
    vec![
        Policy::new("tb", Limit::token_bucket(50, 10, hour).unwrap()).unwrap(),
        Policy::new("gcra", Limit::gcra(50, hour, 50).unwrap()).unwrap(),
        Policy::new("fw", Limit::fixed_window(50, hour).unwrap()).unwrap(),
        Policy::new("sw", Limit::sliding_window(50, hour).unwrap()).unwrap(),
        Policy::new("log", Limit::sliding_log(50, hour).unwrap()).unwrap(),
    ]
}

/// Every layer of `policies` for `subject`, at `cost`.
fn layers<'a>(policies: &'a [Policy], subject: &'a str, cost: u64) -> Vec<LayerRequest<'a>> {
    policies
        .iter()
        .map(|p| LayerRequest {
            key: StoreKey::new(subject, p, "s", subject),
            policy: p,
            cost,
        })
        .collect()
}

/// Whether `store` admits a request of `cost` on every layer of `policies`
/// for `subject` (decided, and so charged when it does).
async fn admits(store: &RedisStore, policies: &[Policy], subject: &str, cost: u64) -> bool {
    tollgate_limiter::ask(store, &layers(policies, subject, cost))
        .await
        .expect("decide")
        .iter()
        .all(|v| v.allowed)
}

#[tokio::test]
async fn the_module_speaks_the_stores_protocol_and_declares_its_keys() {
    let server = RedisServer::shared_with_module();
    assert_eq!(int(server.command(&["TOLLGATE.PROTOCOL"])), MODULE_PROTOCOL);
    // numkeys, then the keys, then the rest: Cluster routing and ACL key
    // patterns see exactly the keys.
    let keys = server.command(&[
        "COMMAND",
        "GETKEYS",
        "TOLLGATE.DECIDE",
        "2",
        "a",
        "b",
        "",
        "",
        "2",
        "1",
        "5",
        "1000",
        "0",
        "3",
        "1",
        "5",
        "1000",
        "0",
    ]);
    assert_eq!(
        keys,
        Reply::Array(Some(vec![
            Reply::Bulk(Some(b"a".to_vec())),
            Reply::Bulk(Some(b"b".to_vec()))
        ]))
    );
    // Arguments the Lua path would refuse are refused the same way.
    match server.command(&[
        "TOLLGATE.DECIDE",
        "1",
        "k",
        "",
        "",
        "9",
        "1",
        "5",
        "1000",
        "0",
    ]) {
        Reply::Error(e) => assert!(e.starts_with("TOLLGATE_ARGS unknown algorithm 9"), "{e}"),
        other => panic!("{other:?}"),
    }
    match server.command(&["TOLLGATE.DECIDE", "1", "k", "", ""]) {
        Reply::Error(e) => assert!(
            e.starts_with("TOLLGATE_ARGS expected 2 arguments and 5 per key"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
}

/// The module runs inside Redis: a panic would take the server down. What
/// a client may send (absurd key counts, costs, blocks, stored numbers)
/// is refused as an argument error or a conflict, the server answers on,
/// and nothing is written.
#[test]
fn client_input_never_brings_the_server_down() {
    let server = RedisServer::shared_with_module();
    let refused = |args: &[&str], starts: &str| match server.command(args) {
        Reply::Error(e) => assert!(e.starts_with(starts), "{args:?}: {e}"),
        other => panic!("{args:?}: {other:?}"),
    };
    let huge = u64::MAX.to_string();
    let k = unique("input");
    let hour = "3600000000";
    // Each algorithm's code with valid parameters (capacity 10).
    let token_bucket = ["1", "10", "10", hour];
    let gcra = ["2", "10", "1000", "0"];
    let fixed_window = ["3", "10", hour, "0"];
    let sliding_window = ["4", "10", hour, "0"];
    let sliding_log = ["5", "10", hour, "0"];
    let call =
        |numkeys: &str, now: &str, [code, p1, p2, p3]: [&str; 4], cost: &str, mode: &[&str]| {
            let mut args = vec![
                "TOLLGATE.DECIDE".to_string(),
                numkeys.into(),
                k.clone(),
                now.into(),
                String::new(),
            ];
            args.extend([code, cost, p1, p2, p3].map(String::from));
            args.extend(mode.iter().map(|m| m.to_string()));
            args
        };
    let send = |args: &[String], starts: &str| {
        refused(&args.iter().map(String::as_str).collect::<Vec<_>>(), starts)
    };
    // A key count beyond the arguments, or one that overflows: the command
    // and its key-position callback (COMMAND GETKEYS, Cluster routing,
    // ACL key patterns) refuse it.
    for n in [huge.as_str(), "18446744073709551614", "11"] {
        send(
            &call(n, "", token_bucket, "1", &[]),
            "TOLLGATE_ARGS numkeys",
        );
        assert!(matches!(
            server.command(&["COMMAND", "GETKEYS", "TOLLGATE.DECIDE", n, &k, "", ""]),
            Reply::Error(_)
        ));
    }
    // Costs no policy allows: above the capacity (the sliding log would
    // index past its entries), zero, beyond u64 arithmetic.
    for (layer, cost) in [
        (sliding_log, "11"),
        (sliding_log, huge.as_str()),
        (token_bucket, "0"),
        (gcra, huge.as_str()),
        (sliding_window, huge.as_str()),
        (fixed_window, "11"),
    ] {
        for mode in [&[][..], &["reserve"], &["peek"]] {
            send(
                &call("1", "", layer, cost, mode),
                "TOLLGATE_ARGS layer 1: cost",
            );
        }
    }
    // Blocks outside 1 ms to 14 days.
    for length in ["0", "999", huge.as_str()] {
        send(
            &call("1", "", token_bucket, length, &["block"]),
            "TOLLGATE_ARGS layer 1:",
        );
    }
    assert_eq!(int(server.command(&["EXISTS", &k])), 0, "nothing written");
    // Stored counts beyond what any state holds, beside a plausible time:
    // someone else's data, left as it is.
    let now = START.as_micros().to_string();
    for (layer, value) in [
        (fixed_window, format!("9007199254740993 {now}")),
        (sliding_window, format!("{huge} 0 {now}")),
        (sliding_window, format!("0 4611686018427387904 {now}")),
        (token_bucket, format!("{now} {huge}")),
    ] {
        server.command(&["SET", &k, &value]);
        send(
            &call("1", &now, layer, "1", &[]),
            "TOLLGATE_CONFLICT 1 not_a_state",
        );
        assert_eq!(text(server.command(&["GET", &k])), value, "untouched");
    }
    server.command(&["DEL", &k]);
    // A penalty of no units writes nothing (as the Lua path).
    let args = call("1", "", token_bucket, "0", &["penalize"]);
    let answered = server.command(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(matches!(answered, Reply::Array(Some(_))), "{answered:?}");
    assert_eq!(
        int(server.command(&["EXISTS", &k])),
        0,
        "a penalty of 0 writes nothing"
    );
    assert_eq!(server.command(&["PING"]), Reply::Status("PONG".into()));
}

/// An error of a command the module runs inside its own, quoting a key
/// that is not ASCII ("unknown command 'PEXPIRE' … with args beginning
/// with: 'kĀ'", on a server that renamed its commands away), is answered
/// as an error: the reply's conversion turned `Ā` into a NUL byte and
/// panicked outside the module's guard, which aborted the server.
#[test]
fn an_inner_commands_error_about_a_non_ascii_key_is_answered() {
    let mut renamed = Vec::new();
    for command in ["DEL", "LTRIM", "LREM", "LRANGE", "PEXPIRE", "PTTL"] {
        renamed.extend(["--rename-command", command, ""]);
    }
    let server = RedisServer::start_with_module(&renamed);
    let hour = "3600000000";
    let now = START.as_micros().to_string();
    let mut errors = 0;
    for round in 0..40 {
        let (a, b) = (unique(&format!("Ā-{round}")), unique(&format!("Ā-{round}")));
        // Two sliding logs: the keyspace's path, not the key API's
        // one-layer shortcut.
        for mode in [&[][..], &["reward"], &["reset"]] {
            let mut args = vec!["TOLLGATE.DECIDE", "2", &a, &b, &now, ""];
            args.extend(["5", "1", "10", hour, "0", "5", "1", "10", hour, "0"]);
            args.extend_from_slice(mode);
            match server.command(&args) {
                Reply::Error(e) => {
                    assert!(e.is_ascii(), "{e}");
                    errors += 1;
                }
                Reply::Array(_) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(errors > 0, "no inner command was met");
    assert_eq!(server.command(&["PING"]), Reply::Status("PONG".into()));
}

/// A release that empties a key and then fails on a later layer still
/// replicates the key's delete: the keys a release empties are deleted at
/// once and their `DEL` replicated at the end, which a failure returned
/// before, leaving the replica (and the AOF) with a holder the primary no
/// longer has. The failure here is a refund no store sends (a remainder
/// past any bucket), which stops the call in this debug build.
#[test]
fn a_failed_release_still_replicates_its_deletes() {
    let primary = RedisServer::start_with_module(&[]);
    let replica = replica_of(&primary);
    let (held, bucket) = (unique("held"), unique("bucket"));
    let decide = |args: &[&str]| primary.command(&[&["TOLLGATE.DECIDE"][..], args].concat());
    let place = ["7", "1", "100", "30000000", "0"];
    let reserved = decide(&[&["1", &held, "", ""][..], &place, &["reserve"]].concat());
    let Reply::Array(Some(fields)) = reserved else {
        panic!("{reserved:?}")
    };
    let (at, mark) = (text_of(&fields[5]), text_of(&fields[6]));
    let bucket_layer = ["1", "1", "10", "10", "3600000000"];
    decide(&[&["1", &bucket, "", ""][..], &bucket_layer].concat());
    let far = "18446744073709551615";
    let mut refund = vec!["2", &held, &bucket, "", ""];
    refund.extend(place);
    refund.extend([at.as_str(), mark.as_str()]);
    refund.extend(bucket_layer);
    refund.extend([far, "9999999999999999", "refund"]);
    let answer = decide(&refund);
    assert!(
        matches!(answer, Reply::Error(_)),
        "the refund failed: {answer:?}"
    );
    caught_up(&primary, &replica);
    assert_eq!(int(primary.command(&["EXISTS", &held])), 0, "released");
    assert_eq!(
        int(replica.command(&["EXISTS", &held])),
        0,
        "the replica has the primary's keys"
    );
}

/// An integer reply's text.
fn text_of(reply: &Reply) -> String {
    match reply {
        Reply::Int(n) => n.to_string(),
        other => panic!("{other:?}"),
    }
}

/// A one-layer sliding log kept as a list is decided on the entries the
/// decision reads (the newest, and a search's from the oldest), not the
/// whole list: a peek changes nothing, a decision trims what aged out and
/// appends, a block in the list still denies, and an entry Tollgate did
/// not write, met by the search, fails the call with nothing written.
#[test]
fn a_long_sliding_log_is_read_where_the_decision_looks() {
    let server = RedisServer::shared_with_module();
    let now = START.as_micros();
    let lrange = |k: &str| server.command(&["LRANGE", k, "0", "-1"]);
    // 40 entries older than the hour, then 100 in the last minute; a limit
    // of 200 per hour.
    let log = |name: &str| {
        let k = unique(name);
        let old = (0..40u64).map(|i| now - 7_200_000_000 + i);
        let live = (0..100u64).map(|i| now - 60_000_000 + i);
        let entries: Vec<String> = old.chain(live).map(|t| t.to_string()).collect();
        let mut push = vec!["RPUSH", k.as_str()];
        push.extend(entries.iter().map(String::as_str));
        server.command(&push);
        server.command(&["PEXPIRE", &k, "3600000"]);
        k
    };
    let now_text = now.to_string();
    let decide = |key: &str, mode: &[&str]| {
        let mut args = vec![
            "TOLLGATE.DECIDE",
            "1",
            key,
            &now_text,
            "",
            "5",
            "1",
            "200",
            "3600000000",
            "0",
        ];
        args.extend(mode);
        server.command(&args)
    };
    let fields = |reply: Reply| match reply {
        Reply::Array(Some(items)) => items.into_iter().map(int).collect::<Vec<i64>>(),
        other => panic!("not a verdict: {other:?}"),
    };
    let k = log("long-log");
    let before = lrange(&k);
    assert_eq!(fields(decide(&k, &["peek"]))[..3], [1, 200, 100]);
    assert_eq!(lrange(&k), before, "a peek writes nothing");
    assert_eq!(fields(decide(&k, &[]))[..3], [1, 200, 99]);
    assert_eq!(
        int(server.command(&["LLEN", &k])),
        101,
        "40 trimmed, 1 added"
    );
    assert_eq!(
        text(server.command(&["LINDEX", &k, "0"])),
        (now - 60_000_000).to_string()
    );
    assert_eq!(text(server.command(&["LINDEX", &k, "-1"])), now_text);
    // Someone else's item where the search looks (it gallops through
    // entries 0, 1, 3, 7, 15, 31, 63), or as the newest entry.
    for at in ["31", "-1"] {
        let k = log("long-log-foreign");
        server.command(&["LSET", &k, at, "someone else's"]);
        let before = lrange(&k);
        for mode in [&[][..], &["peek"]] {
            match decide(&k, mode) {
                Reply::Error(e) => {
                    assert!(e.starts_with("TOLLGATE_CONFLICT 1 not_a_state"), "{e}")
                }
                other => panic!("{at}: {other:?}"),
            }
            assert_eq!(lrange(&k), before, "untouched");
        }
    }
    // A block kept in the list denies until its end.
    let blocked = unique("long-log-block");
    let until = format!("b{}", now + 5_000_000);
    server.command(&["RPUSH", &blocked, &until]);
    server.command(&["PEXPIRE", &blocked, "60000"]);
    let verdict = fields(decide(&blocked, &[]));
    assert_eq!((verdict[0], verdict[4]), (0, 5_000_000));
    assert_eq!(text(server.command(&["LINDEX", &blocked, "0"])), until);
}

/// A decision looks its key up once, so `keyspace_hits` and
/// `keyspace_misses` (an operator's hit ratio) count one lookup per
/// decision: for a counter, a sliding log (opened as a list first) and a
/// concurrency limit's holders kept as text (read as usual first).
#[test]
fn a_decision_looks_its_key_up_once() {
    let server = RedisServer::start_with_module(&[]);
    let stat = |name: &str| info_number(&server, "stats", name);
    let hour = "3600000000";
    for (name, layer, mode) in [
        ("token bucket", ["1", "1", "10", "10", hour], None),
        ("sliding log", ["5", "1", "10", hour, "0"], None),
        ("concurrency", ["7", "1", "10", hour, "0"], Some("reserve")),
    ] {
        let k = unique("lookups");
        let mut args = vec!["TOLLGATE.DECIDE", "1", k.as_str(), "", ""];
        args.extend(layer);
        args.extend(mode);
        for (expected_hits, expected_misses) in [(0, 1), (1, 0)] {
            let (hits, misses) = (stat("keyspace_hits"), stat("keyspace_misses"));
            assert!(matches!(server.command(&args), Reply::Array(Some(_))));
            assert_eq!(
                (
                    stat("keyspace_hits") - hits,
                    stat("keyspace_misses") - misses
                ),
                (expected_hits, expected_misses),
                "{name}"
            );
        }
    }
}

/// Field `name`, a number, of `INFO <section>`.
fn info_number(server: &RedisServer, section: &str, name: &str) -> i64 {
    let info = text(server.command(&["INFO", section]));
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO {section}"))
}

/// A release looks its key up once, as a decision does: one holder among
/// others, the last one (deleted without reading the log into a state),
/// and a key that is gone.
#[test]
fn a_release_looks_its_key_up_once() {
    let server = RedisServer::start_with_module(&[]);
    let lookups = || {
        (
            info_number(&server, "stats", "keyspace_hits"),
            info_number(&server, "stats", "keyspace_misses"),
        )
    };
    let k = unique("release-lookups");
    let layer = ["7", "1", "10", "30000000", "0"];
    let call = |tail: &[&str]| {
        let mut args = vec!["TOLLGATE.DECIDE", "1", k.as_str(), "", ""];
        args.extend(layer);
        args.extend(tail);
        let Reply::Array(Some(reply)) = server.command(&args) else {
            panic!("no answer");
        };
        reply
    };
    let at = |reply: Vec<Reply>| int(reply[5].clone()).to_string();
    let (first, second) = (at(call(&["reserve"])), at(call(&["reserve"])));
    for (holder, given, expected) in [
        (&first, 1, (1, 0)),
        (&second, 1, (1, 0)),
        (&second, 0, (0, 1)),
    ] {
        let (hits, misses) = lookups();
        let reply = call(&[holder.as_str(), "0", "refund"]);
        assert_eq!(int(reply[0].clone()), given, "{holder}");
        let (h, m) = lookups();
        assert_eq!((h - hits, m - misses), expected, "{holder} given {given}");
    }
}

/// A state written over with one of the same length is written in place
/// (the value stays a plain string: no copy on the next read, no key
/// deleted and added), in as much memory as the first write's; one of
/// another length is set whole, and reads back as written.
#[test]
fn a_state_written_over_stays_in_place() {
    let server = RedisServer::start_with_module(&[]);
    let k = unique("in-place");
    // GCRA, 1,000 per hour: each decision moves the TAT by 3.6 s, its
    // text keeping its length.
    let gcra = [
        "TOLLGATE.DECIDE",
        "1",
        k.as_str(),
        "",
        "",
        "2",
        "1",
        "1000",
        "3600000",
        "0",
    ];
    let get = |key: &str| text(server.command(&["GET", key]));
    let encoding = |key: &str| text(server.command(&["OBJECT", "ENCODING", key]));
    let memory = |key: &str| int(server.command(&["MEMORY", "USAGE", key]));
    assert!(matches!(server.command(&gcra), Reply::Array(Some(_))));
    let (first, first_memory) = (get(&k), memory(&k));
    for _ in 0..3 {
        assert!(matches!(server.command(&gcra), Reply::Array(Some(_))));
    }
    let tat = |t: &str| t.parse::<u64>().expect("a TAT");
    assert_eq!(get(&k).len(), first.len());
    assert_eq!(
        tat(&get(&k)) - tat(&first),
        3 * 3_600_000,
        "three more units charged"
    );
    assert_eq!(encoding(&k), "raw", "written over in place");
    assert_eq!(memory(&k), first_memory, "no spare room kept");
    assert!(int(server.command(&["PTTL", &k])) > 0);
    // A fixed window of 100 per hour: its count's text grows at the 10th
    // request ("9 …" to "10 …"); the answer and the stored count agree.
    let w = unique("in-place-window");
    let window = [
        "TOLLGATE.DECIDE",
        "1",
        w.as_str(),
        "",
        "",
        "3",
        "1",
        "100",
        "3600000000",
        "0",
    ];
    for n in 1..=12 {
        let Reply::Array(Some(reply)) = server.command(&window) else {
            panic!("no answer");
        };
        assert_eq!(int(reply[2].clone()), 100 - n, "remaining after {n}");
        let count = get(&w);
        assert_eq!(
            count.split(' ').next(),
            Some(n.to_string().as_str()),
            "{count:?}"
        );
    }
}

/// A concurrency limit's holder is written to a new key in the plain form
/// (before: embedded, which its release's read copied into a plain string
/// and swapped into the keyspace), and a release of the key's one holder
/// deletes it, while one naming another holder leaves it as it was.
#[test]
fn a_holder_is_written_plain_and_its_release_deletes_it() {
    let server = RedisServer::start_with_module(&[]);
    let k = unique("holder");
    let layer = ["7", "1", "10", "30000000", "0"];
    let mut acquire = vec!["TOLLGATE.DECIDE", "1", k.as_str(), "", ""];
    acquire.extend(layer);
    acquire.push("reserve");
    let Reply::Array(Some(reply)) = server.command(&acquire) else {
        panic!("no answer");
    };
    let at = int(reply[5].clone()).to_string();
    assert_eq!(text(server.command(&["GET", &k])), at);
    assert_eq!(text(server.command(&["OBJECT", "ENCODING", &k])), "raw");
    let release = |holder: &str| {
        let mut args = vec!["TOLLGATE.DECIDE", "1", k.as_str(), "", ""];
        args.extend(layer);
        args.extend([holder, "0", "refund"]);
        let Reply::Array(Some(reply)) = server.command(&args) else {
            panic!("no answer");
        };
        int(reply[0].clone())
    };
    let other = (int(reply[5].clone()) + 1).to_string();
    assert_eq!(release(&other), 0, "another holder's release gives nothing");
    assert_eq!(text(server.command(&["GET", &k])), at, "and keeps the key");
    assert_eq!(release(&at), 1);
    assert_eq!(
        int(server.command(&["EXISTS", &k])),
        0,
        "the last holder left"
    );
}

/// A sliding window's reward of more units than its limit takes from the
/// current window, then from the previous one, which may hold up to the
/// limit too: the module capped the units at the limit, and left 3 units
/// of the previous window that the Lua code and the reference take.
#[tokio::test]
async fn a_sliding_windows_large_reward_is_answered_alike() {
    let server = RedisServer::shared_with_module();
    server_clock_store(server.url(), &unique("p"), Engine::Functions).await;
    let function = tollgate_redis::function_name();
    let hour: u64 = 3_600_000_000;
    let t0 = START.as_micros() / hour * hour;
    let later = (t0 + hour + hour * 9 / 10).to_string();
    let (t0, hour) = (t0.to_string(), hour.to_string());
    let mut answers = Vec::new();
    for head in [vec!["TOLLGATE.DECIDE"], vec!["FCALL", function]] {
        let key = unique("sw");
        let call = |now: &str, cost: &str, mode: &[&str]| {
            let mut all: Vec<&str> = head.clone();
            all.extend_from_slice(&["1", &key, now, "", "4", cost, "10", &hour, "0"]);
            all.extend_from_slice(mode);
            server.command(&all)
        };
        call(&t0, "10", &[]);
        // 10 in the previous window, 3 in this one.
        let Reply::Array(Some(admitted)) = call(&later, "3", &[]) else {
            panic!("{head:?}: a decision's answer")
        };
        assert_eq!(admitted[0], Reply::Int(1), "{head:?}: admitted");
        let rewarded = call(&later, "15", &["reward"]);
        answers.push((rewarded, text(server.command(&["GET", &key]))));
    }
    assert_eq!(answers[0], answers[1], "the module, then the Lua code");
}

/// Calls the store never sends, answered alike by the module and the Lua
/// code: a block whose length differs between layers is refused, and a
/// log's reward of no units changes nothing, not even the key's expiry.
#[tokio::test]
async fn hand_written_adjustments_are_answered_alike() {
    let server = RedisServer::shared_with_module();
    // A store of the function library loads it on this server.
    server_clock_store(server.url(), &unique("p"), Engine::Functions).await;
    let function = tollgate_redis::function_name();
    let hour = "3600000000";
    let t0 = START.as_micros();
    let half_hour_later = (t0 + 1_800_000_000).to_string();
    let t0 = t0.to_string();
    for head in [vec!["TOLLGATE.DECIDE"], vec!["FCALL", function]] {
        let call = |args: &[&str]| {
            let mut all: Vec<&str> = head.clone();
            all.extend_from_slice(args);
            server.command(&all)
        };
        let (a, b) = (unique("block"), unique("block"));
        let two_lengths = call(&[
            "2", &a, &b, "", "", "1", "5000", "10", "10", hour, "1", "6000", "10", "10", hour,
            "block",
        ]);
        match two_lengths {
            Reply::Error(e) => assert!(
                e.starts_with("TOLLGATE_ARGS a block's length must be the same"),
                "{head:?}: {e}"
            ),
            other => panic!("{head:?}: {other:?}"),
        }
        assert_eq!(int(server.command(&["EXISTS", &a, &b])), 0, "{head:?}");
        let log = unique("log");
        call(&["1", &log, &t0, "", "5", "1", "10", hour, "0"]);
        let entries = server.command(&["LRANGE", &log, "0", "-1"]);
        let expires = int(server.command(&["PEXPIRETIME", &log]));
        let rewarded = call(&[
            "1",
            &log,
            &half_hour_later,
            "",
            "5",
            "0",
            "10",
            hour,
            "0",
            "reward",
        ]);
        assert!(
            matches!(rewarded, Reply::Array(Some(_))),
            "{head:?}: {rewarded:?}"
        );
        assert_eq!(
            server.command(&["LRANGE", &log, "0", "-1"]),
            entries,
            "{head:?}"
        );
        assert_eq!(
            int(server.command(&["PEXPIRETIME", &log])),
            expires,
            "{head:?}: a reward of nothing keeps the expiry"
        );
    }
}

#[tokio::test]
async fn a_store_uses_the_module_only_where_it_is_loaded() {
    let clock = ManualClock::new(START);
    let with = common::store_at(
        RedisServer::shared_with_module().url(),
        clock.clone(),
        ConnectionMode::Multiplexed,
    )
    .await;
    assert!(with.settings().uses_module());
    let without = common::store_at(
        RedisServer::shared().url(),
        clock.clone(),
        ConnectionMode::Multiplexed,
    )
    .await;
    assert!(!without.settings().uses_module() && without.settings().uses_functions());
    // Asked for the module where there is none: a clear error at connect.
    let refused = RedisStore::builder(RedisServer::shared().url())
        .prefix(unique("t"))
        .engine(Engine::Module)
        .connect()
        .await
        .expect_err("no module");
    assert!(
        matches!(
            RedisStoreError::of(&refused),
            Some(RedisStoreError::NoModule(_))
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("MODULE LOAD"), "{refused}");
}

/// Both paths read and write the same states: a subject charged by the
/// module, then by the function library on the same server, then by the
/// module again, is charged exactly as by one path, and the stored bytes
/// are the same.
#[tokio::test]
async fn the_module_and_the_function_library_share_states() {
    let server = RedisServer::start_with_module(&[]);
    let url = server.url().to_string();
    let clock = ManualClock::new(START);
    let prefix = unique("mix");
    let store = |engine| {
        let clock = clock.clone();
        let prefix = prefix.clone();
        let url = url.clone();
        async move {
            RedisStore::builder(url)
                .prefix(prefix)
                .clock(Arc::new(clock) as Arc<dyn Clock>)
                .engine(engine)
                .connect()
                .await
                .expect("connect")
        }
    };
    let module = store(Engine::Module).await;
    let lua = store(Engine::Functions).await;
    let policies = policies();
    let subject = unique("s");
    let mut admitted = 0;
    for i in 0..60 {
        let by: &RedisStore = if (i / 7) % 2 == 0 { &module } else { &lua };
        if admits(by, &policies, &subject, 1).await {
            admitted += 1;
        }
        clock.advance(Duration::from_millis(10));
    }
    assert_eq!(admitted, 50, "one budget of 50 across both paths");
    // Peeks agree on every layer, whichever path answers.
    let a = module.peek(&layers(&policies, &subject, 1)).await.unwrap();
    let b = lua.peek(&layers(&policies, &subject, 1)).await.unwrap();
    assert_eq!(a.iter().collect::<Vec<_>>(), b.iter().collect::<Vec<_>>());
}

/// A module unloaded under a running store: the store finds out at its
/// next call, goes on with the function library and loses nothing.
#[tokio::test]
async fn a_store_goes_on_without_a_module_that_went_away() {
    let server = RedisServer::start_with_module(&["--enable-module-command", "yes"]);
    let clock = ManualClock::new(START);
    let store = common::store_at(server.url(), clock.clone(), ConnectionMode::Multiplexed).await;
    assert!(store.settings().uses_module());
    let policies = policies();
    let subject = unique("s");
    let mut admitted = 0;
    for i in 0..60 {
        if i == 20 {
            assert_eq!(
                server.command(&["MODULE", "UNLOAD", "tollgate"]),
                Reply::Status("OK".into())
            );
        }
        admitted += usize::from(admits(&store, &policies, &subject, 1).await);
    }
    assert!(!store.settings().uses_module() && store.settings().uses_functions());
    assert_eq!(admitted, 50);
}

/// Decisions at the server's clock, replicated as their effects: the
/// replica (which has no module) holds every state byte for byte with the
/// same absolute expiry, and so does a server replaying the AOF.
#[tokio::test]
async fn replicas_and_the_aof_hold_the_primarys_states() {
    let primary = RedisServer::start_with_module(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--enable-debug-command",
        "yes",
    ]);
    let replica = replica_of(&primary);
    let prefix = unique("repl");
    let store = server_clock_store(primary.url(), &prefix, Engine::Module).await;
    let policies = policies();
    let subjects: Vec<String> = (0..5).map(|_| unique("s")).collect();
    for subject in &subjects {
        for cost in [1, 3, 2] {
            tollgate_limiter::ask(&store, &layers(&policies, subject, cost))
                .await
                .expect("decide");
        }
        // The sliding log alone: a one-layer call, decided on the list
        // entries it reads (`list_log.rs`), its writes replicated alike.
        tollgate_limiter::ask(&store, &layers(&policies[4..], subject, 2))
            .await
            .expect("decide");
    }
    let blocked = &subjects[0];
    store
        .adjust(
            &layers(&policies[..1], blocked, 1),
            tollgate_limiter::Adjustment::Block(Duration::from_secs(90)),
        )
        .await
        .expect("block");
    caught_up(&primary, &replica);
    let keys = match primary.command(&["KEYS", &format!("{prefix}:*")]) {
        Reply::Array(Some(keys)) => keys.into_iter().map(text).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(keys.len(), subjects.len() * policies.len());
    let snapshot = |server: &RedisServer| -> Vec<(String, String, i64)> {
        let mut all: Vec<(String, String, i64)> = keys
            .iter()
            .map(|k| {
                let value = match text(server.command(&["TYPE", k])).as_str() {
                    "list" => format!("{:?}", server.command(&["LRANGE", k, "0", "-1"])),
                    "string" => text(server.command(&["GET", k])),
                    other => panic!("{k} is a {other} on port {}", server.port()),
                };
                (k.clone(), value, int(server.command(&["PEXPIRETIME", k])))
            })
            .collect();
        all.sort();
        all
    };
    let on_primary = snapshot(&primary);
    assert!(
        on_primary.iter().all(|(_, _, at)| *at > 0),
        "every state has a TTL"
    );
    assert_eq!(
        snapshot(&replica),
        on_primary,
        "the replica holds the primary's states"
    );
    // Reloaded from its AOF (the effects as appended), the primary holds
    // the same; and after the AOF is rewritten.
    assert_eq!(
        primary.command(&["DEBUG", "LOADAOF"]),
        Reply::Status("OK".into())
    );
    assert_eq!(snapshot(&primary), on_primary, "the AOF replays the states");
    primary.command(&["BGREWRITEAOF"]);
    for _ in 0..500 {
        let info = text(primary.command(&["INFO", "persistence"]));
        if info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        primary.command(&["DEBUG", "LOADAOF"]),
        Reply::Status("OK".into())
    );
    assert_eq!(
        snapshot(&primary),
        on_primary,
        "the rewritten AOF holds the states"
    );
    // DEBUG RELOAD (save and load the RDB) keeps them too.
    primary.command(&["DEBUG", "RELOAD"]);
    assert_eq!(snapshot(&primary), on_primary);
}

/// A request for one place of `policy` for `subject`.
fn one_place<'a>(policy: &'a Policy, subject: &'a str) -> LayerRequest<'a> {
    LayerRequest {
        key: StoreKey::new(subject, policy, "s", subject),
        policy,
        cost: 1,
    }
}

/// A release replicates what it did: keys it emptied go on the replica
/// too (one `DEL` for a call's emptied keys), and a key that keeps a
/// holder holds the same holders and expiry there.
#[tokio::test]
async fn releases_are_replicated_as_their_effects() {
    let primary = RedisServer::start_with_module(&[]);
    let replica = replica_of(&primary);
    let store = server_clock_store(primary.url(), &unique("release-repl"), Engine::Module).await;
    let in_flight = Policy::new(
        "in-flight",
        Limit::concurrency(10, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let subjects: Vec<String> = (0..3).map(|_| unique("s")).collect();
    // The second subject holds two places, the others one.
    let mut holds = Vec::new();
    for (i, subject) in subjects.iter().enumerate() {
        for _ in 0..=(i % 2) {
            let (verdicts, held) = store
                .acquire(&[one_place(&in_flight, subject)])
                .await
                .expect("acquire");
            assert!(verdicts[0].allowed);
            holds.push((subject.clone(), held[0].expect("a hold")));
        }
    }
    // One call releases a place of each subject: the first and the last
    // subjects' keys are emptied, the second keeps one holder.
    let first_of_each: Vec<_> = subjects
        .iter()
        .map(|s| holds.iter().find(|(h, _)| h == s).expect("held").clone())
        .collect();
    let layers: Vec<LayerRequest<'_>> = first_of_each
        .iter()
        .map(|(s, _)| one_place(&in_flight, s))
        .collect();
    let released: Vec<_> = first_of_each.iter().map(|(_, hold)| *hold).collect();
    store.release(&layers, &released).await.expect("release");
    caught_up(&primary, &replica);
    let state = |server: &RedisServer, subject: &str| -> Option<(String, i64)> {
        let key = store
            .settings()
            .redis_key(&one_place(&in_flight, subject).key);
        match server.command(&["GET", &key]) {
            Reply::Bulk(None) => None,
            value => Some((text(value), int(server.command(&["PEXPIRETIME", &key])))),
        }
    };
    for (i, subject) in subjects.iter().enumerate() {
        let on_primary = state(&primary, subject);
        assert_eq!(on_primary.is_some(), i == 1, "subject {i} on the primary");
        assert_eq!(
            state(&replica, subject),
            on_primary,
            "subject {i} on the replica"
        );
    }
}

/// A release from a long list of holders removes its entries where they
/// are (`LREM`), replicated as such: before, the list was written whole
/// (`DEL`, then every holder pushed again), some 17 bytes per holder sent
/// to every replica and the AOF at each release. The replica holds the
/// same holders.
#[tokio::test]
async fn a_release_from_a_long_list_is_replicated_as_the_removal() {
    let primary = RedisServer::start_with_module(&[]);
    let replica = replica_of(&primary);
    let store = server_clock_store(primary.url(), &unique("lrem"), Engine::Module).await;
    let in_flight = Policy::new(
        "in-flight",
        Limit::concurrency(500, Duration::from_secs(3600)).unwrap(),
    )
    .unwrap();
    let subject = unique("s");
    let mut holds = Vec::new();
    for _ in 0..200 {
        let (verdicts, held) = store
            .acquire(&[one_place(&in_flight, &subject)])
            .await
            .expect("acquire");
        assert!(verdicts[0].allowed);
        holds.push(held[0].expect("a hold"));
    }
    let offset = |server: &RedisServer| info_number(server, "replication", "master_repl_offset");
    let before = offset(&primary);
    store
        .release(&[one_place(&in_flight, &subject)], &[holds[100]])
        .await
        .expect("release");
    let sent = offset(&primary) - before;
    assert!(sent < 1_000, "{sent} bytes replicated for one release");
    caught_up(&primary, &replica);
    let key = store
        .settings()
        .redis_key(&one_place(&in_flight, &subject).key);
    let items = |server: &RedisServer| server.command(&["LRANGE", &key, "0", "-1"]);
    assert_eq!(items(&replica), items(&primary));
    assert_eq!(int(primary.command(&["LLEN", &key])), 199);
}

/// A block on a sliding log that has no key yet is written as a new list:
/// nothing deleted, so no `DEL` reaches the replica (a client's `DEL` of a
/// missing key replicates nothing either); the replica holds the block.
#[tokio::test]
async fn a_block_on_a_new_log_replicates_no_delete() {
    let primary = RedisServer::start_with_module(&[]);
    let replica = replica_of(&primary);
    let store = server_clock_store(primary.url(), &unique("nodel"), Engine::Module).await;
    let log = Policy::new(
        "log",
        Limit::sliding_log(5, Duration::from_secs(60)).unwrap(),
    )
    .unwrap();
    let subject = unique("s");
    // `DEL`s the replica ran (the store's connection probes run some).
    let deletes = || {
        caught_up(&primary, &replica);
        let stats = text(replica.command(&["INFO", "commandstats"]));
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_del:calls="))
            .map_or(0, |rest| {
                rest.split(',').next().unwrap().parse::<u64>().unwrap()
            })
    };
    let before = deletes();
    store
        .adjust(
            &[one_place(&log, &subject)],
            tollgate_limiter::Adjustment::Block(Duration::from_secs(90)),
        )
        .await
        .expect("block");
    assert_eq!(deletes(), before, "no DEL replicated");
    let key = store.settings().redis_key(&one_place(&log, &subject).key);
    let items = |server: &RedisServer| server.command(&["LRANGE", &key, "0", "-1"]);
    assert_eq!(items(&replica), items(&primary));
}

/// A failover to a replica without the module: the promoted replica holds
/// what the primary's module wrote, and a store connected to it decides
/// on with the function library from exactly where the module left off.
#[tokio::test]
async fn a_replica_promoted_without_the_module_decides_on_from_the_same_states() {
    let primary = RedisServer::start_with_module(&[]);
    let replica = replica_of(&primary);
    let prefix = unique("failover");
    let before = server_clock_store(primary.url(), &prefix, Engine::Auto).await;
    assert!(before.settings().uses_module());
    let policies = policies();
    let subject = unique("s");
    // 30 of every layer's 50 spent through the module.
    for _ in 0..10 {
        assert!(admits(&before, &policies, &subject, 3).await);
    }
    caught_up(&primary, &replica);
    primary.kill();
    assert_eq!(
        replica.command(&["REPLICAOF", "NO", "ONE"]),
        Reply::Status("OK".into())
    );
    let after = server_clock_store(replica.url(), &prefix, Engine::Auto).await;
    assert!(
        !after.settings().uses_module(),
        "the promoted replica has no module"
    );
    let mut admitted = 0;
    for _ in 0..30 {
        if admits(&after, &policies, &subject, 1).await {
            admitted += 1;
        }
    }
    // Every layer had 20 left. The token bucket and GCRA refill a unit in
    // minutes, not the seconds this takes; the sliding log's entries stay
    // for their hour, so all five layers admit exactly 20 more, together.
    assert_eq!(admitted, 20);
}

/// A store built with `Engine::Module` keeps exact admission under
/// concurrency on one key (the conformance suite runs it on every
/// algorithm; this is the plain case at the server's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_admit_exactly_the_capacity() {
    let store = Arc::new(
        server_clock_store(
            RedisServer::shared_with_module().url(),
            &unique("c"),
            Engine::Module,
        )
        .await,
    );
    let policy = Arc::new(
        Policy::new(
            "c",
            Limit::gcra(100, Duration::from_secs(3600), 100).unwrap(),
        )
        .unwrap(),
    );
    let subject = Arc::new(unique("s"));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (store, policy, subject) = (store.clone(), policy.clone(), subject.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..4 {
                let layer = LayerRequest {
                    key: StoreKey::new(&subject, &policy, "s", &subject),
                    policy: &policy,
                    cost: 1,
                };
                admitted += usize::from(
                    tollgate_limiter::ask(&*store, &[layer])
                        .await
                        .unwrap()
                        .iter()
                        .all(|v| v.allowed),
                );
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert_eq!(admitted, 100);
}

/// At the server's `TIME` (the default), a calendar span the caller sent
/// that has ended on the server's clock — the caller's clock behind —
/// admits nothing and writes nothing, on the module and on the Lua: its
/// count would expire at once and start again, admitting the limit every
/// few milliseconds for as long as the caller lags.
#[tokio::test]
async fn a_span_ended_at_the_servers_clock_admits_nothing() {
    let now = SystemClock.now().as_micros();
    let day = 86_400_000_000;
    let ended = tollgate_limiter::Calendar::span(5, now - 2 * day, now - day).unwrap();
    let policy = Policy::new("ended", Limit::Calendar(ended)).unwrap();
    for engine in [Engine::Module, Engine::Functions] {
        let server = RedisServer::shared_with_module();
        let prefix = unique("ended");
        let store = RedisStore::builder(server.url())
            .prefix(&prefix)
            .engine(engine)
            .connect()
            .await
            .expect("connect");
        let layer = || {
            vec![LayerRequest {
                key: StoreKey::new("s", &policy, "s", "s"),
                policy: &policy,
                cost: 1,
            }]
        };
        for _ in 0..3 {
            let verdicts = tollgate_limiter::ask(&store, &layer())
                .await
                .expect("decides");
            let verdict = verdicts.iter().next().expect("one layer");
            assert!(!verdict.allowed, "{engine:?}");
            assert_eq!(
                verdict.retry_after,
                Some(tollgate_limiter::CALENDAR_ENDED_RETRY)
            );
        }
        let keys = server.command(&["KEYS", &format!("{prefix}:*")]);
        assert_eq!(
            keys,
            Reply::Array(Some(vec![])),
            "{engine:?}: nothing written"
        );
    }
}

/// The keyspace events one decision's write fires, on `engine`: what a
/// subscriber to `__keyspace@0__:*` receives for the key of `prefix`.
/// The keyspace events of two decisions of `policies()[which]` alone.
async fn events_of_a_decision(server: &RedisServer, engine: Engine, which: usize) -> Vec<String> {
    let prefix = unique("events");
    // Connected first: connecting checks the server (its own writes).
    let store = server_clock_store(server.url(), &prefix, engine).await;
    assert_eq!(store.settings().uses_module(), engine == Engine::Module);
    let client = redis::Client::open(server.url()).expect("url");
    let mut con = client.get_connection().expect("connect");
    let mut pubsub = con.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").expect("psubscribe");
    pubsub
        .set_read_timeout(Some(Duration::from_millis(500)))
        .expect("timeout");
    let policies = policies();
    for _ in 0..2 {
        tollgate_limiter::ask(&store, &layers(&policies[which..=which], "s", 1))
            .await
            .expect("decide");
    }
    let mut events = Vec::new();
    // Events arrive in order; the read times out once they are all in.
    while let Ok(message) = pubsub.get_message() {
        if message.get_channel_name().contains(&prefix) {
            events.push(message.get_payload::<String>().expect("an event name"));
        }
    }
    events
}

/// The module writes through the key API, not through `SET` or `RPUSH`:
/// it fires the events a script's `SET … PX` (a counter) and `RPUSH` then
/// `PEXPIRE` (a sliding log) fire, in the same order.
#[tokio::test]
async fn a_decision_fires_the_keyspace_events_of_a_set() {
    let server = RedisServer::start_with_module(&["--notify-keyspace-events", "KEA"]);
    // The token bucket's policy, then the sliding log's.
    for (which, written) in [(0, "set"), (4, "rpush")] {
        let module = events_of_a_decision(&server, Engine::Module, which).await;
        let functions = events_of_a_decision(&server, Engine::Functions, which).await;
        assert_eq!(
            functions,
            [written, "expire", written, "expire"],
            "the Lua path's"
        );
        assert_eq!(module, functions, "{written}");
    }
}
