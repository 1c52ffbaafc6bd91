-- No foreign keys from a job's rows to the job: each one cost a lookup of the job (and a lock on
-- it) for every event, step and lease row inserted, about 10 µs a row, on the hottest path. Every
-- writer already holds the job's row lock, and removing a job deletes its rows explicitly.

ALTER TABLE job_labels DROP CONSTRAINT IF EXISTS job_labels_job_id_fkey;
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_job_id_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_job_id_fkey;
ALTER TABLE leases DROP CONSTRAINT IF EXISTS leases_job_id_fkey;
