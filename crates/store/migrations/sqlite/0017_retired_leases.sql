-- A step row names its latest lease (`steps.lease_id`), and a lease id is looked up there first,
-- by a new index. `leases` keeps only the leases taken off their steps (a retry's new attempt, an
-- unwind, a new round), so that a late report on one is still fenced as stale, not answered as
-- unknown. A first attempt's claim, nearly every claim, writes no lease row at all.
CREATE INDEX steps_lease_id ON steps (lease_id) WHERE lease_id IS NOT NULL;

CREATE TABLE leases_retired (
    lease_id  TEXT PRIMARY KEY,
    job_id    TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step      INTEGER NOT NULL,
    attempt   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO leases_retired (lease_id, job_id, step, attempt)
    SELECT lease_id, job_id, step, attempt FROM leases
    WHERE lease_id NOT IN (SELECT lease_id FROM steps WHERE lease_id IS NOT NULL);
DROP TABLE leases;
ALTER TABLE leases_retired RENAME TO leases;
CREATE INDEX leases_job_step ON leases (job_id, step, attempt);
