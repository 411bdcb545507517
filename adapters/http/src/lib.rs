//! The framework-independent half of Tollgate's HTTP adapters: who a request
//! is ([`Identity`], [`ClientIp`]), and what to answer for a
//! [`Decision`](tollgate_limiter::Decision) ([`decision_headers`], [`Reply`]).
//! [`Gate`] ties them to a [`Limiter`](tollgate_limiter::Limiter).
//!
//! `tollgate-tower` (axum, tonic, hyper) and `tollgate-actix` are thin
//! wrappers over this crate, so every framework sends the same status codes,
//! headers and bytes. Use those crates (or the `tollgate` facade's `tower`,
//! `axum` and `actix` features) rather than this one, unless you are writing
//! an adapter.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use tollgate_limiter::{Limit, Limiter, Policy, Scope};
//! use tollgate_http::{ClientIp, Gate, Identity, Outcome, PeerAddr};
//!
//! let limiter = Limiter::builder(Arc::new(tollgate_memory::MemoryStore::default()))
//!     .layer("ip", Scope::Subject, Policy::new("per-ip", Limit::fixed_window(1, Duration::from_secs(60))?)?)
//!     .build()?;
//! let gate: Gate<http::request::Parts> = Gate::builder(limiter)
//!     .identity(Identity::new().client_ip(ClientIp::direct()))
//!     .build()?;
//!
//! let (mut parts, ()) = http::Request::get("/").body(())?.into_parts();
//! parts.extensions.insert(PeerAddr("192.0.2.1:40000".parse()?));
//! let prepared = gate.prepare(&parts, &parts).expect("rate limited");
//! assert!(matches!(gate.decide(&prepared).await, Outcome::Allow { .. }));
//! let Outcome::Reject(reply) = gate.decide(&prepared).await else { panic!("limit is 1") };
//! assert_eq!(reply.status(), 429);
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
mod client_ip;
mod gate;
mod grpc;
pub mod headers;
mod holding;
mod identity;
pub mod observe;
mod rejection;
mod response;
mod skip;

pub use access::{check_method, check_path, check_subject, AccessRules};
pub use client_ip::{Cidr, ClientIp, TrustedProxies};
pub use gate::{Gate, GateBuilder, GateError, Outcome, Prepared};
pub use grpc::{
    is_grpc, GrpcCode, APPLICATION_GRPC, GRPC_MESSAGE, GRPC_STATUS, GRPC_STATUS_DETAILS,
};
pub use holding::Holding;
pub use identity::{context_from_extensions, single_header_value, Identity, PeerAddr, RequestView};
pub use rejection::{Rejection, RejectionKind};
pub use response::{
    apply_headers, decision_headers, is_list_field, names, HeaderStyle, Headers, Problem, Reply,
    ReplyError, PROBLEM_JSON, QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY,
};
pub use skip::is_cors_preflight;

/// A network or prefix length that [`ClientIp`] and [`TrustedProxies`]
/// cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// A prefix length longer than the address.
    #[error("prefix length /{bits} is longer than the address (at most /{max})")]
    Prefix {
        /// The prefix length given.
        bits: u8,
        /// The longest prefix for the address family.
        max: u8,
    },
    /// A network that cannot be parsed or has host bits set.
    #[error("invalid network: {0}")]
    Cidr(String),
}
