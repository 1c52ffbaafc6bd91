//! HTTP targets: steps the server runs itself by calling a URL, under a normal fenced lease.
//!
//! A step (or its compensation) names an `http` target instead of an `agent`. It is claimed
//! under a derived, reserved agent name per target host (`http:billing.internal:443`), so the
//! per-agent limits (concurrency, rate, pause) become per-host limits and the waiting reasons
//! name the host. What is decided here is pure: the target's shape and checks, the agent name,
//! how an answer maps to an outcome, the `Retry-After` rule and the circuit breaker's states.
//! The server's `push` module does the I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::spec::{Limits, SpecError};
use crate::time::{Span, Timestamp};

/// Agent names starting with this are reserved for HTTP targets: a client cannot name one.
pub const AGENT_PREFIX: &str = "http:";
/// Headers a target may carry at most.
pub const HEADERS_MAX: usize = 32;
/// Bytes of one header value at most.
pub const HEADER_VALUE_BYTES: usize = 4096;
/// Longest target URL.
pub const URL_BYTES: usize = 2048;
/// Headers the server sets itself on every request; a target may not set them.
pub const RESERVED_HEADERS: [&str; 8] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "idempotency-key",
    "webhook-",
    "overseer-",
];

/// The HTTP method a target is called with. The body is always the JSON request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
#[schema(as = HttpMethod)]
pub enum Method {
    #[default]
    Post,
    Put,
    Patch,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
        }
    }
}

/// Where and how an HTTP step is sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpTarget {
    /// An absolute `http://` or `https://` URL.
    pub url: String,
    #[serde(default)]
    pub method: Method,
    /// Sent with every request (e.g. `Authorization`). Shown redacted in job views.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// How long one request may take; at most the step's timeout, which it defaults to (and
    /// which defaults to it when only this one is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Span>,
    /// The target answers 202 at once and later completes or fails the lease itself through
    /// the lease endpoints, with the lease id it was sent (heartbeating if it needs longer).
    #[serde(default, rename = "async", skip_serializing_if = "std::ops::Not::not")]
    pub asynchronous: bool,
}

/// The parts of a target URL that name the host being called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    /// Lower case; an IPv6 literal keeps its brackets.
    pub host: String,
    pub port: u16,
}

/// Splits an absolute http(s) URL into scheme, host and port, refusing credentials in it.
pub fn endpoint(url: &str) -> Result<Endpoint, String> {
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err("must be an absolute http:// or https:// URL".into());
    };
    if url.len() > URL_BYTES || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must be at most {URL_BYTES} bytes with no white space"
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("credentials in the URL are refused; send them in `headers`".into());
    }
    let (host, port) = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => (&authority[..i], Some(&authority[i + 1..])),
        _ => (authority, None),
    };
    if host.is_empty() || (host.starts_with('[') != host.ends_with(']')) {
        return Err("the URL names no host".into());
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{p}` is not a port"))?,
        None if https => 443,
        None => 80,
    };
    Ok(Endpoint {
        https,
        host: host.to_ascii_lowercase(),
        port,
    })
}

impl HttpTarget {
    /// The reserved agent name its steps are claimed under: one per host and port.
    pub fn agent_name(&self) -> Result<String, String> {
        let e = endpoint(&self.url)?;
        Ok(format!("{AGENT_PREFIX}{}:{}", e.host, e.port))
    }

    /// Checks the target; `at` is its field path (`steps[0].http`). `lease` is the timeout of
    /// the lease it runs under, when given explicitly.
    pub fn validate(
        &self,
        at: &str,
        lease: Option<Span>,
        limits: &Limits,
    ) -> Result<(), SpecError> {
        let name = self
            .agent_name()
            .map_err(|why| SpecError::new(format!("{at}.url"), why))?;
        if name.len() > limits.name_bytes {
            return Err(SpecError::new(
                format!("{at}.url"),
                format!("the host name is longer than {} bytes", limits.name_bytes),
            ));
        }
        if self.headers.len() > HEADERS_MAX {
            return Err(SpecError::new(
                format!("{at}.headers"),
                format!("at most {HEADERS_MAX} headers"),
            ));
        }
        for (k, v) in &self.headers {
            let field = format!("{at}.headers.{k}");
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if k.is_empty() || k.len() > limits.name_bytes || !k.chars().all(token) {
                return Err(SpecError::new(field, "not a valid header name"));
            }
            let lower = k.to_ascii_lowercase();
            if RESERVED_HEADERS
                .iter()
                .any(|r| lower == *r || (r.ends_with('-') && lower.starts_with(r)))
            {
                return Err(SpecError::new(field, "the server sets this header itself"));
            }
            if v.len() > HEADER_VALUE_BYTES || v.chars().any(|c| c.is_control() && c != '\t') {
                return Err(SpecError::new(
                    field,
                    format!("values are at most {HEADER_VALUE_BYTES} bytes, no control characters"),
                ));
            }
        }
        if let Some(t) = self.timeout {
            let max = lease.unwrap_or(limits.timeout_max);
            if t < crate::spec::MIN_TIMEOUT || t > max {
                return Err(SpecError::new(
                    format!("{at}.timeout"),
                    format!(
                        "timeout must be between {} and {max} (the lease's timeout)",
                        crate::spec::MIN_TIMEOUT
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The target as job views show it: header values hidden, as they often carry credentials.
    pub fn redacted(&self) -> HttpTarget {
        HttpTarget {
            headers: self
                .headers
                .keys()
                .map(|k| (k.clone(), "<redacted>".to_string()))
                .collect(),
            ..self.clone()
        }
    }
}

/// What an answer from a target means for the attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: the step succeeded; the JSON body is its result.
    Success,
    /// 202 from an `async` target: the target took the lease and reports through the API.
    Accepted,
    /// Retry later (5xx, 408, 409, 429; timeouts and connection errors likewise).
    Retryable,
    /// The target refused the work for good (other 4xx; 3xx, as redirects are not followed).
    Fatal,
}

/// Maps a status code to a verdict. `asynchronous`: the target is in async mode.
pub fn verdict(status: u16, asynchronous: bool) -> Verdict {
    match status {
        202 if asynchronous => Verdict::Accepted,
        200..=299 => Verdict::Success,
        408 | 409 | 429 => Verdict::Retryable,
        500..=599 => Verdict::Retryable,
        _ => Verdict::Fatal,
    }
}

/// Reads a `Retry-After` value: delay-seconds, or an HTTP date (a date past gives zero).
pub fn retry_after(value: &str, now: Timestamp) -> Option<Span> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Span::from_millis(secs.saturating_mul(1000)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = Timestamp::from_millis(at.timestamp_millis());
    Some(if at > now { now.until(at) } else { Span::ZERO })
}

/// The retry delay a target asked for, kept within the step's backoff bounds: never shorter
/// than `initial` (a target cannot make the server hammer it) nor longer than `max` (a target
/// cannot park a step for ever).
pub fn bounded_retry_after(backoff: &Backoff, asked: Span) -> Span {
    asked
        .max(backoff.initial)
        .min(backoff.max.max(backoff.initial))
}

/// When a host's circuit breaker opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failed attempts (retryable outcomes) that open the breaker; 0 = never.
    pub failures: u32,
    /// How long an open breaker waits before letting one probe through.
    pub cool_down: Span,
}

/// Where one host's breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// No claims until `until`.
    Open {
        until: Timestamp,
    },
    /// One probe may be claimed; `probing` once it is out.
    HalfOpen {
        probing: bool,
    },
}

/// A circuit breaker for one host: while open, the host's steps are not claimed, so they wait
/// (with their attempts intact) instead of failing against a host that is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    pub state: BreakerState,
    /// Retryable outcomes in a row.
    pub failures: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: BreakerState::Closed,
            failures: 0,
        }
    }
}

impl Breaker {
    /// How many leases may be claimed at `now` (`None`: no limit from the breaker). Moves an
    /// open breaker whose cool-down ended to half-open.
    pub fn allowance(&mut self, now: Timestamp) -> Option<usize> {
        match self.state {
            BreakerState::Closed => None,
            BreakerState::Open { until } if now < until => Some(0),
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen { probing: false };
                Some(1)
            }
            BreakerState::HalfOpen { probing } => Some(usize::from(!probing)),
        }
    }

    /// `n` leases were claimed (a half-open breaker's probe is now out).
    pub fn claimed(&mut self, n: usize) {
        if n > 0 && matches!(self.state, BreakerState::HalfOpen { .. }) {
            self.state = BreakerState::HalfOpen { probing: true };
        }
    }

    /// A claimed lease was released without an attempt (e.g. shutdown): a probe may go again.
    pub fn released(&mut self) {
        if self.state == (BreakerState::HalfOpen { probing: true }) {
            self.state = BreakerState::HalfOpen { probing: false };
        }
    }

    /// Records an attempt's outcome: `healthy` when the host answered in a way that is not a
    /// retryable failure (a success, or a fatal refusal, which says the host is up).
    pub fn record(&mut self, healthy: bool, now: Timestamp, settings: &BreakerSettings) {
        if healthy {
            *self = Breaker::default();
            return;
        }
        self.failures = self.failures.saturating_add(1);
        let probe_failed = matches!(self.state, BreakerState::HalfOpen { .. });
        if settings.failures > 0 && (probe_failed || self.failures >= settings.failures) {
            self.state = BreakerState::Open {
                until: now.plus(settings.cool_down),
            };
        }
    }

    pub fn is_open(&self) -> bool {
        !matches!(self.state, BreakerState::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> HttpTarget {
        HttpTarget {
            url: url.into(),
            method: Method::Post,
            headers: BTreeMap::new(),
            timeout: None,
            asynchronous: false,
        }
    }

    // Proves agent names are derived per host and port, with scheme default ports, lower-cased
    // hosts and IPv6 literals, and that credentials, other schemes and empty hosts are refused.
    #[test]
    fn agent_names_are_one_per_host_and_port() {
        let name = |u: &str| target(u).agent_name();
        assert_eq!(
            name("https://Billing.internal/charge").unwrap(),
            "http:billing.internal:443"
        );
        assert_eq!(
            name("http://billing:8080/x?y=1").unwrap(),
            "http:billing:8080"
        );
        assert_eq!(name("http://[::1]:9/x").unwrap(), "http:[::1]:9");
        assert_eq!(name("http://127.0.0.1").unwrap(), "http:127.0.0.1:80");
        for bad in [
            "ftp://x/",
            "http://",
            "http:///x",
            "http://u:p@host/",
            "http://host:99999/",
            "http://host:0/",
            "http://host /",
        ] {
            assert!(name(bad).is_err(), "{bad}");
        }
    }

    // Proves the answer mapping: 2xx succeed, 202 is taken over only in async mode, 408/409/429
    // and 5xx retry, every other status (other 4xx, 3xx) is fatal.
    #[test]
    fn answers_map_to_verdicts() {
        let cases = [
            (200, false, Verdict::Success),
            (204, false, Verdict::Success),
            (202, false, Verdict::Success),
            (202, true, Verdict::Accepted),
            (200, true, Verdict::Success),
            (400, false, Verdict::Fatal),
            (404, false, Verdict::Fatal),
            (422, false, Verdict::Fatal),
            (408, false, Verdict::Retryable),
            (409, false, Verdict::Retryable),
            (429, false, Verdict::Retryable),
            (500, false, Verdict::Retryable),
            (503, false, Verdict::Retryable),
            (301, false, Verdict::Fatal),
            (100, false, Verdict::Fatal),
        ];
        for (status, asynchronous, want) in cases {
            assert_eq!(
                verdict(status, asynchronous),
                want,
                "{status} {asynchronous}"
            );
        }
    }

    // Proves `Retry-After` in seconds and as an HTTP date, and that the asked delay is kept
    // within the backoff's initial and max.
    #[test]
    fn retry_after_is_read_and_bounded() {
        let now = Timestamp::parse_rfc3339("2015-10-21T07:28:00Z").unwrap();
        assert_eq!(retry_after("120", now), Some(Span::from_secs(120)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Span::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Span::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
        let b = Backoff {
            initial: Span::from_secs(1),
            factor: 2.0,
            max: Span::from_secs(60),
        };
        assert_eq!(
            bounded_retry_after(&b, Span::from_secs(5)),
            Span::from_secs(5)
        );
        assert_eq!(bounded_retry_after(&b, Span::ZERO), Span::from_secs(1));
        assert_eq!(
            bounded_retry_after(&b, Span::from_secs(3600)),
            Span::from_secs(60)
        );
    }

    // Proves the breaker opens after N retryable failures in a row, lets exactly one probe
    // through after the cool-down, closes on a healthy probe and reopens on a failed one.
    #[test]
    fn breaker_opens_probes_and_closes() {
        let s = BreakerSettings {
            failures: 3,
            cool_down: Span::from_secs(10),
        };
        let t = |secs: i64| Timestamp::from_millis(secs * 1000);
        let mut b = Breaker::default();
        for _ in 0..2 {
            b.record(false, t(0), &s);
        }
        assert_eq!(b.allowance(t(0)), None, "two failures keep it closed");
        b.record(true, t(0), &s);
        assert_eq!(b.failures, 0, "a healthy answer resets the count");
        for _ in 0..3 {
            b.record(false, t(1), &s);
        }
        assert_eq!(b.allowance(t(5)), Some(0), "open during the cool-down");
        assert_eq!(b.allowance(t(11)), Some(1), "half-open: one probe");
        b.claimed(1);
        assert_eq!(b.allowance(t(11)), Some(0), "only one probe at a time");
        b.record(false, t(12), &s);
        assert_eq!(
            b.state,
            BreakerState::Open { until: t(22) },
            "a failed probe reopens"
        );
        assert_eq!(b.allowance(t(22)), Some(1));
        b.claimed(1);
        b.released();
        assert_eq!(b.allowance(t(22)), Some(1), "a released probe may go again");
        b.claimed(1);
        b.record(true, t(23), &s);
        assert_eq!(b.allowance(t(23)), None, "a healthy probe closes it");
        let never = BreakerSettings { failures: 0, ..s };
        for _ in 0..100 {
            b.record(false, t(30), &never);
        }
        assert!(!b.is_open());
    }

    // Proves the target checks name their field: reserved and malformed headers, too many
    // headers, a timeout longer than the lease's, a bad URL.
    #[test]
    fn targets_are_checked_field_by_field() {
        let limits = Limits::default();
        let check =
            |t: &HttpTarget| t.validate("steps[0].http", Some(Span::from_secs(30)), &limits);
        assert!(check(&target("https://billing/charge")).is_ok());
        assert_eq!(
            check(&target("ftp://x")).unwrap_err().field,
            "steps[0].http.url"
        );
        for (k, field) in [
            ("Idempotency-Key", "steps[0].http.headers.Idempotency-Key"),
            (
                "webhook-signature",
                "steps[0].http.headers.webhook-signature",
            ),
            ("bad header", "steps[0].http.headers.bad header"),
        ] {
            let mut t = target("https://billing/charge");
            t.headers.insert(k.into(), "v".into());
            assert_eq!(check(&t).unwrap_err().field, field);
        }
        let mut t = target("https://billing/charge");
        t.headers = (0..33).map(|i| (format!("x-{i}"), "v".into())).collect();
        assert_eq!(check(&t).unwrap_err().field, "steps[0].http.headers");
        let mut t = target("https://billing/charge");
        t.timeout = Some(Span::from_secs(31));
        assert_eq!(check(&t).unwrap_err().field, "steps[0].http.timeout");
        t.headers
            .insert("Authorization".into(), "Bearer secret".into());
        assert!(!serde_json::to_string(&t.redacted())
            .unwrap()
            .contains("secret"));
    }
}
