// Sending what became of each attempt, batched when many attempts end at once (the same
// rules as the Rust SDK's crates/agent/src/reports.rs).
//
// A report is bound by its lease's local deadline: past it nothing is sent, since the step may
// belong to another attempt by then. When attempts end one at a time each report leaves at once
// on its own `complete`/`fail` call, so batching adds no latency. At most two report calls are in
// flight per worker; reports that arrive meanwhile queue up and leave together in one
// `POST /v1/leases:report`, whose answer is never awaited past the latest deadline in it.
// Whatever a batch could not settle (no answer, a 5xx) falls back to its own call.

import type { Client } from "./client.js";
import { ConnectionError, OverseerError } from "./errors.js";
import type { Json, LeaseOutcome } from "./types.js";

export type Report = { ok: true; result: Json } | { ok: false; error: string; retryable: boolean };

const CALLS_IN_FLIGHT = 2;
const PER_BATCH = 100;
const TRIES = 3;

export type Log = (level: "debug" | "info" | "warn" | "error", message: string) => void;

interface Pending {
  leaseId: string;
  report: Report;
  deadline: number;
  signal: AbortSignal;
  /** `true`: the batch could not settle it, its attempt sends it alone. */
  settle: (sendAlone: boolean) => void;
}

export class Reporter {
  private readonly queue: Pending[] = [];
  private inFlight = 0;

  constructor(private readonly client: Client, private readonly log: Log) {}

  /** Reports one attempt's end; resolves once it is settled, abandoned or past its deadline. */
  async send(leaseId: string, report: Report, deadline: number, signal: AbortSignal): Promise<void> {
    const alone = await new Promise<boolean>((settle) => {
      this.queue.push({ leaseId, report, deadline, signal, settle });
      this.pump();
    });
    if (alone) await sendReport(this.client, this.log, leaseId, report, deadline, signal);
  }

  private pump(): void {
    while (this.inFlight < CALLS_IN_FLIGHT && this.queue.length > 0) {
      const batch = this.queue.splice(0, PER_BATCH);
      this.inFlight += 1;
      void this.sendBatch(batch).finally(() => {
        this.inFlight -= 1;
        this.pump();
      });
    }
  }

  private async sendBatch(batch: Pending[]): Promise<void> {
    const now = performance.now();
    const live = batch.filter((p) => {
      const keep = !p.signal.aborted && p.deadline > now;
      if (!keep) p.settle(false);
      return keep;
    });
    if (live.length < 2) {
      // Alone: its own call says the same with less. Sent while holding the slot, so that
      // reports arriving meanwhile queue up for a batch.
      for (const p of live) {
        await sendReport(this.client, this.log, p.leaseId, p.report, p.deadline, p.signal);
        p.settle(false);
      }
      return;
    }
    const last = Math.max(...live.map((p) => p.deadline));
    try {
      const results = await this.client.reportBatch(live.map(outcomeOf), {
        timeoutMs: Math.max(1, last - performance.now()),
      });
      if (results.length !== live.length) throw new Error("the answer does not match the batch");
      live.forEach((p, i) => {
        const status = results[i]!.status;
        if (status >= 500) return p.settle(true);
        if (status >= 300) this.log("info", `report for lease ${p.leaseId} refused with ${status}`);
        p.settle(false);
      });
    } catch (e) {
      // Past the last deadline nothing is sent again: the leases may be someone else's now.
      const late = performance.now() >= last;
      this.log(late ? "warn" : "debug", `batch report of ${live.length} not settled: ${String(e)}`);
      for (const p of live) p.settle(!late);
    }
  }
}

function outcomeOf(p: Pending): LeaseOutcome {
  return p.report.ok
    ? { outcome: "complete", lease_id: p.leaseId, result: p.report.result }
    : { outcome: "fail", lease_id: p.leaseId, error: p.report.error, retryable: p.report.retryable };
}

/** One report on its own call, tried again on no answer or a 5xx, never past the deadline. */
export async function sendReport(
  client: Client, log: Log, leaseId: string, report: Report, deadline: number, signal: AbortSignal,
): Promise<void> {
  for (let attempt = 1; attempt <= TRIES; attempt++) {
    const left = deadline - performance.now();
    if (signal.aborted || left <= 0) {
      log("warn", `lease ${leaseId}: deadline passed or attempt abandoned; reporting nothing`);
      return;
    }
    const opts = { signal, timeoutMs: Math.max(1, left) };
    try {
      if (report.ok) await client.complete(leaseId, report.result, opts);
      else await client.fail(leaseId, report.error, report.retryable, opts);
      return;
    } catch (e) {
      if (e instanceof OverseerError && e.status < 500) {
        log("info", `lease ${leaseId}: report refused (${e.status} ${e.detail})`);
        return;
      }
      if (!(e instanceof OverseerError || e instanceof ConnectionError)) throw e;
      log("debug", `lease ${leaseId}: report try ${attempt} failed: ${e.message}`);
      await sleep(Math.min(100 * 2 ** attempt, Math.max(0, deadline - performance.now())), signal);
    }
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
