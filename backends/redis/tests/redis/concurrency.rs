//! Concurrency holds on real Redis — the script, the function library and
//! the native module — against the reference (the in-process store runs
//! `tollgate_algorithms` itself): random acquisitions, releases, renewals
//! and clock steps on one key, every verdict and hold compared, and the
//! bytes the three Redis paths keep compared with each other (as text
//! while the holders are few, as a list past `TEXT_LOG_MAX`).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::keyspace::{self, Raw};
use proptest::prelude::*;
use tollgate_limiter::{
    Clock, Hold, LayerRequest, Layout, Limit, ManualClock, Policy, State, Store, StoreKey,
    Timestamp, Verdict,
};
use tollgate_memory::MemoryStore;
use tollgate_redis::{ConnectionMode, Engine, RedisStore};
use tollgate_redis_protocol::{LOG_ENTRY_DIGITS, TEXT_LOG_MAX};
use tollgate_testkit::conformance::unique;
use tollgate_testkit::redis_server::RedisServer;

const START: u64 = 1_780_000_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// Acquire this many units.
    Acquire(u64),
    /// Release the n-th hold still kept (modulo their number).
    Release(usize),
    /// Renew the n-th hold still kept.
    Renew(usize),
    /// Move the clock on by this many µs.
    Advance(u64),
}

/// Mostly acquisitions, few releases, short steps: a log that grows past
/// TEXT_LOG_MAX (moving from text to a list) and shrinks back.
fn growing_op(lease_us: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u64..=3).prop_map(Op::Acquire),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Renew),
        1 => (0..lease_us / 4).prop_map(Op::Advance),
    ]
}

fn op(lease_us: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=3).prop_map(Op::Acquire),
        2 => any::<usize>().prop_map(Op::Release),
        2 => any::<usize>().prop_map(Op::Renew),
        // Steps up to a lease and a half, a few of them to the µs.
        2 => (0..lease_us * 3 / 2).prop_map(Op::Advance),
        1 => Just(Op::Advance(0)),
    ]
}

/// What one operation answered.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Acquired(Vec<Verdict>, Option<Hold>),
    Released,
    Renewed(Option<Hold>),
    Moved,
}

/// One store with its clock and its holds; on Redis, its server and the
/// prefix of its keys.
struct Side {
    store: Arc<dyn Store>,
    clock: ManualClock,
    holds: Vec<Hold>,
    redis: Option<(String, String)>,
}

impl Side {
    async fn apply(&mut self, policy: &Policy, op: &Op) -> Answer {
        let request = |cost| {
            [LayerRequest {
                key: StoreKey::new("diff", policy, "s", "diff"),
                policy,
                cost,
            }]
        };
        let nth = |n: usize, holds: &[Hold]| (!holds.is_empty()).then(|| n % holds.len());
        match *op {
            Op::Acquire(cost) => {
                let (verdicts, holds) = self.store.acquire(&request(cost)).await.unwrap();
                self.holds.extend(holds[0]);
                Answer::Acquired(verdicts.to_vec(), holds[0])
            }
            Op::Release(n) => {
                if let Some(i) = nth(n, &self.holds) {
                    let hold = self.holds.remove(i);
                    self.store
                        .release(&request(hold.cost), &[hold])
                        .await
                        .unwrap();
                }
                Answer::Released
            }
            Op::Renew(n) => {
                let Some(i) = nth(n, &self.holds) else {
                    return Answer::Renewed(None);
                };
                let hold = self.holds[i];
                let renewed = self
                    .store
                    .renew(&request(hold.cost), &[hold])
                    .await
                    .unwrap();
                match renewed[0] {
                    Some(h) => self.holds[i] = h,
                    None => {
                        self.holds.remove(i);
                    }
                }
                Answer::Renewed(renewed[0])
            }
            Op::Advance(us) => {
                self.clock.advance(Duration::from_micros(us));
                Answer::Moved
            }
        }
    }
}

async fn redis_side(url: &str, engine: Engine) -> Side {
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let prefix = unique("t");
    let store = RedisStore::builder(url)
        .prefix(prefix.clone())
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .connection_mode(ConnectionMode::Multiplexed)
        .engine(engine)
        .connect()
        .await
        .expect("connect to the test redis-server");
    Side {
        store: Arc::new(store),
        clock,
        holds: Vec::new(),
        redis: Some((url.to_string(), prefix)),
    }
}

/// What the side's one key holds (its bytes; the key's expiry counts
/// from the wall clock, which differs between sides).
async fn stored(side: &Side) -> Raw {
    let (url, prefix) = side.redis.as_ref().expect("a Redis side");
    let mut con = common::raw(url).await;
    // The prefix and its separator: one side's prefix ("t-…-2") may begin
    // another's ("t-…-21").
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(keys.len() <= 1, "one key per side: {keys:?}");
    match keys.first() {
        Some(key) => keyspace::held(&mut con, key).await.raw,
        None => Raw::Missing,
    }
}

fn reference_side() -> Side {
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let store = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    Side {
        store: Arc::new(store),
        clock,
        holds: Vec::new(),
        redis: None,
    }
}

/// `raw`, or missing when every entry it holds has aged out at `now`:
/// its key then lives a millisecond or two of wall-clock time, so one
/// side may read it and another find it gone.
fn live(raw: Raw, lease: Duration, now: u64) -> Raw {
    match keyspace::state_of(Layout::LogText, &raw) {
        Some(State::Log(entries))
            if entries
                .back()
                .is_some_and(|&t| t + lease.as_micros() as u64 <= now) =>
        {
            Raw::Missing
        }
        _ => raw,
    }
}

async fn differential(limit: u64, lease_s: u64, ops: Vec<Op>) {
    let lease = Duration::from_secs(lease_s);
    let policy = Policy::new(
        unique("cc"),
        Limit::concurrency(limit, lease).expect("valid"),
    )
    .expect("valid");
    let mut reference = reference_side();
    let mut others = vec![
        (
            "script",
            redis_side(RedisServer::shared().url(), Engine::Eval).await,
        ),
        (
            "functions",
            redis_side(RedisServer::shared().url(), Engine::Functions).await,
        ),
        (
            "module",
            redis_side(RedisServer::shared_with_module().url(), Engine::Module).await,
        ),
    ];
    for (step, op) in ops.iter().enumerate() {
        // A request costs at most the limit (the limiter refuses more).
        let op = &match *op {
            Op::Acquire(cost) => Op::Acquire(cost.min(limit)),
            ref other => other.clone(),
        };
        let expected = reference.apply(&policy, op).await;
        for (name, side) in &mut others {
            let got = side.apply(&policy, op).await;
            assert_eq!(got, expected, "{name}, step {step} ({op:?}) of {ops:?}");
        }
        // The script's bytes are the functions' and the module's, and
        // read back as a log kept as text (state_of panics otherwise).
        let now = reference.clock.now().as_micros();
        let script = live(stored(&others[0].1).await, lease, now);
        match &script {
            Raw::List(items) => assert!(items.len() > TEXT_LOG_MAX, "a short list: {items:?}"),
            Raw::Text(v) => assert!(v.len() <= TEXT_LOG_MAX * (LOG_ENTRY_DIGITS + 1), "{v:?}"),
            Raw::Missing => {}
        }
        for (name, side) in &others[1..] {
            let bytes = live(stored(side).await, lease, now);
            assert_eq!(bytes, script, "{name}, step {step} ({op:?}) of {ops:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn holds_on_redis_match_the_reference(
        limit in 1u64..=6,
        lease_s in 1u64..=60,
        ops in (1u64..=60).prop_flat_map(|s| proptest::collection::vec(op(s * 1_000_000), 1..80)),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(differential(limit, lease_s, ops));
    }

    #[test]
    fn long_logs_move_between_text_and_a_list(
        limit in 20u64..=90,
        ops in proptest::collection::vec(growing_op(60_000_000), 40..160),
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(differential(limit, 60, ops));
    }
}

/// Strings that read like holders kept as text at their ends and length,
/// but are not: times a comma apart, and times whose middle entry comes
/// after the last. A conflict on every engine, and left as they were
/// (before, the script and the functions checked only the ends and the
/// length, admitted, and wrote their holders over them).
#[tokio::test(flavor = "current_thread")]
async fn strings_that_are_almost_a_text_log_are_conflicts_and_kept() {
    for foreign in [
        "1800000000000000,1800000000000009",
        "1800000000000000 1900000000000000 1800000000000009",
    ] {
        foreign_data_is_a_conflict_and_kept(|key| {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(foreign);
            set
        })
        .await;
    }
}

/// A key of a type no state has (a hash) where a concurrency limit keeps
/// its holders: a conflict on every engine, and left as it was (the
/// functions' acquire writes with `SET NX GET`, which such a key fails
/// with WRONGTYPE before anything is written).
#[tokio::test(flavor = "current_thread")]
async fn a_key_of_another_type_is_a_conflict_and_kept() {
    foreign_data_is_a_conflict_and_kept(|key| {
        let mut hset = redis::cmd("HSET");
        hset.arg(key).arg("1800000000000000").arg("1");
        hset
    })
    .await;
}

/// On every engine, an acquire where `write` (a command on the key) put
/// data Tollgate did not write is a conflict, and the key is left as it
/// was (its `DUMP` unchanged).
async fn foreign_data_is_a_conflict_and_kept(write: impl Fn(&str) -> redis::Cmd) {
    let policy = Policy::new(
        unique("cc"),
        Limit::concurrency(10, Duration::from_secs(30)).expect("valid"),
    )
    .expect("valid");
    for (name, url, engine) in [
        ("script", RedisServer::shared().url(), Engine::Eval),
        ("functions", RedisServer::shared().url(), Engine::Functions),
        (
            "module",
            RedisServer::shared_with_module().url(),
            Engine::Module,
        ),
    ] {
        let side = redis_side(url, engine).await;
        let (_, prefix) = side.redis.as_ref().expect("a Redis side");
        let subject = unique("s");
        let key = StoreKey::new(&subject, &policy, "s", &subject);
        let stored_at = format!("{prefix}:{key}");
        let mut con = common::raw(url).await;
        let _: () = write(&stored_at).query_async(&mut con).await.unwrap();
        let mut dump = redis::cmd("DUMP");
        dump.arg(&stored_at);
        let before: Vec<u8> = dump.query_async(&mut con).await.unwrap();
        let request = [LayerRequest {
            key,
            policy: &policy,
            cost: 1,
        }];
        let answer = side.store.acquire(&request).await;
        assert!(
            matches!(answer, Err(tollgate_limiter::StoreError::Conflict { .. })),
            "{name}: {answer:?}"
        );
        let after: Vec<u8> = dump.query_async(&mut con).await.unwrap();
        assert_eq!(after, before, "{name}: left as it was");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&stored_at)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(ttl, -1, "{name}: given no expiry");
    }
}
