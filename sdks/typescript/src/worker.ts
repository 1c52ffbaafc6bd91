// Runs handlers for leased steps: long-polls per agent name, heartbeats, enforces each lease's
// deadline on the monotonic clock, and reports (batched under load, see reports.ts).

import { hostname } from "node:os";
import { randomBytes } from "node:crypto";

import { Client, type ClientOptions } from "./client.js";
import { FatalError, OverseerError } from "./errors.js";
import { Reporter, sleep, type Log, type Report } from "./reports.js";
import type { Json, Lease, LeaseKind } from "./types.js";

/** What a handler gets for one attempt. */
export interface StepContext {
  payload: Json;
  /** Each dependency's result by step name (for `compensate`: the undone step's result). */
  inputs: Record<string, Json>;
  jobId: string;
  step: string;
  attempt: number;
  /** `{job_id}/{step}` (`…/compensate` for an undo): the same on every attempt. */
  idempotencyKey: string;
  kind: LeaseKind;
  leaseId: string;
  /** The local deadline on the `performance.now()` clock; heartbeats move it later. */
  readonly deadline: number;
  /** Aborts at the deadline, when the server cancels the work, or when the lease is lost. */
  signal: AbortSignal;
  /** Sends a heartbeat now, with progress for the job's history. */
  heartbeat(progress?: Json): Promise<void>;
  /**
   * Reports how the work is going (any JSON, at most the server's `limits.progress_bytes`, 4 KiB
   * by default, encoded) with the next regular heartbeat, without sending one now; a newer value
   * given before then replaces it. The server keeps the last one on the step (`progress`), and
   * records it in the job's history only for a step submitted with `progress_events: true`.
   */
  progress(value: Json): void;
}

export type Handler = (ctx: StepContext) => Promise<Json | void> | Json | void;

export interface WorkerOptions extends ClientOptions {
  /** Used instead of building a client from `server`/`token`/`fetch`. */
  client?: Client;
  /** Shown in `GET /v1/agents`; default host name, pid and a random suffix. */
  workerId?: string;
  /**
   * Handlers running at once per agent name (default 4). A slot is free again as soon as its
   * handler returns, so the next lease is taken while the report still waits for its answer;
   * up to {@link REPORTS_PER_SLOT} reports per slot may wait for answers at once, and past that a
   * finished attempt keeps its slot until one is answered.
   */
  concurrency?: number;
  /** How long one lease request may wait on the server (default 20 s). */
  pollWaitMs?: number;
  /**
   * While the server has a backlog (the last answer filled every slot asked for), a lease
   * request first lets handlers that are ending finish, so that short handlers ending one by one
   * do not each cost the server a claim of one lease (default true). It never waits on a timer:
   * a slot still working is not waited for. An idle worker asks at its first free slot.
   */
  gather?: boolean;
  log?: Log;
}

const HEARTBEAT_MIN_MS = 100;
/** The server's default `leases_per_call`: a larger `max` would be refused. */
const LEASES_PER_CALL_MAX = 100;
/**
 * Reports that may wait for their answer per slot of `concurrency`. A report's answer takes a
 * commit and a round trip, usually longer than a short handler runs, so with one report per slot
 * the reports, not the handlers, set the pace: measured with the Rust SDK, a PostgreSQL drain
 * (4 workers × 32) ran 6,430 steps/s with one per slot and 8,200 with four. Still bounded, so a
 * server slow to answer slows the claims.
 */
export const REPORTS_PER_SLOT = 4;
/**
 * Turns of the event loop in a row that free no slot, after which a gathering lease request
 * goes. Measured with the Rust SDK: a PostgreSQL drain (4 workers × 32) went from claims of 16
 * leases to 30, and a third more steps per second.
 */
export const GATHER_TURNS = 2;

/** The local deadline of a lease granted or renewed by a request sent at `sentAt`: 5% early
 * (at least 50 ms), since the server started counting later than we did. */
export function localDeadline(sentAt: number, leaseMs: number): number {
  return sentAt + Math.max(0, leaseMs - Math.max(50, leaseMs / 20));
}

export class Worker {
  readonly client: Client;
  readonly id: string;
  private readonly handlers = new Map<string, Handler>();
  private readonly concurrency: number;
  private readonly pollWaitMs: number;
  private readonly gather: boolean;
  private readonly log: Log;
  private readonly reporter: Reporter;
  private readonly stopping = new AbortController();
  private readonly running = new Set<Promise<void>>();
  private loops: Promise<void>[] = [];

  constructor(options: WorkerOptions = {}) {
    this.client = options.client ?? new Client(options);
    this.id = options.workerId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
    this.concurrency = Math.max(1, options.concurrency ?? 4);
    this.pollWaitMs = options.pollWaitMs ?? 20_000;
    this.gather = options.gather ?? true;
    this.log = options.log ?? defaultLog;
    this.reporter = new Reporter(this.client, this.log);
  }

  /** Registers the handler for steps (and undos) of one agent name. */
  handle(agent: string, handler: Handler): this {
    this.handlers.set(agent, handler);
    return this;
  }

  /**
   * Polls every registered agent name until `stop()` (or SIGINT/SIGTERM when `signals` is on),
   * then waits for running attempts to finish and report.
   */
  async run(opts: { signals?: boolean } = {}): Promise<void> {
    if (this.handlers.size === 0) throw new TypeError("no handler registered");
    const onSignal = () => void this.stop();
    if (opts.signals) for (const s of ["SIGINT", "SIGTERM"] as const) process.once(s, onSignal);
    try {
      this.loops = [...this.handlers].map(([agent, h]) => this.pollLoop(agent, h));
      await Promise.all(this.loops);
      while (this.running.size > 0) await Promise.allSettled([...this.running]);
    } finally {
      for (const s of ["SIGINT", "SIGTERM"] as const) process.removeListener(s, onSignal);
    }
  }

  /** Stops taking leases and resolves once running attempts have finished. */
  async stop(): Promise<void> {
    this.stopping.abort();
    await Promise.all(this.loops);
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }

  private async pollLoop(agent: string, handler: Handler): Promise<void> {
    const slots = new Semaphore(this.concurrency);
    // Reports waiting for an answer: REPORTS_PER_SLOT per slot (see `attempt`).
    const reports = new Semaphore(this.concurrency * REPORTS_PER_SLOT);
    let backoff = 0;
    let backlog = false;
    const most = Math.min(this.concurrency, LEASES_PER_CALL_MAX);
    while (!this.stopping.signal.aborted) {
      await slots.free(this.stopping.signal);
      if (backlog && this.gather) await slots.gather(most);
      if (this.stopping.signal.aborted) break;
      const max = Math.min(slots.available, LEASES_PER_CALL_MAX);
      const sentAt = performance.now();
      let leases: Lease[];
      try {
        leases = await this.client.takeLeases(agent, this.id, max, this.pollWaitMs, this.stopping.signal);
        backoff = 0;
        backlog = leases.length >= max;
      } catch (e) {
        backlog = false;
        if (this.stopping.signal.aborted) break;
        // Unreachable or failing server: back off (doubling to 5 s, jittered) and try again;
        // the client has moved on to the next server URL if there are several.
        backoff = Math.min(5_000, backoff === 0 ? 100 : backoff * 2);
        this.log("warn", `lease request for ${agent} failed: ${String(e)}; retrying in ~${backoff} ms`);
        await sleep(backoff / 2 + Math.random() * (backoff / 2), this.stopping.signal);
        continue;
      }
      for (const lease of leases) {
        const p = this.attempt(handler, lease, sentAt, slots.take(), reports).finally(() => {
          this.running.delete(p);
        });
        this.running.add(p);
      }
    }
  }

  /**
   * Runs one lease to its end. The attempt owns `slot` and gives it back once its handler is
   * over (the `finally` covers every path; giving back twice is harmless).
   */
  private async attempt(handler: Handler, lease: Lease, sentAt: number, slot: Permit, reports: Semaphore): Promise<void> {
    const life = new Lifetime(this.client, lease, sentAt, this.log);
    try {
      if (!(await life.start())) return;
      const report = await runHandler(handler, life.context(), life.signal);
      life.stopBeating();
      if (report === null || life.signal.aborted) return; // nothing is reported for this attempt
      // The slot is for running: it goes back once the handler has ended, so the next lease is
      // taken while this report waits for its answer. Held until the answer, every slot would
      // sit idle through the server's commit and a round trip it has no part in. Reports waiting
      // are bounded too, by REPORTS_PER_SLOT per slot: when they are all taken, the slot is kept
      // until one is answered, so a server slow to settle reports also slows down how fast leases
      // are taken. The wait ends early when the lease's deadline passes (nothing is sent then).
      const waiting = await reports.acquire(life.signal);
      if (waiting === null) return;
      slot.release();
      try {
        await this.reporter.send(lease.lease_id, report, life.deadline, life.signal);
      } finally {
        waiting.release();
      }
    } finally {
      slot.release();
      life.end();
    }
  }
}

const ABORTED = Symbol("aborted");

/** The handler's outcome, or `null` when the attempt was aborted before it finished. */
async function runHandler(handler: Handler, ctx: StepContext, signal: AbortSignal): Promise<Report | null> {
  const aborted = new Promise<typeof ABORTED>((resolve) => {
    if (signal.aborted) resolve(ABORTED);
    signal.addEventListener("abort", () => resolve(ABORTED), { once: true });
  });
  const work = Promise.resolve().then(() => handler(ctx));
  work.catch(() => undefined); // a late rejection after an abort is not an unhandled one
  try {
    const value = await Promise.race([work, aborted]);
    if (value === ABORTED) return null;
    return { ok: true, result: value === undefined ? null : value };
  } catch (e) {
    if (signal.aborted) return null;
    const error = e instanceof Error ? e.message : String(e);
    return { ok: false, error: error || "error", retryable: !(e instanceof FatalError) };
  }
}

/** One attempt's lease: its deadline timer, its heartbeats and its abort signal. */
class Lifetime {
  deadline: number;
  private readonly abort = new AbortController();
  private deadlineTimer: ReturnType<typeof setTimeout> | undefined;
  private beatTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly interval: number;
  private beating = true;
  /** Progress from `ctx.progress` for the next regular heartbeat. */
  private pending: Json | undefined;

  constructor(private readonly client: Client, private readonly lease: Lease, sentAt: number, private readonly log: Log) {
    this.deadline = localDeadline(sentAt, lease.lease_ms);
    this.interval = Math.max(HEARTBEAT_MIN_MS, lease.lease_ms / 3);
  }

  /**
   * Arms the deadline and the heartbeats. A lease whose long-poll ate more than half of it is
   * first renewed by a heartbeat (its answer counts from a fresh send time); `false` when that
   * fails: the attempt is dropped unstarted and its lease left to expire.
   */
  async start(): Promise<boolean> {
    if (this.deadline - performance.now() < this.lease.lease_ms / 2) {
      const sent = performance.now();
      try {
        const hb = await this.client.heartbeat(this.lease.lease_id, undefined, { timeoutMs: this.lease.lease_ms / 2 });
        if (hb.cancel) return false;
        this.deadline = localDeadline(sent, hb.lease_ms);
      } catch (e) {
        this.log("warn", `lease ${this.lease.lease_id} arrived late and could not be renewed: ${String(e)}`);
        return false;
      }
    }
    this.armDeadline();
    this.scheduleBeat();
    return true;
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  context(): StepContext {
    const l = this.lease;
    const self = this;
    return {
      payload: l.payload, inputs: l.inputs, jobId: l.job_id, step: l.step, attempt: l.attempt,
      idempotencyKey: l.idempotency_key, kind: l.kind, leaseId: l.lease_id, signal: this.signal,
      get deadline() {
        return self.deadline;
      },
      heartbeat: (progress?: Json) => this.beat(progress),
      progress: (value: Json) => {
        this.pending = value;
      },
    };
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer);
    const left = this.deadline - performance.now();
    this.deadlineTimer = setTimeout(() => {
      this.log("warn", `lease ${this.lease.lease_id}: local deadline passed; aborting, reporting nothing`);
      this.abort.abort(new Error("the lease's deadline passed"));
    }, Math.max(0, left));
  }

  private scheduleBeat(): void {
    if (!this.beating || this.signal.aborted) return;
    const halfLeft = (this.deadline - performance.now()) / 2;
    const wait = Math.max(HEARTBEAT_MIN_MS, Math.min(this.interval, halfLeft));
    this.beatTimer = setTimeout(() => void this.beat().finally(() => this.scheduleBeat()), wait);
  }

  /**
   * One heartbeat: moves the deadline, aborts on `cancel: true` or a lost lease. Without
   * `progress` it carries the progress given to `ctx.progress` since the last one, once (again
   * with the next one if it fails).
   */
  private async beat(progress?: Json): Promise<void> {
    if (this.signal.aborted) return;
    const sent = performance.now();
    const carried = progress !== undefined ? progress : this.pending;
    if (progress === undefined) this.pending = undefined;
    try {
      const hb = await this.client.heartbeat(this.lease.lease_id, carried, {
        signal: this.signal, timeoutMs: Math.max(1, this.deadline - sent),
      });
      const next = localDeadline(sent, hb.lease_ms);
      if (next > this.deadline && !this.signal.aborted) {
        this.deadline = next;
        this.armDeadline();
      }
      if (hb.cancel) this.abort.abort(new Error("the job no longer wants this work"));
    } catch (e) {
      if (e instanceof OverseerError && e.status < 500) {
        this.abort.abort(new Error(`the lease is no longer live (${e.status})`));
      } else if (!this.signal.aborted) {
        this.log("debug", `lease ${this.lease.lease_id}: heartbeat failed: ${String(e)}`);
        if (progress === undefined && this.pending === undefined) this.pending = carried;
      }
    }
  }

  stopBeating(): void {
    this.beating = false;
    clearTimeout(this.beatTimer);
  }

  /** The attempt is over: timers go; the signal aborts so a still-running handler can stop. */
  end(): void {
    this.stopBeating();
    clearTimeout(this.deadlineTimer);
    if (!this.signal.aborted) this.abort.abort(new Error("the attempt is over"));
  }
}

/** One unit taken from a `Semaphore`. */
interface Permit {
  /** Gives the unit back; only the first call counts, so every exit path may call it. */
  release(): void;
}

/** A count of free units (slots to run a handler, or reports that may wait for an answer). */
export class Semaphore {
  available: number;
  private waiters: (() => void)[] = [];

  constructor(n: number) {
    this.available = n;
  }

  /** Takes one unit now; the caller has seen one free (`available > 0`). */
  take(): Permit {
    this.available -= 1;
    let held = true;
    return {
      release: () => {
        if (!held) return;
        held = false;
        this.available += 1;
        this.waiters.splice(0).forEach((w) => w());
      },
    };
  }

  /** Resolves when at least one unit is free (or at once when `signal` aborts). */
  async free(signal: AbortSignal): Promise<void> {
    while (this.available <= 0 && !signal.aborted) await this.changed(signal);
  }

  /**
   * Lets other work run until `n` units are free or {@link GATHER_TURNS} turns of the event loop
   * in a row free none (a lease request gathering the slots of handlers that are ending).
   */
  async gather(n: number): Promise<void> {
    let idleTurns = 0;
    while (this.available < n && idleTurns < GATHER_TURNS) {
      const before = this.available;
      await new Promise<void>((resolve) => setImmediate(resolve));
      idleTurns = this.available > before ? 0 : idleTurns + 1;
    }
  }

  /** Takes one unit, waiting until one is free; `null` when `signal` aborts first. */
  async acquire(signal: AbortSignal): Promise<Permit | null> {
    // Checked and taken with no await in between, so two waiters cannot take the same unit.
    while (this.available <= 0 && !signal.aborted) await this.changed(signal);
    return signal.aborted ? null : this.take();
  }

  /** Resolves at the next release, or when `signal` aborts. */
  private changed(signal: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = () => {
        signal.removeEventListener("abort", done);
        const i = this.waiters.indexOf(done); // gone already when a release woke it
        if (i >= 0) this.waiters.splice(i, 1);
        resolve();
      };
      this.waiters.push(done);
      signal.addEventListener("abort", done, { once: true });
    });
  }
}

const defaultLog: Log = (level, message) => {
  if (level === "warn" || level === "error") console.error(`overseer worker ${level}: ${message}`);
};
