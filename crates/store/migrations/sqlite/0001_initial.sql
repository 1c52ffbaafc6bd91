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
