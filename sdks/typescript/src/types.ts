// The JSON shapes of Overseer's HTTP API (v1), written from crates/core/src/{wire,spec,job}.rs.
// test/schema.test.ts checks their field names against the server's `GET /openapi.json`.

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A duration as the server reads it: "30s", "500ms", "5m". */
export type Span = string;
/** An RFC 3339 timestamp. */
export type Timestamp = string;

export type JobState =
  | "pending" | "running" | "compensating" | "blocked" | "succeeded" | "failed" | "cancelled";
export type StepState =
  | "waiting" | "ready" | "running" | "succeeded" | "failed" | "skipped" | "cancelled"
  | "compensating" | "compensated";
export type CompPhase = "waiting" | "ready" | "running" | "failed";
export type OnFailure = "compensate" | "fail" | "hold" | "compensate_and_retry";
export type LeaseKind = "work" | "compensate";

export interface Backoff { initial?: Span; factor?: number; max?: Span }

/** An HTTP endpoint the server calls itself instead of an agent pool (see the README). */
export interface HttpTarget {
  url: string;
  method?: "POST" | "PUT" | "PATCH";
  headers?: Record<string, string>;
  timeout?: Span;
  async?: boolean;
}

/** Why a step or a pending job is not running. */
export interface WaitingReason { code: string; text: string }

/** Give `agent` or `http`, not both. */
export interface CompensateSpec {
  agent?: string;
  http?: HttpTarget;
  payload?: Json;
  timeout?: Span;
  /** The longest one attempt of the undo may run (defaults to the step's). */
  deadline?: Span;
  max_attempts?: number;
}

/** Give `agent` or `http`, not both. */
export interface StepSpec {
  name: string;
  agent?: string;
  http?: HttpTarget;
  payload?: Json;
  depends_on?: string[];
  /** The longest silence between heartbeats (the lease). */
  timeout?: Span;
  /** The longest one attempt may run, heartbeats or not. */
  deadline?: Span;
  max_attempts?: number;
  backoff?: Backoff;
  backoff_formula?: "exponential" | "faktory";
  compensate?: CompensateSpec;
  /** Record each new progress of the step in the job's history (default false). */
  progress_events?: boolean;
}

export interface JobSpec {
  idempotency_key?: string;
  labels?: Record<string, string>;
  priority?: number;
  run_at?: Timestamp;
  ordering_key?: string;
  callback_url?: string;
  on_failure?: OnFailure;
  /** An RFC 3339 instant or a duration after submission: past it the job fails. */
  deadline?: string;
  /** Rounds a `compensate_and_retry` job runs at most (default 3). */
  job_attempts?: number;
  /** The wait before each new round of a `compensate_and_retry` job. */
  job_backoff?: Backoff;
  /** When the last round fails: `fail` (undo it, the default) or `hold` (block for an operator). */
  job_exhausted?: "fail" | "hold";
  /** How long the finished job is kept, instead of the server's default. */
  retention?: Span;
  steps: StepSpec[];
}

export interface Step {
  name: string;
  agent: string;
  state: StepState;
  depends_on: string[];
  attempt: number;
  failures: number;
  max_attempts: number;
  timeout: Span;
  deadline?: Span;
  payload: Json;
  worker: string | null;
  created_at: Timestamp;
  ready_at: Timestamp | null;
  started_at: Timestamp | null;
  finished_at: Timestamp | null;
  lease_expires_at: Timestamp | null;
  next_attempt_at: Timestamp | null;
  result: Json | null;
  last_error: string | null;
  compensate: CompensateSpec | null;
  comp_phase: CompPhase | null;
  comp_attempts: number;
  comp_failures: number;
  /** The HTTP target, header values redacted. */
  http?: HttpTarget;
  /** What the current (or last) attempt last reported with a heartbeat. */
  progress?: Json;
  /** When `progress` was reported. */
  progress_at?: Timestamp;
  /** Whether each new progress is recorded in the history. */
  progress_events?: boolean;
  waiting_reason?: WaitingReason;
}

export interface Job {
  id: string;
  state: JobState;
  desired_state: "succeeded" | "cancelled";
  idempotency_key: string | null;
  labels: Record<string, string>;
  priority: number;
  run_at: Timestamp | null;
  ordering_key: string | null;
  on_failure: string;
  created_at: Timestamp;
  updated_at: Timestamp;
  finished_at: Timestamp | null;
  blocked_reason: string | null;
  compensated: string[];
  callback_url: string | null;
  /** The name of the token that submitted the job (null without auth or for server-made jobs). */
  submitted_by: string | null;
  /** The job's own retention, when it gave one. */
  retention?: Span;
  /** When the finished job will be removed. */
  removable_at?: Timestamp;
  deadline?: Timestamp;
  /** The round of a whole-job retry, from 1. */
  round: number;
  job_attempts?: number;
  job_exhausted?: "fail" | "hold";
  /** The job this one reruns, when it is a rerun. */
  rerun_of?: string;
  /** The rerun of this job, once one was made (a job is rerun once). */
  rerun_by?: string;
  waiting_reason?: WaitingReason;
  steps: Step[];
}

export interface JobList { jobs: Job[]; next_cursor: string | null }

export interface Event {
  seq: number;
  at: Timestamp;
  kind: string;
  step?: string;
  attempt?: number;
  detail?: Json;
}

export interface Lease {
  lease_id: string;
  kind: LeaseKind;
  job_id: string;
  step: string;
  agent: string;
  attempt: number;
  /** For a `compensate` lease: which try of the undo this is (1 for the first). */
  undo_attempt?: number;
  payload: Json;
  inputs: Record<string, Json>;
  idempotency_key: string;
  complete_by: Timestamp;
  lease_ms: number;
  timeout_ms: number;
}

/** `POST /v1/agents/{agent}/leases` body. */
export interface LeaseRequest { worker: string; max?: number; wait?: Span }
/** `POST /v1/leases/{id}/heartbeat` body. */
export interface HeartbeatRequest { progress?: Json }
/** `POST /v1/leases/{id}/complete` body. */
export interface CompleteRequest { result?: Json }
/** `POST /v1/leases/{id}/fail` body. */
export interface FailRequest { error: string; retryable?: boolean }

export interface HeartbeatResponse { complete_by: Timestamp; lease_ms: number; cancel: boolean }

export type LeaseOutcome =
  | { outcome: "complete"; lease_id: string; result?: Json }
  | { outcome: "fail"; lease_id: string; error: string; retryable?: boolean };

export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code?: string;
  field?: string;
}

export interface ReportResult {
  lease_id: string;
  status: number;
  job_id?: string;
  job_state?: JobState;
  problem?: Problem;
}

export interface AgentLimits {
  agent: string;
  max_concurrency: number | null;
  rate: number | null;
  paused: boolean;
}

export interface ScheduleSpec {
  name: string;
  cron: string;
  timezone?: string;
  job: JobSpec;
  overlap?: "skip" | "allow";
  misfire?: "once" | "skip" | "all";
}

export interface Schedule {
  name: string;
  cron: string;
  timezone: string;
  overlap: "skip" | "allow";
  misfire: "once" | "skip" | "all";
  job: JobSpec;
  paused: boolean;
  next_fire_at: Timestamp | null;
  last_fire_at: Timestamp | null;
  last_job_id: string | null;
  created_at: Timestamp;
  updated_at: Timestamp;
}

/** Who acts on a blocked job and why; both land in the job's history. */
export interface OperatorNote { by?: string; reason?: string }

/** `POST /v1/jobs/{id}/rerun` body: keep what succeeded (`from_failed`), who and why. */
export interface RerunRequest { from_failed?: boolean; by?: string; reason?: string }
