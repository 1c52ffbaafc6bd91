CREATE TABLE jobs (
    id              uuid PRIMARY KEY,
    -- Submission order, for ordering keys: allocated while the key's advisory lock is held, so
    -- it follows the order in which jobs of one key were admitted, across nodes.
    seq             bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    idempotency_key text UNIQUE,
    fingerprint     text NOT NULL,
    labels          text NOT NULL,
    priority        integer NOT NULL,
    run_at          bigint,
    ordering_key    text,
    callback_url    text,
    on_failure      text NOT NULL,
    state           text NOT NULL,
    desired_state   text NOT NULL,
    created_at      bigint NOT NULL,
    updated_at      bigint NOT NULL,
    finished_at     bigint,
    blocked_reason  text,
    -- The seq of the newest event ever appended; kept here because trimming may delete it.
    last_event_seq  bigint NOT NULL DEFAULT 0
);
CREATE INDEX jobs_state_id ON jobs (state, id);
-- Pending jobs by their due instant: a keyed job is admitted `pending` even without a `run_at`
-- and waits for its turn. Jobs without a key are due at their `run_at` whoever else waits.
CREATE INDEX jobs_pending_due ON jobs ((COALESCE(run_at, created_at)), id) WHERE state = 'pending';
CREATE INDEX jobs_pending_unkeyed ON jobs (run_at) WHERE state = 'pending' AND ordering_key IS NULL;
CREATE INDEX jobs_active ON jobs (id) WHERE state NOT IN ('succeeded', 'failed', 'cancelled');
CREATE INDEX jobs_ordering_key ON jobs (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'cancelled');

-- Labels again, one row per pair, so a label filter is an index lookup rather than JSON parsing.
CREATE TABLE job_labels (
    job_id uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    key    text NOT NULL,
    value  text NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX job_labels_key_value ON job_labels (key, value, job_id);

-- One row per step. Besides the step's own fields, three columns are derived from the step as it
-- is written, so the queries that find work never decode a step: `claim_agent`
-- (`Step::claim_agent()`), `lease_agent` (the agent holding its live lease) and `claim_rank`
-- (`Job::claim_rank()`, the order claims take). `priority` is the job's, copied.
CREATE TABLE steps (
    job_id             uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    idx                integer NOT NULL,
    name               text NOT NULL,
    agent              text NOT NULL,
    payload            text NOT NULL,
    depends_on         text NOT NULL,
    timeout_ms         bigint NOT NULL,
    max_attempts       bigint NOT NULL,
    backoff_initial_ms bigint NOT NULL,
    backoff_factor     double precision NOT NULL,
    backoff_max_ms     bigint NOT NULL,
    compensate         text,
    state              text NOT NULL,
    attempt            bigint NOT NULL,
    failures           bigint NOT NULL,
    budget_from        bigint NOT NULL,
    comp_phase         text,
    comp_attempts      bigint NOT NULL,
    comp_failures      bigint NOT NULL,
    comp_budget_from   bigint NOT NULL,
    lease_id           uuid,
    worker             text,
    created_at         bigint NOT NULL,
    ready_at           bigint,
    started_at         bigint,
    finished_at        bigint,
    lease_expires_at   bigint,
    next_attempt_at    bigint,
    result             text,
    last_error         text,
    priority           integer NOT NULL,
    claim_agent        text,
    lease_agent        text,
    claim_rank         bigint,
    PRIMARY KEY (job_id, idx)
);
CREATE INDEX steps_claim ON steps (claim_agent, claim_rank, job_id, idx)
    WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_claim_due ON steps (next_attempt_at) WHERE claim_agent IS NOT NULL;
CREATE INDEX steps_lease_expiry ON steps (lease_expires_at, job_id, idx)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX steps_lease_agent ON steps (lease_agent)
    WHERE lease_expires_at IS NOT NULL AND lease_agent IS NOT NULL;

CREATE TABLE events (
    job_id  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq     bigint NOT NULL,
    at      bigint NOT NULL,
    kind    text NOT NULL,
    step    text,
    attempt bigint,
    detail  text,
    PRIMARY KEY (job_id, seq)
);

-- One row per attempt ever leased, so a lease id still resolves after its attempt is superseded.
CREATE TABLE leases (
    lease_id  uuid PRIMARY KEY,
    job_id    uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step      integer NOT NULL,
    attempt   bigint NOT NULL,
    worker    text NOT NULL,
    leased_at bigint NOT NULL
);
CREATE INDEX leases_job_step ON leases (job_id, step, attempt);

-- Alerts and callbacks, recorded in the transaction of the transition that raised them and
-- delivered later with retries. Not tied to the job row: a delivery outlives its job's removal.
CREATE TABLE deliveries (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind            text NOT NULL,
    job_id          uuid NOT NULL,
    url             text,
    idempotency_key text NOT NULL UNIQUE,
    body            text NOT NULL,
    attempts        bigint NOT NULL DEFAULT 0,
    created_at      bigint NOT NULL,
    next_attempt_at bigint NOT NULL,
    last_error      text,
    -- Set once its attempt budget is spent: kept for inspection, never retried.
    dead            boolean NOT NULL DEFAULT false
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at, id) WHERE NOT dead;

-- Limits on handing out one agent name's leases, and its token bucket. A claim locks its agent's
-- row, which serialises that agent's claims across nodes and keeps the limits exact.
CREATE TABLE agent_settings (
    agent           text PRIMARY KEY,
    max_concurrency bigint,
    rate            double precision,
    paused          boolean NOT NULL DEFAULT false,
    -- The token bucket for `rate`: tokens left as of `tokens_at`.
    tokens          double precision,
    tokens_at       bigint,
    updated_at      bigint NOT NULL
);

-- The leader lease: at most one row.
CREATE TABLE leader (
    id         smallint PRIMARY KEY CHECK (id = 1),
    node       text NOT NULL,
    epoch      bigint NOT NULL,
    expires_at bigint NOT NULL
);

CREATE TABLE schedules (
    name         text PRIMARY KEY,
    spec         text NOT NULL,
    paused       boolean NOT NULL,
    next_fire_at bigint,
    last_fire_at bigint,
    last_job_id  uuid,
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE INDEX schedules_due ON schedules (next_fire_at, name) WHERE NOT paused;
