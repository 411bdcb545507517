//! Conformance of concurrency limits: places held until released, renewed
//! while held, forgotten a lease after the last renewal.

use std::time::Duration;

use tollgate_limiter::{Hold, LayerRequest, Limit, ManualClock, Policy, Store, StoreKey, Verdicts};

use super::{unique, StoreFactory, START};

/// One acquisition of `requests`: the verdicts, and the first layer's hold.
async fn acquire(store: &dyn Store, requests: &[LayerRequest<'_>]) -> (Verdicts, Option<Hold>) {
    let (verdicts, holds) = store.acquire(requests).await.expect("store answers");
    assert_eq!(holds.len(), requests.len(), "one hold per layer");
    (verdicts, holds[0])
}

/// A concurrency limit of 2 holds each admitted request's place until it
/// is released: a third request is denied (holding nothing) with
/// `retry_after` the time until the oldest place's lease runs out; a
/// release frees one place; a renewed place outlives its first lease while
/// one not renewed is forgotten at its lease's end, and renewing it then
/// finds it lost. A rate layer that denies leaves the places untouched.
pub async fn concurrency_limits_hold_places(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let lease = Duration::from_secs(30);
    let policy = Policy::new(
        unique("in-flight"),
        Limit::concurrency(2, lease).expect("valid"),
    )
    .expect("valid");
    let subject = unique("holder");
    let one = [LayerRequest {
        key: StoreKey::new(&subject, &policy, "s", &subject),
        policy: &policy,
        cost: 1,
    }];
    let (first, a) = acquire(&*store, &one).await;
    assert!(first[0].allowed && first[0].remaining == 1, "{first:?}");
    let a = a.expect("an admitted concurrency layer holds its place");
    clock.advance(Duration::from_secs(5));
    let (second, b) = acquire(&*store, &one).await;
    assert!(second[0].allowed && second[0].remaining == 0);
    let b = b.expect("held");
    let (third, none) = acquire(&*store, &one).await;
    assert!(!third[0].allowed && none.is_none(), "full: {third:?}");
    assert_eq!(third[0].retry_after, Some(lease - Duration::from_secs(5)));

    store.release(&one, &[a]).await.expect("released");
    let (again, c) = acquire(&*store, &one).await;
    assert!(again[0].allowed, "a released place is free: {again:?}");
    let c = c.expect("held");
    assert!(!acquire(&*store, &one).await.0[0].allowed, "full again");

    // b renewed 20 s on; c (taken at +5 s) is not, and is forgotten at +35 s.
    clock.advance(Duration::from_secs(20));
    let renewed = store.renew(&one, &[b]).await.expect("renewed");
    let b = renewed[0].expect("a live place renews");
    assert_eq!(b.at, START.as_micros() + 25_000_000, "moved to now");
    clock.advance(Duration::from_secs(10));
    let lost = store.renew(&one, &[c]).await.expect("answered");
    assert_eq!(lost[0], None, "a place past its lease is lost");
    let (freed, _) = acquire(&*store, &one).await;
    assert!(freed[0].allowed, "c's place came back at its lease's end");
    assert!(
        !acquire(&*store, &one).await.0[0].allowed,
        "b still holds its place"
    );

    // A request a rate layer denies holds nothing.
    let rate = Policy::new(
        unique("rate"),
        Limit::fixed_window(1, lease).expect("valid"),
    )
    .expect("valid");
    let other = unique("holder");
    let layered = [
        LayerRequest {
            key: StoreKey::new(&other, &policy, "s", &other),
            policy: &policy,
            cost: 1,
        },
        LayerRequest {
            key: StoreKey::new(&other, &rate, "s", &other),
            policy: &rate,
            cost: 1,
        },
    ];
    assert!(acquire(&*store, &layered).await.0.iter().all(|v| v.allowed));
    let (denied, held) = acquire(&*store, &layered).await;
    assert!(!denied[1].allowed && held.is_none(), "{denied:?}");
    assert_eq!(
        denied[0].remaining, 1,
        "the concurrency layer kept its second place"
    );
}

/// A release or renewal that does not name one hold per layer at the
/// layer's cost is refused and changes nothing: two layers of one place
/// each, held; a release naming only the first hold, a renewal naming
/// only the first, and a release of the right count at another cost are
/// each an error, and both places stay held; the release of both frees
/// both.
pub async fn mismatched_holds_are_refused(factory: impl StoreFactory) {
    let clock = ManualClock::new(START);
    let store = factory.make(clock.clone()).await;
    let one_place = |name: &str| {
        let limit = Limit::concurrency(1, Duration::from_secs(30)).expect("valid");
        Policy::new(unique(name), limit).expect("valid")
    };
    let (first, second) = (one_place("first"), one_place("second"));
    let subject = unique("holder");
    let layers = [&first, &second].map(|policy| LayerRequest {
        key: StoreKey::new(&subject, policy, "s", &subject),
        policy,
        cost: 1,
    });
    let (verdicts, holds) = store.acquire(&layers).await.expect("store answers");
    assert!(verdicts.iter().all(|v| v.allowed), "{verdicts:?}");
    let [a, b] = [holds[0], holds[1]].map(|h| h.expect("each layer holds its place"));

    let refused = [
        store.release(&layers, &[a]).await.err(),
        store.renew(&layers, &[a]).await.err(),
        store
            .release(&layers, &[a, Hold { cost: 2, ..b }])
            .await
            .err(),
    ];
    for (i, error) in refused.into_iter().enumerate() {
        assert!(
            matches!(error, Some(tollgate_limiter::StoreError::Protocol(_))),
            "call {i}: {error:?}"
        );
    }
    let (full, _) = store.acquire(&layers).await.expect("store answers");
    assert!(full.iter().all(|v| !v.allowed), "both still held: {full:?}");

    store.release(&layers, &[a, b]).await.expect("released");
    let (free, _) = store.acquire(&layers).await.expect("store answers");
    assert!(free.iter().all(|v| v.allowed), "both freed: {free:?}");
}
