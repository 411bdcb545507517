//! Who is never rate limited and who is always refused: exempt and denied
//! subjects and client networks, and the requests not limited at all
//! (skipped by method or path).

use std::net::IpAddr;

use tollgate_limiter::Subject;

use crate::client_ip::{network_subject_error, Cidr, ClientIp};

/// Allow lists, deny lists and skip rules, in code
/// ([`GateBuilder::access`](crate::GateBuilder::access)) or from the
/// configuration file's `[access]` section.
///
/// - An **exempt** subject or client network is never charged and gets no
///   rate-limit headers: internal services, health checkers, your own
///   monitoring.
/// - A **denied** subject or network is refused with 403 (gRPC:
///   `PERMISSION_DENIED`), never charged. Denial wins when both match.
/// - A **skipped** method or path is passed on without a decision, like a
///   CORS preflight: `/health`, `/metrics`.
///
/// Subjects are compared as identified: list an API key by its
/// [`Subject::hashed`] form (the configuration never holds the key
/// itself), a client address by [`ClientIp::subject`]'s form, or better by
/// network. Networks are matched against the client address as a
/// [`ClientIp`] reads it — [`AccessRules::client_ip`]'s, else the gate
/// identity's — so behind a proxy they judge the client, not the proxy;
/// building a gate with network rules and neither fails
/// ([`GateError::NetworkRulesNeedClientIp`](crate::GateError::NetworkRulesNeedClientIp)).
/// Denied networks are judged before anything else, skip rules included;
/// subjects after the skip rules (a skipped request is not identified).
///
/// ```
/// use tollgate_http::AccessRules;
/// use tollgate_limiter::Subject;
/// let rules = AccessRules::new()
///     .exempt_network("10.0.0.0/8".parse()?)
///     .deny_subject(Subject::new("h.5f1e0c6a9b2d7e4f8a3c1b0d2e4f6a8c")?)
///     .skip_path("/health")
///     .skip_path("/internal/*");
/// assert!(!rules.is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRules {
    exempt_subjects: Vec<Subject>,
    exempt_networks: Vec<Cidr>,
    denied_subjects: Vec<Subject>,
    denied_networks: Vec<Cidr>,
    pub(crate) skip_methods: Vec<String>,
    pub(crate) skip_paths: Vec<String>,
    client_ip: Option<ClientIp>,
}

/// What the lists say about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Exempt,
    Denied,
}

impl AccessRules {
    /// No rule.
    pub fn new() -> Self {
        AccessRules::default()
    }

    /// Never charge `subject`.
    pub fn exempt_subject(mut self, subject: Subject) -> Self {
        self.exempt_subjects.push(subject);
        self
    }

    /// Never charge clients in `network`.
    pub fn exempt_network(mut self, network: Cidr) -> Self {
        self.exempt_networks.push(network);
        self
    }

    /// Refuse `subject` (403), without charging it.
    pub fn deny_subject(mut self, subject: Subject) -> Self {
        self.denied_subjects.push(subject);
        self
    }

    /// Refuse clients in `network` (403), without charging them.
    pub fn deny_network(mut self, network: Cidr) -> Self {
        self.denied_networks.push(network);
        self
    }

    /// How network rules read the client's address (default: the gate
    /// identity's [`ClientIp`]): say [`ClientIp::direct`] to judge the
    /// TCP peer, or trust your proxies.
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = Some(client_ip);
        self
    }

    /// Do not limit requests of `method` (any case: `options`, `OPTIONS`).
    pub fn skip_method(mut self, method: &str) -> Self {
        self.skip_methods.push(method.to_ascii_uppercase());
        self
    }

    /// Do not limit requests for `path`: exactly that path, or with a
    /// trailing `*` every path starting with what precedes it. It starts
    /// with `/` and holds no query (building the gate checks).
    pub fn skip_path(mut self, path: &str) -> Self {
        self.skip_paths.push(path.to_string());
        self
    }

    /// These rules and `other`'s.
    pub fn merge(mut self, other: AccessRules) -> Self {
        self.exempt_subjects.extend(other.exempt_subjects);
        self.exempt_networks.extend(other.exempt_networks);
        self.denied_subjects.extend(other.denied_subjects);
        self.denied_networks.extend(other.denied_networks);
        self.skip_methods.extend(other.skip_methods);
        self.skip_paths.extend(other.skip_paths);
        self.client_ip = other.client_ip.or(self.client_ip);
        self
    }

    /// The [`ClientIp`] network rules read the address with, if set.
    pub(crate) fn own_client_ip(&self) -> Option<&ClientIp> {
        self.client_ip.as_ref()
    }

    /// The first skip rule that can never match, and why.
    pub(crate) fn invalid_skip_rule(&self) -> Option<(String, String)> {
        let methods = self
            .skip_methods
            .iter()
            .filter_map(|m| check_method(m).err().map(|why| (m.clone(), why)));
        let paths = self
            .skip_paths
            .iter()
            .filter_map(|p| check_path(p).err().map(|why| (p.clone(), why)));
        methods.chain(paths).next()
    }

    /// Whether there is no rule at all.
    pub fn is_empty(&self) -> bool {
        *self == AccessRules::default()
    }

    /// Whether any list names a subject or a network (skip rules aside).
    pub(crate) fn judges(&self) -> bool {
        !(self.exempt_subjects.is_empty()
            && self.exempt_networks.is_empty()
            && self.denied_subjects.is_empty()
            && self.denied_networks.is_empty())
    }

    /// Whether a network rule needs the client's address.
    pub(crate) fn has_networks(&self) -> bool {
        !(self.exempt_networks.is_empty() && self.denied_networks.is_empty())
    }

    /// Whether any subject is denied (then a request whose credential is
    /// ambiguous, sent twice, is refused too).
    pub(crate) fn has_denied_subjects(&self) -> bool {
        !self.denied_subjects.is_empty()
    }

    /// Whether any network is denied (then a request whose address is
    /// unknown is refused too).
    pub(crate) fn has_denied_networks(&self) -> bool {
        !self.denied_networks.is_empty()
    }

    /// Whether a client at `ip` is in a denied network.
    pub(crate) fn denies_network(&self, ip: IpAddr) -> bool {
        self.denied_networks.iter().any(|n| n.contains(ip))
    }

    /// What the lists say about a client at `ip` identified as `subject`:
    /// denied when any deny rule matches, else exempt when any exempt rule
    /// does.
    pub(crate) fn judge(&self, ip: Option<IpAddr>, subject: Option<&Subject>) -> Option<Access> {
        let in_any =
            |networks: &[Cidr]| ip.is_some_and(|ip| networks.iter().any(|n| n.contains(ip)));
        let named = |subjects: &[Subject]| subject.is_some_and(|s| subjects.contains(s));
        if in_any(&self.denied_networks) || named(&self.denied_subjects) {
            Some(Access::Denied)
        } else if in_any(&self.exempt_networks) || named(&self.exempt_subjects) {
            Some(Access::Exempt)
        } else {
            None
        }
    }
}

/// A subject an access rule can name so that a request can match it: a
/// hashed API key as [`Subject::hashed`] writes it (`h.` and 32
/// lower-case hex digits), a client's network as
/// [`ClientIp::subject`](crate::ClientIp::subject) writes it
/// (`ip:<network>/<bits>`, the network in its canonical text); any other
/// subject as it is.
///
/// ```
/// use tollgate_http::check_subject;
/// assert!(check_subject("ip:198.51.100.7/32").is_ok());
/// assert!(check_subject("ip:198.51.100.7").is_err());
/// assert!(check_subject("ip:2001:DB8::/64").is_err()); // ip:2001:db8::/64
/// assert!(check_subject("h.9F811E4CF32DC31E6F422DAAE9C8C27A").is_err());
/// assert!(check_subject("user-42").is_ok());
/// ```
pub fn check_subject(subject: &str) -> Result<(), String> {
    if subject.starts_with("h.") && !Subject::is_hashed_form(subject) {
        return Err(format!(
            "{subject:?} is not a hashed subject: those are h. and 32 lower-case hex digits, \
             as the identity writes them (this entry would match no request)"
        ));
    }
    match subject.strip_prefix("ip:").and_then(network_subject_error) {
        Some(why) => Err(format!("{subject:?}: {why}")),
        None => Ok(()),
    }
}

/// A method a skip rule can name: an HTTP token.
pub fn check_method(method: &str) -> Result<(), String> {
    let token = !method.is_empty()
        && method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        Ok(())
    } else {
        Err(format!(
            "{method:?} is not an HTTP method (GET, OPTIONS, …)"
        ))
    }
}

/// A path a skip rule can name: it starts with `/`, holds no query, and
/// may end with one `*`. Plain ASCII without `%`: tower sees a path as
/// sent (percent-encoded), actix-web decoded, and a rule in either form
/// would match under one adapter only.
pub fn check_path(path: &str) -> Result<(), String> {
    let body = path.strip_suffix('*').unwrap_or(path);
    if !path.is_ascii() || path.contains('%') {
        return Err(format!(
            "{path:?}: a skip rule is plain ASCII without %, matched as one adapter sees it encoded and the other decoded; end it with * before the first such character (\"/docs/*\")"
        ));
    }
    if path.starts_with('/') && !body.contains(['*', '?', '#']) {
        Ok(())
    } else {
        Err(format!(
            "{path:?} is not a path: it starts with /, holds no query, and may end with one * (\"/internal/*\")"
        ))
    }
}

/// Whether `path` matches a skip rule: exactly, or by prefix with `*`.
pub(crate) fn path_matches(rule: &str, path: &str) -> bool {
    match rule.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => rule == path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denial_wins_and_networks_match_the_client() {
        let vip = Subject::new("vip").unwrap();
        let rules = AccessRules::new()
            .exempt_network("10.0.0.0/8".parse().unwrap())
            .exempt_subject(vip.clone())
            .deny_network("10.6.6.0/24".parse().unwrap());
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(rules.judge(ip("10.1.2.3"), None), Some(Access::Exempt));
        assert_eq!(
            rules.judge(ip("10.6.6.6"), Some(&vip)),
            Some(Access::Denied)
        );
        assert_eq!(
            rules.judge(ip("192.0.2.1"), Some(&vip)),
            Some(Access::Exempt)
        );
        assert_eq!(rules.judge(ip("192.0.2.1"), None), None);
        assert_eq!(rules.judge(None, None), None);
    }

    #[test]
    fn skip_rules_are_checked() {
        assert!(check_path("/health").is_ok());
        assert!(check_path("/internal/*").is_ok());
        for bad in [
            "health",
            "/a*/b",
            "/health?x=1",
            "",
            "*",
            "/café",
            "/caf%C3%A9",
        ] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        assert!(check_method("OPTIONS").is_ok());
        assert!(check_method("GET POST").is_err());
        let rules = AccessRules::new().skip_path("/ok").skip_path("nope");
        assert_eq!(
            rules.invalid_skip_rule().map(|(rule, _)| rule),
            Some("nope".to_string())
        );
    }

    #[test]
    fn paths_match_exactly_or_by_prefix() {
        assert!(path_matches("/health", "/health"));
        assert!(!path_matches("/health", "/healthz"));
        assert!(path_matches("/internal/*", "/internal/stats"));
        assert!(!path_matches("/internal/*", "/internals"));
    }
}
