//! The login recipe against guessing: attempts are charged before the
//! password is checked, and a block never lets through more guesses than
//! the policy alone.
#![cfg(feature = "memory")]

use std::sync::Arc;
use std::time::Duration;

use tollgate::{
    Context, Escalation, Limit, LoginGuard, ManualClock, MemoryStore, Policy, Subject, Timestamp,
};
use tollgate_testkit::ready;

const MINUTE: Duration = Duration::from_secs(60);

fn guard(window: Duration, steps: &[Duration]) -> (ManualClock, LoginGuard) {
    let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
    let store = Arc::new(
        MemoryStore::builder()
            .clock(Arc::new(clock.clone()))
            .build(),
    );
    let guard = LoginGuard::new(
        store,
        Policy::new("login", Limit::sliding_log(3, window).unwrap()).unwrap(),
        Escalation::new(steps.iter().copied(), 24 * 60 * MINUTE).unwrap(),
    )
    .unwrap();
    (clock, guard)
}

/// A burst of guesses arriving together (each password being checked
/// while the others arrive) gets the policy's three attempts, not one
/// check each.
#[test]
fn parallel_guesses_get_the_policys_attempts() {
    let (_clock, guard) = guard(MINUTE, &[MINUTE]);
    let dave = Context::for_subject(Subject::new("dave").unwrap());
    let attempts: Vec<_> = (0..20)
        .map(|_| ready(guard.attempt(&dave)).unwrap())
        .collect();
    let checked = attempts.iter().filter(|a| a.is_allowed()).count();
    assert_eq!(checked, 3, "passwords checked out of 20 guesses at once");
    // Every one was wrong: exactly one offence (the attempt that took
    // the last one), so the first step's block.
    let answers: Vec<_> = attempts
        .iter()
        .map(|a| ready(guard.failed(&dave, a)).unwrap())
        .collect();
    let blocked = answers.iter().filter_map(|d| d.retry_after()).max();
    assert_eq!(blocked, Some(MINUTE));
}

/// A first step shorter than the policy's window blocks until the policy
/// would be full again: the guard never admits more than the policy.
#[test]
fn a_block_lasts_at_least_until_the_policy_is_full_again() {
    let (clock, guard) = guard(15 * MINUTE, &[MINUTE, 10 * MINUTE]);
    let dave = Context::for_subject(Subject::new("dave").unwrap());
    let mut last = None;
    for _ in 0..3 {
        let attempt = ready(guard.attempt(&dave)).unwrap();
        assert!(attempt.is_allowed());
        last = Some(ready(guard.failed(&dave, &attempt)).unwrap());
    }
    assert_eq!(last.unwrap().retry_after(), Some(15 * MINUTE), "not 1 min");
    clock.advance(MINUTE);
    assert!(!ready(guard.attempt(&dave)).unwrap().is_allowed());
    clock.advance(14 * MINUTE);
    assert!(ready(guard.attempt(&dave)).unwrap().is_allowed());
}
