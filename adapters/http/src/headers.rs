//! The standard rate-limit header values for a [`Decision`], shared by every
//! HTTP adapter: `RateLimit-Policy` and `RateLimit` as structured fields
//! (draft-ietf-httpapi-ratelimit-headers-10, one list item per layer) and
//! `Retry-After`.
//!
//! ```
//! # use std::time::Duration;
//! # use tollgate_limiter::*;
//! # use tollgate_http::headers;
//! let policy = Policy::new("search", Limit::fixed_window(100, Duration::from_secs(60))?)?;
//! let layer = Layer::new("key", Scope::Subject, policy);
//! let decision = Decision::new([LayerDecision::new(&layer, Verdict {
//!     allowed: true, limit: 100, remaining: 42,
//!     reset_after: Duration::from_millis(12_300), retry_after: None,
//! }, Source::Store)]);
//! assert_eq!(headers::rate_limit_policy(&decision, false), r#""search";q=100;w=60"#);
//! assert_eq!(headers::rate_limit(&decision, false), r#""search";r=42;t=13"#);
//! assert_eq!(headers::retry_after_secs(&decision), None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;
use std::fmt::Write;
use std::time::Duration;

use tollgate_limiter::{Decision, LayerDecision, Limit, Source};

/// Whole seconds in `d`, rounded up (at most `u64::MAX`: a wait of
/// [`Duration::MAX`], a breaker open for good, stays the longest).
///
/// ```
/// # use std::time::Duration;
/// use tollgate_http::headers::ceil_secs;
/// assert_eq!(ceil_secs(Duration::from_millis(1_001)), 2);
/// assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
/// ```
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Whole milliseconds in `d`, rounded up (at most `u64::MAX`), for a wait
/// written in a body: a client that retries after it is never early.
///
/// ```
/// # use std::time::Duration;
/// use tollgate_http::headers::ceil_millis;
/// assert_eq!(ceil_millis(Duration::from_nanos(333_333_334)), 334);
/// assert_eq!(ceil_millis(Duration::from_millis(60_000)), 60_000);
/// assert_eq!(ceil_millis(Duration::MAX), u64::MAX);
/// ```
pub fn ceil_millis(d: Duration) -> u64 {
    let whole = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    whole.saturating_add(u64::from(!d.subsec_nanos().is_multiple_of(1_000_000)))
}

/// The window `w` a policy announces, in whole seconds (rounded up, at
/// least 1): the window, or the time an empty bucket takes to refill. `None`
/// for custom algorithms, whose window Tollgate cannot know (`w` is optional
/// in the draft, and a made-up one would mislead clients).
pub fn window_secs(limit: &Limit) -> Option<u64> {
    limit.window().map(announced)
}

/// A window as announced: whole seconds, rounded up, at least 1.
fn announced(window: Duration) -> u64 {
    ceil_secs(window).max(1)
}

/// Seconds a layer announces as `t`: until it admits again when it denies,
/// until it is full again otherwise.
pub fn layer_t(layer: &LayerDecision) -> u64 {
    ceil_secs(layer.wait())
}

/// Whether a layer appears in the headers: enforced layers always, shadow
/// layers only when `shadow` (clients must not pace themselves by a limit
/// that is not enforced).
pub fn is_shown(layer: &LayerDecision, shadow: bool) -> bool {
    shadow || !layer.is_shadow()
}

/// The `RateLimit-Policy` value: `"<policy>";q=<quota>;w=<window seconds>`
/// per layer shown ([`is_shown`]; `w` omitted when unknown, see
/// [`window_secs`]); a concurrency limit is
/// `"<policy>";q=<places>;qu="concurrent-requests"` (its lease is no
/// window: read as one, `q` would be a rate).
pub fn rate_limit_policy(decision: &Decision, shadow: bool) -> String {
    let mut out = String::new();
    let shown = decision.layers().iter().filter(|l| is_shown(l, shadow));
    for (i, layer) in shown.clone().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let name = item_name(layer, shown.clone());
        let _ = write!(out, "{sep}\"{name}\";q={}", layer.verdict().limit);
        if layer.is_concurrency() {
            out.push_str(";qu=\"concurrent-requests\"");
        } else if let Some(w) = layer.window().map(announced) {
            let _ = write!(out, ";w={w}");
        }
    }
    out
}

/// The name a layer's items carry in both lists: its policy's, unless
/// another layer `shown` beside it decides by the same policy (one per
/// subject, one per tenant): then the layer's own, when it is a plain
/// name (as policy names are) that no other shown layer's policy has, so
/// that each item names one limit; else the policy's and the layer's
/// place among those shown (`"api#2"`: no policy's or plain name holds a
/// `#`, so no other item is named so).
pub(crate) fn item_name<'a>(
    layer: &LayerDecision,
    shown: impl Iterator<Item = &'a LayerDecision> + Clone,
) -> Cow<'static, str> {
    let policy = layer.policy();
    if shown.clone().filter(|l| l.policy() == policy).count() < 2 {
        return Cow::Borrowed(policy);
    }
    let own = layer.layer();
    let plain = tollgate_limiter::check_name("layer", own).is_ok();
    let others_policy = shown
        .clone()
        .any(|l| !std::ptr::eq(l, layer) && l.policy() == own && own != policy);
    if plain && !others_policy {
        return Cow::Borrowed(own);
    }
    let place = shown.take_while(|l| !std::ptr::eq(*l, layer)).count() + 1;
    Cow::Owned(format!("{policy}#{place}"))
}

/// Whether a layer's numbers come from counting (the store, the emergency
/// store, the blocked-key cache), rather than from a failure mode that
/// counted nothing: a client pacing itself by `r` and `t` must not read an
/// outage as a spent quota.
pub fn is_counted(layer: &LayerDecision) -> bool {
    !matches!(layer.source, Source::FailClosed | Source::FailOpen)
}

/// The `RateLimit` value: `"<policy>";r=<remaining>;t=<seconds>` per
/// counted layer shown ([`is_counted`], [`is_shown`]); empty when there is
/// none.
pub fn rate_limit(decision: &Decision, shadow: bool) -> String {
    let mut out = String::new();
    let named = decision.layers().iter().filter(|l| is_shown(l, shadow));
    let shown = named.clone().filter(|l| is_counted(l));
    for (i, layer) in shown.enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let _ = write!(
            out,
            "{sep}\"{}\";r={};t={}",
            item_name(layer, named.clone()),
            layer.verdict().remaining,
            layer_t(layer)
        );
    }
    out
}

/// `Retry-After` for a denied decision: whole seconds, rounded up, at least 1,
/// and never earlier than the `t` any denying layer announced.
pub fn retry_after_secs(decision: &Decision) -> Option<u64> {
    decision
        .denied_layers()
        .map(layer_t)
        .max()
        .map(|t| t.max(1))
}
