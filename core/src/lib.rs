//! Core model of Tollgate (`tollgate-limiter`, re-exported by the `tollgate`
//! facade): policies, subjects, decisions, clocks, the [`Store`] trait every
//! store implements, and the [`Algorithm`] trait for algorithms of one's
//! own (the built-ins are [`Limit`] variants, dispatched by one `match`).
//!
//! This crate does no I/O. Algorithms live in `tollgate-algorithms`, stores
//! in `tollgate-memory` and `tollgate-redis`; the `tollgate` facade crate
//! re-exports all of them behind cargo features.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod adjustment;
mod algorithm;
#[cfg(feature = "blocked-cache")]
mod blocked;
mod budget;
mod context;
mod decide;
mod decision;
mod error;
mod failure;
mod hold;
mod key_hash;
mod layer;
#[cfg(feature = "lease")]
mod lease;
#[cfg(feature = "lease")]
mod lease_table;
#[cfg(feature = "lease")]
mod leased_store;
mod limit;
mod limiter;
mod live;
pub mod observe;
mod operate;
#[cfg(feature = "concurrency")]
mod permit;
mod plan;
#[cfg(feature = "plan-source")]
mod plan_cache;
#[cfg(feature = "plan-source")]
mod plan_flight;
#[cfg(feature = "plan-source")]
mod plan_source;
mod policy;
#[cfg(feature = "concurrency")]
mod release_queue;
mod scoped;
#[cfg(feature = "serde")]
mod spec;
mod store;
mod subject;
mod time;
mod usage;
mod verdicts;
#[cfg(feature = "wait")]
mod wait;

pub use adjustment::Adjustment;
pub use algorithm::{Algorithm, State, Stored, Transition, Verdict};
#[cfg(feature = "blocked-cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocked-cache")))]
pub use blocked::BlockedCacheConfig;
pub use budget::{KeyBudget, WhenFull};
pub use context::Context;
pub use decide::{ask, Decide, Deciding};
pub use decision::{Decision, LayerDecision, Source};
pub use error::{BuildError, Error, HashKeyError, PolicyError, StoreError, SubjectError};
pub use failure::{BreakerConfig, BreakerState, CircuitBreaker, Fallback, OnStoreFailure};
pub use hold::{check_holds, Hold, Holds};
pub use layer::{Layer, Scope};
#[cfg(feature = "lease")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
pub use lease::Lease;
// For Tollgate's sibling crates (the configuration reports each rule
// where it was written): not part of the model an application uses.
#[doc(hidden)]
pub use layer::{duplicate_names, shared_counters};
// Whole: each built-in algorithm's parameters and configuration types
// come from the list of built-ins.
pub use limit::*;
#[cfg(feature = "concurrency")]
pub use limiter::Acquired;
pub use limiter::{Limiter, LimiterBuilder};
pub use live::{LimiterSource, ReloadableRoute, RouteLimits, RouteRequirement};
#[cfg(feature = "concurrency")]
pub use permit::Permit;
pub use plan::{Plan, PlanName, Plans};
#[cfg(feature = "plan-source")]
#[cfg_attr(docsrs, doc(cfg(feature = "plan-source")))]
pub use plan_source::{PlanCacheConfig, PlanSource, PlanSourceError};
#[doc(hidden)]
pub use policy::check_name;
pub use policy::Policy;
pub use scoped::ScopedOperations;
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use spec::{DurationSpec, LimitSpec, ModeSpec, OnFailureSpec, WhenFullSpec};
pub use store::{LayerRequest, Store, StoreKey};
pub use subject::{HashKey, Subject};
#[cfg(feature = "wait")]
pub use time::Sleep;
pub use time::{duration_micros, Clock, ManualClock, MonotonicClock, SystemClock, Timestamp};
pub use usage::{LayerUsage, Usage};
pub use verdicts::{IntoIter as VerdictsIntoIter, Verdicts};
#[cfg(feature = "wait")]
pub use wait::{Rejected, Throttle, WhenLimited};

pub use async_trait::async_trait;
