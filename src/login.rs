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

/// A login's rate limit, as users expect it: every attempt is charged to
/// the account before its password is checked, running out of attempts
/// blocks the account with [`Escalation`]'s growing durations, and a
/// successful login (or a password reset) forgets the failures and the
/// escalation.
///
/// Two limiters on one store: `failures` (the policy given, one unit per
/// attempt, per subject) and `offences` (a sliding log per subject named
/// `<policy>-offences`: the blocks within a quiet period). Key the
/// [`Context`] on the account (its stable id, or its name as your sign-in
/// compares it: lowercased if it ignores case; hash it with
/// [`Subject::hashed`](tollgate_limiter::Subject::hashed) if it is
/// sensitive), and keep a per-client limit on the route as well, so one
/// client cannot walk through many accounts. The store must implement
/// `peek`, `adjust` and `reset` (every store of the project does).
///
/// ```no_run
/// # async fn f(store: std::sync::Arc<dyn tollgate::Store>) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::{Context, Escalation, Limit, LoginGuard, Policy, Subject};
///
/// let minute = Duration::from_secs(60);
/// let guard = LoginGuard::new(
///     store,
///     Policy::new("login", Limit::sliding_log(3, minute)?)?,
///     Escalation::new([minute, 10 * minute, 60 * minute], 24 * 60 * minute)?,
/// )?;
/// let dave = Context::for_subject(Subject::new("dave")?);
/// for left in [2, 1] {
///     let attempt = guard.attempt(&dave).await?; // charged before the check
///     assert!(attempt.is_allowed());
///     // ... the password is wrong:
///     assert_eq!(guard.failed(&dave, &attempt).await?.layers()[0].remaining(), left);
/// }
/// let third = guard.attempt(&dave).await?;
/// let blocked = guard.failed(&dave, &third).await?; // the last attempt: blocked
/// assert_eq!(blocked.retry_after(), Some(minute));
/// assert!(!guard.attempt(&dave).await?.is_allowed()); // not even checked
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

    /// Whether `ctx` may try to log in now, nothing charged (to show it):
    /// denied while blocked or out of attempts, with the exact
    /// retry-after. A login itself goes through [`attempt`](Self::attempt).
    pub async fn allows(&self, ctx: &Context) -> Result<Decision, Error> {
        self.failures.peek(ctx, 1).await
    }

    /// An attempt to log in as `ctx`, charged before its password is
    /// checked: admitted while the account has attempts left and is not
    /// blocked. Check the password only when it admits, then answer with
    /// [`succeeded`](Self::succeeded) or [`failed`](Self::failed). Charged
    /// first, a burst of parallel guesses gets the policy's attempts, not
    /// one password check each.
    pub async fn attempt(&self, ctx: &Context) -> Result<Decision, Error> {
        self.failures.check(ctx, 1).await
    }

    /// A wrong password on `attempt` (what [`attempt`](Self::attempt)
    /// answered). The attempt that took the last one blocks `ctx` for the
    /// next step of the escalation, and at least until the policy alone
    /// would be full again: a block never lets through more guesses than
    /// the policy would. Answers the failures layer afterwards (denied,
    /// with the block's end, when blocked). A refused attempt is no new
    /// offence: it answers that refusal.
    pub async fn failed(&self, ctx: &Context, attempt: &Decision) -> Result<Decision, Error> {
        let last = attempt.layers().iter().any(|l| l.remaining() == 0);
        if !attempt.is_allowed() || !last {
            return Ok(attempt.clone());
        }
        let offences = self.offences.penalize(ctx, 1).await?;
        let held = offences.layers().first().map_or(1, |l| {
            l.verdict().limit.saturating_sub(l.verdict().remaining)
        });
        // The policy's own wait: until its state is back to full.
        let full_again = attempt
            .layers()
            .iter()
            .map(|l| l.verdict().reset_after)
            .max();
        let block = self
            .escalation
            .block_for(held)
            .max(full_again.unwrap_or_default());
        self.failures.block(ctx, block.min(MAX_RECOVERY)).await
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
