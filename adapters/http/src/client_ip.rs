//! The client's IP address, trusting forwarding headers only as far as the
//! server says, and the subject it becomes (grouped by network prefix).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use tollgate_limiter::Subject;

use crate::CidrError;

/// Which hops in front of this server are trusted to report the client's
/// address in `X-Forwarded-For`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrustedProxies {
    /// No proxy: the TCP peer is the client, and `X-Forwarded-For` is ignored.
    None,
    /// Exactly this many proxies, each appending the address it received the
    /// request from. The client is the `hops`-th entry of `X-Forwarded-For`
    /// counted from the right.
    Hops(usize),
    /// Proxies whose addresses fall in these networks. Walking
    /// `X-Forwarded-For` from the right, from the TCP peer, the first address
    /// outside them is the client.
    Cidrs(Vec<Cidr>),
}

/// Turns a request's addresses into the client IP subject.
///
/// The TCP peer is the only address nobody can forge, so it is the default;
/// `X-Forwarded-For` is read only through an explicit [`TrustedProxies`]
/// setting, and always from the right: entries to the left of the ones the
/// trusted proxies appended were written by the client and prove nothing.
///
/// Addresses are grouped into networks before they become subjects: IPv4 by
/// /32 (one address) and IPv6 by /64 (one customer site, usually — a single
/// IPv6 host can pick any of 2^64 addresses in its /64, so counting by full
/// address would give it unlimited buckets).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate_http::{Cidr, ClientIp};
///
/// // One proxy (a load balancer at 10.0.0.5) in front of the server.
/// let ip = ClientIp::trusted_proxies(["10.0.0.0/8".parse::<Cidr>()?]);
/// let peer: IpAddr = "10.0.0.5".parse()?;
/// // The client wrote "1.1.1.1" itself; the proxy appended the real address.
/// let client = ip.client_addr(Some(peer), &[b"1.1.1.1, 203.0.113.9"]).unwrap();
/// assert_eq!(client, "203.0.113.9".parse::<IpAddr>()?);
/// assert_eq!(ip.subject(client).as_str(), "ip:203.0.113.9/32");
///
/// // IPv6 clients are grouped by /64.
/// let v6: IpAddr = "2001:db8:1:2:aaaa::1".parse()?;
/// assert_eq!(ip.subject(v6).as_str(), "ip:2001:db8:1:2::/64");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    proxies: TrustedProxies,
    v4_prefix: u8,
    v6_prefix: u8,
}

impl ClientIp {
    /// The TCP peer is the client; no header is trusted.
    pub fn direct() -> Self {
        ClientIp::with(TrustedProxies::None)
    }

    /// Behind exactly `hops` proxies (`0` is the same as [`ClientIp::direct`]).
    ///
    /// Only safe when nothing can reach the server except through those
    /// proxies: a client connecting directly could write any
    /// `X-Forwarded-For` it likes. Prefer [`ClientIp::trusted_proxies`] when
    /// the proxies' addresses are known.
    pub fn trusted_hops(hops: usize) -> Self {
        ClientIp::with(TrustedProxies::Hops(hops))
    }

    /// Behind proxies whose addresses fall in `cidrs`.
    pub fn trusted_proxies(cidrs: impl IntoIterator<Item = Cidr>) -> Self {
        ClientIp::with(TrustedProxies::Cidrs(cidrs.into_iter().collect()))
    }

    /// A setting from its parts, with the default prefixes (/32 and /64).
    pub fn with(proxies: TrustedProxies) -> Self {
        ClientIp {
            proxies,
            v4_prefix: 32,
            v6_prefix: 64,
        }
    }

    /// Group IPv4 clients by this prefix length (0–32, default 32).
    pub fn ipv4_prefix(mut self, bits: u8) -> Result<Self, CidrError> {
        if bits > 32 {
            return Err(CidrError::Prefix { bits, max: 32 });
        }
        self.v4_prefix = bits;
        Ok(self)
    }

    /// Group IPv6 clients by this prefix length (0–128, default 64).
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, CidrError> {
        if bits > 128 {
            return Err(CidrError::Prefix { bits, max: 128 });
        }
        self.v6_prefix = bits;
        Ok(self)
    }

    /// The trusted proxies.
    pub fn proxies(&self) -> &TrustedProxies {
        &self.proxies
    }

    /// The client's address, from the TCP `peer` and the request's
    /// `X-Forwarded-For` field lines (in the order received). `None` only
    /// when the peer address is unknown.
    ///
    /// When the header does not look like the configured proxies wrote it
    /// (too few entries, or an entry that is not an address where a trusted
    /// proxy should have put one), the nearest trusted proxy's address is
    /// used: such requests share one bucket rather than letting the header
    /// choose one.
    pub fn client_addr(&self, peer: Option<IpAddr>, forwarded_for: &[&[u8]]) -> Option<IpAddr> {
        let peer = peer?.to_canonical();
        match &self.proxies {
            TrustedProxies::None | TrustedProxies::Hops(0) => Some(peer),
            TrustedProxies::Hops(hops) => {
                let entries = entries(forwarded_for);
                // The proxies appended `hops` entries; the leftmost of those
                // is the address the outermost proxy saw: the client.
                let client = entries
                    .len()
                    .checked_sub(*hops)
                    .and_then(|i| parse_entry(entries[i]));
                Some(client.unwrap_or(peer))
            }
            TrustedProxies::Cidrs(cidrs) => {
                let trusted = |ip: &IpAddr| cidrs.iter().any(|c| c.contains(*ip));
                let mut nearest = peer;
                if !trusted(&nearest) {
                    return Some(nearest);
                }
                for entry in entries(forwarded_for).into_iter().rev() {
                    match parse_entry(entry) {
                        Some(ip) if trusted(&ip) => nearest = ip,
                        Some(ip) => return Some(ip),
                        None => return Some(nearest),
                    }
                }
                // Every hop is a trusted proxy: the leftmost one is the client.
                Some(nearest)
            }
        }
    }

    /// The subject for a client address: its network under the configured
    /// prefix, as `ip:<network>/<prefix>`.
    pub fn subject(&self, ip: IpAddr) -> Subject {
        let ip = ip.to_canonical();
        let bits = match ip {
            IpAddr::V4(_) => self.v4_prefix,
            IpAddr::V6(_) => self.v6_prefix,
        };
        let network = mask(ip, bits);
        Subject::new(format!("ip:{network}/{bits}"))
            .expect("an IP network is a valid subject: short, no white space or braces")
    }
}

/// What is wrong with `network` (a subject after `ip:`) as a client's
/// network, when [`ClientIp::subject`] would never write it: it writes
/// `<address>/<bits>`, the address masked to its bits, in its canonical
/// text (IPv4 for an IPv4-mapped IPv6 address).
pub(crate) fn network_subject_error(network: &str) -> Option<String> {
    let canonical = network.split_once('/').and_then(|(address, bits)| {
        let ip = address.parse::<IpAddr>().ok()?.to_canonical();
        let bits = bits.parse::<u8>().ok()?;
        let most = if ip.is_ipv4() { 32 } else { 128 };
        (bits <= most).then(|| format!("{}/{bits}", mask(ip, bits)))
    });
    match canonical {
        Some(canonical) if canonical == network => None,
        Some(canonical) => Some(format!(
            "a client's network is written ip:{canonical}: this entry would match no request"
        )),
        None => Some(
            "a client's network is written ip:<address>/<prefix bits>, as ClientIp names it \
             (ip:203.0.113.7/32): this entry would match no request"
                .to_string(),
        ),
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        ClientIp::direct()
    }
}

/// Every comma-separated entry of every field line, trimmed, in order.
fn entries<'a>(lines: &[&'a [u8]]) -> Vec<&'a [u8]> {
    lines
        .iter()
        .flat_map(|line| line.split(|b| *b == b','))
        .map(|e| e.trim_ascii())
        .filter(|e| !e.is_empty())
        .collect()
}

/// An address in an `X-Forwarded-For` entry: `1.2.3.4`, `1.2.3.4:80`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    let ip = text
        .parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            text.strip_prefix('[')?
                .strip_suffix(']')?
                .parse::<IpAddr>()
                .ok()
        })?;
    Some(ip.to_canonical())
}

/// `ip` with every bit after the first `bits` cleared.
fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & m))
        }
    }
}

/// An IP network: `10.0.0.0/8`, `2001:db8::/32`, or a single address.
///
/// ```
/// use tollgate_http::Cidr;
/// let net: Cidr = "192.168.0.0/16".parse()?;
/// assert!(net.contains("192.168.4.2".parse()?));
/// assert!(!net.contains("10.0.0.1".parse()?));
/// assert!("192.168.0.1/16".parse::<Cidr>().is_err()); // host bits set
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    bits: u8,
}

impl Cidr {
    /// The network `network/bits`; its host bits must be zero.
    pub fn new(network: IpAddr, bits: u8) -> Result<Self, CidrError> {
        let network = network.to_canonical();
        let max = if network.is_ipv4() { 32 } else { 128 };
        if bits > max {
            return Err(CidrError::Prefix { bits, max });
        }
        // A host address with a prefix is usually a typo for a network;
        // widening it silently would trust more hosts than written.
        if mask(network, bits) != network {
            return Err(CidrError::Cidr(format!(
                "{network}/{bits} has host bits set; the network is {}/{bits}",
                mask(network, bits)
            )));
        }
        Ok(Cidr { network, bits })
    }

    /// Whether `ip` is in this network (IPv4-mapped IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && mask(ip, self.bits) == self.network
    }
}

impl FromStr for Cidr {
    type Err = CidrError;
    fn from_str(text: &str) -> Result<Self, CidrError> {
        let bad = || {
            CidrError::Cidr(format!(
                "{text:?} is not an address or a network like 10.0.0.0/8 or 2001:db8::/32"
            ))
        };
        let (addr, bits) = match text.trim().split_once('/') {
            Some((addr, bits)) => (addr, Some(bits.parse::<u8>().map_err(|_| bad())?)),
            None => (text.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let bits = bits.unwrap_or(if addr.to_canonical().is_ipv4() {
            32
        } else {
            128
        });
        Cidr::new(addr, bits)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn direct_ignores_the_header() {
        let c = ClientIp::direct();
        assert_eq!(
            c.client_addr(Some(ip("198.51.100.1")), &[b"1.2.3.4"]),
            Some(ip("198.51.100.1"))
        );
        assert_eq!(c.client_addr(None, &[b"1.2.3.4"]), None);
    }

    #[test]
    fn hops_read_from_the_right_across_field_lines() {
        let c = ClientIp::trusted_hops(2);
        let lines: [&[u8]; 2] = [b"6.6.6.6, 1.1.1.1", b"203.0.113.7 , 10.0.0.2"];
        assert_eq!(
            c.client_addr(Some(ip("10.0.0.3")), &lines),
            Some(ip("203.0.113.7"))
        );
        // Too few entries: the nearest proxy, never a client-written entry.
        assert_eq!(
            c.client_addr(Some(ip("10.0.0.3")), &[b"10.0.0.2"]),
            Some(ip("10.0.0.3"))
        );
    }

    #[test]
    fn cidrs_stop_at_the_first_untrusted_hop() {
        let c = ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
        let lines: [&[u8]; 1] = [b"6.6.6.6, [2001:db8::1]:443, 10.1.1.1"];
        assert_eq!(
            c.client_addr(Some(ip("10.0.0.1")), &lines),
            Some(ip("2001:db8::1"))
        );
        // An untrusted peer is the client, whatever it writes.
        assert_eq!(
            c.client_addr(Some(ip("198.51.100.1")), &lines),
            Some(ip("198.51.100.1"))
        );
        // Garbage where a trusted proxy should have written an address.
        assert_eq!(
            c.client_addr(Some(ip("10.0.0.1")), &[b"1.1.1.1, unknown, 10.1.1.1"]),
            Some(ip("10.1.1.1"))
        );
        // All hops trusted: the leftmost.
        assert_eq!(
            c.client_addr(Some(ip("10.0.0.1")), &[b"10.9.9.9"]),
            Some(ip("10.9.9.9"))
        );
    }

    #[test]
    fn access_rules_accept_only_the_networks_subjects_name() {
        let clients = [
            "192.0.2.1",
            "::ffff:192.0.2.1",
            "2001:db8:a:b:c:d:e:f",
            "::1",
        ];
        for (v4, v6) in [(32, 64), (24, 48), (0, 0), (32, 128)] {
            let c = ClientIp::direct()
                .ipv4_prefix(v4)
                .unwrap()
                .ipv6_prefix(v6)
                .unwrap();
            for client in clients {
                let subject = c.subject(ip(client));
                let network = subject.as_str().strip_prefix("ip:").unwrap();
                assert_eq!(network_subject_error(network), None, "{subject}");
            }
        }
        for odd in [
            "198.51.100.7",
            "198.51.100.7/33",
            "198.51.100.7/24",
            "2001:DB8::/64",
            "::ffff:192.0.2.1/128",
            "192.0.2.1/x",
            "",
        ] {
            assert!(network_subject_error(odd).is_some(), "{odd}");
        }
    }

    #[test]
    fn subjects_group_by_prefix() {
        let c = ClientIp::direct();
        assert_eq!(
            c.subject(ip("::ffff:192.0.2.1")).as_str(),
            "ip:192.0.2.1/32"
        );
        assert_eq!(
            c.subject(ip("2001:db8:a:b:c:d:e:f")).as_str(),
            "ip:2001:db8:a:b::/64"
        );
        let c = c.ipv4_prefix(24).unwrap().ipv6_prefix(48).unwrap();
        assert_eq!(c.subject(ip("192.0.2.77")).as_str(), "ip:192.0.2.0/24");
        assert_eq!(
            c.subject(ip("2001:db8:a:b::1")).as_str(),
            "ip:2001:db8:a::/48"
        );
        assert!(ClientIp::direct().ipv4_prefix(33).is_err());
        assert_eq!(
            ClientIp::direct()
                .ipv6_prefix(0)
                .unwrap()
                .subject(ip("2001:db8::1"))
                .as_str(),
            "ip:::/0"
        );
    }

    #[test]
    fn cidr_parsing() {
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        let single: Cidr = "192.0.2.1".parse().unwrap();
        assert!(single.contains(ip("192.0.2.1")));
        assert!(single.contains(ip("::ffff:192.0.2.1")));
        assert!(!single.contains(ip("192.0.2.2")));
        let v6: Cidr = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("192.0.2.1")));
        assert_eq!(v6.to_string(), "2001:db8::/32");
    }
}
