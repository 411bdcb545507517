//! Who a request is: the [`Context`] its limiter layers count by.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tollgate_limiter::{Context, HashKey, PlanName, Subject};

use crate::client_ip::ClientIp;

/// The client's socket address, for stacks that do not record it where the
/// adapter looks (axum's `ConnectInfo` and actix-web's peer address are read
/// directly). Insert it into the request extensions per connection; see the
/// HTTP guide for hyper and tonic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// What identification needs from a request, whatever the framework.
///
/// Implemented here for [`http::request::Parts`] and [`http::Request`]
/// (axum, hyper, tonic); the actix-web adapter implements it for its own
/// request type.
pub trait RequestView {
    /// The request method, uppercase (`GET`, `OPTIONS`, …).
    fn method(&self) -> &str;
    /// The request path, without the query (`/health`).
    fn path(&self) -> &str;
    /// Every value of the header `name` (lowercase), in the order received.
    fn header_values(&self, name: &str) -> Vec<&[u8]>;
    /// The TCP peer's address, if the server recorded it.
    fn peer_ip(&self) -> Option<IpAddr>;
    /// The identity an earlier layer (typically authentication) put into the
    /// request extensions: a [`Context`], or else a [`Subject`].
    fn extension_context(&self) -> Option<Context>;
    /// The plan an earlier layer (authentication) put into the request
    /// extensions ([`PlanName`]), if any. The default reads none: an
    /// adapter of your own implements it to honour plans, and a view that
    /// wraps another delegates it.
    fn extension_plan(&self) -> Option<PlanName> {
        None
    }
}

/// The identity in `extensions`: a [`Context`], or else a [`Subject`].
pub fn context_from_extensions(extensions: &http::Extensions) -> Option<Context> {
    extensions.get::<Context>().cloned().or_else(|| {
        extensions
            .get::<Subject>()
            .cloned()
            .map(Context::for_subject)
    })
}

impl RequestView for http::request::Parts {
    fn method(&self) -> &str {
        self.method.as_str()
    }
    fn path(&self) -> &str {
        self.uri.path()
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect()
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        self.extensions.get::<PeerAddr>().map(|p| p.0.ip())
    }
    fn extension_context(&self) -> Option<Context> {
        context_from_extensions(&self.extensions)
    }
    fn extension_plan(&self) -> Option<PlanName> {
        self.extensions.get::<PlanName>().cloned()
    }
}

impl<B> RequestView for http::Request<B> {
    fn method(&self) -> &str {
        self.method().as_str()
    }
    fn path(&self) -> &str {
        self.uri().path()
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers()
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect()
    }
    fn peer_ip(&self) -> Option<IpAddr> {
        self.extensions().get::<PeerAddr>().map(|p| p.0.ip())
    }
    fn extension_context(&self) -> Option<Context> {
        context_from_extensions(self.extensions())
    }
    fn extension_plan(&self) -> Option<PlanName> {
        self.extensions().get::<PlanName>().cloned()
    }
}

/// A function from the framework's request type to an identity.
type CustomFn<R> = Arc<dyn Fn(&R) -> Option<Context> + Send + Sync>;

enum Source<R: ?Sized> {
    Extension,
    ApiKey {
        header: Box<str>,
        bearer: bool,
        key: HashKey,
    },
    ClientIp(ClientIp),
    Custom(CustomFn<R>),
}

impl<R: ?Sized> Clone for Source<R> {
    fn clone(&self) -> Self {
        match self {
            Source::Extension => Source::Extension,
            Source::ApiKey {
                header,
                bearer,
                key,
            } => Source::ApiKey {
                header: header.clone(),
                bearer: *bearer,
                key: key.clone(),
            },
            Source::ClientIp(ip) => Source::ClientIp(ip.clone()),
            Source::Custom(f) => Source::Custom(f.clone()),
        }
    }
}

impl<R: ?Sized> fmt::Debug for Source<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Extension => f.write_str("Extension"),
            Source::ApiKey { header, bearer, .. } => f
                .debug_struct("ApiKey")
                .field("header", header)
                .field("bearer", bearer)
                .finish_non_exhaustive(),
            Source::ClientIp(ip) => f.debug_tuple("ClientIp").field(ip).finish(),
            Source::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// How a request's identity is found: sources tried in order, the first
/// that answers wins, then an optional fallback subject.
///
/// `R` is the framework's request type (`http::request::Parts` for tower,
/// `ServiceRequest` for actix-web); only [`Identity::custom`] sees it.
///
/// Policy stays the server's: every source reads something the client cannot
/// choose freely (an authenticated identity, a secret it must hold, the
/// socket address) or something you decide in code. Nothing here lets a
/// request pick its policy or its limit.
///
/// ```
/// use tollgate_limiter::{HashKey, Subject};
/// use tollgate_http::{ClientIp, Identity};
///
/// let key = HashKey::new(b"server-side secret, 16+ bytes").unwrap();
/// // The authenticated user if an auth layer set one, else the hashed API
/// // key, else the client address, else one shared anonymous bucket.
/// let identity: Identity<http::request::Parts> = Identity::new()
///     .extension()
///     .api_key("x-api-key", key)
///     .client_ip(ClientIp::direct())
///     .fallback(Subject::new("anonymous")?);
/// # Ok::<(), tollgate_limiter::SubjectError>(())
/// ```
pub struct Identity<R: ?Sized> {
    sources: Vec<Source<R>>,
    fallback: Option<Subject>,
}

impl<R: ?Sized> Identity<R> {
    /// No source: every request is unidentified (HTTP 401) unless a
    /// [fallback](Identity::fallback) is set. Add sources with the methods below.
    pub fn new() -> Self {
        Identity {
            sources: Vec::new(),
            fallback: None,
        }
    }

    /// The [`Context`] (or else the [`Subject`]) an earlier layer inserted
    /// into the request extensions — the way to use an authenticated
    /// principal. Clients cannot set extensions.
    pub fn extension(mut self) -> Self {
        self.sources.push(Source::Extension);
        self
    }

    /// The value of the header `header`, hashed with [`Subject::hashed`]
    /// under `key`: the raw key never reaches a store key or a log line.
    /// A request carrying the header more than once is not identified by it.
    ///
    /// Put an authentication layer that rejects unknown keys *before* the
    /// limiter (or add a per-IP or global layer): otherwise every made-up key
    /// gets a fresh bucket.
    ///
    /// # Panics
    ///
    /// When `header` is not a valid header name.
    pub fn api_key(mut self, header: &str, key: HashKey) -> Self {
        let header = http::HeaderName::from_bytes(header.as_bytes())
            .unwrap_or_else(|_| panic!("{header:?} is not a valid header name"));
        self.sources.push(Source::ApiKey {
            header: header.as_str().into(),
            bearer: false,
            key,
        });
        self
    }

    /// The token of an `Authorization: Bearer <token>` header, hashed like
    /// [`Identity::api_key`] (with the same advice about authentication).
    pub fn bearer_token(mut self, key: HashKey) -> Self {
        self.sources.push(Source::ApiKey {
            header: "authorization".into(),
            bearer: true,
            key,
        });
        self
    }

    /// The client's IP address, grouped by prefix; see [`ClientIp`] for which
    /// forwarding headers are trusted (none unless configured).
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.sources.push(Source::ClientIp(client_ip));
        self
    }

    /// Your own function of the framework's request type; `None` passes to
    /// the next source. It can set a tenant and attributes as well.
    pub fn custom(mut self, f: impl Fn(&R) -> Option<Context> + Send + Sync + 'static) -> Self {
        self.sources.push(Source::Custom(Arc::new(f)));
        self
    }

    /// The subject of requests no source identifies, instead of HTTP 401.
    /// They all share its buckets.
    pub fn fallback(mut self, subject: Subject) -> Self {
        self.fallback = Some(subject);
        self
    }

    /// The identity of `request` (`view` is the same request seen through
    /// [`RequestView`]); `None` when no source answers and there is no
    /// fallback, or when a credential header is sent more than once: an
    /// authentication layer may have checked either value, so neither a
    /// later source nor the fallback may count the request instead.
    pub fn identify(&self, request: &R, view: &dyn RequestView) -> Option<Context> {
        for source in &self.sources {
            let found = match source {
                Source::Extension => view.extension_context(),
                Source::ApiKey {
                    header,
                    bearer,
                    key,
                } => match credential(view, header, *bearer) {
                    Credential::One(k) => Some(Context::for_subject(Subject::hashed(k, key))),
                    Credential::None => None,
                    Credential::Several => return None,
                },
                Source::ClientIp(config) => {
                    let forwarded = view.header_values("x-forwarded-for");
                    config
                        .client_addr(view.peer_ip(), &forwarded)
                        .map(|ip| Context::for_subject(config.subject(ip)))
                }
                Source::Custom(f) => f(request),
            };
            if found.is_some() {
                return found;
            }
        }
        self.fallback.clone().map(Context::for_subject)
    }
}

impl<R: ?Sized> Identity<R> {
    /// This identity's [`ClientIp`] source, if it has one.
    pub(crate) fn client_ip_source(&self) -> Option<&ClientIp> {
        self.sources.iter().find_map(|source| match source {
            Source::ClientIp(config) => Some(config),
            _ => None,
        })
    }
}

/// What identity sources can supply, for checking layers at build time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Supplies {
    /// No source, no fallback.
    Nothing,
    /// Subjects only (API keys, client addresses, a fallback).
    Subjects,
    /// Subjects, tenants and attributes (extensions, custom functions).
    Everything,
}

impl<R: ?Sized> Identity<R> {
    pub(crate) fn supplies(&self) -> Supplies {
        if self
            .sources
            .iter()
            .any(|s| matches!(s, Source::Extension | Source::Custom(_)))
        {
            Supplies::Everything
        } else if self.sources.is_empty() && self.fallback.is_none() {
            Supplies::Nothing
        } else {
            Supplies::Subjects
        }
    }

    /// Whether a credential header this identity reads is in `view` more
    /// than once (it then identifies nobody: see [`identify`](Self::identify)).
    pub(crate) fn repeats_a_credential(&self, view: &dyn RequestView) -> bool {
        self.sources.iter().any(|source| match source {
            Source::ApiKey { header, bearer, .. } => {
                matches!(credential(view, header, *bearer), Credential::Several)
            }
            _ => false,
        })
    }

    /// Whether a source reads the client's address.
    pub(crate) fn reads_client_ip(&self) -> bool {
        self.sources
            .iter()
            .any(|s| matches!(s, Source::ClientIp(_)))
    }

    /// The `WWW-Authenticate` challenge matching the first credential
    /// source: `Bearer`, or `ApiKey header="<name>"`; `Bearer` otherwise.
    pub(crate) fn challenge(&self) -> String {
        self.sources
            .iter()
            .find_map(|s| match s {
                Source::ApiKey { bearer: true, .. } => Some("Bearer".to_string()),
                Source::ApiKey { header, .. } => Some(format!("ApiKey header=\"{header}\"")),
                _ => None,
            })
            .unwrap_or_else(|| "Bearer".to_string())
    }
}

/// The value of a credential header as the limiter reads it: exactly one
/// field line, trimmed, non-empty. An authentication layer that reads the
/// same header this way can never disagree with the limiter about which
/// key a request carries (a request with two is refused by both).
///
/// ```
/// let (parts, ()) = http::Request::get("/").header("x-api-key", "k1")
///     .header("x-api-key", "k2").body(()).unwrap().into_parts();
/// assert_eq!(tollgate_http::single_header_value(&parts, "x-api-key"), None);
/// ```
pub fn single_header_value<'a>(view: &'a dyn RequestView, header: &str) -> Option<&'a [u8]> {
    match credential(view, header, false) {
        Credential::One(value) => Some(value),
        Credential::None | Credential::Several => None,
    }
}

/// What a credential header holds.
enum Credential<'a> {
    /// No secret: no such header, an empty one, or (for a bearer token)
    /// another scheme. The next source may identify the request.
    None,
    /// One secret.
    One(&'a [u8]),
    /// The header on more than one field line: ambiguous, since an auth
    /// layer might check one value while the limiter counts another.
    Several,
}

/// The secret in `header`: exactly one field line, non-empty after trimming,
/// and after `Bearer ` (any case) when `bearer`.
fn credential<'a>(view: &'a dyn RequestView, header: &str, bearer: bool) -> Credential<'a> {
    let values = view.header_values(header);
    let value = match values.as_slice() {
        [] => return Credential::None,
        [value] => value.trim_ascii(),
        _ => return Credential::Several,
    };
    let secret = if bearer {
        match value.split_at_checked(7) {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest.trim_ascii(),
            _ => return Credential::None,
        }
    } else {
        value
    };
    if secret.is_empty() {
        Credential::None
    } else {
        Credential::One(secret)
    }
}

impl<R: ?Sized> Default for Identity<R> {
    /// Extensions only: the identity an authentication layer established.
    fn default() -> Self {
        Identity::new().extension()
    }
}

impl<R: ?Sized> Clone for Identity<R> {
    fn clone(&self) -> Self {
        Identity {
            sources: self.sources.clone(),
            fallback: self.fallback.clone(),
        }
    }
}

impl<R: ?Sized> fmt::Debug for Identity<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("sources", &self.sources)
            .field("fallback", &self.fallback)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::request::Parts;

    fn parts(headers: &[(&str, &str)], peer: Option<&str>) -> Parts {
        let mut b = http::Request::builder();
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        let (mut parts, ()) = b.body(()).unwrap().into_parts();
        if let Some(p) = peer {
            parts.extensions.insert(PeerAddr(p.parse().unwrap()));
        }
        parts
    }

    fn key() -> HashKey {
        HashKey::new(b"0123456789abcdef").unwrap()
    }

    fn who(identity: &Identity<Parts>, p: &Parts) -> Option<String> {
        identity
            .identify(p, p)
            .and_then(|c| c.subject().map(|s| s.to_string()))
    }

    #[test]
    fn sources_in_order_then_fallback() {
        let id: Identity<Parts> = Identity::new()
            .extension()
            .api_key("X-Api-Key", key())
            .client_ip(ClientIp::direct());
        let mut p = parts(&[("x-api-key", "sk_live_1")], Some("192.0.2.1:5000"));
        let hashed = who(&id, &p).unwrap();
        assert!(hashed.starts_with("h.") && !hashed.contains("sk_live"));
        p.extensions.insert(Subject::new("user-1").unwrap());
        assert_eq!(who(&id, &p).unwrap(), "user-1");
        let p = parts(&[], Some("192.0.2.1:5000"));
        assert_eq!(who(&id, &p).unwrap(), "ip:192.0.2.1/32");
        let p = parts(&[], None);
        assert_eq!(who(&id, &p), None);
        let id = id.fallback(Subject::new("anon").unwrap());
        assert_eq!(who(&id, &p).unwrap(), "anon");
    }

    #[test]
    fn api_keys_must_be_single_and_non_empty() {
        let id: Identity<Parts> = Identity::new().api_key("x-api-key", key());
        assert_eq!(who(&id, &parts(&[("x-api-key", "  ")], None)), None);
        let two = parts(&[("x-api-key", "a"), ("x-api-key", "b")], None);
        assert_eq!(who(&id, &two), None);
    }

    /// A key sent twice ends identification: an auth layer may have
    /// accepted the first, so the request may not fall to the client's
    /// address (or the fallback) and be counted in another bucket. A
    /// missing or empty key passes to the next source.
    #[test]
    fn a_repeated_key_is_not_passed_to_the_next_source() {
        let id: Identity<Parts> = Identity::new()
            .api_key("x-api-key", key())
            .client_ip(ClientIp::direct())
            .fallback(Subject::new("anon").unwrap());
        let peer = Some("192.0.2.1:5000");
        let twice = parts(&[("x-api-key", "stolen"), ("x-api-key", "stolen")], peer);
        assert_eq!(who(&id, &twice), None);
        let bearer: Identity<Parts> = Identity::new()
            .bearer_token(key())
            .client_ip(ClientIp::direct());
        let twice = parts(
            &[("authorization", "Bearer a"), ("authorization", "Basic b")],
            peer,
        );
        assert_eq!(who(&bearer, &twice), None);
        for (name, value) in [("x-api-key", " "), ("other", "x")] {
            let p = parts(&[(name, value)], peer);
            assert_eq!(who(&id, &p).as_deref(), Some("ip:192.0.2.1/32"));
        }
        let basic = parts(&[("authorization", "Basic dXNlcg==")], peer);
        assert_eq!(who(&bearer, &basic).as_deref(), Some("ip:192.0.2.1/32"));
        let a = who(&id, &parts(&[("x-api-key", " a ")], None));
        assert_eq!(a, who(&id, &parts(&[("x-api-key", "a")], None)));
    }

    #[test]
    fn bearer_tokens() {
        let id: Identity<Parts> = Identity::new().bearer_token(key());
        let t = who(&id, &parts(&[("authorization", "bearer tok")], None));
        assert_eq!(t, Some(Subject::hashed("tok", &key()).to_string()));
        assert_eq!(
            who(&id, &parts(&[("authorization", "Basic dXNlcg==")], None)),
            None
        );
        assert_eq!(who(&id, &parts(&[("authorization", "Bearer")], None)), None);
    }

    #[test]
    fn custom_sees_the_request() {
        let id: Identity<Parts> = Identity::new().custom(|p: &Parts| {
            let tenant = p.uri.path().strip_prefix("/t/")?;
            Some(Context::new().with_tenant(Subject::new(tenant).ok()?))
        });
        let (p, ()) = http::Request::get("/t/acme").body(()).unwrap().into_parts();
        let ctx = id.identify(&p, &p).unwrap();
        assert_eq!(ctx.tenant().unwrap().as_str(), "acme");
    }
}
