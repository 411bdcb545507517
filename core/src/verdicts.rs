//! A store's answer: one verdict per layer, without a heap allocation for
//! up to four layers.

use std::ops::{Deref, DerefMut};

use smallvec::SmallVec;

use crate::algorithm::Verdict;

/// Layers kept inline; more spill to the heap.
const INLINE: usize = 4;

/// One [`Verdict`] per layer, in the layers' order: what
/// [`Store::decide`](crate::Store::decide) returns. Up to four verdicts
/// live inline, so answering a request allocates nothing; it reads as a
/// slice.
///
/// ```
/// use tollgate_limiter::{Verdict, Verdicts};
/// use std::time::Duration;
/// let v = Verdict { allowed: true, limit: 5, remaining: 4, reset_after: Duration::ZERO, retry_after: None };
/// let verdicts: Verdicts = [v, v].into_iter().collect();
/// assert_eq!(verdicts.len(), 2);
/// assert!(verdicts.iter().all(|v| v.allowed));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts(SmallVec<[Verdict; INLINE]>);

impl Verdicts {
    /// No verdict yet.
    pub fn new() -> Self {
        Verdicts(SmallVec::new())
    }

    /// The answer of a one-layer request.
    pub fn one(verdict: Verdict) -> Self {
        let mut v = SmallVec::new();
        v.push(verdict);
        Verdicts(v)
    }

    /// Add the next layer's verdict.
    #[inline]
    pub fn push(&mut self, verdict: Verdict) {
        self.0.push(verdict);
    }

    /// Add the next layers' verdicts.
    pub fn extend_from_slice(&mut self, verdicts: &[Verdict]) {
        self.0.extend_from_slice(verdicts);
    }
}

impl Deref for Verdicts {
    type Target = [Verdict];
    #[inline]
    fn deref(&self) -> &[Verdict] {
        &self.0
    }
}

impl DerefMut for Verdicts {
    fn deref_mut(&mut self) -> &mut [Verdict] {
        &mut self.0
    }
}

impl FromIterator<Verdict> for Verdicts {
    fn from_iter<I: IntoIterator<Item = Verdict>>(iter: I) -> Self {
        Verdicts(iter.into_iter().collect())
    }
}

impl Extend<Verdict> for Verdicts {
    fn extend<I: IntoIterator<Item = Verdict>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl From<Vec<Verdict>> for Verdicts {
    fn from(v: Vec<Verdict>) -> Self {
        Verdicts(SmallVec::from_vec(v))
    }
}

impl IntoIterator for Verdicts {
    type Item = Verdict;
    type IntoIter = IntoIter;
    fn into_iter(self) -> IntoIter {
        IntoIter(self.0.into_iter())
    }
}

/// The verdicts of a [`Verdicts`], by value.
#[derive(Debug)]
pub struct IntoIter(smallvec::IntoIter<[Verdict; INLINE]>);

impl Iterator for IntoIter {
    type Item = Verdict;
    fn next(&mut self) -> Option<Verdict> {
        self.0.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for IntoIter {}

impl<'a> IntoIterator for &'a Verdicts {
    type Item = &'a Verdict;
    type IntoIter = std::slice::Iter<'a, Verdict>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
