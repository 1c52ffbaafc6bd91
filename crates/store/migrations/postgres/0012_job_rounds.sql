-- Whole-job retry: `round` is the round a `compensate_and_retry` job is in (from 1), and
-- `job_retry` its policy as JSON (rounds at most, backoff between them); NULL for every other job,
-- which is every job written before this migration.

ALTER TABLE jobs ADD COLUMN round bigint NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN job_retry text;
