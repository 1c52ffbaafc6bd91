//! API tokens in the PostgreSQL store (see `crate::tokens` for the row shape).

use super::tx::Transaction;
use overseer_core::auth::TokenRecord;
use overseer_core::Timestamp;
use tokio_postgres::Row;

use super::rows::{execute, get, ms, query, query_opt};
use super::{Failure, PgStore, Res};
use crate::{Error, Result, Tokens};

const COLUMNS: &str = "name, hash, scopes, agents, created_at, expires_at, revoked_at";

async fn create(tx: &Transaction<'_>, t: &TokenRecord) -> Res<()> {
    let (scopes, agents) = crate::tokens::columns(&t.grant);
    let inserted = execute(
        tx,
        &format!(
            "INSERT INTO tokens ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT DO NOTHING"
        ),
        &[
            &t.name,
            &t.hash,
            &scopes,
            &agents,
            &t.created_at.as_millis(),
            &ms(t.expires_at),
            &ms(t.revoked_at),
        ],
    )
    .await?;
    match inserted {
        0 => Err(Failure::Store(Error::TokenExists(t.name.clone()))),
        _ => Ok(()),
    }
}

fn record(row: &Row) -> Res<TokenRecord> {
    let at = |v: Option<i64>| v.map(Timestamp::from_millis);
    let scopes: String = get(row, 2, "tokens.scopes")?;
    let agents: String = get(row, 3, "tokens.agents")?;
    Ok(TokenRecord {
        name: get(row, 0, "tokens.name")?,
        hash: get(row, 1, "tokens.hash")?,
        grant: crate::tokens::grant(&scopes, &agents).map_err(Failure::Store)?,
        created_at: Timestamp::from_millis(get(row, 4, "tokens.created_at")?),
        expires_at: at(get(row, 5, "tokens.expires_at")?),
        revoked_at: at(get(row, 6, "tokens.revoked_at")?),
    })
}

async fn list(tx: &Transaction<'_>) -> Res<Vec<TokenRecord>> {
    let rows = query(
        tx,
        &format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, name"),
        &[],
    )
    .await?;
    rows.iter().map(record).collect()
}

async fn by_hash(tx: &Transaction<'_>, hash: &str) -> Res<Option<TokenRecord>> {
    let row = query_opt(
        tx,
        &format!("SELECT {COLUMNS} FROM tokens WHERE hash = $1"),
        &[&hash],
    )
    .await?;
    row.as_ref().map(record).transpose()
}

async fn revoke(tx: &Transaction<'_>, name: &str, now: Timestamp) -> Res<bool> {
    let n = execute(
        tx,
        "UPDATE tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL",
        &[&name, &now.as_millis()],
    )
    .await?;
    Ok(n > 0)
}

#[async_trait::async_trait]
impl Tokens for PgStore {
    async fn token_create(&self, token: TokenRecord) -> Result<()> {
        let token = &token;
        self.write(move |tx, _| Box::pin(create(tx, token))).await
    }

    async fn tokens_list(&self) -> Result<Vec<TokenRecord>> {
        self.read(|tx, _| Box::pin(list(tx))).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.read(move |tx, _| Box::pin(by_hash(tx, hash))).await
    }

    async fn token_revoke(&self, name: &str, now: Timestamp) -> Result<bool> {
        self.write(move |tx, _| Box::pin(revoke(tx, name, now)))
            .await
    }

    async fn setting_get_or_insert(
        &self,
        key: &str,
        value: &str,
        now: Timestamp,
    ) -> Result<String> {
        self.write(move |tx, _| Box::pin(setting_get_or_insert(tx, key, value, now)))
            .await
    }
}

/// A shared setting (see `Tokens::setting_get_or_insert`): the first value stored wins; a racing
/// insert waits on the key's row and then finds the winner's value.
async fn setting_get_or_insert(
    tx: &Transaction<'_>,
    key: &str,
    value: &str,
    now: Timestamp,
) -> Res<String> {
    execute(
        tx,
        "INSERT INTO settings (key, value, created_at) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
        &[&key, &value, &now.as_millis()],
    )
    .await?;
    let row = query_opt(tx, "SELECT value FROM settings WHERE key = $1", &[&key]).await?;
    let row = row.ok_or_else(|| super::rows::corrupt("settings", key))?;
    get(&row, 0, "settings.value")
}
