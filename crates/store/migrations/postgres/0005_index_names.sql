-- The same index names on both backends: the unique index on idempotency keys is called what
-- SQLite calls it.

ALTER TABLE jobs RENAME CONSTRAINT jobs_idempotency_key_key TO jobs_idempotency_key;
