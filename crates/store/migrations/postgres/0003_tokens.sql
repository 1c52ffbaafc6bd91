-- API tokens: only the SHA-256 of each secret is kept. `scopes` and `agents` are comma lists.

CREATE TABLE tokens (
    name       text PRIMARY KEY,
    hash       text NOT NULL UNIQUE,
    scopes     text NOT NULL,
    agents     text NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint,
    revoked_at bigint
);
