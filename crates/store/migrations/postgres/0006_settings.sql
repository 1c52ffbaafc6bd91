-- Values the server makes once and every node shares (e.g. the generated webhook secret).

CREATE TABLE settings (
    key        text PRIMARY KEY,
    value      text NOT NULL,
    created_at bigint NOT NULL
);
