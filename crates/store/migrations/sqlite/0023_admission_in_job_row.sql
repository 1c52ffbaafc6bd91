-- A submit no longer writes a history row: a new job's admission entries (`job_submitted`,
-- `job_started` or `job_pending`, `step_ready`s) are kept in its row, `admission` (a JSON array
-- of entries in order, each with `at`, `kind`, `step`, `attempt`, `detail`) numbered from
-- `admission_seq`. They are the job's first entries: its history rows hold the later ones.
-- Readers put them first; trimming cuts them like any other entry.
ALTER TABLE jobs ADD COLUMN admission_seq INTEGER;
ALTER TABLE jobs ADD COLUMN admission TEXT;
