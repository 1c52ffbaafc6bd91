//! Who may do what. A token carries scopes (and, for agents, the agent names it may lease for);
//! every API route needs one permission. This module decides, purely, whether a token's grant
//! covers a need; the server only looks the token up and turns a refusal into 401 or 403.

use sha2::{Digest, Sha256};

use crate::time::Timestamp;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Everything, including tokens and settings.
    Admin,
    /// Operator actions (cancel, retry, skip, resume, limits, pause, schedules) and reading.
    Operate,
    /// Submitting jobs, and reading them.
    Submit,
    /// Reading only.
    Read,
    /// Taking leases, heartbeating and reporting, optionally for named agents only.
    Agent,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::Admin,
        Scope::Operate,
        Scope::Submit,
        Scope::Read,
        Scope::Agent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Operate => "operate",
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Agent => "agent",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|scope| scope.as_str() == s)
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one API call needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// Anyone, token or not (liveness and readiness).
    Public,
    Read,
    Submit,
    Operate,
    /// Lease work of this agent name (`None`: report on a lease already held).
    Agent(Option<String>),
    Admin,
}

/// What a token grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub scopes: Vec<Scope>,
    /// For the `agent` scope: the agent names it may lease for; empty means any.
    pub agents: Vec<String>,
}

impl Grant {
    /// Whether this grant covers `need`. `admin` covers everything; `operate` and `submit`
    /// include reading; an agent-bound grant leases only for its agent names.
    pub fn permits(&self, need: &Need) -> bool {
        let has = |s: Scope| self.scopes.contains(&s);
        if has(Scope::Admin) {
            return true;
        }
        match need {
            Need::Public => true,
            Need::Read => has(Scope::Read) || has(Scope::Operate) || has(Scope::Submit),
            Need::Submit => has(Scope::Submit),
            Need::Operate => has(Scope::Operate),
            Need::Agent(None) => has(Scope::Agent),
            Need::Agent(Some(agent)) => {
                has(Scope::Agent) && (self.agents.is_empty() || self.agents.contains(agent))
            }
            Need::Admin => false,
        }
    }

    /// Whether reading jobs covers every job. Reading through `submit` alone covers only the
    /// jobs this token submitted (a client of a shared scheduler sees its own work, not its
    /// neighbours').
    pub fn reads_every_job(&self) -> bool {
        [Scope::Admin, Scope::Operate, Scope::Read]
            .iter()
            .any(|s| self.scopes.contains(s))
    }
}

/// A stored token: never its secret, only the secret's hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub name: String,
    /// SHA-256 of the secret, hex.
    pub hash: String,
    pub grant: Grant,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

impl TokenRecord {
    /// Whether the token may be used at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|t| now < t)
    }
}

/// The prefix of every secret, so a leaked one is recognisable (e.g. by secret scanners).
pub const SECRET_PREFIX: &str = "ovr_";

/// A secret from 32 random bytes the caller drew (256 bits): `ovr_` and 64 hex digits.
pub fn secret_from(random: [u8; 32]) -> String {
    format!("{SECRET_PREFIX}{}", hex::encode(random))
}

/// The hash a token is stored and looked up by.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A token name: 1 to 64 of letters, digits, `-`, `_`, `.`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(scopes: &[Scope], agents: &[&str]) -> Grant {
        Grant {
            scopes: scopes.to_vec(),
            agents: agents.iter().map(|a| a.to_string()).collect(),
        }
    }

    // Proves who reads every job: admin, operate and read do; submit alone (or with agent) sees
    // only its own; submit together with read sees all.
    #[test]
    fn submit_alone_reads_only_its_own_jobs() {
        for (scopes, every) in [
            (&[Scope::Admin][..], true),
            (&[Scope::Operate][..], true),
            (&[Scope::Read][..], true),
            (&[Scope::Submit][..], false),
            (&[Scope::Submit, Scope::Agent][..], false),
            (&[Scope::Submit, Scope::Read][..], true),
        ] {
            assert_eq!(grant(scopes, &[]).reads_every_job(), every, "{scopes:?}");
        }
    }

    // Proves the permission table: each scope against each need, and agent binding.
    #[test]
    fn each_scope_covers_what_it_says() {
        let needs = [
            Need::Public,
            Need::Read,
            Need::Submit,
            Need::Operate,
            Need::Agent(Some("dns".into())),
            Need::Agent(None),
            Need::Admin,
        ];
        // (scope, covers each need above in order)
        let table = [
            (Scope::Admin, [true, true, true, true, true, true, true]),
            (
                Scope::Operate,
                [true, true, false, true, false, false, false],
            ),
            (
                Scope::Submit,
                [true, true, true, false, false, false, false],
            ),
            (Scope::Read, [true, true, false, false, false, false, false]),
            (Scope::Agent, [true, false, false, false, true, true, false]),
        ];
        for (scope, expected) in table {
            let g = grant(&[scope], &[]);
            let got: Vec<bool> = needs.iter().map(|n| g.permits(n)).collect();
            assert_eq!(got, expected, "{scope}");
        }
        let dns_only = grant(&[Scope::Agent], &["dns"]);
        assert!(dns_only.permits(&Need::Agent(Some("dns".into()))));
        assert!(!dns_only.permits(&Need::Agent(Some("billing".into()))));
        assert!(dns_only.permits(&Need::Agent(None)));
        assert!(!grant(&[], &[]).permits(&Need::Read));
    }

    // Proves secrets look alike, hash stably, and compare only when equal.
    #[test]
    fn secrets_hash_and_compare() {
        let s = secret_from([7; 32]);
        assert!(s.starts_with(SECRET_PREFIX) && s.len() == 4 + 64);
        assert_eq!(hash_secret(&s), hash_secret(&s.clone()));
        assert_ne!(hash_secret(&s), hash_secret(&secret_from([8; 32])));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
        assert!(valid_name("ci-deploy_1.x") && !valid_name("") && !valid_name("a b"));
        let t = TokenRecord {
            name: "t".into(),
            hash: String::new(),
            grant: grant(&[Scope::Read], &[]),
            created_at: Timestamp::from_millis(0),
            expires_at: Some(Timestamp::from_millis(10)),
            revoked_at: None,
        };
        assert!(t.is_live(Timestamp::from_millis(9)) && !t.is_live(Timestamp::from_millis(10)));
    }
}
