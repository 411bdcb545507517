//! The application's own source of plans (a database, an account service),
//! asked under a deadline and cached in-process, so that a decision does
//! not wait on it in the common case.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use moka::sync::Cache;
use moka::Expiry;

use crate::plan::PlanName;
use crate::subject::Subject;

/// Where a customer's plan is kept (see [`Plans::source`](crate::Plans::source)).
///
/// Asked when a customer's plan is not cached, with a deadline: a source
/// that fails or hangs does not hold the request up, which is decided
/// under the default plan (counted in `tollgate_plan_defaults_total`).
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
    /// The most answers kept (default 100,000); the least used go first.
    pub max_entries: u64,
    /// How long a decision waits for the source (default 50 ms).
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
    /// says.
    pub fn source(mut self, source: Arc<dyn PlanSource>, config: PlanCacheConfig) -> Self {
        self.source = Some(SourceSettings { source, config });
        self
    }
}

/// A cached answer: the plan (`None`: the default), or a failure's reason.
#[derive(Debug, Clone)]
struct Answer(Result<Option<PlanName>, &'static str>);

/// Answers expire after the TTL of their kind.
struct AnswerExpiry(PlanCacheConfig);

impl Expiry<Subject, Answer> for AnswerExpiry {
    fn expire_after_create(
        &self,
        _: &Subject,
        answer: &Answer,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(match answer.0 {
            Ok(_) => self.0.ttl,
            Err(_) => self.0.failure_ttl,
        })
    }
}

/// A plan source behind its cache.
pub(crate) struct PlanCache {
    source: Arc<dyn PlanSource>,
    answers: Cache<Subject, Answer>,
    deadline: Duration,
}

impl fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanCache")
            .field("source", &self.source)
            .field("entries", &self.answers.entry_count())
            .finish()
    }
}

impl PlanCache {
    pub(crate) fn new(settings: SourceSettings) -> Self {
        let answers = Cache::builder()
            .max_capacity(settings.config.max_entries)
            .expire_after(AnswerExpiry(settings.config))
            .build();
        PlanCache {
            source: settings.source,
            answers,
            deadline: settings.config.deadline,
        }
    }

    /// The cached answer for `customer`, if any: its plan (`None`: the
    /// default), or why the source gave none, remembered for a while.
    pub(crate) fn cached(
        &self,
        customer: &Subject,
    ) -> Option<Result<Option<PlanName>, &'static str>> {
        self.answers.get(customer).map(|a| a.0)
    }

    /// Ask the source for `customer`'s plan, under the deadline, and keep
    /// the answer; `Err` is why there is none (`source_failed`,
    /// `source_timeout`).
    pub(crate) async fn fetch(&self, customer: &Subject) -> Result<Option<PlanName>, &'static str> {
        let answer = match tokio::time::timeout(self.deadline, self.source.plan_of(customer)).await
        {
            Ok(Ok(plan)) => Ok(plan),
            Ok(Err(_)) => Err("source_failed"),
            Err(_) => Err("source_timeout"),
        };
        self.answers
            .insert(customer.clone(), Answer(answer.clone()));
        answer
    }
}
