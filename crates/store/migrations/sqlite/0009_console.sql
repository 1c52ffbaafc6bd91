-- What the operator console reads.
--
-- Jobs by the time they finished, for the per-minute counts of `GET /v1/stats`: a window of the
-- last hour reads only the jobs finished in it.
CREATE INDEX jobs_finished ON jobs (finished_at, state) WHERE finished_at IS NOT NULL;

-- A delivered alert or callback is kept (marked with when) for `GET /v1/alerts` instead of
-- deleted, and pruned a week later; only the undelivered are due.
ALTER TABLE deliveries ADD COLUMN delivered_at INTEGER;
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries (next_attempt_at, id)
    WHERE dead = 0 AND delivered_at IS NULL;
CREATE INDEX deliveries_delivered ON deliveries (delivered_at) WHERE delivered_at IS NOT NULL;
CREATE INDEX deliveries_kind ON deliveries (kind, id);
