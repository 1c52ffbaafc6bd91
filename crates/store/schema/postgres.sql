-- The postgres.sql schema as the migrations in `crates/store/migrations/` leave a new store.
-- Generated: `OVERSEER_WRITE_SCHEMA=1 cargo test -p overseer-store --features testing schema_file`; a test fails when it differs from a migrated store. Never edit by hand.

CREATE TABLE public.agent_settings (
    agent text NOT NULL,
    max_concurrency bigint,
    rate double precision,
    paused boolean DEFAULT false NOT NULL,
    tokens double precision,
    tokens_at bigint,
    updated_at bigint NOT NULL
);

CREATE TABLE public.deliveries (
    id bigint NOT NULL,
    kind text NOT NULL,
    job_id uuid NOT NULL,
    url text,
    idempotency_key text NOT NULL,
    body text NOT NULL,
    attempts bigint DEFAULT 0 NOT NULL,
    created_at bigint NOT NULL,
    next_attempt_at bigint NOT NULL,
    last_error text,
    dead boolean DEFAULT false NOT NULL,
    delivered_at bigint
);

ALTER TABLE public.deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.events (
    job_id uuid NOT NULL,
    seq bigint NOT NULL,
    at bigint NOT NULL,
    kind text NOT NULL,
    step text,
    attempt bigint,
    detail text,
    more text
);

CREATE TABLE public.job_labels (
    job_id uuid NOT NULL,
    key text NOT NULL,
    value text NOT NULL
);

CREATE TABLE public.jobs (
    id uuid NOT NULL,
    seq bigint NOT NULL,
    idempotency_key text,
    fingerprint text NOT NULL,
    labels text NOT NULL,
    priority integer NOT NULL,
    run_at bigint,
    ordering_key text,
    callback_url text,
    on_failure text NOT NULL,
    state text NOT NULL,
    desired_state text NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    blocked_reason text,
    last_event_seq bigint DEFAULT 0 NOT NULL,
    retention_ms bigint,
    submitted_by text,
    deadline bigint,
    deadline_due bigint,
    round bigint DEFAULT 1 NOT NULL,
    job_retry text,
    rerun_of uuid,
    rerun_by uuid,
    unlogged_entries text
);

ALTER TABLE public.jobs ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.jobs_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.leader (
    id smallint NOT NULL,
    node text NOT NULL,
    epoch bigint NOT NULL,
    expires_at bigint NOT NULL,
    CONSTRAINT leader_id_check CHECK ((id = 1))
);

CREATE TABLE public.leases (
    lease_id uuid NOT NULL,
    job_id uuid NOT NULL,
    step integer NOT NULL,
    attempt bigint NOT NULL
);

CREATE TABLE public.schedules (
    name text NOT NULL,
    spec text NOT NULL,
    paused boolean NOT NULL,
    next_fire_at bigint,
    last_fire_at bigint,
    last_job_id uuid,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL
);

CREATE TABLE public.schema_migrations (
    version integer NOT NULL,
    applied_at bigint NOT NULL
);

CREATE TABLE public.settings (
    key text NOT NULL,
    value text NOT NULL,
    created_at bigint NOT NULL
);

CREATE TABLE public.steps (
    job_id uuid NOT NULL,
    idx integer NOT NULL,
    name text NOT NULL,
    agent text NOT NULL,
    payload text NOT NULL,
    depends_on text NOT NULL,
    timeout_ms bigint NOT NULL,
    max_attempts bigint NOT NULL,
    backoff_initial_ms bigint NOT NULL,
    backoff_factor double precision NOT NULL,
    backoff_max_ms bigint NOT NULL,
    compensate text,
    state text NOT NULL,
    attempt bigint NOT NULL,
    failures bigint NOT NULL,
    budget_from bigint NOT NULL,
    comp_phase text,
    comp_attempts bigint NOT NULL,
    comp_failures bigint NOT NULL,
    comp_budget_from bigint NOT NULL,
    lease_id uuid,
    worker text,
    created_at bigint NOT NULL,
    ready_at bigint,
    started_at bigint,
    finished_at bigint,
    lease_expires_at bigint,
    next_attempt_at bigint,
    result text,
    last_error text,
    priority integer NOT NULL,
    claim_agent text,
    lease_agent text,
    claim_rank bigint,
    backoff_formula text,
    http text,
    deadline_ms bigint,
    attempt_ends_at bigint,
    progress text,
    progress_at bigint,
    progress_events boolean DEFAULT false NOT NULL,
    unlogged_entry text
);

CREATE TABLE public.tokens (
    name text NOT NULL,
    hash text NOT NULL,
    scopes text NOT NULL,
    agents text NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint,
    revoked_at bigint
);

ALTER TABLE ONLY public.agent_settings
    ADD CONSTRAINT agent_settings_pkey PRIMARY KEY (agent);

ALTER TABLE ONLY public.deliveries
    ADD CONSTRAINT deliveries_idempotency_key_key UNIQUE (idempotency_key);

ALTER TABLE ONLY public.deliveries
    ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (job_id, seq);

ALTER TABLE ONLY public.job_labels
    ADD CONSTRAINT job_labels_pkey PRIMARY KEY (job_id, key);

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.leader
    ADD CONSTRAINT leader_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (lease_id);

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (key);

ALTER TABLE ONLY public.steps
    ADD CONSTRAINT steps_pkey PRIMARY KEY (job_id, idx);

ALTER TABLE ONLY public.tokens
    ADD CONSTRAINT tokens_hash_key UNIQUE (hash);

ALTER TABLE ONLY public.tokens
    ADD CONSTRAINT tokens_pkey PRIMARY KEY (name);

CREATE INDEX deliveries_delivered ON public.deliveries USING btree (delivered_at) WHERE (delivered_at IS NOT NULL);

CREATE INDEX deliveries_due ON public.deliveries USING btree (next_attempt_at, id) WHERE ((NOT dead) AND (delivered_at IS NULL));

CREATE INDEX deliveries_job ON public.deliveries USING btree (job_id);

CREATE INDEX deliveries_kind ON public.deliveries USING btree (kind, id);

CREATE INDEX job_labels_key_value ON public.job_labels USING btree (key, value, job_id);

CREATE INDEX jobs_deadline_due ON public.jobs USING btree (deadline_due, id) WHERE (deadline_due IS NOT NULL);

CREATE INDEX jobs_finished ON public.jobs USING btree (state, finished_at, retention_ms) WHERE (finished_at IS NOT NULL);

CREATE UNIQUE INDEX jobs_idempotency_key ON public.jobs USING btree (idempotency_key) WHERE (idempotency_key IS NOT NULL);

CREATE INDEX jobs_ordering_key ON public.jobs USING btree (ordering_key, seq) WHERE ((ordering_key IS NOT NULL) AND (state <> ALL (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text])));

CREATE INDEX jobs_pending_due ON public.jobs USING btree (COALESCE(run_at, created_at), id) WHERE (state = 'pending'::text);

CREATE INDEX jobs_pending_unkeyed ON public.jobs USING btree (run_at) WHERE ((state = 'pending'::text) AND (ordering_key IS NULL));

CREATE INDEX jobs_retention_own ON public.jobs USING btree (((finished_at + retention_ms))) WHERE ((finished_at IS NOT NULL) AND (retention_ms IS NOT NULL));

CREATE INDEX jobs_state_id ON public.jobs USING btree (state, id);

CREATE INDEX leases_job_step ON public.leases USING btree (job_id, step, attempt);

CREATE INDEX schedules_due ON public.schedules USING btree (next_fire_at, name) WHERE (NOT paused);

CREATE INDEX steps_claim ON public.steps USING btree (claim_agent, claim_rank, job_id, idx) WHERE (claim_agent IS NOT NULL);

CREATE INDEX steps_claim_due ON public.steps USING btree (next_attempt_at) WHERE ((claim_agent IS NOT NULL) AND (next_attempt_at > ready_at));

CREATE INDEX steps_lease_expiry ON public.steps USING btree (lease_agent, lease_expires_at, job_id, idx) WHERE (lease_expires_at IS NOT NULL);

CREATE INDEX steps_lease_id ON public.steps USING btree (lease_id) WHERE (lease_id IS NOT NULL);
