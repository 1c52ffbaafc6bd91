//! API tokens in the SQLite store (see `crate::tokens` for the row shape).

use overseer_core::auth::TokenRecord;
use overseer_core::Timestamp;
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::rows::DbResult;
use crate::{Error, Result};

const COLUMNS: &str = "name, hash, scopes, agents, created_at, expires_at, revoked_at";

pub(super) fn create(conn: &Connection, t: &TokenRecord) -> Result<()> {
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

pub(super) fn list(conn: &Connection) -> Result<Vec<TokenRecord>> {
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

pub(super) fn by_hash(conn: &Connection, hash: &str) -> Result<Option<TokenRecord>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM tokens WHERE hash = ?1"))
        .db()?
        .query_row([hash], record)
        .optional()
        .db()?
        .map(with_grant)
        .transpose()
}

pub(super) fn revoke(conn: &Connection, name: &str, now: Timestamp) -> Result<bool> {
    let n = conn
        .prepare_cached("UPDATE tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL")
        .db()?
        .execute(params![name, now.as_millis()])
        .db()?;
    Ok(n > 0)
}

/// A shared setting (see `Store::setting_get_or_insert`): the first value stored wins.
pub(super) fn setting_get_or_insert(
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
