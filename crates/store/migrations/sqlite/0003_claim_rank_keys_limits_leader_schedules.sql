-- Claim order by aging, agent limits, ordering keys, the leader lease and cron schedules.
--
-- Steps gain a third derived column, `claim_rank` (`Job::claim_rank`: the instant the step
-- became claimable moved earlier by its job's priority), so a claim is one ordered range of one
-- index: `claim_agent = ? ORDER BY claim_rank`. Jobs gain `seq`, a submission sequence taken
-- from `job_seq` in the writer's transaction, so it grows strictly in commit order; the head of
-- an ordering key is its unfinished job with the smallest `seq`.
--
-- Pending jobs are found by their due instant, `COALESCE(run_at, created_at)`: a keyed job is
-- admitted `pending` even without a `run_at` and waits for its turn. Queries on these indexes
-- repeat their expressions and WHERE clauses word for word, which SQLite needs to use them.

ALTER TABLE steps ADD COLUMN claim_rank INTEGER;
-- The aging in force when this migration was written (`PRIORITY_AGING`, 1 s per point): the
-- writer keeps the column from then on, from the core's own `Job::claim_rank`.
UPDATE steps SET claim_rank = next_attempt_at - priority * 1000 WHERE claim_agent IS NOT NULL;
DROP INDEX steps_claim;
CREATE INDEX steps_claim_rank ON steps (claim_agent, claim_rank, job_id, idx)
    WHERE claim_agent IS NOT NULL;
-- Leases in flight per agent name, for `max_concurrency`.
CREATE INDEX steps_lease_agent ON steps (lease_agent) WHERE lease_expires_at IS NOT NULL;

ALTER TABLE jobs ADD COLUMN seq INTEGER;
-- Earlier files have no submission order but their insertion order, which the rowid keeps.
UPDATE jobs SET seq = rowid;
CREATE TABLE job_seq (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT INTO job_seq (id, last) SELECT 1, COALESCE(MAX(seq), 0) FROM jobs;
CREATE INDEX jobs_ordering ON jobs (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'cancelled');
DROP INDEX jobs_pending_run_at;
CREATE INDEX jobs_pending_due ON jobs (COALESCE(run_at, created_at), id) WHERE state = 'pending';
-- Jobs without a key are due at their `run_at` whoever else waits: the supervisor's wake-up
-- finds the earliest one without walking past keyed jobs queued behind their heads.
CREATE INDEX jobs_pending_unkeyed ON jobs (run_at) WHERE state = 'pending' AND ordering_key IS NULL;

-- Per agent name: limits, and the token bucket for `rate` (`tokens` as of `tokens_at`).
CREATE TABLE agent_settings (
    agent           TEXT PRIMARY KEY,
    max_concurrency INTEGER,
    rate            REAL,
    paused          INTEGER NOT NULL DEFAULT 0,
    tokens          REAL,
    tokens_at       INTEGER,
    updated_at      INTEGER NOT NULL
);

-- The leader lease: at most one row. `epoch` grows by one each time the lease changes hands.
CREATE TABLE leader (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    node       TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE schedules (
    name         TEXT PRIMARY KEY,
    -- The `ScheduleSpec` as JSON.
    spec         TEXT NOT NULL,
    paused       INTEGER NOT NULL,
    next_fire_at INTEGER,
    last_fire_at INTEGER,
    last_job_id  TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire_at, name) WHERE paused = 0;
