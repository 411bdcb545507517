//! When a watched file counts as changed: its contents differ from the
//! last version acted on and stayed the same for one more look.
//!
//! A file's time and length do not say it changed (an edit of the same
//! length with its time restored keeps both), so the contents are
//! compared. And a writer may be caught halfway (write-then-rename is the
//! convention, but not every editor or tool keeps it): contents seen once
//! are not acted on until the next look finds them unchanged, so a file
//! is applied only after it stood still for one interval.

/// The contents last acted on and last seen (a file's bytes, or what
/// several files hold).
#[derive(Debug)]
pub(crate) struct Settled<T> {
    acted_on: Option<T>,
    last_seen: Option<T>,
}

impl<T: Clone + PartialEq> Settled<T> {
    /// Watching a file whose current contents (`None`: unreadable) are
    /// already in force.
    pub(crate) fn new(contents: Option<T>) -> Self {
        Settled {
            acted_on: contents.clone(),
            last_seen: contents,
        }
    }

    /// One look at the file: whether to act on `contents` now. An
    /// unreadable file (`None`, say between a remove and a rename) is
    /// never acted on.
    pub(crate) fn changed(&mut self, contents: Option<T>) -> bool {
        let settled = contents.is_some() && contents == self.last_seen;
        let act = settled && contents != self.acted_on;
        if act {
            self.acted_on = contents.clone();
        }
        self.last_seen = contents;
        act
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(file: &mut Settled<Vec<u8>>, text: &str) -> bool {
        file.changed(Some(text.as_bytes().to_vec()))
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
        assert!(!file.changed(None));
        assert!(!file.changed(None));
        assert!(!look(&mut file, "limit = 5"), "back as it was");
        assert!(!look(&mut file, "limit = 5"), "nothing to act on");
        assert!(!look(&mut file, "limit = 8"));
        assert!(look(&mut file, "limit = 8"));
    }
}
