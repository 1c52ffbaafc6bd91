-- Two fewer indexes on `jobs`. Every index a write changes costs at least one page of the log
-- per commit, so an index that another one can serve is paid for by every submit, claim,
-- report and removal.
--
-- * `jobs_active` (the unfinished jobs by id) is read only by the supervisor's repair, which
--   pages through the unfinished jobs a few hundred at a time: it now reads one range of
--   `jobs_state_id` per unfinished state, merged by id. Every job entered it at submit and left
--   it when it finished.
-- * `jobs_retention` (finished jobs without their own retention, by state and time) and
--   `jobs_finished` (finished jobs by time, for the per-minute counts) held the same rows in a
--   different order. One index, by state, time and own retention, serves both: removal reads
--   one range per terminal state as before, and the counts read the same three ranges.
DROP INDEX jobs_active;
DROP INDEX jobs_retention;
DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (state, finished_at, retention_ms) WHERE finished_at IS NOT NULL;
