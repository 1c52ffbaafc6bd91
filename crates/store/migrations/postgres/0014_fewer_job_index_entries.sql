-- Fewer index entries per job row. A job row is written three times in its life (the insert, a
-- claim, the report that finishes it), and each write of a changed row adds an entry to every
-- index of the table, so each index costs three entries a job.
--
-- * `seq` is an identity column: its sequence already makes it unique, and nothing looks a job
--   up by `seq` alone (ordering keys use `jobs_ordering_key`), so its unique index goes.
-- * The unique index on idempotency keys holds only the jobs that have one, as on SQLite
--   (a plain unique constraint also indexes every NULL).
ALTER TABLE jobs DROP CONSTRAINT jobs_seq_key;
ALTER TABLE jobs DROP CONSTRAINT jobs_idempotency_key;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
