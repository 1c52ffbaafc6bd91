-- Deadlines: a step's `deadline_ms` bounds one attempt however it heartbeats, and
-- `attempt_ends_at` is the hard end of its current (or last) attempt, which no heartbeat renews
-- the lease past. A job's `deadline` is the instant past which it fails; `deadline_due` is that
-- instant while the supervisor must still enforce it (NULL once the job is finished, unwinding or
-- being cancelled), indexed so the sweep and the supervisor's wake-up find it at once. All NULL
-- for rows written before this migration, which had no deadlines.

ALTER TABLE steps ADD COLUMN deadline_ms bigint;
ALTER TABLE steps ADD COLUMN attempt_ends_at bigint;
ALTER TABLE jobs ADD COLUMN deadline bigint;
ALTER TABLE jobs ADD COLUMN deadline_due bigint;

CREATE INDEX jobs_deadline_due ON jobs (deadline_due, id) WHERE deadline_due IS NOT NULL;
