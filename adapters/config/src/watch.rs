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
}

impl<T: Clone + PartialEq, R: FnMut() -> Option<T>> Changes<T, R> {
    /// Changes of what `read` answers (`None`: unreadable), whose answer
    /// now is what is already in force, looked at every `every` (at least
    /// [`MIN_EVERY`]). Read here, not at the first look: a change made
    /// before then is a change.
    pub fn new(every: Duration, mut read: R) -> Self {
        let seen = Settled::new(read());
        let every = every.max(MIN_EVERY);
        Changes { every, read, seen }
    }

    /// Wait for the next change: contents that differ from the last ones
    /// acted on and stayed the same for one more look; they are returned.
    /// An unreadable file (say, between a remove and a rename) is never a
    /// change.
    pub async fn next(&mut self) -> T {
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
