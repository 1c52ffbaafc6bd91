-- A claim that only leases work no longer writes its job row or a history row: its
-- `step_leased` entry waits in the step row it leased, in `unlogged_entry` (a JSON object with
-- the entry's `at`, `kind`, `step`, `attempt`, `detail`, and `n`, its place among the job's
-- entries waiting), and the job's next write that appends to its history logs the waiting
-- entries first, in that order, and clears the column. Readers number waiting entries after the
-- job's `last_event_seq` in the same order, so the history reads the same before and after.
ALTER TABLE steps ADD COLUMN unlogged_entry text;
