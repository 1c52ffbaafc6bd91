//! The SQLite schema as an ordered list of migrations.
//!
//! `PRAGMA user_version` records how many migrations a file has seen; opening a file applies the
//! rest in one transaction. Never edit a migration that has shipped: append a new one.

/// Migration `i` takes a file from version `i` to version `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5];

const V1: &str = r#"
CREATE TABLE jobs (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT,
    fingerprint     TEXT NOT NULL,
    labels          TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    run_at          INTEGER,
    ordering_key    TEXT,
    callback_url    TEXT,
    on_failure      TEXT NOT NULL,
    state           TEXT NOT NULL,
    desired_state   TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER,
    -- The seq of the newest event ever appended; kept here because trimming may delete it.
    last_event_seq  INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_state_id ON jobs (state, id);
-- Queries on it name it (INDEXED BY): the planner would otherwise pick jobs_state_id and sort.
CREATE INDEX jobs_pending_run_at ON jobs (run_at, id) WHERE state = 'pending';

-- Labels again, one row per pair, so a label filter is an index lookup rather than JSON parsing.
CREATE TABLE job_labels (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX job_labels_key_value ON job_labels (key, value, job_id);

CREATE TABLE steps (
    job_id             TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
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
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX steps_ready ON steps (agent, priority DESC, next_attempt_at, job_id, idx) WHERE state = 'ready';
CREATE INDEX steps_ready_due ON steps (next_attempt_at) WHERE state = 'ready';
CREATE INDEX steps_running_expiry ON steps (lease_expires_at, job_id, idx) WHERE state = 'running';

CREATE TABLE events (
    job_id  TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    step    TEXT,
    attempt INTEGER,
    detail  TEXT,
    PRIMARY KEY (job_id, seq)
);

-- One row per attempt ever leased, so a lease id still resolves after its attempt is superseded.
CREATE TABLE leases (
    lease_id  TEXT PRIMARY KEY,
    job_id    TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step      INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    worker    TEXT NOT NULL,
    leased_at INTEGER NOT NULL
);
CREATE INDEX leases_job_step ON leases (job_id, step, attempt);
"#;

/// Compensation, operator hold and repair, and the outbox.
///
/// Steps gain the core's new fields and two derived columns, rewritten with every step write so
/// the queries that find work never decode a step: `claim_agent` (`Step::claim_agent()`: the
/// agent that may lease the step now, for its work or for its undo) and `lease_agent` (the agent
/// holding its live lease, if `Step::is_leased()`). Claims, wake-ups and counts go by them instead
/// of by `state`, so an undo is found exactly like work.
///
/// Expiry goes by `lease_expires_at` alone: the core sets it when a lease starts and clears it
/// whenever one ends (completed, failed, expired or settled), for work and undo alike, so it is
/// set exactly while a lease is live or reportable.
const V2: &str = r#"
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
"#;

/// Claim order by aging, agent limits, ordering keys, the leader lease and cron schedules.
///
/// Steps gain a third derived column, `claim_rank` (`Job::claim_rank`: the instant the step
/// became claimable moved earlier by its job's priority), so a claim is one ordered range of one
/// index: `claim_agent = ? ORDER BY claim_rank`. Jobs gain `seq`, a submission sequence taken
/// from `job_seq` in the writer's transaction, so it grows strictly in commit order; the head of
/// an ordering key is its unfinished job with the smallest `seq`.
///
/// Pending jobs are found by their due instant, `COALESCE(run_at, created_at)`: a keyed job is
/// admitted `pending` even without a `run_at` and waits for its turn. Queries on these indexes
/// repeat their expressions and WHERE clauses word for word, which SQLite needs to use them.
const V3: &str = r#"
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
"#;

/// Retry delay formulas: `backoff_formula` names the curve a step's retries follow when it is not
/// the exponential `backoff_*` one (`faktory` for jobs pushed over the Faktory protocol). NULL
/// means exponential, which is what every step written before this migration used.
const V4: &str = r#"
ALTER TABLE steps ADD COLUMN backoff_formula TEXT;
"#;

/// API tokens: only the SHA-256 of each secret is kept. `scopes` and `agents` are comma lists.
const V5: &str = r#"
CREATE TABLE tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    agents     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);
"#;
