//! Errors. Being rate limited is not one of them: that is a [`Decision`](crate::Decision).

use std::error::Error as StdError;

/// A policy (or a request's cost) that Tollgate cannot enforce exactly.
///
/// The message names the field and says what to change, for example
/// `window: 0ns must be between 1ms and 604800s (7 days)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    field: String,
    reason: String,
}

impl PolicyError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        PolicyError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error with `prefix.` before its field path, so configuration
    /// errors read `policies.search.window: …`.
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = format!("{prefix}.{}", self.field);
        self
    }

    /// The field path the error is about.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why the value is rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// A subject that cannot name a counter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubjectError {
    /// Nothing left after trimming white space.
    #[error("subject is empty: pass a user, tenant or key id (hash secrets with Subject::hashed)")]
    Empty,
    /// Longer than [`Subject::MAX_LEN`](crate::Subject::MAX_LEN) bytes.
    #[error("subject is {0} bytes long; at most 256 bytes are accepted (hash long identifiers with Subject::hashed)")]
    TooLong(usize),
    /// Contains a control character, white space, or `{`/`}` (which would
    /// change the Redis Cluster hash tag).
    #[error("subject contains {0:?}; control characters, white space, '{{' and '}}' are not allowed (hash such identifiers with Subject::hashed)")]
    BadCharacter(char),
}

/// A hashing key too short to keep subjects unguessable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the hash key is {0} bytes long; use at least 16 bytes of a server-side secret (load it from your secret store, never from the request)")]
pub struct HashKeyError(pub usize);

/// Why a store could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer within its deadline.
    #[error(
        "the store did not answer within {0:?}; check that it is reachable, or raise the deadline"
    )]
    Timeout(std::time::Duration),
    /// The store cannot be reached or refused the connection.
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open: the store failed repeatedly and is not
    /// asked again until the open period ends.
    #[error("the store failed repeatedly and is skipped for {0:?} more (circuit breaker open)")]
    CircuitOpen(std::time::Duration),
    /// A key budget of the in-process store is full of live keys: the
    /// store's own `max_keys`, or a policy's
    /// ([`Policy::with_key_budget`](crate::Policy::with_key_budget)), whose
    /// [`WhenFull`](crate::WhenFull) is to refuse.
    #[error("the in-process store's key budget {budget} is full ({max_keys} live keys); room frees up in {retry_after:?} — raise max_keys, or give busy policies a budget of their own")]
    Full {
        /// Which budget: `store`, or `policy <name>`.
        budget: String,
        /// The policy whose own budget is full (`None`: the store's).
        policy: Option<String>,
        /// The budget's size.
        max_keys: usize,
        /// When the first of its keys expires, freeing room.
        retry_after: std::time::Duration,
    },
    /// A key of this policy holds a value Tollgate did not write (another
    /// application sharing the database and the prefix, a hand-made key).
    /// The value is left exactly as it was; the policy's failure mode
    /// decides the request.
    #[error("a key of policy {policy:?} holds data Tollgate did not write ({found}); it was left untouched: give Tollgate a key prefix of its own, or remove that value")]
    Conflict {
        /// The policy whose key it is (never the key: it holds a subject).
        policy: String,
        /// What was found there (a type or a shape, never the value).
        found: String,
    },
    /// The store's clock reads an instant it will not decide with (before
    /// 2020 or after 2100, see [`Timestamp::is_plausible`](crate::Timestamp::is_plausible)).
    #[error("the store's clock reads {0}, which is not between 2020-01-01 and 2100-01-01; refusing to decide with it (check the clock given to the store)")]
    ImplausibleTime(crate::Timestamp),
    /// The caller's clock and the store's disagree by more than the store
    /// allows (the Redis store's `max_skew`): a wrong clock, not an outage.
    /// The store's own error says by how much.
    #[error("{0}")]
    ClockSkew(#[source] Box<dyn StdError + Send + Sync>),
    /// The store cannot run this policy's algorithm.
    #[error("this store cannot run the {0} algorithm; use a built-in algorithm or a store with a generic path")]
    Unsupported(&'static str),
    /// The store does not offer this per-key operation (`peek`, `reset`).
    #[error("this store cannot {0} a key's state: use a store that implements Store::{0}")]
    UnsupportedOperation(&'static str),
    /// A block too short or too long for a store to keep
    /// ([`Adjustment::check`](crate::Adjustment::check)).
    #[error("a block of {0:?} is outside 1 ms to 14 days (the longest a store keeps a state); lift a block with reset")]
    InvalidBlock(std::time::Duration),
    /// The store answered something Tollgate does not understand.
    #[error("the store answered unexpectedly: {0}")]
    Protocol(String),
    /// Any other failure of a store implementation.
    #[error("store error: {0}")]
    Backend(#[source] Box<dyn StdError + Send + Sync>),
}

impl StoreError {
    /// Whether the error says the store is down or unreachable (and so
    /// counts towards opening the circuit breaker). A full in-process store
    /// or an unsupported algorithm is not an outage, nor is foreign data at
    /// one key or a wrong clock.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_)
                | StoreError::Unavailable(_)
                | StoreError::Protocol(_)
                | StoreError::Backend(_)
        )
    }

    /// The policy a store error is about, when it is about one policy's
    /// key or budget (a conflict, a policy's full key budget) rather than
    /// the store as a whole.
    pub fn policy(&self) -> Option<&str> {
        match self {
            StoreError::Conflict { policy, .. } => Some(policy),
            StoreError::Full { policy, .. } => policy.as_deref(),
            _ => None,
        }
    }

    /// A short, bounded label for metrics and logs (`timeout`, `unavailable`, …).
    pub fn class(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::CircuitOpen(_) => "circuit_open",
            StoreError::Full { .. } => "full",
            StoreError::Conflict { .. } => "conflict",
            StoreError::ImplausibleTime(_) => "implausible_time",
            StoreError::ClockSkew(_) => "clock_skew",
            StoreError::Unsupported(_) | StoreError::UnsupportedOperation(_) => "unsupported",
            StoreError::InvalidBlock(_) => "invalid_block",
            StoreError::Protocol(_) => "protocol",
            StoreError::Backend(_) => "backend",
        }
    }
}

/// Everything [`Limiter::check`](crate::Limiter::check) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A policy or cost is invalid.
    #[error("invalid policy: {0}")]
    Policy(#[from] PolicyError),
    /// A subject is invalid.
    #[error("invalid subject: {0}")]
    Subject(#[from] SubjectError),
    /// A per-key operation ([`Limiter::peek`](crate::Limiter::peek),
    /// [`Limiter::reset`](crate::Limiter::reset)) failed in the store: an
    /// operator's call, so the failure is reported, not decided by a
    /// failure mode.
    #[error("the store failed: {0}")]
    Store(#[from] StoreError),
    /// A per-key operation was asked for something it cannot do (a
    /// penalty of no units, a block too short or too long, a limiter with
    /// no per-subject layer to change).
    #[error("cannot {operation}: {reason}")]
    Operation {
        /// `penalize`, `reward` or `block`.
        operation: &'static str,
        /// What is wrong, and what to do instead.
        reason: String,
    },
    /// The request context lacks the subject a layer needs (HTTP: 401).
    #[error("layer {layer:?} needs a {scope} subject and the request has none")]
    MissingSubject {
        /// The layer's name.
        layer: String,
        /// What the layer keys on.
        scope: String,
    },
    /// [`Limiter::check`](crate::Limiter::check) was asked to decide a
    /// concurrency layer: its place would stay taken until its lease ran
    /// out. Such a limiter decides with `Limiter::acquire`, whose permit
    /// gives the place back.
    #[error("layer {layer:?} is a concurrency limit: decide with Limiter::acquire, whose permit gives its place back when the work ends (check would hold the place until its lease runs out)")]
    NeedsPermit {
        /// The concurrency layer's name.
        layer: String,
    },
}

/// A limiter that cannot work, refused when it is built
/// ([`LimiterBuilder::build`](crate::LimiterBuilder::build)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The limiter has no layers.
    #[error("a limiter needs at least one layer: add one with LimiterBuilder::layer")]
    NoLayers,
    /// Two layers share a name.
    #[error("two layers are named {0:?}; layer names must be unique")]
    DuplicateLayer(String),
    /// Two layers count with the same policy (name and version) and scope:
    /// they would share one counter, and every request would be charged
    /// twice against it.
    #[error("layers {first:?} and {second:?} both count policy {policy:?} by the same scope, so they would share one counter: give one of them another scope or policy")]
    SharedCounter {
        /// The earlier layer.
        first: String,
        /// The later layer.
        second: String,
        /// The policy both count.
        policy: String,
    },
    /// A layer falls back to the emergency store but the limiter has none.
    #[error("layer {0:?} falls back to an emergency store on store failure; give the limiter one with LimiterBuilder::fallback_store")]
    NoFallbackStore(String),
    /// A concurrency layer falls back to the emergency store on store
    /// failure: the emergency store's places would never be given back.
    #[error("layer {0:?} is a concurrency limit, which cannot fall back to an emergency store: let it fail open or closed")]
    ConcurrencyFallback(String),
    /// A plan cannot be used ([`LimiterBuilder::plans`](crate::LimiterBuilder::plans)).
    #[error("plan {plan:?}: {reason}")]
    Plan {
        /// The plan's name.
        plan: String,
        /// What is wrong with it.
        reason: String,
    },
}
