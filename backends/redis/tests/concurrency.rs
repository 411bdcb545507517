//! Concurrency holds on real Redis — the script, the function library and
//! the native module — against the reference (the in-process store runs
//! `tollgate_algorithms` itself): random acquisitions, releases, renewals
//! and clock steps on one key, every verdict and hold compared.

mod common;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate_limiter::{
    Hold, LayerRequest, Limit, ManualClock, Policy, Store, StoreKey, Timestamp, Verdict,
};
use tollgate_memory::MemoryStore;
use tollgate_redis::{ConnectionMode, Engine};
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

/// One store with its clock and its holds.
struct Side {
    store: Arc<dyn Store>,
    clock: ManualClock,
    holds: Vec<Hold>,
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
    let store = common::store_with(url, clock.clone(), ConnectionMode::Multiplexed, engine).await;
    Side {
        store: Arc::new(store),
        clock,
        holds: Vec::new(),
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
}
