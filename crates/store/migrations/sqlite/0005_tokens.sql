-- API tokens: only the SHA-256 of each secret is kept. `scopes` and `agents` are comma lists.

CREATE TABLE tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    agents     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);
