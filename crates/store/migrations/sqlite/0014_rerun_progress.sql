-- Reruns and progress. `rerun_of` names the job a rerun was made from, `rerun_by` the rerun of a
-- job (a job is rerun at most once); both NULL for every job written before this migration. A
-- step keeps the `progress` (JSON) its current or last attempt reported with a heartbeat and when
-- (`progress_at`), and whether a new progress is recorded in the history (`progress_events`).

ALTER TABLE jobs ADD COLUMN rerun_of TEXT;
ALTER TABLE jobs ADD COLUMN rerun_by TEXT;
ALTER TABLE steps ADD COLUMN progress TEXT;
ALTER TABLE steps ADD COLUMN progress_at INTEGER;
ALTER TABLE steps ADD COLUMN progress_events INTEGER NOT NULL DEFAULT 0;
