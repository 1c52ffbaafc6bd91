// Proves the SDK's wire types cannot drift from the server: each type's field names (listed
// below, and checked against the type itself by the compiler) must equal the properties of the
// matching schema in the `GET /openapi.json` of a real server.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type {
  Backoff, CompensateSpec, CompleteRequest, Event, FailRequest, HeartbeatRequest,
  HeartbeatResponse, HttpTarget, Job, JobList, JobSpec, Lease, LeaseOutcome, LeaseRequest,
  Problem, ReportResult, RerunRequest, ScheduleSpec, Step, StepSpec, WaitingReason,
} from "../src/types.js";
import { startServer, type RunningServer } from "./helpers.js";

/** Exactly the keys of `T`: the compiler refuses a missing key and an extra one. */
type Keys<T> = { [K in keyof Required<T>]: true };
const keys = <T>(k: Keys<T>): string[] => Object.keys(k).sort();

type Complete = Extract<LeaseOutcome, { outcome: "complete" }>;
type Fail = Extract<LeaseOutcome, { outcome: "fail" }>;

/** SDK type → its schema name and its field names. */
const types: Array<[string, string, string[]]> = [
  ["Lease", "Lease", keys<Lease>({
    lease_id: true, kind: true, job_id: true, step: true, agent: true, attempt: true,
    undo_attempt: true, payload: true, inputs: true, idempotency_key: true, complete_by: true,
    lease_ms: true, timeout_ms: true,
  })],
  ["HeartbeatResponse", "HeartbeatResponse", keys<HeartbeatResponse>({
    complete_by: true, lease_ms: true, cancel: true,
  })],
  ["ReportResult", "ReportResult", keys<ReportResult>({
    lease_id: true, status: true, job_id: true, job_state: true, problem: true,
  })],
  ["Problem", "Problem", keys<Problem>({
    type: true, title: true, status: true, detail: true, code: true, field: true,
  })],
  ["Job", "JobView", keys<Job>({
    id: true, state: true, desired_state: true, idempotency_key: true, labels: true,
    priority: true, run_at: true, ordering_key: true, on_failure: true, created_at: true,
    updated_at: true, finished_at: true, blocked_reason: true, compensated: true,
    callback_url: true, submitted_by: true, retention: true, removable_at: true, deadline: true,
    round: true, job_attempts: true, job_exhausted: true, rerun_of: true, rerun_by: true,
    waiting_reason: true, steps: true,
  })],
  ["Step", "StepView", keys<Step>({
    name: true, agent: true, state: true, depends_on: true, attempt: true, failures: true,
    max_attempts: true, timeout: true, deadline: true, payload: true, worker: true,
    created_at: true,
    ready_at: true, started_at: true, finished_at: true, lease_expires_at: true,
    next_attempt_at: true, result: true, last_error: true, compensate: true, comp_phase: true,
    comp_attempts: true, comp_failures: true, http: true, progress: true, progress_at: true,
    progress_events: true, waiting_reason: true,
  })],
  ["JobList", "JobList", keys<JobList>({ jobs: true, next_cursor: true })],
  ["Event", "Event", keys<Event>({
    seq: true, at: true, kind: true, step: true, attempt: true, detail: true,
  })],
  ["JobSpec", "JobSpec", keys<JobSpec>({
    idempotency_key: true, labels: true, priority: true, run_at: true, ordering_key: true,
    callback_url: true, on_failure: true, deadline: true, job_attempts: true, job_backoff: true,
    job_exhausted: true, retention: true, steps: true,
  })],
  ["StepSpec", "StepSpec", keys<StepSpec>({
    name: true, agent: true, http: true, payload: true, depends_on: true, timeout: true,
    deadline: true, max_attempts: true, backoff: true, backoff_formula: true, compensate: true,
    progress_events: true,
  })],
  ["CompensateSpec", "CompensateSpec", keys<CompensateSpec>({
    agent: true, http: true, payload: true, timeout: true, deadline: true, max_attempts: true,
  })],
  ["HttpTarget", "HttpTarget", keys<HttpTarget>({
    url: true, method: true, headers: true, timeout: true, async: true,
  })],
  ["Backoff", "Backoff", keys<Backoff>({ initial: true, factor: true, max: true })],
  ["WaitingReason", "WaitingReason", keys<WaitingReason>({ code: true, text: true })],
  ["ScheduleSpec", "ScheduleSpec", keys<ScheduleSpec>({
    name: true, cron: true, timezone: true, job: true, overlap: true, misfire: true,
  })],
];

let server: RunningServer;
let schemas: Record<string, any>;

before(async () => {
  server = await startServer();
  const res = await fetch(`${server.url}/openapi.json`);
  assert.equal(res.status, 200);
  schemas = (await res.json()).components.schemas;
});
after(async () => server.stop());

const props = (schema: any): string[] => Object.keys(schema?.properties ?? {}).sort();

test("every wire type has the fields of its OpenAPI schema", () => {
  for (const [sdk, name, fields] of types) {
    assert.ok(schemas[name], `the server's schema has no ${name} (for ${sdk})`);
    assert.deepEqual(fields, props(schemas[name]), `${sdk} vs the server's ${name}`);
  }
});

test("report bodies have the fields of the batch report variants", () => {
  const variants: any[] = schemas.LeaseOutcome.oneOf;
  const byOutcome = (o: string) =>
    variants.find((v) => v.properties.outcome.enum.includes(o));
  assert.deepEqual(
    keys<Complete>({ outcome: true, lease_id: true, result: true }),
    props(byOutcome("complete")),
  );
  assert.deepEqual(
    keys<Fail>({ outcome: true, lease_id: true, error: true, retryable: true }),
    props(byOutcome("fail")),
  );
});

test("the request bodies the client builds use the server's field names", () => {
  // The types `Client` annotates its lease, heartbeat, complete and fail bodies with.
  const sent: Array<[string, string[]]> = [
    ["LeaseRequest", keys<LeaseRequest>({ worker: true, max: true, wait: true })],
    ["HeartbeatRequest", keys<HeartbeatRequest>({ progress: true })],
    ["CompleteRequest", keys<CompleteRequest>({ result: true })],
    ["FailRequest", keys<FailRequest>({ error: true, retryable: true })],
    ["RerunRequest", keys<RerunRequest>({ from_failed: true, by: true, reason: true })],
  ];
  for (const [name, fields] of sent) {
    assert.deepEqual(fields, props(schemas[name]), name);
  }
});
