-- A submit no longer writes a history row: the entries of a new job's admission (its
-- `job_submitted`, `job_started` or `job_pending`, `step_ready`s) wait in the job row, in
-- `unlogged_entries` (a JSON array of entries in order, each with `at`, `kind`, `step`,
-- `attempt`, `detail`), numbered from `last_event_seq + 1`, before any entry waiting in a step
-- row. The job's next write that appends to its history logs them first, in the same history
-- row as its own entries, and clears the column. Readers number them the same way, so the
-- history reads the same before and after.
ALTER TABLE jobs ADD COLUMN unlogged_entries text;
