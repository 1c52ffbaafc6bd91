-- Values the server makes once and every node shares (e.g. the generated webhook secret).

CREATE TABLE settings (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
