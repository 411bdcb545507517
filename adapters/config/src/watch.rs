//! Watching files by reading them again: when what they hold counts as
//! changed ([`Changes`]), and the task that acts on it ([`Watch`]).
//!
//! A file's time and length do not say it changed (an edit of the same
//! length with its time restored keeps both), so the contents are
//! compared. And a writer may be caught halfway (write-then-rename is the
//! convention, but not every editor or tool keeps it): contents seen once
//! are not acted on until the next look finds them unchanged, so a file
//! is applied only after it stood still for one interval.

use std::future::Future;
use std::time::Duration;

/// The shortest interval between two looks: `every` below it (zero, say)
/// would read the files in a busy loop.
pub const MIN_EVERY: Duration = Duration::from_millis(10);

/// The changes of what some files hold, looked at every `every`: the
/// configuration file for [`LiveConfig::watch`](crate::LiveConfig::watch),
/// or any files a program reloads itself (the rate limit server's
/// certificates, its configuration with envoyproxy/ratelimit's
/// directory).
///
/// ```no_run
/// # async fn run() {
/// use std::time::Duration;
/// use tollgate_config::{Changes, Watch};
/// let mut changes = Changes::new(Duration::from_secs(1), || std::fs::read("limits.toml").ok());
/// let _watch = Watch::spawn(async move {
///     loop {
///         changes.next().await;
///         println!("limits.toml changed");
///     }
/// });
/// # }
/// ```
pub struct Changes<T, R> {
    every: Duration,
    read: R,
    seen: Settled<T>,
    /// The wait before the next look, besides `every`, when the contents
    /// last handed over are being tried again ([`Changes::retry`]).
    retry_wait: Option<Duration>,
    /// The last such wait, while tries follow one another.
    last_retry_wait: Option<Duration>,
}

/// The longest wait between two tries of the same contents
/// ([`Changes::retry`]).
pub const RETRY_AT_MOST_EVERY: Duration = Duration::from_secs(60);

impl<T: Clone + PartialEq, R: FnMut() -> Option<T>> Changes<T, R> {
    /// Changes of what `read` answers (`None`: unreadable), whose answer
    /// now is what is already in force, looked at every `every` (at least
    /// [`MIN_EVERY`]). Read here, not at the first look: a change made
    /// before then is a change.
    pub fn new(every: Duration, mut read: R) -> Self {
        let in_force = read();
        Changes::since(every, in_force, read)
    }

    /// Changes of what `read` answers since `in_force` (`None`: nothing
    /// read yet), the contents already acted on (the ones a configuration
    /// was loaded from: an edit made between that load and this watch is
    /// a change), looked at every `every` (at least [`MIN_EVERY`]).
    pub fn since(every: Duration, in_force: Option<T>, read: R) -> Self {
        let every = every.max(MIN_EVERY);
        let seen = Settled::new(in_force);
        Changes {
            every,
            read,
            seen,
            retry_wait: None,
            last_retry_wait: None,
        }
    }

    /// The contents [`next`](Self::next) last handed over did not take
    /// (a transient failure): it hands them over again if the file still
    /// holds them, after a wait of `every`, twice as long at each retry in
    /// a row, at most [`RETRY_AT_MOST_EVERY`].
    pub fn retry(&mut self) {
        self.seen.acted_on = None;
        let wait = self
            .last_retry_wait
            .map_or(self.every, |last| (last * 2).min(RETRY_AT_MOST_EVERY));
        self.retry_wait = Some(wait);
        self.last_retry_wait = Some(wait);
    }

    /// The contents [`next`](Self::next) last handed over were not applied:
    /// the file no longer held them when their turn came (a write begun
    /// since). They are no longer taken as acted on, so the next contents
    /// that settle are handed over, even the same ones again (a write that
    /// ends where it began).
    pub fn not_applied(&mut self) {
        self.seen.acted_on = None;
    }

    /// Wait for the next change: contents that differ from the last ones
    /// acted on and stayed the same for one more look; they are returned.
    /// An unreadable file (say, between a remove and a rename) is never a
    /// change.
    pub async fn next(&mut self) -> T {
        match self.retry_wait.take() {
            Some(wait) => tokio::time::sleep(wait).await,
            None => self.last_retry_wait = None,
        }
        loop {
            tokio::time::sleep(self.every).await;
            if let Some(settled) = self.seen.changed((self.read)()) {
                return settled;
            }
        }
    }
}

impl<T, R> std::fmt::Debug for Changes<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

/// A running watch: a task acting on [`Changes`] (as
/// [`LiveConfig::watch`](crate::LiveConfig::watch) starts one); dropping
/// it stops the task.
#[derive(Debug)]
pub struct Watch(tokio::task::JoinHandle<()>);

impl Watch {
    /// Run `task` on the current tokio runtime until the watch is dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Watch {
        Watch(tokio::spawn(task))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The contents last acted on and last seen (a file's bytes, or what
/// several files hold).
#[derive(Debug)]
struct Settled<T> {
    acted_on: Option<T>,
    last_seen: Option<T>,
}

impl<T: Clone + PartialEq> Settled<T> {
    /// Watching a file whose current contents (`None`: unreadable) are
    /// already in force.
    fn new(contents: Option<T>) -> Self {
        Settled {
            acted_on: contents.clone(),
            last_seen: contents,
        }
    }

    /// One look at the file: the contents to act on now, if any. An
    /// unreadable file (`None`, say between a remove and a rename) is
    /// never acted on.
    fn changed(&mut self, contents: Option<T>) -> Option<T> {
        let settled = contents.is_some() && contents == self.last_seen;
        let act = settled && contents != self.acted_on;
        if act {
            self.acted_on = contents.clone();
        }
        self.last_seen = contents;
        act.then(|| self.acted_on.clone()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(file: &mut Settled<Vec<u8>>, text: &str) -> bool {
        file.changed(Some(text.as_bytes().to_vec())).is_some()
    }

    #[test]
    fn a_change_is_acted_on_once_it_stood_still_for_one_look() {
        let mut file = Settled::new(Some(b"limit = 5".to_vec()));
        assert!(!look(&mut file, "limit = 5"), "unchanged");
        assert!(
            !look(&mut file, "limit = 7"),
            "seen once: may be half written"
        );
        assert!(look(&mut file, "limit = 7"), "unchanged for one look");
        assert!(!look(&mut file, "limit = 7"), "acted on once");
    }

    #[test]
    fn contents_retried_are_acted_on_again_at_the_next_look() {
        let mut file = Settled::new(Some(b"limit = 5".to_vec()));
        look(&mut file, "limit = 7");
        assert!(look(&mut file, "limit = 7"));
        file.acted_on = None; // Changes::retry
        assert!(look(&mut file, "limit = 7"), "handed over again");
        assert!(!look(&mut file, "limit = 7"), "once");
    }

    /// Retries in a row wait `every`, then twice as long each time (up to
    /// a minute).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn retries_wait_longer_each_time_in_a_row() {
        let every = Duration::from_secs(1);
        let mut changes = Changes::since(every, None, || Some(1));
        async fn handed_over_after<R: FnMut() -> Option<u8>>(c: &mut Changes<u8, R>) -> Duration {
            let started = tokio::time::Instant::now();
            c.next().await;
            started.elapsed()
        }
        assert_eq!(
            handed_over_after(&mut changes).await,
            2 * every,
            "seen, then settled"
        );
        let mut waits = Vec::new();
        for _ in 0..8 {
            changes.retry();
            waits.push(handed_over_after(&mut changes).await - every);
        }
        let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn contents_caught_halfway_are_never_acted_on() {
        let mut file = Settled::new(Some(b"limit = 5".to_vec()));
        assert!(!look(&mut file, "limit = 5\n[polic"));
        assert!(!look(&mut file, "limit = 5\n[policies.b]"));
        assert!(look(&mut file, "limit = 5\n[policies.b]"));
    }

    #[test]
    fn the_same_length_and_time_is_still_a_change() {
        // Only the contents count: "limit = 6" has the length of "limit = 5".
        let mut file = Settled::new(Some(b"limit = 5".to_vec()));
        look(&mut file, "limit = 6");
        assert!(look(&mut file, "limit = 6"));
    }

    #[test]
    fn an_unreadable_file_is_not_acted_on_and_its_return_is() {
        let mut file = Settled::new(Some(b"limit = 5".to_vec()));
        assert!(file.changed(None).is_none());
        assert!(file.changed(None).is_none());
        assert!(!look(&mut file, "limit = 5"), "back as it was");
        assert!(!look(&mut file, "limit = 5"), "nothing to act on");
        assert!(!look(&mut file, "limit = 8"));
        assert_eq!(
            file.changed(Some(b"limit = 8".to_vec())).as_deref(),
            Some(&b"limit = 8"[..]),
            "what settled is handed over"
        );
    }
}
