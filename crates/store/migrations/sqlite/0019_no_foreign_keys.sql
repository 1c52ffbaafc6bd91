-- No foreign keys from a job's rows to the job, as on PostgreSQL. Each one cost a lookup of the
-- job in its primary key index for every step, label, event and lease row inserted: three for a
-- submitted one-step job's history alone, one more for each claim and two for each report, all on
-- the single writer's thread. Every write already loads the job it changes in the same
-- transaction, and removing a job deletes its rows explicitly (`rows::delete_job`), so the keys
-- guarded nothing the writes do not. SQLite cannot drop a constraint: the four tables are
-- rebuilt with the same columns, keys and indexes. Rows of a job that no longer exists are not
-- carried over.

CREATE TABLE events_unkeyed (
    job_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    step    TEXT,
    attempt INTEGER,
    detail  TEXT,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
INSERT INTO events_unkeyed (job_id, seq, at, kind, step, attempt, detail)
    SELECT job_id, seq, at, kind, step, attempt, detail FROM events
    WHERE job_id IN (SELECT id FROM jobs);
DROP TABLE events;
ALTER TABLE events_unkeyed RENAME TO events;

CREATE TABLE leases_unkeyed (
    lease_id  TEXT PRIMARY KEY,
    job_id    TEXT NOT NULL,
    step      INTEGER NOT NULL,
    attempt   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO leases_unkeyed (lease_id, job_id, step, attempt)
    SELECT lease_id, job_id, step, attempt FROM leases
    WHERE job_id IN (SELECT id FROM jobs);
DROP TABLE leases;
ALTER TABLE leases_unkeyed RENAME TO leases;
CREATE INDEX leases_job_step ON leases (job_id, step, attempt);

CREATE TABLE job_labels_unkeyed (
    job_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;
INSERT INTO job_labels_unkeyed (job_id, key, value) SELECT job_id, key, value FROM job_labels
    WHERE job_id IN (SELECT id FROM jobs);
DROP TABLE job_labels;
ALTER TABLE job_labels_unkeyed RENAME TO job_labels;
CREATE INDEX job_labels_key_value ON job_labels (key, value, job_id);

CREATE TABLE steps_unkeyed (
    job_id             TEXT NOT NULL,
    idx                INTEGER NOT NULL,
    name               TEXT NOT NULL,
    agent              TEXT NOT NULL,
    payload            TEXT NOT NULL,
    depends_on         TEXT NOT NULL,
    timeout_ms         INTEGER NOT NULL,
    max_attempts       INTEGER NOT NULL,
    backoff_initial_ms INTEGER NOT NULL,
    backoff_factor     REAL NOT NULL,
    backoff_max_ms     INTEGER NOT NULL,
    compensate         TEXT,
    state              TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    failures           INTEGER NOT NULL,
    lease_id           TEXT,
    worker             TEXT,
    created_at         INTEGER NOT NULL,
    ready_at           INTEGER,
    started_at         INTEGER,
    finished_at        INTEGER,
    lease_expires_at   INTEGER,
    next_attempt_at    INTEGER,
    result             TEXT,
    last_error         TEXT,
    -- The job's priority, copied so a claim is one ordered scan of one index.
    priority           INTEGER NOT NULL,
    budget_from        INTEGER NOT NULL DEFAULT 0,
    comp_phase         TEXT,
    comp_attempts      INTEGER NOT NULL DEFAULT 0,
    comp_failures      INTEGER NOT NULL DEFAULT 0,
    comp_budget_from   INTEGER NOT NULL DEFAULT 0,
    claim_agent        TEXT,
    lease_agent        TEXT,
    claim_rank         INTEGER,
    backoff_formula    TEXT,
    http               TEXT,
    deadline_ms        INTEGER,
    attempt_ends_at    INTEGER,
    progress           TEXT,
    progress_at        INTEGER,
    progress_events    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, idx)
);
INSERT INTO steps_unkeyed (job_id, idx, name, agent, payload, depends_on, timeout_ms,
        max_attempts, backoff_initial_ms, backoff_factor, backoff_max_ms, compensate, state,
        attempt, failures, lease_id, worker, created_at, ready_at, started_at, finished_at,
        lease_expires_at, next_attempt_at, result, last_error, priority, budget_from, comp_phase,
        comp_attempts, comp_failures, comp_budget_from, claim_agent, lease_agent, claim_rank,
        backoff_formula, http, deadline_ms, attempt_ends_at, progress, progress_at,
        progress_events)
    SELECT job_id, idx, name, agent, payload, depends_on, timeout_ms,
        max_attempts, backoff_initial_ms, backoff_factor, backoff_max_ms, compensate, state,
        attempt, failures, lease_id, worker, created_at, ready_at, started_at, finished_at,
        lease_expires_at, next_attempt_at, result, last_error, priority, budget_from, comp_phase,
        comp_attempts, comp_failures, comp_budget_from, claim_agent, lease_agent, claim_rank,
        backoff_formula, http, deadline_ms, attempt_ends_at, progress, progress_at,
        progress_events
    FROM steps WHERE job_id IN (SELECT id FROM jobs);
DROP TABLE steps;
ALTER TABLE steps_unkeyed RENAME TO steps;
CREATE INDEX steps_claim ON steps (claim_agent, claim_rank, job_id, idx)
    WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_claim_due ON steps (next_attempt_at) WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_lease_agent ON steps (lease_agent) WHERE lease_expires_at IS NOT NULL;
CREATE INDEX steps_lease_expiry ON steps (lease_expires_at, job_id, idx)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX steps_lease_id ON steps (lease_id) WHERE lease_id IS NOT NULL;
