//! Requests the server makes on its own (job callbacks, alert webhooks): which addresses they
//! may reach, and how the receiver can tell they came from us.
//!
//! By default nothing internal is reachable: loopback, private, shared (CGNAT), link-local
//! (cloud metadata lives at 169.254.169.254), multicast, broadcast and unspecified addresses,
//! in IPv4, IPv6, and IPv4 written inside IPv6. The decision is made on the address a name
//! *resolves to*, at connect time (so a name that resolves to loopback, or starts to, is
//! refused), and on IP literals before sending; redirects are not followed. `outbound_allow`
//! opens networks (`10.0.0.0/8`) or host names (`hooks.internal`) an operator chooses.
//!
//! Every delivery is signed in the Standard Webhooks shape: `webhook-id`, `webhook-timestamp`
//! and `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// An allowed network: an address and a prefix length.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn parse(s: &str) -> Option<Net> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
            None => {
                let a = s.parse::<IpAddr>().ok()?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Net { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

/// Whether `ip` is internal: never reached unless allowed.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_unspecified()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped().or_else(|| embedded_v4(ip)) {
        return internal_v4(v4);
    }
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (segments[0] & 0xffc0) == 0xfe80
        || (segments[0] & 0xfe00) == 0xfc00
}

/// The IPv4 address inside an IPv4-compatible (`::a.b.c.d`) or NAT64 (`64:ff9b::a.b.c.d`)
/// address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let compatible = s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1);
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    (compatible || nat64).then_some(v4)
}

/// Where outbound requests may go.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    nets: Vec<Net>,
    hosts: Vec<String>,
}

impl Policy {
    /// From `outbound_allow`: each entry a network (`10.0.0.0/8`, `127.0.0.1`) or a host name.
    pub fn new(allow: &[String]) -> Result<Policy, String> {
        let mut policy = Policy::default();
        for entry in allow {
            let entry = entry.trim();
            if let Some(net) = Net::parse(entry) {
                policy.nets.push(net);
            } else if !entry.is_empty() && !entry.contains(['/', ':', ' ']) {
                policy.hosts.push(entry.to_ascii_lowercase());
            } else {
                return Err(format!("`{entry}` is neither a network nor a host name"));
            }
        }
        Ok(policy)
    }

    pub fn permits_ip(&self, ip: IpAddr) -> bool {
        !is_internal(ip) || self.nets.iter().any(|n| n.contains(ip))
    }

    fn permits_any_address(&self, host: &str) -> bool {
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// What can be decided about `url` without resolving it: the scheme, and an IP literal.
    /// A host name is decided at connect time.
    pub fn check_url(&self, url: &str) -> Result<(), String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err("only http:// and https:// URLs are called".into());
        }
        let ip = match parsed.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            Some(url::Host::Domain(_)) => return Ok(()),
            None => return Err("the URL names no host".into()),
        };
        match self.permits_ip(ip) {
            true => Ok(()),
            false => Err(format!(
                "{ip} is an internal address; add it to `outbound_allow` to call it"
            )),
        }
    }
}

/// A resolver that leaves out internal addresses, so a name is refused if it resolves only to
/// such addresses at the moment of connecting.
struct Guarded(Arc<Policy>);

impl reqwest::dns::Resolve for Guarded {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let open = policy.permits_any_address(&host);
            let kept: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| open || policy.permits_ip(a.ip()))
                .collect();
            if kept.is_empty() {
                let msg = format!(
                    "{host} resolves only to internal addresses ({}); add it to `outbound_allow` to call it",
                    found.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>().join(", ")
                );
                return Err(msg.into());
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The HTTP client for outbound requests: guarded resolution, no redirects.
pub fn client(
    policy: Arc<Policy>,
    timeout: std::time::Duration,
) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(std::time::Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(Guarded(policy)))
        .user_agent(concat!("overseer/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Signs deliveries with every key of the `webhook_secret` / `webhook_secrets` settings
/// (`whsec_` and the base64 of the key), so receivers can move from one key to the next.
#[derive(Clone)]
pub struct Signer {
    keys: Vec<Vec<u8>>,
}

/// A new webhook secret from 32 random bytes the caller drew (256 bits).
pub fn generated_secret(random: [u8; 32]) -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(random)
    )
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<secret>)")
    }
}

impl Signer {
    /// A signer with one key.
    pub fn new(secret: &str) -> Result<Signer, String> {
        Signer::with_secrets(&[secret.to_string()])
    }

    /// A signer with every key of `secrets`, in order (at least one).
    pub fn with_secrets(secrets: &[String]) -> Result<Signer, String> {
        if secrets.is_empty() {
            return Err("no secret given".into());
        }
        let keys = secrets
            .iter()
            .map(|s| key_of(s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Signer { keys })
    }

    /// The `webhook-signature` value for a delivery: one `v1,<signature>` per key, separated by
    /// spaces (Standard Webhooks), so a receiver holding any one of the keys can verify.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let one = |key: &[u8]| {
            let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key size");
            mac.update(format!("{id}.{timestamp}.").as_bytes());
            mac.update(body);
            let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
            format!("v1,{sig}")
        };
        let all: Vec<String> = self.keys.iter().map(|k| one(k)).collect();
        all.join(" ")
    }
}

/// The key inside a `whsec_<base64>` secret.
fn key_of(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "must be `whsec_` followed by base64".to_string())?;
    if key.len() < 24 {
        return Err("the key must be at least 24 bytes (32 recommended)".into());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the default deny list, address by address, and that an allowed network opens
    // exactly itself.
    #[test]
    fn internal_addresses_are_refused_unless_allowed() {
        let internal = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ];
        for ip in internal {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "8.8.8.8",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
        let policy = Policy::new(&[
            "10.0.0.0/8".into(),
            "127.0.0.1".into(),
            "hooks.internal".into(),
        ])
        .unwrap();
        assert!(policy.permits_ip("10.9.9.9".parse().unwrap()));
        assert!(policy.permits_ip("127.0.0.1".parse().unwrap()));
        assert!(!policy.permits_ip("127.0.0.2".parse().unwrap()));
        assert!(!policy.permits_ip("192.168.0.1".parse().unwrap()));
        assert!(policy.permits_any_address("HOOKS.internal"));
        assert!(Policy::new(&["10.0.0.0/33".into()]).is_err());
    }

    // Proves what a URL alone decides: schemes, IP literals (v4 and v6), and names left for
    // connect time.
    #[test]
    fn urls_are_judged_before_sending_where_possible() {
        let p = Policy::default();
        assert!(p.check_url("https://hooks.example.com/x").is_ok());
        assert!(
            p.check_url("http://localhost:9/x").is_ok(),
            "names are decided at connect time"
        );
        assert!(p.check_url("http://127.0.0.1:9/x").is_err());
        assert!(p
            .check_url("http://169.254.169.254/latest/meta-data")
            .is_err());
        assert!(p.check_url("http://[::1]:9/").is_err());
        assert!(p.check_url("ftp://example.com/").is_err());
        assert!(p.check_url("file:///etc/passwd").is_err());
    }

    // Proves the signature against a value computed by hand for a fixed key, id, time and body,
    // so a receiver's independent implementation agrees.
    #[test]
    fn signatures_follow_the_standard_shape() {
        let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        let signer = Signer::new(&format!("whsec_{key}")).unwrap();
        let sig = signer.sign("msg_1", 1_700_000_000, b"{\"a\":1}");
        let mut mac = Hmac::<Sha256>::new_from_slice(&[7u8; 32]).unwrap();
        mac.update(b"msg_1.1700000000.{\"a\":1}");
        let expected =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        assert_eq!(sig, format!("v1,{expected}"));
        assert!(Signer::new("whsec_short").is_err());
        assert!(!format!("{signer:?}").contains(&key));
    }

    // Proves rotation: with two keys every delivery carries two space-separated signatures, the
    // first by the first key and the second by the second, each what a one-key signer makes; a
    // generated secret is a valid 32-byte key, different each time.
    #[test]
    fn several_keys_sign_side_by_side() {
        let (new, old) = (generated_secret([1; 32]), generated_secret([2; 32]));
        assert_ne!(new, old);
        let both = Signer::with_secrets(&[new.clone(), old.clone()]).unwrap();
        let header = both.sign("msg_2", 1_700_000_001, b"{}");
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2, "{header}");
        assert_eq!(
            parts[0],
            Signer::new(&new)
                .unwrap()
                .sign("msg_2", 1_700_000_001, b"{}")
        );
        assert_eq!(
            parts[1],
            Signer::new(&old)
                .unwrap()
                .sign("msg_2", 1_700_000_001, b"{}")
        );
        assert!(Signer::with_secrets(&[]).is_err());
        assert!(Signer::with_secrets(&[new, "whsec_short".into()]).is_err());
    }
}
