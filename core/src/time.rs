//! Time as Tollgate sees it: integer microseconds since the Unix epoch, read
//! from a [`Clock`] so tests move time by hand instead of sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An instant, in whole microseconds since the Unix epoch.
///
/// Microseconds keep every algorithm in exact integer arithmetic, and every
/// instant until the year 2255 fits in 2^53, so the Lua scripts (whose numbers
/// are doubles) compute bit-identical results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The instant `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This instant moved `by` forward (saturating).
    pub fn saturating_add(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_micros(by)))
    }

    /// This instant moved `by` back (saturating at the epoch).
    pub fn saturating_sub(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_micros(by)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}µs", self.0)
    }
}

impl Timestamp {
    /// The earliest instant a store decides with: 2020-01-01T00:00:00Z.
    pub const EARLIEST: Timestamp = Timestamp(1_577_836_800_000_000);
    /// The latest instant a store decides with: 2100-01-01T00:00:00Z.
    pub const LATEST: Timestamp = Timestamp(4_102_444_800_000_000);

    /// Whether a store should decide at this instant: between
    /// [`EARLIEST`](Self::EARLIEST) and [`LATEST`](Self::LATEST). Outside
    /// that range a clock is wrong (unset, or a test's mistake), and stores
    /// refuse it with [`StoreError::ImplausibleTime`](crate::StoreError::ImplausibleTime)
    /// rather than deciding with it.
    ///
    /// ```
    /// use tollgate_limiter::Timestamp;
    /// assert!(!Timestamp::from_micros(0).is_plausible());
    /// assert!(Timestamp::from_micros(1_800_000_000_000_000).is_plausible());
    /// assert!(!Timestamp::from_micros(u64::MAX).is_plausible());
    /// ```
    pub const fn is_plausible(self) -> bool {
        self.0 >= Self::EARLIEST.0 && self.0 <= Self::LATEST.0
    }
}

/// Whole microseconds in `d`, saturating at `u64::MAX`.
pub fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
///
/// Production code uses [`SystemClock`]; tests use [`ManualClock`] and move
/// time explicitly, so no test sleeps.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;

    /// A future that completes once this clock shows `deadline` or later
    /// (at once when it already does): how [`Limiter::wait`](crate::Limiter::wait)
    /// sleeps. The default sleeps on tokio's timer for the time left, so it
    /// needs a tokio runtime with its timer enabled; [`ManualClock`]'s
    /// completes when the test moves the clock past `deadline`.
    #[cfg(feature = "wait")]
    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        let left = Duration::from_micros(deadline.0.saturating_sub(self.now().0));
        Box::pin(tokio::time::sleep(left))
    }
}

/// The future of [`Clock::sleep_until`].
#[cfg(feature = "wait")]
pub type Sleep = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_micros(since))
    }
}

/// A monotonic clock read from the CPU's time-stamp counter (through
/// `quanta`, as governor does; the operating system's monotonic clock where
/// there is no usable TSC), anchored to the wall clock once, when it is
/// made. The default clock of the in-process store and of the limiter.
///
/// Reading it costs a few nanoseconds (no system call, no conversion from
/// the calendar), and it never goes back: a step of the wall clock (NTP,
/// an operator) cannot reach the algorithms. It drifts from the wall clock
/// only as fast as the TSC's rate differs from it (parts per million),
/// which an in-process store, whose state lives in this process alone,
/// never sees. Stores shared between processes read their server's clock
/// instead.
///
/// ```
/// use tollgate_limiter::{Clock, MonotonicClock, SystemClock};
/// let clock = MonotonicClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(b >= a);
/// let wall = SystemClock.now().as_micros();
/// assert!(a.as_micros().abs_diff(wall) < 1_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    /// The counter's reading when the clock was made...
    start: u64,
    /// ... and the wall clock's then (µs since the epoch).
    anchor: u64,
}

impl MonotonicClock {
    /// A clock reading the wall clock's time now, and counting from there.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        MonotonicClock {
            anchor: SystemClock.now().as_micros(),
            start,
            clock,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        let elapsed = self.clock.delta_as_nanos(self.start, self.clock.raw()) / 1_000;
        Timestamp(self.anchor + elapsed)
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_micros(1_000));
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(clock.now(), Timestamp::from_micros(3_000));
/// clock.set(Timestamp::from_micros(500)); // clocks can go backwards too
/// assert_eq!(clock.now().as_micros(), 500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<Manual>);

#[derive(Debug, Default)]
struct Manual {
    now: AtomicU64,
    /// Sleeps pending on this clock ([`Clock::sleep_until`]), by id, woken
    /// at each move to look at the time again.
    #[cfg(feature = "wait")]
    sleepers: std::sync::Mutex<Vec<(u64, std::task::Waker)>>,
    #[cfg(feature = "wait")]
    next_sleep: AtomicU64,
}

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(Manual {
            now: AtomicU64::new(start.0),
            #[cfg(feature = "wait")]
            sleepers: Default::default(),
            #[cfg(feature = "wait")]
            next_sleep: AtomicU64::new(0),
        }))
    }

    /// Move the clock forward by `by` (saturating: it stops at `u64::MAX`
    /// µs rather than wrapping back to the epoch).
    pub fn advance(&self, by: Duration) {
        let by = duration_micros(by);
        let _ = self
            .0
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
        self.moved();
    }

    /// Move the clock back by `by`, as a stepped system clock would.
    pub fn rewind(&self, by: Duration) {
        let by = duration_micros(by);
        let _ = self
            .0
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_sub(by))
            });
        self.moved();
    }

    /// Show `to` from now on (forward or backward).
    pub fn set(&self, to: Timestamp) {
        self.0.now.store(to.0, Ordering::SeqCst);
        self.moved();
    }

    /// How many sleeps are pending on this clock: a test waits for a
    /// waiter to be asleep before it moves the clock.
    #[cfg(feature = "wait")]
    pub fn sleepers(&self) -> usize {
        self.0
            .sleepers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Wake every sleeper, after the time changed: each looks again.
    fn moved(&self) {
        #[cfg(feature = "wait")]
        {
            let woken =
                std::mem::take(&mut *self.0.sleepers.lock().unwrap_or_else(|e| e.into_inner()));
            woken.into_iter().for_each(|(_, waker)| waker.wake());
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.now.load(Ordering::SeqCst))
    }

    #[cfg(feature = "wait")]
    fn sleep_until(&self, deadline: Timestamp) -> Sleep {
        Box::pin(ManualSleep {
            id: self.0.next_sleep.fetch_add(1, Ordering::Relaxed),
            clock: self.clone(),
            deadline,
        })
    }
}

/// A sleep on a [`ManualClock`]: done when the clock shows its deadline.
#[cfg(feature = "wait")]
struct ManualSleep {
    id: u64,
    clock: ManualClock,
    deadline: Timestamp,
}

#[cfg(feature = "wait")]
impl ManualSleep {
    fn sleepers(&self) -> std::sync::MutexGuard<'_, Vec<(u64, std::task::Waker)>> {
        self.clock
            .0
            .sleepers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// A sleep dropped before its deadline (a timeout, a `select!`) leaves no
/// waker behind.
#[cfg(feature = "wait")]
impl Drop for ManualSleep {
    fn drop(&mut self) {
        let id = self.id;
        self.sleepers().retain(|(sleep, _)| *sleep != id);
    }
}

#[cfg(feature = "wait")]
impl std::future::Future for ManualSleep {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.clock.now() >= self.deadline {
            return std::task::Poll::Ready(());
        }
        let id = self.id;
        let mut sleepers = self.sleepers();
        // Looked at again under the lock: a move between the first look
        // and the lock has already woken the sleepers it found, and this
        // one was not among them.
        if self.clock.now() >= self.deadline {
            return std::task::Poll::Ready(());
        }
        // One entry per sleep, however often it is polled.
        match sleepers.iter_mut().find(|(sleep, _)| *sleep == id) {
            Some((_, waker)) => waker.clone_from(cx.waker()),
            None => sleepers.push((id, cx.waker().clone())),
        }
        std::task::Poll::Pending
    }
}
