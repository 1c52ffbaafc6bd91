//! API tokens: the trait, and how a token's grant is kept in a row, the same in both stores:
//! scopes and agent names as comma-separated lists (neither can contain a comma: scopes are
//! fixed words, agent names bound to tokens are checked when the token is made).

use overseer_core::auth::{Grant, Scope, TokenRecord};
use overseer_core::Timestamp;

use crate::{Error, Result};

/// The `scopes` and `agents` columns of a grant.
pub(crate) fn columns(grant: &Grant) -> (String, String) {
    let scopes: Vec<&str> = grant.scopes.iter().map(|s| s.as_str()).collect();
    (scopes.join(","), grant.agents.join(","))
}

/// The grant stored as `scopes` and `agents`.
pub(crate) fn grant(scopes: &str, agents: &str) -> Result<Grant> {
    let scopes = scopes
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Scope::parse(s).ok_or_else(|| Error::Corrupt(format!("tokens.scopes `{s}`"))))
        .collect::<Result<Vec<Scope>>>()?;
    let agents = agents
        .split(',')
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Grant { scopes, agents })
}

/// API tokens (only their hashes are stored) and the cluster-wide secrets kept beside them.
#[async_trait::async_trait]
pub trait Tokens: Send + Sync {
    /// Stores a new token; a name already used (live or revoked) is [`Error::TokenExists`].
    async fn token_create(&self, token: TokenRecord) -> Result<()>;

    /// Every token, oldest first. Hashes are included; callers never show them.
    async fn tokens_list(&self) -> Result<Vec<TokenRecord>>;

    /// The token whose secret hashes to `hash`, live or not.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;

    /// Revokes the named token at `now`; false when no unrevoked token has that name.
    async fn token_revoke(&self, name: &str, now: Timestamp) -> Result<bool>;

    /// The cluster-wide secret stored under `key` (the generated webhook key); when there is
    /// none, stores `value` (made at `now`) and answers it. Concurrent callers on any node all
    /// get the one value that was stored first.
    async fn setting_get_or_insert(&self, key: &str, value: &str, now: Timestamp)
        -> Result<String>;
}
