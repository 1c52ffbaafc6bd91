import { ConnectionError, OverseerError } from "./errors.js";
import type {
  AgentLimits, CompleteRequest, Event, FailRequest, HeartbeatRequest, HeartbeatResponse, Job,
  JobList, JobSpec, JobState, Json, Lease, LeaseOutcome, LeaseRequest, OperatorNote, Problem,
  ReportResult, RerunRequest, Schedule, ScheduleSpec,
} from "./types.js";

export interface ClientOptions {
  /** One base URL or several (fail-over: a call that gets no answer moves to the next). */
  server?: string | string[];
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string;
  /** Replaces the global `fetch` (to trace or shape requests). */
  fetch?: typeof fetch;
  /** Per-call timeout when the call sets none (default 30 s). */
  timeoutMs?: number;
}

export interface ListOptions {
  state?: JobState;
  /** Labels that must all match, `{customer: "acme"}`. */
  labels?: Record<string, string>;
  limit?: number;
  cursor?: string;
}

export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
  /** Extra request headers. */
  headers?: Record<string, string>;
}

/** A submitted job as `Prefer: return=minimal` answers it. */
export interface SubmittedJob {
  id: string;
  state: string;
  /** False when the idempotency key named a job that already existed. */
  created: boolean;
}

const TERMINAL: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled"]);

/** Overseer's HTTP API. Every method throws `OverseerError` on an error answer. */
export class Client {
  readonly servers: string[];
  private current = 0;
  private readonly token?: string;
  private readonly fetcher: typeof fetch;
  private readonly timeoutMs: number;

  constructor(options: ClientOptions = {}) {
    const given = options.server ?? process.env.OVERSEER_SERVER ?? "http://127.0.0.1:7433";
    const list = Array.isArray(given) ? given : given.split(",");
    this.servers = list.map((s) => s.trim().replace(/\/+$/, "")).filter((s) => s !== "");
    if (this.servers.length === 0) throw new TypeError("no Overseer server URL given");
    const token = options.token ?? process.env.OVERSEER_TOKEN;
    if (token) this.token = token;
    this.fetcher = options.fetch ?? globalThis.fetch;
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** The server the next call goes to. */
  get server(): string {
    return this.servers[this.current]!;
  }

  /**
   * One HTTP call. A call that gets no answer is not repeated here (it may have been applied);
   * the next call goes to the next server URL instead.
   */
  async request<T>(method: string, path: string, body?: unknown, opts: CallOptions = {}): Promise<T> {
    const server = this.server;
    const headers: Record<string, string> = { accept: "application/json", ...opts.headers };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const timeout = AbortSignal.timeout(Math.max(1, Math.ceil(opts.timeoutMs ?? this.timeoutMs)));
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    let response: Response;
    let text: string;
    try {
      response = await this.fetcher(server + path, {
        method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
      });
      text = await response.text();
    } catch (cause) {
      // Abandoned by the caller: says nothing about the server.
      if (opts.signal?.aborted) throw new ConnectionError(server, cause);
      if (this.servers[this.current] === server) this.current = (this.current + 1) % this.servers.length;
      throw new ConnectionError(server, cause);
    }
    if (!response.ok) throw new OverseerError(problemOf(response.status, text));
    return (text === "" ? undefined : JSON.parse(text)) as T;
  }

  /** Submits one job: `202` for a new one, `200` with the existing job for a repeat. */
  submit(spec: JobSpec): Promise<Job> {
    return this.request("POST", "/v1/jobs", spec);
  }

  /** Submits several jobs, all or nothing; the answer keeps their order. */
  async submitBatch(specs: JobSpec[]): Promise<Job[]> {
    const answer = await this.request<{ jobs: Job[] }>("POST", "/v1/jobs:batch", { jobs: specs });
    return answer.jobs;
  }

  /**
   * `submitBatch` with `Prefer: return=minimal`: answers each job's id, state and whether this
   * call created it, in order, instead of whole jobs (far less to send and decode).
   */
  async submitBatchMinimal(specs: JobSpec[]): Promise<SubmittedJob[]> {
    const headers = { prefer: "return=minimal" };
    const answer = await this.request<{ jobs: SubmittedJob[] }>("POST", "/v1/jobs:batch", { jobs: specs }, { headers });
    return answer.jobs;
  }

  getJob(id: string): Promise<Job> {
    return this.request("GET", `/v1/jobs/${enc(id)}`);
  }

  /**
   * Waits until the job is terminal, long-polling in rounds of at most 30 s; after `timeoutMs`
   * (default: no limit) it answers the job as it stands.
   */
  async wait(id: string, opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<Job> {
    const end = performance.now() + (opts.timeoutMs ?? Infinity);
    for (;;) {
      const left = Math.min(30_000, Math.max(0, end - performance.now()));
      const ms = Math.max(1, Math.floor(left));
      const job = await this.request<Job>("GET", `/v1/jobs/${enc(id)}/wait?timeout=${ms}ms`, undefined, {
        signal: opts.signal, timeoutMs: ms + 10_000,
      });
      if (TERMINAL.has(job.state) || performance.now() >= end) return job;
    }
  }

  /** One page of jobs, newest first. */
  listJobs(opts: ListOptions = {}): Promise<JobList> {
    const q = new URLSearchParams();
    if (opts.state) q.append("state", opts.state);
    for (const [k, v] of Object.entries(opts.labels ?? {})) q.append("label", `${k}:${v}`);
    if (opts.limit !== undefined) q.append("limit", String(opts.limit));
    if (opts.cursor) q.append("cursor", opts.cursor);
    const qs = q.toString();
    return this.request("GET", `/v1/jobs${qs ? `?${qs}` : ""}`);
  }

  /** Every job matching the filters, page after page. */
  async *jobs(opts: Omit<ListOptions, "cursor"> = {}): AsyncGenerator<Job> {
    let cursor: string | undefined;
    do {
      const page = await this.listJobs({ ...opts, cursor });
      yield* page.jobs;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  async events(id: string): Promise<Event[]> {
    return (await this.request<{ events: Event[] }>("GET", `/v1/jobs/${enc(id)}/events`)).events;
  }

  cancel(id: string): Promise<Job> {
    return this.request("POST", `/v1/jobs/${enc(id)}/cancel`, {});
  }

  retryStep(id: string, step: string, note: OperatorNote = {}): Promise<Job> {
    return this.request("POST", `/v1/jobs/${enc(id)}/steps/${enc(step)}/retry`, note);
  }

  skipStep(id: string, step: string, note: OperatorNote = {}): Promise<Job> {
    return this.request("POST", `/v1/jobs/${enc(id)}/steps/${enc(step)}/skip`, note);
  }

  resume(id: string, note: OperatorNote = {}): Promise<Job> {
    return this.request("POST", `/v1/jobs/${enc(id)}/resume`, note);
  }

  /**
   * Runs a failed or cancelled job again as a new job and answers it (its `rerun_of` names this
   * one). With `from_failed`, the steps that succeeded keep their results and are not run again.
   * A job is rerun once: a second call is refused (409).
   */
  rerun(id: string, request: RerunRequest = {}): Promise<Job> {
    return this.request("POST", `/v1/jobs/${enc(id)}/rerun`, request);
  }

  getLimits(agent: string): Promise<AgentLimits> {
    return this.request("GET", `/v1/agents/${enc(agent)}/limits`);
  }

  setLimits(agent: string, limits: { max_concurrency?: number | null; rate?: number | null }): Promise<AgentLimits> {
    return this.request("PUT", `/v1/agents/${enc(agent)}/limits`, limits);
  }

  pauseAgent(agent: string): Promise<AgentLimits> {
    return this.request("POST", `/v1/agents/${enc(agent)}/pause`, {});
  }

  resumeAgent(agent: string): Promise<AgentLimits> {
    return this.request("POST", `/v1/agents/${enc(agent)}/resume`, {});
  }

  createSchedule(spec: ScheduleSpec): Promise<Schedule> {
    return this.request("POST", "/v1/schedules", spec);
  }

  async listSchedules(): Promise<Schedule[]> {
    return (await this.request<{ schedules: Schedule[] }>("GET", "/v1/schedules")).schedules;
  }

  getSchedule(name: string): Promise<Schedule> {
    return this.request("GET", `/v1/schedules/${enc(name)}`);
  }

  /** Replaces the schedule's cron, timezone, job, overlap and misfire in one step (`name` in
   * `spec` defaults to `name`). The next due time counts from now under the new pattern; a
   * paused schedule stays paused. */
  updateSchedule(name: string, spec: Omit<ScheduleSpec, "name"> & { name?: string }): Promise<Schedule> {
    return this.request("PUT", `/v1/schedules/${enc(name)}`, { ...spec, name: spec.name ?? name });
  }

  async deleteSchedule(name: string): Promise<void> {
    await this.request("DELETE", `/v1/schedules/${enc(name)}`);
  }

  pauseSchedule(name: string): Promise<Schedule> {
    return this.request("POST", `/v1/schedules/${enc(name)}/pause`, {});
  }

  resumeSchedule(name: string): Promise<Schedule> {
    return this.request("POST", `/v1/schedules/${enc(name)}/resume`, {});
  }

  // The agent's side: used by `Worker`, open to anyone writing their own loop.

  async takeLeases(agent: string, worker: string, max: number, waitMs: number, signal?: AbortSignal): Promise<Lease[]> {
    const body: LeaseRequest = { worker, max, wait: `${waitMs}ms` };
    const answer = await this.request<{ leases: Lease[] }>("POST", `/v1/agents/${enc(agent)}/leases`, body, {
      signal, timeoutMs: waitMs + 10_000,
    });
    return answer.leases;
  }

  heartbeat(leaseId: string, progress?: Json, opts: CallOptions = {}): Promise<HeartbeatResponse> {
    const body: HeartbeatRequest = progress === undefined ? {} : { progress };
    return this.request("POST", `/v1/leases/${enc(leaseId)}/heartbeat`, body, opts);
  }

  complete(leaseId: string, result: Json, opts: CallOptions = {}): Promise<unknown> {
    const body: CompleteRequest = { result };
    return this.request("POST", `/v1/leases/${enc(leaseId)}/complete`, body, opts);
  }

  fail(leaseId: string, error: string, retryable: boolean, opts: CallOptions = {}): Promise<unknown> {
    const body: FailRequest = { error, retryable };
    return this.request("POST", `/v1/leases/${enc(leaseId)}/fail`, body, opts);
  }

  async reportBatch(reports: LeaseOutcome[], opts: CallOptions = {}): Promise<ReportResult[]> {
    return (await this.request<{ results: ReportResult[] }>("POST", "/v1/leases:report", { reports }, opts)).results;
  }
}

function enc(part: string): string {
  return encodeURIComponent(part);
}

/** The problem in an error answer; a non-JSON answer (a proxy's page) still makes one. */
function problemOf(status: number, text: string): Problem {
  try {
    const p = JSON.parse(text) as Partial<Problem>;
    if (p && typeof p === "object" && typeof p.title === "string") {
      return {
        type: p.type ?? "about:blank", title: p.title, status: p.status ?? status,
        detail: p.detail ?? "", ...(p.field !== undefined ? { field: p.field } : {}),
      };
    }
  } catch {
    // not JSON: fall through
  }
  return { type: "about:blank", title: `HTTP ${status}`, status, detail: text.slice(0, 500) };
}
