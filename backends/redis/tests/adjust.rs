//! Operators' adjustments (penalty, reward, block) in the Lua code against
//! the Rust reference: random sequences of decisions, penalties, rewards,
//! blocks and time steps run through a Redis store and an in-process store
//! (which runs `tollgate_algorithms`) on one manual clock, layer by layer
//! and over two layers at once; every answer must be identical.

mod common;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::{Adjustment, LayerRequest, Limit, ManualClock, Policy, Store, StoreKey};
use tollgate_memory::MemoryStore;
use tollgate_redis::{ConnectionMode, Scripting};
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
    (0usize..5, 2u64..20).prop_map(|(kind, secs)| {
        let w = Duration::from_secs(secs);
        match kind {
            0 => Limit::token_bucket(8, 3, w).unwrap(),
            1 => Limit::gcra(8, w, 8).unwrap(),
            2 => Limit::fixed_window(8, w).unwrap(),
            3 => Limit::sliding_window(8, w).unwrap(),
            _ => Limit::sliding_log(8, w).unwrap(),
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
    let (url, scripting) = match path {
        Path::Functions => (RedisServer::shared().url(), Scripting::Functions),
        Path::Module => (RedisServer::shared_with_module().url(), Scripting::Module),
    };
    let store =
        common::store_with(url, clock.clone(), ConnectionMode::Multiplexed, scripting).await;
    assert_eq!(store.uses_module(), path == Path::Module);
    let redis: Arc<dyn Store> = Arc::new(store);
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
        let (a, b) = match op {
            Op::Wait(k) => {
                clock.advance(Duration::from_micros(scale * k / 1000 + 1));
                continue;
            }
            Op::Decide(c) => (
                redis.decide(&layers(*c)).await,
                memory.decide(&layers(*c)).await,
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
        let (a, b) = (a.expect("redis answers"), b.expect("memory answers"));
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            b.iter().collect::<Vec<_>>(),
            "step {i} ({op:?}) of {ops:?} under {policies:?}"
        );
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
