//! `ShouldRateLimit`'s request as it is on the wire, with descriptor
//! values as bytes.
//!
//! Envoy's protos declare the values `string`, and a `string` decoder
//! refuses bytes that are not UTF-8 — which Envoy turns into an allow
//! (`failure_mode_deny: false`) or a 500. A header value is bytes on the
//! wire (`x-api-key: k\xe9y`), so a client could lift its own limit by
//! sending one. `bytes` and `string` share the wire type, so these
//! messages read every request Envoy sends; each value that is not UTF-8
//! is then counted under its hash (see `rules.rs`).

use crate::rules::{Descriptor, LimitOverride};

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireRequest {
    /// The domain (Envoy's configuration: decoded leniently, it matches a
    /// rule only when it is the rule's UTF-8).
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    /// The descriptors.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    /// Units every descriptor costs (0: 1).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireDescriptor {
    /// Its entries.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    /// Envoy's dynamic limit for this descriptor.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<WireOverride>,
    /// `google.protobuf.UInt64Value`: this descriptor's own cost.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<WireU64>,
}

/// `RateLimitDescriptor.Entry`: a key and its value, as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireEntry {
    /// The key (Envoy's configuration).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value (often a request header: any bytes).
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct WireOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct WireU64 {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

impl WireRequest {
    /// The domain and the descriptors the rules decide.
    pub fn into_descriptors(self) -> (String, Vec<Descriptor>) {
        // The request's 0 (unset) means 1; a descriptor's own 0 checks
        // without charging (envoyproxy/ratelimit's `GetHitsAddends`).
        let hits = u64::from(self.hits_addend).max(1);
        let descriptors = self
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| (lossy(e.key), e.value))
                    .collect(),
                hits: d.hits_addend.map_or(hits, |h| h.value),
                limit: d
                    .limit
                    .map(|o| LimitOverride::from_envoy(o.requests_per_unit, o.unit)),
            })
            .collect();
        (lossy(self.domain), descriptors)
    }
}

/// Text of Envoy's own configuration (a domain, an entry key): never a
/// client's bytes, so a lossy reading cannot merge two clients' budgets.
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}
