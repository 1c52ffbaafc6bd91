//! API tokens in the SQLite store (see `crate::tokens` for the row shape).

use overseer_core::auth::TokenRecord;
use overseer_core::Timestamp;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::rows::DbResult;
use super::SqliteStore;
use crate::{Error, Result, Tokens};

const COLUMNS: &str = "name, hash, scopes, agents, created_at, expires_at, revoked_at";

fn create(conn: &Connection, t: &TokenRecord) -> Result<()> {
    let (scopes, agents) = crate::tokens::columns(&t.grant);
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO tokens ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT DO NOTHING"
        ))
        .db()?
        .execute(params![
            t.name,
            t.hash,
            scopes,
            agents,
            t.created_at.as_millis(),
            t.expires_at.map(Timestamp::as_millis),
            t.revoked_at.map(Timestamp::as_millis),
        ])
        .db()?;
    match inserted {
        0 => Err(Error::TokenExists(t.name.clone())),
        _ => Ok(()),
    }
}

fn record(row: &Row<'_>) -> rusqlite::Result<(TokenRecord, String, String)> {
    let at = |v: Option<i64>| v.map(Timestamp::from_millis);
    let record = TokenRecord {
        name: row.get(0)?,
        hash: row.get(1)?,
        grant: overseer_core::auth::Grant {
            scopes: Vec::new(),
            agents: Vec::new(),
        },
        created_at: Timestamp::from_millis(row.get(4)?),
        expires_at: at(row.get(5)?),
        revoked_at: at(row.get(6)?),
    };
    Ok((record, row.get(2)?, row.get(3)?))
}

fn with_grant((mut t, scopes, agents): (TokenRecord, String, String)) -> Result<TokenRecord> {
    t.grant = crate::tokens::grant(&scopes, &agents)?;
    Ok(t)
}

fn list(conn: &Connection) -> Result<Vec<TokenRecord>> {
    let rows: Vec<_> = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tokens ORDER BY created_at, name"
        ))
        .db()?
        .query_map([], record)
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    rows.into_iter().map(with_grant).collect()
}

fn by_hash(conn: &Connection, hash: &str) -> Result<Option<TokenRecord>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE hash = ?1"))
        .db()?
        .query_row([hash], record)
        .optional()
        .db()?
        .map(with_grant)
        .transpose()
}

fn revoke(conn: &Connection, name: &str, now: Timestamp) -> Result<bool> {
    let n = conn
        .prepare_cached("UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL")
        .db()?
        .execute(params![name, now.as_millis()])
        .db()?;
    Ok(n > 0)
}

#[async_trait::async_trait]
impl Tokens for SqliteStore {
    async fn token_create(&self, token: TokenRecord) -> Result<()> {
        self.write(move |conn| create(conn, &token)).await
    }

    async fn tokens_list(&self) -> Result<Vec<TokenRecord>> {
        self.read(list).await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let hash = hash.to_string();
        self.read(move |conn| by_hash(conn, &hash)).await
    }

    async fn token_revoke(&self, name: &str, now: Timestamp) -> Result<bool> {
        let name = name.to_string();
        self.write(move |conn| revoke(conn, &name, now)).await
    }

    async fn setting_get_or_insert(
        &self,
        key: &str,
        value: &str,
        now: Timestamp,
    ) -> Result<String> {
        let (key, value) = (key.to_string(), value.to_string());
        self.write(move |conn| setting_get_or_insert(conn, &key, &value, now))
            .await
    }
}

/// A shared setting (see `Tokens::setting_get_or_insert`): the first value stored wins.
fn setting_get_or_insert(
    conn: &Connection,
    key: &str,
    value: &str,
    now: Timestamp,
) -> Result<String> {
    conn.prepare_cached(
        "INSERT INTO settings (key, value, created_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT DO NOTHING",
    )
    .db()?
    .execute(params![key, value, now.as_millis()])
    .db()?;
    conn.prepare_cached("SELECT value FROM settings WHERE key = ?1")
        .db()?
        .query_row(params![key], |row| row.get(0))
        .db()
}
