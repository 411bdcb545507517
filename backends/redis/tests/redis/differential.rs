//! The Lua scripts — and Tollgate's native module — against the Rust
//! reference, bit for bit.
//!
//! Random policies and long random sequences of operations (time steps of
//! 0, sub-millisecond, fractions of the window, long idles, and backward
//! steps; costs from 1 to the capacity) run through the script on a real
//! redis-server and through `tollgate_algorithms::decide` on a Rust-side
//! state. At every step the verdicts must be identical, the stored state
//! must be the Rust state in its Redis encoding, and the TTL the script set
//! must be the Rust TTL (to the millisecond the Redis clock allows).
//!
//! Each step runs in one round trip: `TIME`, then in `MULTI`/`EXEC` the
//! script, `PEXPIRETIME` and `PERSIST` of every key, the state reads and
//! `TIME` again. `PERSIST` removes the TTL right after reading it, so Redis
//! never expires a key on its own wall clock while the manual clock of the
//! test says it is still live: both sides keep state until the algorithm
//! replaces it (the TTL itself is checked, not waited for). The two `TIME`s
//! bracket the instant the script's `PEXPIRE` counted from.
//!
//! Every way a server decides runs it: the function library (three
//! sequences per algorithm and layered cases), the script form and the
//! module (one sequence per algorithm each; the module's layered cases too).

use crate::common;

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use redis::aio::MultiplexedConnection;
use redis::Value;
use tollgate_limiter::{
    duration_micros, Calendar, CalendarUnit, LayerRequest, Layout, Limit, Policy, Recurrence,
    State, StoreKey, Timestamp, Verdict, MAX_EXACT, MAX_RECOVERY,
};
use tollgate_redis::script::{layer_args, parse_reply};
use tollgate_testkit::conformance::{unique, START};
use tollgate_testkit::redis_server::RedisServer;

/// Log entries compared one by one (longer logs: length, ends and this many
/// oldest entries).
const LOG_COMPARED: usize = 256;

/// A time step, resolved against the policy's time scale.
#[derive(Debug, Clone)]
enum Step {
    Same,
    Micros(u64),
    Millis(u64),
    /// Thousandths of the scale.
    Fraction(u64),
    /// Past the scale by this many percent.
    Idle(u64),
    /// Back by thousandths of the scale, plus a few microseconds.
    Back(u64, u64),
}

#[derive(Debug, Clone)]
enum Cost {
    One,
    Full,
    /// 1 + this modulo the capacity.
    Any(u64),
}

#[derive(Debug, Clone)]
struct Op {
    step: Step,
    cost: Cost,
    /// A change of plan before the step (runs with plans: the plan this
    /// modulo their number).
    plan: Option<u8>,
}

fn op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![
        15 => Just(Step::Same),
        25 => (1u64..1_000).prop_map(Step::Micros),
        10 => (1u64..50).prop_map(Step::Millis),
        35 => (1u64..=1_000).prop_map(Step::Fraction),
        5 => (0u64..300).prop_map(Step::Idle),
        10 => ((1u64..=1_500), (0u64..1_000)).prop_map(|(f, us)| Step::Back(f, us)),
    ];
    let cost = prop_oneof![
        6 => Just(Cost::One),
        1 => Just(Cost::Full),
        3 => any::<u64>().prop_map(Cost::Any),
    ];
    let plan = prop_oneof![49 => Just(None), 1 => any::<u8>().prop_map(Some)];
    (step, cost, plan).prop_map(|(step, cost, plan)| Op { step, cost, plan })
}

fn ops(n: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), n)
}

/// A period or window: a millisecond, a second, or anything between 1 ms
/// and 10 s (odd values stress the rounding).
fn period() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_000u64), Just(1_000_000u64), 1_000u64..=10_000_000,]
}

fn token_bucket() -> impl Strategy<Value = Limit> {
    let small = (1u64..=50, 1u64..=100, period()).prop_map(|(capacity, refill, p)| {
        Limit::token_bucket(capacity, refill, Duration::from_micros(p)).expect("valid")
    });
    // Near the 2^53 bound: the largest capacity the period allows, and a
    // refill fast enough to stay within MAX_RECOVERY.
    let big = (period(), any::<u64>(), any::<u64>()).prop_map(|(p, c, r)| {
        let max_capacity = (MAX_EXACT / p).min(1_000_000_000);
        let capacity = max_capacity - c % (max_capacity / 10 + 1);
        let min_refill = (capacity * p)
            .div_ceil(duration_micros(MAX_RECOVERY))
            .max(1);
        let refill = min_refill + r % (1_000_000_000 - min_refill + 1);
        Limit::token_bucket(capacity, refill, Duration::from_micros(p)).expect("valid")
    });
    prop_oneof![3 => small, 1 => big]
}

fn gcra() -> impl Strategy<Value = Limit> {
    let small = (1u64..=100, period(), 1u64..=50).prop_map(|(rate, p, burst)| {
        Limit::gcra(rate.min(p), Duration::from_micros(p), burst).expect("valid")
    });
    let big =
        (period(), 1u64..=1_000_000_000, 1u64..=1_000_000_000).prop_map(|(p, rate, burst)| {
            let rate = rate.min(p);
            let interval = p.div_ceil(rate);
            let burst = burst.min(duration_micros(MAX_RECOVERY) / interval).max(1);
            Limit::gcra(rate, Duration::from_micros(p), burst).expect("valid")
        });
    prop_oneof![3 => small, 1 => big]
}

fn fixed_window() -> impl Strategy<Value = Limit> {
    // Up to a year's quota: windows whose ends lie far past the run.
    let quota = 1_000_000u64..=duration_micros(tollgate_limiter::MAX_QUOTA_WINDOW);
    prop_oneof![
        3 => (1u64..=50, period()),
        1 => (1u64..=1_000_000_000, period()),
        1 => (1u64..=1_000_000_000, quota),
    ]
    .prop_map(|(limit, w)| Limit::fixed_window(limit, Duration::from_micros(w)).expect("valid"))
}

fn sliding_window() -> impl Strategy<Value = Limit> {
    let small = (1u64..=50, period()).prop_map(|(limit, w)| {
        Limit::sliding_window(limit, Duration::from_micros(w)).expect("valid")
    });
    // limit × window close to 2^53, where a sum of two such products no
    // longer fits a double exactly.
    let big = (period(), any::<u64>()).prop_map(|(w, l)| {
        let max_limit = (MAX_EXACT / w).min(1_000_000_000);
        let limit = max_limit - l % (max_limit / 10 + 1);
        Limit::sliding_window(limit, Duration::from_micros(w)).expect("valid")
    });
    prop_oneof![3 => small, 1 => big]
}

fn sliding_log() -> impl Strategy<Value = Limit> {
    prop_oneof![
        3 => (1u64..=50, period()),
        // Longer than the script reads whole (binary search with LINDEX),
        // and costs above its RPUSH chunk.
        1 => (65u64..=3_000, period()),
    ]
    .prop_map(|(limit, w)| Limit::sliding_log(limit, Duration::from_micros(w)).expect("valid"))
}

/// Calendar quotas: any unit, in zones with daylight-saving changes of
/// an hour and of 30 minutes, an offset of +05:45 and UTC, from anchors
/// at odd times and on the 29th to 31st (spans that start on a shorter
/// month's last day).
fn calendar() -> impl Strategy<Value = Limit> {
    let unit = prop_oneof![
        Just(CalendarUnit::Day),
        Just(CalendarUnit::Week),
        Just(CalendarUnit::Month),
        Just(CalendarUnit::Year),
    ];
    let zone = prop_oneof![
        Just("UTC"),
        Just("Europe/Berlin"),
        Just("America/New_York"),
        Just("Australia/Lord_Howe"),
        Just("Asia/Kathmandu"),
    ];
    let limit = prop_oneof![3 => 1u64..=50, 1 => 1u64..=1_000_000_000];
    let anchor = (
        2019i32..=2025,
        1u32..=12,
        1u32..=31,
        0u32..24,
        prop_oneof![Just(0u32), Just(30), 0u32..60],
    );
    let every =
        (limit.clone(), unit, zone, anchor).prop_map(|(limit, unit, zone, (y, m, d, h, min))| {
            let february = if y % 4 == 0 { 29 } else { 28 };
            let d = d.min(if m == 2 {
                february
            } else {
                30 + (m + m / 8) % 2
            });
            let from = format!("{y}-{m:02}-{d:02}T{h:02}:{min:02}");
            let every = Recurrence::new(unit, zone, &from).expect("valid");
            Limit::calendar(limit, every).expect("valid")
        });
    prop_oneof![4 => every, 1 => calendar_span()]
}

/// One calendar span as a store receives it, around the run's start: the
/// run's clock passes its end (a span ended at the store's clock admits
/// nothing) and steps back before its start.
fn calendar_span() -> impl Strategy<Value = Limit> {
    let day = 86_400_000_000u64;
    let limit = prop_oneof![3 => 1u64..=50, 1 => 1u64..=1_000_000_000];
    (limit, 0..day, 1_000..2 * day).prop_map(|(limit, before, length)| {
        let start = START.as_micros() - before;
        Limit::Calendar(Calendar::span(limit, start, start + length).expect("valid"))
    })
}

/// The time scale of a policy: its period, window, or burst × interval.
fn scale(limit: &Limit) -> u64 {
    common::time_scale(limit)
}

/// What the differential run compares after a step, for one key.
struct Observed {
    expire_ms: i64,
    state: ObservedState,
}

enum ObservedState {
    Cells(Option<String>),
    Log {
        len: usize,
        first: Option<u64>,
        last: Option<u64>,
        head: Vec<u64>,
    },
}

/// How the server decides: the Lua as a function or as a script, or the
/// module's command on a server that loaded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// The function library (`FCALL`), as the stores run it on Redis 7.
    Functions,
    /// The script form (`EVALSHA`), as on Redis 6.2.
    Script,
    /// Tollgate's native module (`TOLLGATE.DECIDE`).
    Module,
}

struct Harness {
    path: Path,
    con: MultiplexedConnection,
    keys: Vec<String>,
    policies: Vec<Policy>,
    /// The script's digest on the `Script` path.
    sha: String,
}

impl Harness {
    async fn new(limits: Vec<Limit>, path: Path) -> Harness {
        let mut con = match path {
            Path::Functions | Path::Script => common::raw(RedisServer::shared().url()).await,
            Path::Module => common::raw(RedisServer::shared_with_module().url()).await,
        };
        let mut sha = String::new();
        if path == Path::Script {
            sha = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(tollgate_redis::eval_script())
                .query_async(&mut con)
                .await
                .expect("SCRIPT LOAD");
        }
        if path == Path::Functions {
            let loaded: String = redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(tollgate_redis::function_library())
                .query_async(&mut con)
                .await
                .expect("FUNCTION LOAD");
            assert_eq!(loaded, tollgate_redis::library_name());
        }
        let prefix = unique("diff");
        let policies: Vec<Policy> = limits
            .into_iter()
            .enumerate()
            .map(|(i, l)| Policy::new(format!("p{i}"), l).expect("valid"))
            .collect();
        let keys = policies
            .iter()
            .map(|p| format!("{prefix}:{}", StoreKey::new("diff", p, "subject", "s")))
            .collect();
        Harness {
            path,
            con,
            keys,
            policies,
            sha,
        }
    }

    /// Decide with `limits` from now on (a change of plan): the same
    /// policies, so the same keys.
    fn set_limits(&mut self, limits: &[Limit]) {
        self.policies = limits
            .iter()
            .enumerate()
            .map(|(i, l)| Policy::new(format!("p{i}"), l.clone()).expect("valid"))
            .collect();
    }

    /// Run the script for `costs` at `now`; return its verdicts, what each
    /// key looks like afterwards, and the server's time before and after (µs).
    async fn step(&mut self, now: u64, costs: &[u64]) -> (Vec<Verdict>, Vec<Observed>, u64, u64) {
        let mut eval = match self.path {
            Path::Functions => {
                let mut fcall = redis::cmd("FCALL");
                fcall.arg(tollgate_redis::function_name());
                fcall
            }
            Path::Script => {
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha.arg(&self.sha);
                evalsha
            }
            Path::Module => redis::cmd("TOLLGATE.DECIDE"),
        };
        eval.arg(self.keys.len());
        for key in &self.keys {
            eval.arg(key);
        }
        eval.arg(now).arg("");
        for (policy, &cost) in self.policies.iter().zip(costs) {
            let key = StoreKey::new("diff", policy, "subject", "s");
            let layer = LayerRequest { key, policy, cost };
            for a in layer_args(&layer, Timestamp::from_micros(now)).expect("built-in algorithm") {
                eval.arg(a);
            }
        }
        let mut pipe = redis::pipe();
        pipe.cmd("TIME").cmd("MULTI").add_command(eval);
        for key in &self.keys {
            pipe.cmd("PEXPIRETIME").arg(key);
        }
        for key in &self.keys {
            pipe.cmd("PERSIST").arg(key);
        }
        for (key, policy) in self.keys.iter().zip(&self.policies) {
            if matches!(policy.limit(), Limit::SlidingLog(_)) {
                pipe.cmd("LLEN").arg(key);
                pipe.cmd("LINDEX").arg(key).arg(0);
                pipe.cmd("LINDEX").arg(key).arg(-1);
                pipe.cmd("LRANGE").arg(key).arg(0).arg(LOG_COMPARED - 1);
            } else {
                pipe.cmd("GET").arg(key);
            }
        }
        // TIME after EXEC, outside the transaction: an upper bound of the
        // write's clock on every server (Valkey answers TIME inside a
        // transaction from the time the transaction started, and the
        // module reads the clock when it writes).
        pipe.cmd("TIME").cmd("EXEC").cmd("TIME");
        let replies: Vec<Value> = match pipe.query_async(&mut self.con).await {
            Ok(r) => r,
            Err(e) => panic!(
                "pipeline: {e}: {:?}",
                String::from_utf8_lossy(&pipe.get_packed_pipeline())
            ),
        };
        let before = server_time(&replies[0]);
        let after = server_time(replies.last().expect("the last TIME"));
        let exec = &replies[replies.len() - 2];
        let Value::Array(results) = exec else {
            panic!("EXEC answered {exec:?}");
        };
        let mut results = results.iter();
        let reply: Vec<i64> = redis::from_redis_value_ref(results.next().expect("script reply"))
            .unwrap_or_else(|e| panic!("script reply: {e}"));
        let verdicts = parse_reply(&reply, self.keys.len()).expect("well-formed reply");
        let n = self.keys.len();
        let expires: Vec<i64> = (0..n).map(|_| int(results.next())).collect();
        for _ in 0..n {
            results.next(); // PERSIST
        }
        let mut observed = Vec::with_capacity(n);
        for (policy, expire_ms) in self.policies.iter().zip(expires) {
            let state = if matches!(policy.limit(), Limit::SlidingLog(_)) {
                let len = int(results.next()) as usize;
                let first = stamp(results.next());
                let last = stamp(results.next());
                let head: Vec<String> =
                    redis::from_redis_value_ref(results.next().expect("LRANGE")).expect("LRANGE");
                ObservedState::Log {
                    len,
                    first,
                    last,
                    head: head.iter().map(|s| s.parse().expect("µs")).collect(),
                }
            } else {
                let v: Option<String> =
                    redis::from_redis_value_ref(results.next().expect("GET")).expect("GET");
                ObservedState::Cells(v)
            };
            observed.push(Observed { expire_ms, state });
        }
        results.next().expect("TIME"); // inside the transaction
        (verdicts.to_vec(), observed, before, after)
    }
}

fn int(v: Option<&Value>) -> i64 {
    redis::from_redis_value_ref(v.expect("a reply")).expect("an integer")
}

fn stamp(v: Option<&Value>) -> Option<u64> {
    let s: Option<String> = redis::from_redis_value_ref(v.expect("a reply")).expect("LINDEX");
    s.map(|s| s.parse().expect("µs"))
}

fn server_time(v: &Value) -> u64 {
    let (sec, usec): (u64, u64) = redis::from_redis_value_ref(v).expect("TIME");
    sec * 1_000_000 + usec
}

/// The Rust reference for a layered decision: every layer decided, all
/// charged only if all admit, admitting layers uncharged otherwise.
struct Model {
    states: Vec<Option<State>>,
}

/// Run `ops` through the script and the reference under the first of
/// `plans` (each a limit per layer, the same algorithms), changing plan
/// where an op says so; panic at the first difference, naming the step.
async fn differential(plans: Vec<Vec<Limit>>, ops: &[Op], path: Path) {
    let mut limits = plans[0].clone();
    let mut harness = Harness::new(limits.clone(), path).await;
    let mut model = Model {
        states: vec![None; limits.len()],
    };
    let scale = plans
        .iter()
        .flatten()
        .map(scale)
        .max()
        .expect("one layer at least");
    let mut now = START.as_micros();
    for (i, op) in ops.iter().enumerate() {
        if let (Some(p), true) = (op.plan, plans.len() > 1) {
            limits = plans[usize::from(p) % plans.len()].clone();
            harness.set_limits(&limits);
        }
        now = match op.step {
            Step::Same => now,
            Step::Micros(us) => now + us,
            Step::Millis(ms) => now + ms * 1_000,
            Step::Fraction(f) => now + (scale * f / 1_000).max(1),
            Step::Idle(pct) => now + scale + scale * pct / 100,
            Step::Back(f, us) => now.saturating_sub(scale * f / 1_000 + us),
        }
        // Stores decide only up to 2100 (a later time is refused before
        // any code runs): a run of year-long windows stops there.
        .min(Timestamp::LATEST.as_micros());
        let costs: Vec<u64> = limits
            .iter()
            .map(|l| match op.cost {
                Cost::One => 1,
                Cost::Full => l.capacity(),
                Cost::Any(r) => 1 + r % l.capacity(),
            })
            .collect();
        let transitions: Vec<_> = limits
            .iter()
            .zip(&model.states)
            .zip(&costs)
            .map(|((l, s), &c)| {
                tollgate_algorithms::decide(l, s.as_ref(), Timestamp::from_micros(now), c)
            })
            .collect();
        let all = transitions.iter().all(|t| t.verdict.allowed);
        let expected: Vec<Verdict> = transitions
            .iter()
            .zip(&costs)
            .map(|(t, &c)| {
                if all {
                    t.verdict
                } else {
                    t.verdict.uncharged(c)
                }
            })
            .collect();

        let (verdicts, observed, before, after) = harness.step(now, &costs).await;
        let context = || {
            format!(
                "step {i} of {}: now {now}, op {op:?}, costs {costs:?}, limits {limits:?}, states before {:?}",
                ops.len(),
                model.states
            )
        };
        assert_eq!(verdicts, expected, "verdicts differ at {}", context());

        let mut vanished = vec![false; limits.len()];
        for (layer, (t, seen)) in transitions.iter().zip(&observed).enumerate() {
            let expected_state = if all {
                let next = t.next.as_ref().expect("an admitted layer has a next state");
                // The script adds a millisecond to the reference TTL (Redis
                // counts from its clock truncated to the millisecond), and
                // its PEXPIRE counted from a millisecond between the two
                // TIME readings.
                let ttl_ms = next.ttl.as_millis() as i64 + 1;
                let lo = (before / 1_000) as i64 + ttl_ms;
                let hi = (after / 1_000) as i64 + ttl_ms;
                // A key of a millisecond's TTL may expire inside the
                // transaction on a loaded machine: right when the server's
                // clock had passed its earliest expiry, and then it is
                // absent to every later decision, as the reference's state
                // is once its TTL ran out.
                if seen.expire_ms == -2 && (after / 1_000) as i64 >= lo {
                    vanished[layer] = true;
                    continue;
                }
                assert!(
                    (lo..=hi).contains(&seen.expire_ms),
                    "layer {layer}: expiry at {} ms, Rust says {ttl_ms} ms (+1) from the server clock {before}..{after} µs, at {}",
                    seen.expire_ms,
                    context()
                );
                Some(&next.state)
            } else {
                // Nothing written: the TTL stays removed (or the key absent).
                let expect = if model.states[layer].is_some() {
                    -1
                } else {
                    -2
                };
                assert_eq!(
                    seen.expire_ms,
                    expect,
                    "layer {layer}: a denied request wrote a TTL at {}",
                    context()
                );
                model.states[layer].as_ref()
            };
            compare_state(&limits[layer], expected_state, &seen.state, layer, &context);
        }
        if all {
            for ((state, t), gone) in model.states.iter_mut().zip(transitions).zip(vanished) {
                *state = if gone { None } else { t.next.map(|n| n.state) };
            }
        }
    }
}

/// A counter state as the script stores it: the cells the algorithm uses
/// (GCRA two, the token bucket three, the fixed window two, the sliding
/// window and the calendar three), in decimal, separated by spaces,
/// trailing zeros after the time cell left out.
fn stored_text(limit: &Limit, cells: [u64; 3]) -> String {
    let Some(Layout::Cells {
        cells: n,
        time_cell,
    }) = limit.layout()
    else {
        panic!("{limit:?} keeps no cells");
    };
    let mut used = n;
    while used > time_cell + 1 && cells[used - 1] == 0 {
        used -= 1;
    }
    let text: Vec<String> = cells[..used].iter().map(u64::to_string).collect();
    text.join(" ")
}

fn compare_state(
    limit: &Limit,
    expected: Option<&State>,
    seen: &ObservedState,
    layer: usize,
    context: &dyn Fn() -> String,
) {
    match (expected, seen) {
        (None, ObservedState::Cells(v)) => {
            assert_eq!(v, &None, "layer {layer}: state at {}", context())
        }
        (Some(State::Cells(cells)), ObservedState::Cells(v)) => assert_eq!(
            v.as_deref(),
            Some(stored_text(limit, *cells).as_str()),
            "layer {layer}: state at {}",
            context()
        ),
        (None, ObservedState::Log { len, .. }) => {
            assert_eq!(*len, 0, "layer {layer}: log at {}", context())
        }
        (
            Some(State::Log(entries)),
            ObservedState::Log {
                len,
                first,
                last,
                head,
            },
        ) => {
            let entries: &VecDeque<u64> = entries;
            assert_eq!(
                *len,
                entries.len(),
                "layer {layer}: log length at {}",
                context()
            );
            assert_eq!(
                first.as_ref(),
                entries.front(),
                "layer {layer}: oldest at {}",
                context()
            );
            assert_eq!(
                last.as_ref(),
                entries.back(),
                "layer {layer}: newest at {}",
                context()
            );
            let want: Vec<u64> = entries.iter().take(LOG_COMPARED).copied().collect();
            assert_eq!(head, &want, "layer {layer}: log entries at {}", context());
        }
        (expected, _) => panic!(
            "layer {layer}: unexpected state shape {expected:?} at {}",
            context()
        ),
    }
}

fn run(limits: Vec<Limit>, ops: &[Op]) {
    run_on(limits, ops, Path::Functions);
}

fn run_on(limits: Vec<Limit>, ops: &[Op], path: Path) {
    run_plans(vec![limits], ops, path);
}

fn run_plans(plans: Vec<Vec<Limit>>, ops: &[Op], path: Path) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(differential(plans, ops, path));
}

/// Operations per sequence: 10,000, or `TOLLGATE_DIFFERENTIAL_OPS`
/// (`cargo xtask soak` sets 100,000; `cargo xtask valkey` 2,500).
fn steps() -> usize {
    env_number("TOLLGATE_DIFFERENTIAL_OPS").unwrap_or(10_000)
}

/// A number from the environment, if set.
fn env_number(name: &str) -> Option<usize> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// Sequences of 10,000 operations: few cases, each long (`cargo xtask
/// soak` sets `TOLLGATE_DIFFERENTIAL_CASES`: 10 cases of 100,000 operations, a
/// million per algorithm).
fn long_runs() -> ProptestConfig {
    ProptestConfig {
        cases: env_number("TOLLGATE_DIFFERENTIAL_CASES").map_or(3, |n| n as u32),
        // A failing case names its step; shrinking 10,000-step runs against
        // Redis would take long for little gain.
        max_shrink_iters: 16,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(long_runs())]

    #[test]
    fn token_bucket_matches_rust(limit in token_bucket(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn gcra_matches_rust(limit in gcra(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn fixed_window_matches_rust(limit in fixed_window(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn sliding_window_matches_rust(limit in sliding_window(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn sliding_log_matches_rust(limit in sliding_log(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn calendar_matches_rust(limit in calendar(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }

    #[test]
    fn calendar_span_matches_rust(limit in calendar_span(), ops in ops(steps())) {
        run(vec![limit], &ops);
    }
}

/// Two to four plans of one bucket algorithm, each keeping units across a
/// change of plan (as a plan's layers do).
fn bucket_plans(bucket: impl Strategy<Value = Limit>) -> impl Strategy<Value = Vec<Vec<Limit>>> {
    proptest::collection::vec(bucket.prop_map(|l| vec![l.keeping_units()]), 2..=4)
}

proptest! {
    #![proptest_config(long_runs())]

    /// Plan changes (2% of the steps) between token buckets or GCRAs of
    /// other rates: the state read as the units it holds, bit for bit.
    #[test]
    fn token_bucket_plans_match_rust(plans in bucket_plans(token_bucket()), ops in ops(steps())) {
        run_plans(plans, &ops, Path::Functions);
    }

    #[test]
    fn gcra_plans_match_rust(plans in bucket_plans(gcra()), ops in ops(steps())) {
        run_plans(plans, &ops, Path::Functions);
    }
}

proptest! {
    #![proptest_config(module_runs())]

    #[test]
    fn module_token_bucket_plans_match_rust(plans in bucket_plans(token_bucket()), ops in ops(steps())) {
        run_plans(plans, &ops, Path::Module);
    }

    #[test]
    fn module_gcra_plans_match_rust(plans in bucket_plans(gcra()), ops in ops(steps())) {
        run_plans(plans, &ops, Path::Module);
    }
}

/// The units a token bucket's state holds at another rate when the time
/// until full is a whole number of the old periods and the remainder is
/// not 0 (the one case where the remainder takes a unit off, which random
/// runs rarely reach): every path reads it as the reference does.
#[test]
fn a_whole_period_less_the_remainder_reads_alike() {
    let bucket = |refill, period| {
        Limit::token_bucket(10, refill, period)
            .expect("valid")
            .keeping_units()
    };
    let plans = vec![
        vec![bucket(3, Duration::from_millis(10))],
        vec![bucket(1, Duration::from_secs(1))],
    ];
    let ops = [
        (Step::Same, Cost::Any(3), None),
        (Step::Micros(3_334), Cost::One, Some(1)),
        (Step::Same, Cost::Full, None),
    ]
    .map(|(step, cost, plan)| Op { step, cost, plan });
    for path in [Path::Functions, Path::Script, Path::Module] {
        run_plans(plans.clone(), &ops, path);
    }
}

fn any_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        token_bucket(),
        gcra(),
        fixed_window(),
        sliding_window(),
        sliding_log(),
        calendar()
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, max_shrink_iters: 64, ..ProptestConfig::default() })]

    /// Two or three layers of any algorithms: all-or-nothing, and admitting
    /// layers of a denied request report their cost back.
    #[test]
    fn layered_decisions_match_rust(
        limits in proptest::collection::vec(any_limit(), 2..=3),
        ops in ops(1_500),
    ) {
        run(limits, &ops);
    }
}

/// The module's runs: one sequence of 10,000 operations per algorithm (the
/// module runs the reference itself, so what is checked is its reading and
/// writing of states, TTLs and replies; `cargo xtask soak` sets more).
fn module_runs() -> ProptestConfig {
    ProptestConfig {
        cases: env_number("TOLLGATE_DIFFERENTIAL_CASES").map_or(1, |n| n as u32),
        ..long_runs()
    }
}

proptest! {
    #![proptest_config(module_runs())]

    #[test]
    fn module_token_bucket_matches_rust(limit in token_bucket(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_gcra_matches_rust(limit in gcra(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_fixed_window_matches_rust(limit in fixed_window(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_sliding_window_matches_rust(limit in sliding_window(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_sliding_log_matches_rust(limit in sliding_log(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_calendar_matches_rust(limit in calendar(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }

    #[test]
    fn module_calendar_span_matches_rust(limit in calendar_span(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Module);
    }
}

proptest! {
    #![proptest_config(module_runs())]

    /// The script form runs the function library's code: one sequence per
    /// algorithm shows the script's wrapper passes every call and reply
    /// through unchanged.
    #[test]
    fn script_token_bucket_matches_rust(limit in token_bucket(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }

    #[test]
    fn script_gcra_matches_rust(limit in gcra(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }

    #[test]
    fn script_fixed_window_matches_rust(limit in fixed_window(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }

    #[test]
    fn script_sliding_window_matches_rust(limit in sliding_window(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }

    #[test]
    fn script_sliding_log_matches_rust(limit in sliding_log(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }

    #[test]
    fn script_calendar_matches_rust(limit in calendar(), ops in ops(steps())) {
        run_on(vec![limit], &ops, Path::Script);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, max_shrink_iters: 64, ..ProptestConfig::default() })]

    /// The module's layered decisions: all-or-nothing, as the reference.
    #[test]
    fn module_layered_decisions_match_rust(
        limits in proptest::collection::vec(any_limit(), 2..=3),
        ops in ops(1_500),
    ) {
        run_on(limits, &ops, Path::Module);
    }
}
