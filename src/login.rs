//! The login recipe: failed attempts are charged, repeated failures block
//! for longer and longer, a success forgets them.

use std::sync::Arc;
use std::time::Duration;

use tollgate_limiter::{
    duration_micros, Context, Decision, Error, Limit, Limiter, Policy, PolicyError, Scope, Store,
    MAX_LOG_LIMIT, MAX_RECOVERY,
};

/// How blocks grow with repeated offences: the first block lasts
/// `steps[0]`, the second within a quiet period `steps[1]`, and so on,
/// staying at the last step; an offence is forgotten a quiet period after
/// it (so after a quiet period without one, the next block is the first
/// step again).
///
/// ```
/// use std::time::Duration;
/// use tollgate::Escalation;
///
/// let minute = Duration::from_secs(60);
/// let escalation = Escalation::new([minute, 10 * minute, 60 * minute], 24 * 60 * minute)?;
/// assert_eq!(escalation.block_for(1), minute);
/// assert_eq!(escalation.block_for(3), 60 * minute);
/// assert_eq!(escalation.block_for(9), 60 * minute, "the last step stays");
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    steps: Vec<Duration>,
    quiet: Duration,
}

impl Escalation {
    /// Blocks of `steps` (1 ms to 14 days each, never shorter than the one
    /// before, at most 100 of them), each offence forgotten after `quiet`
    /// (1 ms to 7 days, the longest window a policy counts).
    pub fn new(
        steps: impl IntoIterator<Item = Duration>,
        quiet: Duration,
    ) -> Result<Self, PolicyError> {
        let steps: Vec<Duration> = steps.into_iter().collect();
        if steps.is_empty() || steps.len() > 100 {
            return Err(PolicyError::new(
                "steps",
                format!("{} block durations; give 1 to 100", steps.len()),
            ));
        }
        for (i, step) in steps.iter().enumerate() {
            if *step < Duration::from_millis(1) || *step > MAX_RECOVERY {
                return Err(PolicyError::new(
                    "steps",
                    format!(
                        "{step:?} is outside 1 ms to 14 days (the longest block a store keeps)"
                    ),
                ));
            }
            if i > 0 && *step < steps[i - 1] {
                return Err(PolicyError::new(
                    "steps",
                    format!(
                        "{step:?} follows the longer {:?}; blocks escalate: list them shortest first",
                        steps[i - 1]
                    ),
                ));
            }
        }
        let escalation = Escalation { steps, quiet };
        escalation.offences_limit()?;
        Ok(escalation)
    }

    /// The block durations, shortest first.
    pub fn steps(&self) -> &[Duration] {
        &self.steps
    }

    /// How long an offence is remembered.
    pub fn quiet(&self) -> Duration {
        self.quiet
    }

    /// The block for the `offences`-th offence within a quiet period
    /// (counting from 1; 0 counts as 1; past the last step, the last).
    pub fn block_for(&self, offences: u64) -> Duration {
        let i = usize::try_from(offences.saturating_sub(1)).unwrap_or(usize::MAX);
        self.steps[i.min(self.steps.len() - 1)]
    }

    /// The limit that remembers offences: a sliding log of one entry per
    /// offence over the quiet period, with room for every offence that can
    /// happen in it (one per shortest block; at least one per step, at
    /// most [`MAX_LOG_LIMIT`]), so one who keeps offending stays at the
    /// last step until a quiet period passes.
    fn offences_limit(&self) -> Result<Limit, PolicyError> {
        let per_block = duration_micros(self.quiet).div_ceil(duration_micros(self.steps[0]).max(1));
        let room = per_block
            .saturating_add(1)
            .clamp(self.steps.len() as u64, MAX_LOG_LIMIT);
        Limit::sliding_log(room, self.quiet)
            .map_err(|e| PolicyError::new("quiet", format!("{:?}: {}", self.quiet, e)))
    }
}

/// A login's rate limit, as users expect it: every failed attempt is
/// charged to the account, running out of attempts blocks the account with
/// [`Escalation`]'s growing durations, and a successful login (or a
/// password reset) forgets the failures and the escalation.
///
/// Two limiters on one store: `failures` (the policy given, one unit per
/// failed attempt, per subject) and `offences` (a sliding log per subject
/// named `<policy>-offences`: the blocks within a quiet period). Key the
/// [`Context`] on the account (a user name or id; hash it with
/// [`Subject::hashed`](tollgate_limiter::Subject::hashed) if it is sensitive), and keep
/// a per-client limit on the route as well, so one client cannot walk
/// through many accounts.
///
/// ```no_run
/// # async fn f(store: std::sync::Arc<dyn tollgate::Store>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::{Context, Escalation, Limit, LoginGuard, Policy, Subject};
///
/// let minute = Duration::from_secs(60);
/// let guard = LoginGuard::new(
///     store,
///     Policy::new("login", Limit::sliding_log(3, 15 * minute)?)?,
///     Escalation::new([minute, 10 * minute, 60 * minute], 24 * 60 * minute)?,
/// )?;
/// let dave = Context::for_subject(Subject::new("dave")?);
/// assert!(guard.allows(&dave).await?.is_allowed());
/// guard.failed(&dave).await?;
/// guard.failed(&dave).await?;
/// let third = guard.failed(&dave).await?; // out of attempts: blocked
/// assert_eq!(third.retry_after(), Some(minute));
/// assert!(!guard.allows(&dave).await?.is_allowed());
/// guard.succeeded(&dave).await?; // e.g. after a password reset
/// assert!(guard.allows(&dave).await?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LoginGuard {
    failures: Limiter,
    offences: Limiter,
    escalation: Escalation,
}

impl LoginGuard {
    /// A guard charging failed attempts to `failures` (counted per
    /// subject) and blocking as `escalation` says, both kept in `store`.
    pub fn new(
        store: Arc<dyn Store>,
        failures: Policy,
        escalation: Escalation,
    ) -> Result<Self, Error> {
        let offences = Policy::new(
            format!("{}-offences", failures.name()),
            escalation.offences_limit()?,
        )?;
        let limiter = |name: &str, policy: Policy| {
            Limiter::builder(store.clone())
                .layer(name.to_string(), Scope::Subject, policy)
                .build()
                .map_err(|e| Error::Policy(PolicyError::new("login", e.to_string())))
        };
        Ok(LoginGuard {
            failures: limiter("failures", failures)?,
            offences: limiter("offences", offences)?,
            escalation,
        })
    }

    /// Whether `ctx` may try to log in now (nothing is charged): denied
    /// while blocked or out of attempts, with the exact retry-after.
    pub async fn allows(&self, ctx: &Context) -> Result<Decision, Error> {
        self.failures.peek(ctx, 1).await
    }

    /// A failed attempt: charged one unit; the one that leaves no attempt
    /// blocks `ctx` for the next step of the escalation. Answers the
    /// failures layer afterwards (denied, with the block's end, when
    /// blocked). An attempt [`allows`](Self::allows) refuses (made while
    /// blocked) is not charged and is no new offence: it answers that
    /// refusal. Failures of one account racing each other (both allowed,
    /// then both finding it out of attempts) each count as an offence, so
    /// a parallel burst of wrong passwords escalates faster.
    pub async fn failed(&self, ctx: &Context) -> Result<Decision, Error> {
        let now = self.allows(ctx).await?;
        if !now.is_allowed() {
            return Ok(now);
        }
        let after = self.failures.penalize(ctx, 1).await?;
        if after
            .layers()
            .iter()
            .all(|l| l.verdict().allowed && l.verdict().remaining > 0)
        {
            return Ok(after);
        }
        let offences = self.offences.penalize(ctx, 1).await?;
        let held = offences.layers().first().map_or(1, |l| {
            l.verdict().limit.saturating_sub(l.verdict().remaining)
        });
        self.failures
            .block(ctx, self.escalation.block_for(held))
            .await
    }

    /// A successful login, or a password reset: the failures and the
    /// escalation are forgotten (a block is lifted).
    pub async fn succeeded(&self, ctx: &Context) -> Result<(), Error> {
        self.failures.reset(ctx).await?;
        self.offences.reset(ctx).await
    }

    /// The escalation.
    pub fn escalation(&self) -> &Escalation {
        &self.escalation
    }
}
