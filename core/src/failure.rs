//! What a policy does when its store fails, and the circuit breaker that
//! stops paying the store's deadline on every request while it is down.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::PolicyError;
use crate::limit::Limit;
use crate::time::{duration_micros, Clock, MonotonicClock};

/// A policy's answer when the store cannot decide.
///
/// There is deliberately no silent default in configuration files: the
/// builder default is [`OnStoreFailure::FailClosed`], the only mode that never
/// admits more than the policy allows.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum OnStoreFailure {
    /// Admit (the layer reports its source as `fail_open`).
    FailOpen,
    /// Reject with a store-failure outcome (HTTP 503, not 429).
    #[default]
    FailClosed,
    /// Decide in the limiter's in-process emergency store instead. Per
    /// process, so weaker than the shared store: with N processes up to N
    /// times the fallback limit passes in total.
    Fallback(Fallback),
}

/// The limit the emergency bucket enforces.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Fallback {
    /// Its own limit.
    Limit(Limit),
    /// The policy's own limit divided by `instances` (the number of
    /// processes sharing the store), rounded down, at least 1.
    Share {
        /// How many processes share the store's limit.
        instances: u32,
    },
}

impl Fallback {
    /// The emergency limit for a policy whose shared limit is `shared`.
    pub fn limit_for(&self, shared: &Limit) -> Result<Limit, PolicyError> {
        match self {
            Fallback::Limit(limit) => Ok(limit.clone()),
            Fallback::Share { instances } => shared.divided_by(*instances),
        }
    }
}

/// Circuit breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive store failures that open the breaker (default 5).
    pub failure_threshold: u32,
    /// How long the breaker stays open before one probe may try the store
    /// again (default 1 s).
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

/// The breaker's state, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// Requests go to the store.
    Closed,
    /// Requests skip the store and use the failure mode.
    Open,
    /// The open period ended; one probe request is trying the store.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// A lock-free circuit breaker: closed while the store answers, open after
/// `failure_threshold` consecutive failures, half-open (one probe) once
/// `open_for` has passed; the probe's success closes it, its failure opens
/// it again. Recovery needs no manual step.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    failures: AtomicU32,
    /// 0 while closed; otherwise the instant (µs) the open period ends.
    open_until: AtomicU64,
    probing: AtomicBool,
}

/// What the breaker says about one request (only the limiter asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Ask the store.
    Call,
    /// Ask the store: this request is the half-open probe.
    Probe,
    /// Do not ask the store; it is considered down for this long.
    Skip(Duration),
}

impl CircuitBreaker {
    /// A closed breaker on a [`MonotonicClock`](crate::MonotonicClock)
    /// (as the limiter's): a step of the wall clock cannot open or close it.
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreaker::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A closed breaker reading time from `clock`.
    pub fn with_clock(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        CircuitBreaker {
            config,
            clock,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// Whether the next request may call the store.
    pub(crate) fn admit(&self) -> Admission {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Admission::Call;
        }
        let now = self.clock.now().as_micros();
        if now < until {
            let open_for = duration_micros(self.config.open_for);
            if until - now <= open_for {
                return Admission::Skip(Duration::from_micros(until - now));
            }
            // The clock stepped back: the period ends at most `open_for`
            // from now, not an hour later for an hour's step.
            let capped = now.saturating_add(open_for).max(1);
            let _ = self.open_until.compare_exchange(
                until,
                capped,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return Admission::Skip(Duration::from_micros(capped.saturating_sub(now)));
        }
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Admission::Probe
        } else {
            // Another request is probing; wait for its answer.
            Admission::Skip(self.config.open_for)
        }
    }

    /// The store answered. Returns true when this closed an open breaker.
    pub(crate) fn success(&self) -> bool {
        // Loads first: the common case writes nothing shared.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(0, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return true;
        }
        // A probe that began as another request's success closed the
        // breaker (it read the open period over just before): its flag
        // goes too, or the next open period could never be probed.
        if self.probing.load(Ordering::Relaxed) {
            self.probing.store(false, Ordering::Release);
        }
        false
    }

    /// The store failed. Returns true when this opened the breaker.
    pub(crate) fn failure(&self, probe: bool) -> bool {
        let reopen_at = self
            .clock
            .now()
            .as_micros()
            .saturating_add(duration_micros(self.config.open_for));
        // A probe whose breaker another request's success closed meanwhile
        // counts as any failure: one late answer does not reopen a closed
        // breaker past its threshold, nor end a newer probe.
        if probe && self.open_until.load(Ordering::Acquire) != 0 {
            self.open_until.store(reopen_at, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return true;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= self.config.failure_threshold && self.open_until.load(Ordering::Acquire) == 0
        {
            self.open_until.store(reopen_at, Ordering::Release);
            return true;
        }
        false
    }

    /// A probe that ended without an answer (its caller stopped waiting):
    /// let the next request probe.
    pub(crate) fn abandon_probe(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// The settings.
    pub fn config(&self) -> BreakerConfig {
        self.config
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            BreakerState::Closed
        } else if self.clock.now().as_micros() < until {
            BreakerState::Open
        } else {
            BreakerState::HalfOpen
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ManualClock, Timestamp};

    /// A probe that began just after another request's success closed the
    /// breaker (the state that interleaving leaves: closed, probing) must
    /// not keep the next open period from being probed.
    #[test]
    fn a_probe_that_raced_a_closing_success_leaves_later_probes_possible() {
        let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
        let config = BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(1),
        };
        let breaker = CircuitBreaker::with_clock(config, Arc::new(clock.clone()));
        // Closed by a success while a late probe took the flag.
        breaker.probing.store(true, Ordering::Release);
        assert!(!breaker.success(), "it was closed already");
        // Opened again, then its open period over: one request probes.
        assert!(breaker.failure(false));
        clock.advance(Duration::from_secs(2));
        assert_eq!(breaker.admit(), Admission::Probe);
    }

    /// A probe that fails after another request's success closed the
    /// breaker (a request sent before it opened, slower than the open
    /// period) counts as one failure, below the threshold: the breaker
    /// stays closed.
    #[test]
    fn a_late_probe_failure_does_not_reopen_a_closed_breaker() {
        let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
        let config = BreakerConfig {
            failure_threshold: 5,
            open_for: Duration::from_secs(1),
        };
        let breaker = CircuitBreaker::with_clock(config, Arc::new(clock.clone()));
        for _ in 0..5 {
            breaker.failure(false);
        }
        clock.advance(Duration::from_secs(2));
        assert_eq!(breaker.admit(), Admission::Probe);
        assert!(breaker.success(), "the slow request closed it");
        assert!(!breaker.failure(true), "the probe's failure");
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    /// A clock stepping back does not stretch an open period: it ends at
    /// most `open_for` after the step.
    #[test]
    fn a_clock_stepping_back_does_not_stretch_the_open_period() {
        let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
        let config = BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::from_secs(1),
        };
        let breaker = CircuitBreaker::with_clock(config, Arc::new(clock.clone()));
        assert!(breaker.failure(false));
        clock.rewind(Duration::from_secs(3_600));
        assert!(matches!(breaker.admit(), Admission::Skip(d) if d == Duration::from_secs(1)));
        clock.advance(Duration::from_secs(2));
        assert!(matches!(breaker.admit(), Admission::Probe));
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
    }

    /// An open period past the clock's range opens the breaker for as
    /// long as the clock counts, without overflowing.
    #[test]
    fn a_huge_open_period_saturates() {
        let clock = ManualClock::new(Timestamp::from_micros(1_780_000_000_000_000));
        let config = BreakerConfig {
            failure_threshold: 1,
            open_for: Duration::MAX,
        };
        let breaker = CircuitBreaker::with_clock(config, Arc::new(clock.clone()));
        assert!(breaker.failure(false));
        assert_eq!(breaker.state(), BreakerState::Open);
    }
}
