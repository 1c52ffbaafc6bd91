-- Compensation, operator hold and repair, and the outbox.
--
-- Steps gain the core's new fields and two derived columns, rewritten with every step write so
-- the queries that find work never decode a step: `claim_agent` (`Step::claim_agent()`: the
-- agent that may lease the step now, for its work or for its undo) and `lease_agent` (the agent
-- holding its live lease, if `Step::is_leased()`). Claims, wake-ups and counts go by them instead
-- of by `state`, so an undo is found exactly like work.
--
-- Expiry goes by `lease_expires_at` alone: the core sets it when a lease starts and clears it
-- whenever one ends (completed, failed, expired or settled), for work and undo alike, so it is
-- set exactly while a lease is live or reportable.

ALTER TABLE jobs ADD COLUMN blocked_reason TEXT;

ALTER TABLE steps ADD COLUMN budget_from      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN comp_phase       TEXT;
ALTER TABLE steps ADD COLUMN comp_attempts    INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN comp_failures    INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN comp_budget_from INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN claim_agent      TEXT;
ALTER TABLE steps ADD COLUMN lease_agent      TEXT;

-- Version 1 knew no compensation: only `ready` work was claimable and only `running` work leased.
UPDATE steps SET claim_agent = agent WHERE state = 'ready';
UPDATE steps SET lease_agent = agent WHERE state = 'running';
-- Version 1 cleared the expiry whenever a lease ended too; this only makes sure of it, since the
-- expiry index below must hold live leases alone.
UPDATE steps SET lease_expires_at = NULL WHERE state <> 'running' AND lease_expires_at IS NOT NULL;

DROP INDEX steps_ready;
DROP INDEX steps_ready_due;
DROP INDEX steps_running_expiry;
CREATE INDEX steps_claim ON steps (claim_agent, priority DESC, next_attempt_at, job_id, idx)
    WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_claim_due ON steps (next_attempt_at) WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_lease_expiry ON steps (lease_expires_at, job_id, idx)
    WHERE lease_expires_at IS NOT NULL;

-- The repair scan pages through unfinished jobs by id. Queries on it name it (INDEXED BY) and
-- repeat its WHERE clause word for word, which is what lets SQLite use a partial index.
CREATE INDEX jobs_active ON jobs (id) WHERE state NOT IN ('succeeded', 'failed', 'cancelled');

-- Alerts and callbacks, recorded in the transaction of the transition that raised them and
-- delivered later with retries. Not tied to the job row: a delivery outlives its job's removal.
CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    url             TEXT,
    idempotency_key TEXT NOT NULL UNIQUE,
    body            TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    -- 1 once its attempt budget is spent: kept for inspection, never retried.
    dead            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at, id) WHERE dead = 0;
