-- The partial indexes on unfinished jobs say "unfinished" with three comparisons instead of
-- `state NOT IN ('succeeded', 'failed', 'cancelled')`. SQLite evaluates an IN list by building a
-- temporary index of its values each time a statement runs, and every insert or update of a job
-- row evaluates the condition of both indexes, for the old row and the new: four temporary
-- indexes built and dropped for each job update of a drain. The indexes hold the same rows.

DROP INDEX jobs_active;
CREATE INDEX jobs_active ON jobs (id)
    WHERE state <> 'succeeded' AND state <> 'failed' AND state <> 'cancelled';

DROP INDEX jobs_ordering_key;
CREATE INDEX jobs_ordering_key ON jobs (ordering_key, seq)
    WHERE ordering_key IS NOT NULL
      AND state <> 'succeeded' AND state <> 'failed' AND state <> 'cancelled';
