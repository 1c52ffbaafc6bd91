-- Retention: finished jobs are removed once kept long enough (see `overseer_core::retention`).
--
-- A job may ask for its own retention at submit; the others follow the server's default for the
-- state they ended in, so each state's cutoff is one range of `jobs_retention`, and the jobs with
-- a retention of their own are found by when they may go.
ALTER TABLE jobs ADD COLUMN retention_ms bigint;
CREATE INDEX jobs_retention ON jobs (state, finished_at)
    WHERE finished_at IS NOT NULL AND retention_ms IS NULL;
CREATE INDEX jobs_retention_own ON jobs ((finished_at + retention_ms))
    WHERE finished_at IS NOT NULL AND retention_ms IS NOT NULL;
-- A removed job's settled deliveries go with it.
CREATE INDEX deliveries_job ON deliveries (job_id);
