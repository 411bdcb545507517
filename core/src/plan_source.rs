//! The application's own source of plans (a database, an account service),
//! asked under a deadline and cached in-process, so that a decision does
//! not wait on it in the common case.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::plan::PlanName;
use crate::plan_cache::{AnswerCache, Over};
use crate::plan_flight::{Flights, Seat};
use crate::subject::Subject;

/// Where a customer's plan is kept (see [`Plans::source`](crate::Plans::source)).
///
/// Asked when a customer's plan is not cached, with a deadline: a source
/// that fails or hangs does not hold the request up, which is decided
/// under the default plan (counted in `tollgate_plan_defaults_total`; with
/// the `tracing` feature a failure is logged as a warning). The deadline
/// is tokio's timer: decide inside a tokio runtime with time enabled.
///
/// ```
/// use tollgate_limiter::{async_trait, PlanName, PlanSource, PlanSourceError, Subject};
///
/// #[derive(Debug)]
/// struct Accounts; // your database client
///
/// #[async_trait]
/// impl PlanSource for Accounts {
///     async fn plan_of(&self, customer: &Subject) -> Result<Option<PlanName>, PlanSourceError> {
///         // SELECT plan FROM accounts WHERE api_key_hash = $1
///         let plan = if customer.as_str() == "key-9" { Some("pro") } else { None };
///         plan.map(PlanName::new).transpose().map_err(|e| PlanSourceError::new(e.to_string()))
///     }
/// }
/// ```
#[async_trait]
pub trait PlanSource: Send + Sync + fmt::Debug {
    /// The plan of `customer` (the request's subject, or its tenant with
    /// [`Plans::keyed_by_tenant`](crate::Plans::keyed_by_tenant)); `None`
    /// for the default plan.
    async fn plan_of(&self, customer: &Subject) -> Result<Option<PlanName>, PlanSourceError>;
}

/// Why a [`PlanSource`] could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the plan source failed: {0}")]
pub struct PlanSourceError(String);

impl PlanSourceError {
    /// An error saying `why`.
    pub fn new(why: impl Into<String>) -> Self {
        PlanSourceError(why.into())
    }
}

/// How a [`PlanSource`] is asked and its answers kept.
///
/// ```
/// use std::time::Duration;
/// use tollgate_limiter::PlanCacheConfig;
/// let config = PlanCacheConfig::default().ttl(Duration::from_secs(300)).deadline(Duration::from_millis(20));
/// assert_eq!(config.max_entries, 100_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanCacheConfig {
    /// How long an answer is kept (default 60 s): a plan change reaches
    /// the limiter within this time.
    pub ttl: Duration,
    /// How long a failure is remembered (default 1 s): meanwhile the
    /// customer is decided under the default plan without asking again.
    pub failure_ttl: Duration,
    /// The most answers kept (default 100,000); when full, expired answers
    /// make room first, then arbitrary ones. Zero keeps none: every
    /// decision whose plan nothing else gives asks the source.
    pub max_entries: u64,
    /// How long a decision waits for the source (default 50 ms; any
    /// length, `Duration::MAX` waiting as long as the source takes).
    pub deadline: Duration,
}

impl Default for PlanCacheConfig {
    fn default() -> Self {
        PlanCacheConfig {
            ttl: Duration::from_secs(60),
            failure_ttl: Duration::from_secs(1),
            max_entries: 100_000,
            deadline: Duration::from_millis(50),
        }
    }
}

impl PlanCacheConfig {
    /// The same settings with answers kept for `ttl`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// The same settings with failures remembered for `ttl`.
    pub fn failure_ttl(mut self, ttl: Duration) -> Self {
        self.failure_ttl = ttl;
        self
    }
    /// The same settings keeping at most `entries` answers.
    pub fn max_entries(mut self, entries: u64) -> Self {
        self.max_entries = entries;
        self
    }
    /// The same settings waiting at most `deadline` for the source.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }
}

/// A source and its settings, as [`Plans`](crate::Plans) keeps them.
#[derive(Debug, Clone)]
pub(crate) struct SourceSettings {
    pub(crate) source: Arc<dyn PlanSource>,
    pub(crate) config: PlanCacheConfig,
}

impl crate::plan::Plans {
    /// The same plans, asking `source` for the plan of a customer the
    /// static table does not list, and keeping its answers as `config`
    /// says. Each limiter built with these plans keeps its own answers (a
    /// service with several limiters asks the source once per limiter and
    /// customer).
    pub fn source(mut self, source: Arc<dyn PlanSource>, config: PlanCacheConfig) -> Self {
        self.source = Some(SourceSettings { source, config });
        self
    }
}

/// What the source said of a customer, as kept (small: one is read per
/// decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The plan of this index among the limiter's.
    Plan(u32),
    /// The default plan.
    Default,
    /// No plan: why.
    Failed(Failure),
}

/// Why the source gave no plan (one byte: a kept answer fits a cache line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The source named a plan the limiter does not have.
    UnknownPlan,
    /// The source returned an error.
    SourceFailed,
    /// The source did not answer within the deadline.
    SourceTimeout,
}

impl Failure {
    /// The reason as metrics label it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::UnknownPlan => "unknown_plan",
            Failure::SourceFailed => "source_failed",
            Failure::SourceTimeout => "source_timeout",
        }
    }
}

/// A plan source behind its cache.
pub(crate) struct PlanCache {
    source: Arc<dyn PlanSource>,
    answers: AnswerCache<Answer>,
    flights: Flights,
    config: PlanCacheConfig,
}

impl fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanCache")
            .field("source", &self.source)
            .field("entries", &self.answers.len())
            .finish()
    }
}

impl PlanCache {
    pub(crate) fn new(settings: SourceSettings) -> Self {
        PlanCache {
            source: settings.source,
            answers: AnswerCache::new(settings.config.max_entries),
            flights: Flights::default(),
            config: settings.config,
        }
    }

    /// The answer kept for `customer`, if any.
    #[inline]
    pub(crate) fn cached(&self, customer: &Subject) -> Option<Answer> {
        self.answers.get(customer)
    }

    /// `customer`'s plan from the source, under the deadline: asked by
    /// this request, or by another asking about the same customer now,
    /// whose answer this one waits for (one question per customer at a
    /// time); `index_of` finds a plan by name.
    pub(crate) async fn fetch(
        &self,
        customer: &Subject,
        index_of: impl Fn(&PlanName) -> Option<usize>,
    ) -> Answer {
        let until = deadline_from_now(self.config.deadline);
        // Whether this request asks with its whole deadline (not after
        // waiting for another that was dropped).
        let mut whole = true;
        loop {
            match self.flights.board(customer) {
                Seat::Asks(flight) => {
                    // Kept since this request missed the cache: no question.
                    let answer = match self.cached(customer) {
                        Some(answer) => answer,
                        None => self.ask(customer, until, whole, &index_of).await,
                    };
                    flight.land(answer);
                    return answer;
                }
                Seat::Waits(mut landed) => {
                    let answer = tokio::time::timeout_at(until, landed.wait_for(Option::is_some));
                    match answer.await {
                        Ok(Ok(answer)) => return answer.unwrap_or(Answer::Default),
                        // The asking request was dropped: ask again.
                        Ok(Err(_)) => whole = false,
                        Err(_) => return Answer::Failed(Failure::SourceTimeout),
                    }
                }
            }
        }
    }

    /// Ask the source for `customer`'s plan, giving up at `until`, and keep
    /// the answer (a failure for `failure_ttl`, unless another request
    /// kept an answer meanwhile: that one is answered). A timeout is kept
    /// only when the source had the `whole` deadline: one given what was
    /// left of a wait says nothing of the source.
    async fn ask(
        &self,
        customer: &Subject,
        until: tokio::time::Instant,
        whole: bool,
        index_of: &impl Fn(&PlanName) -> Option<usize>,
    ) -> Answer {
        let asked = tokio::time::timeout_at(until, self.source.plan_of(customer));
        let answer = match asked.await {
            Ok(Ok(None)) => Answer::Default,
            Ok(Ok(Some(plan))) => match index_of(&plan).and_then(|i| u32::try_from(i).ok()) {
                Some(i) => Answer::Plan(i),
                None => Answer::Failed(Failure::UnknownPlan),
            },
            Ok(Err(error)) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(%error, "the plan source failed; deciding under the default plan");
                let _ = error;
                Answer::Failed(Failure::SourceFailed)
            }
            Err(_) => Answer::Failed(Failure::SourceTimeout),
        };
        let (ttl, over) = match answer {
            Answer::Failed(Failure::SourceTimeout) if !whole => return answer,
            Answer::Failed(Failure::SourceFailed | Failure::SourceTimeout) => {
                (self.config.failure_ttl, Over::Expired)
            }
            _ => (self.config.ttl, Over::Any),
        };
        self.answers.keep(customer.clone(), answer, ttl, over)
    }
}

/// The instant `deadline` from now; one past what the clock can hold
/// ("as long as it takes") is thirty years away, as tokio's own timeout
/// reads it (an `Instant` plus `Duration::MAX` overflows and panics).
fn deadline_from_now(deadline: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(deadline)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}

#[cfg(test)]
mod tests {
    /// A kept answer is at most 8 bytes: with its customer and expiry it
    /// fills one cache line of the answer cache.
    #[test]
    fn an_answer_is_small() {
        assert!(std::mem::size_of::<super::Answer>() <= 8);
    }
}
