//! API tokens in the PostgreSQL store (see `crate::tokens` for the row shape).

use deadpool_postgres::Transaction;
use overseer_core::auth::TokenRecord;
use overseer_core::Timestamp;
use tokio_postgres::Row;

use super::rows::{execute, get, ms, query, query_opt};
use super::{Failure, Res};
use crate::Error;

const COLUMNS: &str = "name, hash, scopes, agents, created_at, expires_at, revoked_at";

pub(super) async fn create(tx: &Transaction<'_>, t: &TokenRecord) -> Res<()> {
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

pub(super) async fn list(tx: &Transaction<'_>) -> Res<Vec<TokenRecord>> {
    let rows = query(
        tx,
        &format!("SELECT {COLUMNS} FROM tokens ORDER BY created_at, name"),
        &[],
    )
    .await?;
    rows.iter().map(record).collect()
}

pub(super) async fn by_hash(tx: &Transaction<'_>, hash: &str) -> Res<Option<TokenRecord>> {
    let row = query_opt(
        tx,
        &format!("SELECT {COLUMNS} FROM tokens WHERE hash = $1"),
        &[&hash],
    )
    .await?;
    row.as_ref().map(record).transpose()
}

pub(super) async fn revoke(tx: &Transaction<'_>, name: &str, now: Timestamp) -> Res<bool> {
    let n = execute(
        tx,
        "UPDATE tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL",
        &[&name, &now.as_millis()],
    )
    .await?;
    Ok(n > 0)
}

/// A shared setting (see `Store::setting_get_or_insert`): the first value stored wins; a racing
/// insert waits on the key's row and then finds the winner's value.
pub(super) async fn setting_get_or_insert(
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
