//! The script's `reserve`, `peek` and `refund` modes (what the Cluster store
//! runs per slot group) against the Rust reference, on a real redis-server.
//!
//! Random policies and random sequences of reservations and refunds of
//! earlier reservations (in any order, time moving forward, standing still
//! or stepping back) run through the script and through
//! `tollgate_algorithms::decide` and `tollgate_algorithms::refund::refund`. At
//! every step the verdicts, the reported charges, what each refund gave back
//! and the stored state must be identical. Keys get a one-hour TTL after
//! every step so that Redis never expires one on its own clock while the
//! test's clock says it is live (TTLs are the standalone differential
//! test's subject).

use std::collections::VecDeque;
use std::time::Duration;

use proptest::prelude::*;
use redis::aio::MultiplexedConnection;
use tollgate_algorithms::refund::{refund, Charge};
use tollgate_limiter::{
    CalendarUnit, LayerRequest, Limit, Policy, Recurrence, State, StoreKey, Timestamp,
};
use tollgate_redis::script::{layer_args, parse_reply, sha1};
use tollgate_testkit::conformance::{unique, START};
use tollgate_testkit::redis_server::RedisServer;

#[derive(Debug, Clone)]
enum Step {
    Same,
    Micros(u64),
    /// Thousandths of the policy's time scale.
    Fraction(u64),
    /// Back by thousandths of the scale.
    Back(u64),
}

#[derive(Debug, Clone)]
enum Action {
    /// Reserve with cost `1 + n % capacity`.
    Reserve(u64),
    /// Refund the outstanding reservation `n % outstanding`.
    Refund(usize),
    /// Judge without charging.
    Peek,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Same),
        2 => (1u64..2_000).prop_map(Step::Micros),
        4 => (1u64..=1_500).prop_map(Step::Fraction),
        1 => (1u64..=500).prop_map(Step::Back),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => any::<u64>().prop_map(Action::Reserve),
        4 => any::<usize>().prop_map(Action::Refund),
        1 => Just(Action::Peek),
    ]
}

fn period() -> impl Strategy<Value = u64> {
    prop_oneof![Just(1_000u64), Just(1_000_000u64), 1_000u64..=10_000_000]
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..=30, 1u64..=100, period()).prop_map(|(c, r, p)| Limit::token_bucket(
            c,
            r,
            Duration::from_micros(p)
        )),
        (1u64..=100, period(), 1u64..=30).prop_map(|(rate, p, burst)| Limit::gcra(
            rate.min(p),
            Duration::from_micros(p),
            burst
        )),
        (1u64..=30, period()).prop_map(|(l, w)| Limit::fixed_window(l, Duration::from_micros(w))),
        (1u64..=30, period()).prop_map(|(l, w)| Limit::sliding_window(l, Duration::from_micros(w))),
        (1u64..=30, period()).prop_map(|(l, w)| Limit::sliding_log(l, Duration::from_micros(w))),
        (1u64..=30, prop_oneof![Just("UTC"), Just("Europe/Berlin")]).prop_map(|(l, zone)| {
            let day = Recurrence::new(CalendarUnit::Day, zone, "2025-01-01T00:00")?;
            Limit::calendar(l, day)
        }),
    ]
    .prop_filter_map("a valid policy", Result::ok)
}

fn scale(limit: &Limit) -> u64 {
    match limit {
        Limit::TokenBucket(p) => p.period_us() * p.capacity() / p.refill().max(1),
        Limit::Gcra(p) => p.interval_us() * p.burst(),
        Limit::FixedWindow(p) => p.window_us(),
        Limit::SlidingWindow(p) => p.window_us(),
        Limit::SlidingLog(p) => p.window_us(),
        Limit::Concurrency(p) => p.lease_us(),
        Limit::Calendar(_) => tollgate_limiter::duration_micros(limit.window().expect("built-in")),
        Limit::Custom(_) => unreachable!("built-in algorithms only"),
    }
    .max(1)
}

/// Whether the server decides with the script or with the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Script,
    Module,
}

struct Harness {
    path: Path,
    con: MultiplexedConnection,
    key: String,
    policy: Policy,
}

impl Harness {
    async fn new(limit: Limit, path: Path) -> Harness {
        let url = match path {
            Path::Script => RedisServer::shared().url(),
            Path::Module => RedisServer::shared_with_module().url(),
        };
        let mut con = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        if path == Path::Script {
            let loaded: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(tollgate_redis::eval_script())
                .query_async(&mut con)
                .await
                .expect("SCRIPT LOAD");
            assert_eq!(loaded, sha1());
        }
        let policy = Policy::new("p", limit).expect("valid");
        let key = format!(
            "{}:{}",
            unique("refund"),
            StoreKey::new("r", &policy, "subject", "s")
        );
        Harness {
            path,
            con,
            key,
            policy,
        }
    }

    fn args(&self, cost: u64, now: u64) -> [u64; 5] {
        let key = StoreKey::new("r", &self.policy, "subject", "s");
        let layer = LayerRequest {
            key,
            policy: &self.policy,
            cost,
        };
        layer_args(&layer, Timestamp::from_micros(now)).expect("built-in")
    }

    async fn script(&mut self, now: u64, args: &[u64], mode: &str) -> Vec<i64> {
        let mut cmd = match self.path {
            Path::Script => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha1());
                cmd
            }
            Path::Module => redis::cmd("TOLLGATE.DECIDE"),
        };
        cmd.arg(1).arg(&self.key).arg(now).arg("");
        for a in args {
            cmd.arg(*a);
        }
        cmd.arg(mode);
        // Keep the key past the test (see the module docs). In the same
        // MULTI as the script: a separate call could come after Redis already
        // expired a short TTL on its own wall clock (a loaded CI machine).
        let (reply, _): (Vec<i64>, i64) = redis::pipe()
            .atomic()
            .add_command(cmd)
            .cmd("PEXPIRE")
            .arg(&self.key)
            .arg(3_600_000)
            .query_async(&mut self.con)
            .await
            .expect("script and PEXPIRE");
        reply
    }

    async fn stored(&mut self) -> Option<State> {
        if matches!(self.policy.limit(), Limit::SlidingLog(_)) {
            let entries: Vec<u64> = redis::cmd("LRANGE")
                .arg(&self.key)
                .arg(0)
                .arg(-1)
                .query_async(&mut self.con)
                .await
                .expect("LRANGE");
            (!entries.is_empty()).then(|| State::Log(VecDeque::from(entries)))
        } else {
            let text: Option<String> = redis::cmd("GET")
                .arg(&self.key)
                .query_async(&mut self.con)
                .await
                .expect("GET");
            text.map(|t| {
                // The cells an algorithm does not use are not stored: 0.
                let mut cells = [0u64; 3];
                for (cell, text) in cells.iter_mut().zip(t.split(' ')) {
                    *cell = text.parse().expect("an integer");
                }
                State::Cells(cells)
            })
        }
    }
}

/// An empty log is stored as no key.
fn normalized(state: Option<State>) -> Option<State> {
    match state {
        Some(State::Log(entries)) if entries.is_empty() => None,
        other => other,
    }
}

async fn differential(limit: Limit, ops: &[(Step, Action)], path: Path) {
    let mut h = Harness::new(limit.clone(), path).await;
    let name = limit.algorithm_name();
    let scale = scale(&limit);
    let mut state: Option<State> = None;
    let mut outstanding: Vec<Charge> = Vec::new();
    let mut now = START.as_micros();
    for (i, (step, action)) in ops.iter().enumerate() {
        now = match step {
            Step::Same => now,
            Step::Micros(us) => now + us,
            Step::Fraction(f) => now + (scale * f / 1_000).max(1),
            Step::Back(f) => now.saturating_sub(scale * f / 1_000 + 1),
        };
        let at = format!("{name} step {i} ({action:?} at {now})");
        match action {
            Action::Reserve(_) | Action::Peek => {
                let peek = matches!(action, Action::Peek);
                let cost = match action {
                    Action::Reserve(n) => 1 + n % limit.capacity(),
                    _ => 1,
                };
                let args = h.args(cost, now);
                let reply = h
                    .script(now, &args, if peek { "peek" } else { "reserve" })
                    .await;
                let t = tollgate_algorithms::decide(
                    &limit,
                    state.as_ref(),
                    Timestamp::from_micros(now),
                    cost,
                );
                if peek {
                    let verdicts = parse_reply(&reply, 1).expect("peek reply");
                    let expected = t.verdict.uncharged(cost);
                    assert_eq!(verdicts[0], expected, "{at}: peek verdict");
                } else {
                    assert_eq!(reply.len(), 7, "{at}: reserve reply");
                    let verdicts = parse_reply(&reply[..5], 1).expect("verdict");
                    assert_eq!(verdicts[0], t.verdict, "{at}: verdict");
                    match t.next {
                        Some(next) => {
                            let charge = Charge::of(&limit, &next.state, cost).expect("charge");
                            assert_eq!(
                                (reply[5] as u64, reply[6] as u64),
                                (charge.at, charge.mark),
                                "{at}: the charge reported"
                            );
                            outstanding.push(charge);
                            state = Some(next.state);
                        }
                        None => assert_eq!(&reply[5..], &[0, 0], "{at}: a denial charges nothing"),
                    }
                }
            }
            Action::Refund(n) => {
                if outstanding.is_empty() {
                    continue;
                }
                let charge = outstanding.remove(n % outstanding.len());
                let mut args = h.args(charge.cost, now).to_vec();
                args.extend([charge.at, charge.mark]);
                let reply = h.script(now, &args, "refund").await;
                let r = refund(&limit, state.as_ref(), now, charge);
                assert_eq!(reply, vec![r.given as i64], "{at}: given back");
                if let Some(next) = r.next {
                    state = Some(next);
                }
            }
        }
        state = normalized(state);
        assert_eq!(h.stored().await, state, "{at}: stored state");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn reservations_and_refunds_match_rust(
        limit in limit(),
        ops in proptest::collection::vec((step(), action()), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(differential(limit, &ops, Path::Script));
    }

    /// The module's reservations and refunds, against the same reference.
    #[test]
    fn module_reservations_and_refunds_match_rust(
        limit in limit(),
        ops in proptest::collection::vec((step(), action()), 1..60),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(differential(limit, &ops, Path::Module));
    }
}

/// A charge refunded at once restores the state it was taken from, bit for
/// bit, for every algorithm (the common case the cluster store relies on).
#[tokio::test]
async fn an_immediate_refund_undoes_the_charge() {
    for path in [Path::Script, Path::Module] {
        immediate_refund(path).await;
    }
}

async fn immediate_refund(path: Path) {
    let second = Duration::from_secs(1);
    for limit in [
        Limit::token_bucket(10, 10, second).unwrap(),
        Limit::gcra(10, second, 10).unwrap(),
        Limit::fixed_window(10, second).unwrap(),
        Limit::sliding_window(10, second).unwrap(),
        Limit::sliding_log(10, second).unwrap(),
        Limit::calendar(
            10,
            Recurrence::new(CalendarUnit::Month, "UTC", "2025-01-01T00:00").unwrap(),
        )
        .unwrap(),
    ] {
        let name = limit.algorithm_name();
        let mut h = Harness::new(limit.clone(), path).await;
        let now = START.as_micros();
        let first = h.args(3, now);
        h.script(now, &first, "reserve").await;
        let before = h.stored().await;
        let args = h.args(2, now);
        let reply = h.script(now, &args, "reserve").await;
        let mut refund_args = args.to_vec();
        refund_args.extend([reply[5] as u64, reply[6] as u64]);
        let given = h.script(now, &refund_args, "refund").await;
        assert!(given[0] > 0, "{name}");
        let after = h.stored().await;
        match (&before, &after) {
            // Token bucket and GCRA keep the later `last` (same instant here).
            (Some(b), Some(a)) => assert_eq!(b, a, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}
