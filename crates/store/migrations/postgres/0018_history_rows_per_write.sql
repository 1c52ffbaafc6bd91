-- A job's history is kept one row per write instead of one row per entry, as on SQLite: the
-- entries a write appends to a job (a submit's three, a report's two) share a row, the first in
-- the row's own columns and the others, in order, in `more` (a JSON array of objects with `at`,
-- `kind` and, when set, `step`, `attempt` and `detail`). The row's `seq` is its first entry's
-- number; the others follow it. Rows written before hold one entry each (`more` is NULL) and
-- read as before. Trimming deletes the rows wholly older than a job's newest entries kept; a row
-- holding entries on both sides of the cut stays, and readers skip its older entries.
ALTER TABLE events ADD COLUMN more text;
