//! Operators' adjustments (penalty, reward, block) in the Lua code and the
//! module against the Rust reference: random sequences of decisions,
//! penalties, rewards, blocks and time steps run through a Redis store and
//! an in-process store (which runs `tollgate_algorithms`) on one manual
//! clock, layer by layer and over two layers at once; every answer must be
//! identical, and after every call each key must hold exactly what the
//! reference wrote — the same bytes, expiring after the reference's TTL.

use crate::common;

use common::keyspace;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::{
    Adjustment, CalendarUnit, Clock, LayerRequest, Limit, ManualClock, Policy, Recurrence, State,
    Store, StoreKey, Stored,
};
use tollgate_memory::MemoryStore;
use tollgate_redis::{ConnectionMode, Engine};
use tollgate_testkit::conformance::{unique, START};
use tollgate_testkit::redis_server::RedisServer;

#[derive(Debug, Clone)]
enum Op {
    Decide(u64),
    Peek,
    Penalize(u64),
    Reward(u64),
    /// Thousandths of the policy's window or period.
    Block(u64),
    /// Thousandths of the policy's window or period.
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=8).prop_map(Op::Decide),
        1 => Just(Op::Peek),
        2 => (1u64..=8).prop_map(Op::Penalize),
        2 => (1u64..=8).prop_map(Op::Reward),
        1 => (1u64..3000).prop_map(Op::Block),
        3 => (0u64..1500).prop_map(Op::Wait),
    ]
}

/// Two policies of every algorithm pair, capacity 8, windows of a few
/// seconds (the Redis keys outlive the test's run: the manual clock
/// decides, not Redis's expiry).
fn limit() -> impl Strategy<Value = Limit> {
    (0usize..6, 2u64..20).prop_map(|(kind, secs)| {
        let w = Duration::from_secs(secs);
        match kind {
            0 => Limit::token_bucket(8, 3, w).unwrap(),
            1 => Limit::gcra(8, w, 8).unwrap(),
            2 => Limit::fixed_window(8, w).unwrap(),
            3 => Limit::sliding_window(8, w).unwrap(),
            4 => Limit::sliding_log(8, w).unwrap(),
            _ => {
                let days = Recurrence::new(CalendarUnit::Day, "Europe/Berlin", "2025-01-01T00:00");
                Limit::calendar(8, days.unwrap()).unwrap()
            }
        }
    })
}

/// Where the Redis side decides: the function library, or the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    Functions,
    Module,
}

async fn run(limits: Vec<Limit>, ops: Vec<Op>, path: Path) {
    let clock = ManualClock::new(START);
    let (url, engine) = match path {
        Path::Functions => (RedisServer::shared().url(), Engine::Functions),
        Path::Module => (RedisServer::shared_with_module().url(), Engine::Module),
    };
    let store = common::store_with(url, clock.clone(), ConnectionMode::Multiplexed, engine).await;
    assert_eq!(store.settings().uses_module(), path == Path::Module);
    let mut con = common::raw(url).await;
    let redis_key = |l: &LayerRequest<'_>| store.settings().redis_key(&l.key);
    let redis_keys = |layers: &[LayerRequest<'_>]| layers.iter().map(redis_key).collect::<Vec<_>>();
    let redis: Arc<dyn Store> = Arc::new(store.clone());
    let memory: Arc<dyn Store> = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let policies: Vec<Policy> = limits
        .into_iter()
        .map(|l| Policy::new(unique("adjust"), l).unwrap())
        .collect();
    let scale = common::time_scale(policies[0].limit());
    let subject = unique("s");
    for (i, op) in ops.iter().enumerate() {
        let layers = |cost: u64| -> Vec<LayerRequest<'_>> {
            policies
                .iter()
                .map(|p| LayerRequest {
                    key: StoreKey::new(&subject, p, "s", &subject),
                    policy: p,
                    cost: cost.min(p.limit().capacity()),
                })
                .collect()
        };
        if let Op::Wait(k) = op {
            clock.advance(Duration::from_micros(scale * k / 1000 + 1));
            continue;
        }
        let keys = redis_keys(&layers(1));
        let mut before = Vec::new();
        for key in &keys {
            before.push(keyspace::held(&mut con, key).await);
        }
        let called_from = keyspace::wall_ms();
        let (a, b) = match op {
            Op::Wait(_) => unreachable!(),
            Op::Decide(c) => (
                tollgate_limiter::ask(&*redis, &layers(*c)).await,
                tollgate_limiter::ask(&*memory, &layers(*c)).await,
            ),
            Op::Peek => (redis.peek(&layers(1)).await, memory.peek(&layers(1)).await),
            Op::Penalize(u) | Op::Reward(u) => {
                let how = match op {
                    Op::Penalize(_) => Adjustment::Penalize,
                    _ => Adjustment::Reward,
                };
                (
                    redis.adjust(&layers(*u), how).await,
                    memory.adjust(&layers(*u), how).await,
                )
            }
            Op::Block(k) => {
                let how = Adjustment::Block(Duration::from_micros(scale * k / 1000 + 1000));
                (
                    redis.adjust(&layers(1), how).await,
                    memory.adjust(&layers(1), how).await,
                )
            }
        };
        let called = (called_from, keyspace::wall_ms());
        let (a, b) = (a.expect("redis answers"), b.expect("memory answers"));
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            b.iter().collect::<Vec<_>>(),
            "step {i} ({op:?}) of {ops:?} under {policies:?}"
        );
        // A key about to expire in real time may be gone before Redis
        // reads it: the reference would be given the wrong state.
        if before
            .iter()
            .any(|h| (0..=called.0 + 50).contains(&h.expires_ms))
        {
            continue;
        }
        let layouts: Vec<_> = policies.iter().map(|p| layout(p.limit())).collect();
        let states: Vec<Option<State>> = before
            .iter()
            .zip(&layouts)
            .map(|(h, &l)| keyspace::state_of(l, &h.raw))
            .collect();
        let (written, kept) = reference_writes(op, &layers, &states, clock.now(), scale);
        for (j, key) in keys.iter().enumerate() {
            let after = keyspace::held(&mut con, key).await;
            let stored = written.get(j).and_then(Option::as_ref);
            if let Err(e) = keyspace::check_write(
                layouts[j],
                &before[j],
                &after,
                stored,
                kept.get(j).copied().flatten(),
                called,
                keyspace::wall_ms(),
            ) {
                panic!("step {i} ({op:?}), layer {j} under {policies:?} on {path:?}: {e}\nops: {ops:?}");
            }
        }
    }
}

/// How the built-in algorithm of `limit` keeps its state.
fn layout(limit: &Limit) -> tollgate_limiter::Layout {
    tollgate_limiter::Builtin::named(limit.algorithm_name())
        .expect("a built-in algorithm")
        .layout
}

/// What the reference writes for `op` over `layers` (their costs given)
/// from `states` at `now`: one entry per layer (`None`: nothing), empty
/// when nothing is written.
fn reference_writes<'a>(
    op: &Op,
    layers: &impl Fn(u64) -> Vec<LayerRequest<'a>>,
    states: &[Option<State>],
    now: tollgate_limiter::Timestamp,
    scale: u64,
) -> (Vec<Option<Stored>>, Vec<Option<Duration>>) {
    let states: Vec<Option<&State>> = states.iter().map(Option::as_ref).collect();
    let adjust = |units: u64, how: Adjustment| {
        let adjusted = tollgate_algorithms::adjust_layers(&layers(units), &states, now, how)
            .expect("the reference adjusts");
        (adjusted.writes.to_vec(), Vec::new())
    };
    match op {
        Op::Decide(c) => {
            let layered = tollgate_algorithms::decide_layers(&layers(*c), &states, now);
            // What a denial keeps: each denying layer's state it read.
            let kept = layered
                .verdicts
                .iter()
                .zip(&states)
                .map(|(v, s)| s.and(tollgate_algorithms::kept_by_denial(v)))
                .collect();
            (layered.writes.to_vec(), kept)
        }
        Op::Peek | Op::Wait(_) => (Vec::new(), Vec::new()),
        Op::Penalize(u) => adjust(*u, Adjustment::Penalize),
        Op::Reward(u) => adjust(*u, Adjustment::Reward),
        Op::Block(k) => adjust(
            1,
            Adjustment::Block(Duration::from_micros(scale * k / 1000 + 1000)),
        ),
    }
}

fn check(limits: Vec<Limit>, ops: Vec<Op>) {
    check_on(limits, ops, Path::Functions);
}

fn check_on(limits: Vec<Limit>, ops: Vec<Op>, path: Path) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(limits, ops, path));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn one_layer_matches_rust(limit in limit(), ops in prop::collection::vec(op(), 1..60)) {
        check(vec![limit], ops);
    }

    #[test]
    fn two_layers_match_rust(
        first in limit(),
        second in limit(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        check(vec![first, second], ops);
    }

    /// The module's operator changes (and decisions, peeks), against the
    /// in-process store.
    #[test]
    fn module_layers_match_rust(
        first in limit(),
        second in limit(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        check_on(vec![first.clone()], ops.clone(), Path::Module);
        check_on(vec![first, second], ops, Path::Module);
    }
}
