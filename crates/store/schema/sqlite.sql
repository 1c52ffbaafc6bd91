-- The sqlite.sql schema as the migrations in `crates/store/migrations/` leave a new store.
-- Generated: `OVERSEER_WRITE_SCHEMA=1 cargo test -p overseer-store --features testing schema_file`; a test fails when it differs from a migrated store. Never edit by hand.

CREATE TABLE agent_settings (
    agent           TEXT PRIMARY KEY,
    max_concurrency INTEGER,
    rate            REAL,
    paused          INTEGER NOT NULL DEFAULT 0,
    tokens          REAL,
    tokens_at       INTEGER,
    updated_at      INTEGER NOT NULL
);

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
, delivered_at INTEGER);

CREATE TABLE "events" (
    job_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    kind    TEXT NOT NULL,
    step    TEXT,
    attempt INTEGER,
    detail  TEXT, more TEXT,
    PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;

CREATE TABLE "job_labels" (
    job_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;

CREATE TABLE job_seq (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);

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
, blocked_reason TEXT, seq INTEGER, retention_ms INTEGER, submitted_by TEXT, deadline INTEGER, deadline_due INTEGER, round INTEGER NOT NULL DEFAULT 1, job_retry TEXT, rerun_of TEXT, rerun_by TEXT, admission_seq INTEGER, admission TEXT, ending_seq INTEGER, ending TEXT);

CREATE TABLE leader (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    node       TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE "leases" (
    lease_id  TEXT PRIMARY KEY,
    job_id    TEXT NOT NULL,
    step      INTEGER NOT NULL,
    attempt   INTEGER NOT NULL
) WITHOUT ROWID;

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

CREATE TABLE settings (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE "steps" (
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
    progress_events    INTEGER NOT NULL DEFAULT 0, lease_entry_seq INTEGER, lease_entry TEXT,
    PRIMARY KEY (job_id, idx)
);

CREATE TABLE tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    scopes     TEXT NOT NULL,
    agents     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);

CREATE INDEX deliveries_delivered ON deliveries (delivered_at) WHERE delivered_at IS NOT NULL;

CREATE INDEX deliveries_due ON deliveries (next_attempt_at, id)
    WHERE dead = 0 AND delivered_at IS NULL;

CREATE INDEX deliveries_job ON deliveries (job_id);

CREATE INDEX deliveries_kind ON deliveries (kind, id);

CREATE INDEX job_labels_key_value ON job_labels (key, value, job_id);

CREATE INDEX jobs_deadline_due ON jobs (deadline_due, id) WHERE deadline_due IS NOT NULL;

CREATE INDEX jobs_finished ON jobs (state, finished_at, retention_ms) WHERE finished_at IS NOT NULL;

CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX jobs_ordering_key ON jobs (ordering_key, seq)
    WHERE ordering_key IS NOT NULL
      AND state <> 'succeeded' AND state <> 'failed' AND state <> 'cancelled';

CREATE INDEX jobs_pending_due ON jobs (COALESCE(run_at, created_at), id) WHERE state = 'pending';

CREATE INDEX jobs_pending_unkeyed ON jobs (run_at) WHERE state = 'pending' AND ordering_key IS NULL;

CREATE INDEX jobs_retention_own ON jobs ((finished_at + retention_ms))
    WHERE finished_at IS NOT NULL AND retention_ms IS NOT NULL;

CREATE INDEX jobs_state_id ON jobs (state, id);

CREATE INDEX leases_job_step ON leases (job_id, step, attempt);

CREATE INDEX schedules_due ON schedules (next_fire_at, name) WHERE paused = 0;

CREATE INDEX steps_claim ON steps (claim_agent, claim_rank, job_id, idx)
    WHERE claim_agent IS NOT NULL;

CREATE INDEX steps_claim_due ON steps (next_attempt_at)
    WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at;

CREATE INDEX steps_lease_expiry ON steps (lease_agent, lease_expires_at, job_id, idx)
    WHERE lease_expires_at IS NOT NULL;

CREATE INDEX steps_lease_id ON steps (lease_id) WHERE lease_id IS NOT NULL;
