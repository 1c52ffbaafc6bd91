-- A write that finishes its job with few entries (a one-step job's report: `step_succeeded`,
-- `job_succeeded`) writes no history row: its entries are kept in the job row it writes anyway,
-- `ending` (a JSON array of entries in order, as `admission`) numbered from `ending_seq`. They
-- are the job's last entries until an operator's action writes the finished job again (its
-- entries then go to history rows after them). Readers merge them in by number; trimming cuts
-- them like any other entry.
ALTER TABLE jobs ADD COLUMN ending_seq INTEGER;
ALTER TABLE jobs ADD COLUMN ending TEXT;
