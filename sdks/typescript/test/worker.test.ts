import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";

import { Client, FatalError, RetryableError, Worker, type JobSpec, type StepContext } from "../src/index.js";
import { REPORTS_PER_SLOT, Semaphore } from "../src/worker.js";
import { deferred, recordingFetch, reportedLeases, startServer, until, type RunningServer } from "./helpers.js";

let server: RunningServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

/** Runs `body` with a worker running, then stops the worker and waits for it. */
async function withWorker(worker: Worker, body: () => Promise<void>): Promise<void> {
  const running = worker.run();
  try {
    await body();
  } finally {
    await worker.stop();
    await running;
  }
}

// Proves the README walkthrough's job (examples/provision-site.json) succeeds when TS workers
// run its four agents: dns and storage get create-account's result as input, deploy gets both,
// and every lease carries the stable `{job_id}/{step}` idempotency key.
test("walkthrough job runs on TS workers", async () => {
  const spec = JSON.parse(readFileSync(new URL("../../../../examples/provision-site.json", import.meta.url), "utf8"));
  const seen: StepContext[] = [];
  const worker = new Worker({ server: server.url, workerId: "walkthrough" });
  const record = (result: (c: StepContext) => unknown) => async (c: StepContext) => {
    seen.push(c);
    return result(c) as any;
  };
  worker
    .handle("accounts", record((c) => ({ account: `acct-${(c.payload as any).customer}` })))
    .handle("dns", record((c) => ({ record: (c.payload as any).domain, account: (c.inputs["create-account"] as any).account })))
    .handle("storage", record((c) => ({ bucket: (c.payload as any).bucket })))
    .handle("deploy", record((c) => ({ deployed: Object.keys(c.inputs).sort() })));
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const job = await client.wait((await client.submit(spec)).id, { timeoutMs: 30_000 });
    assert.equal(job.state, "succeeded", JSON.stringify(job));
    const step = (n: string) => job.steps.find((s) => s.name === n)!;
    assert.deepEqual(step("provision-dns").result, { record: "acme.example.com", account: "acct-acme" });
    assert.deepEqual(step("deploy-site").result, { deployed: ["provision-dns", "provision-storage"] });
    for (const c of seen) assert.equal(c.idempotencyKey, `${job.id}/${c.step}`);
    assert.equal(seen.length, 4);
  });
});

// Proves a RetryableError fails only the attempt: the step runs again (attempt 2) and succeeds.
test("retry then success", async () => {
  const attempts: number[] = [];
  const worker = new Worker({ server: server.url }).handle("flaky-ts", (c) => {
    attempts.push(c.attempt);
    if (c.attempt === 1) throw new RetryableError("not yet");
    return { ok: c.attempt };
  });
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const spec: JobSpec = { steps: [{ name: "s", agent: "flaky-ts", backoff: { initial: "50ms", max: "50ms" } }] };
    const job = await client.wait((await client.submit(spec)).id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded");
    assert.deepEqual(job.steps[0]!.result, { ok: 2 });
    assert.deepEqual(attempts, [1, 2]);
  });
});

// Proves a FatalError fails the step at its first attempt and the job compensates the step that
// had succeeded: its undo runs as a `compensate` lease and the job lists it in `compensated`.
test("fatal error fails the job and compensation runs", async () => {
  const undos: StepContext[] = [];
  const worker = new Worker({ server: server.url })
    .handle("ok-ts", () => ({ made: "thing" }))
    .handle("bad-ts", () => {
      throw new FatalError("cannot ever work");
    })
    .handle("undo-ts", (c) => {
      undos.push(c);
      return "undone";
    });
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const spec: JobSpec = {
      steps: [
        { name: "a", agent: "ok-ts", compensate: { agent: "undo-ts", payload: { why: "b failed" } } },
        { name: "b", agent: "bad-ts", depends_on: ["a"] },
      ],
    };
    const job = await client.wait((await client.submit(spec)).id, { timeoutMs: 20_000 });
    assert.equal(job.state, "failed", JSON.stringify(job));
    assert.deepEqual(job.compensated, ["a"]);
    const b = job.steps.find((s) => s.name === "b")!;
    assert.equal(b.attempt, 1, "a fatal error is not retried");
    assert.equal(b.last_error, "cannot ever work");
    assert.equal(undos.length, 1);
    assert.equal(undos[0]!.kind, "compensate");
    assert.deepEqual(undos[0]!.payload, { why: "b failed" });
    assert.equal(undos[0]!.idempotencyKey, `${job.id}/a/compensate`);
  });
});

// Proves nothing is reported after the local deadline: attempt 1's heartbeats are made to fail
// (by the injected fetch), its signal aborts at the deadline, and its handler resolving later
// sends no complete/fail; the step is leased again as attempt 2, whose result is recorded.
test("a handler that outlives its deadline does not report", async () => {
  const rec = recordingFetch((r) => r.path.endsWith("/heartbeat") && firstLease !== undefined && r.path.includes(firstLease));
  let firstLease: string | undefined;
  const lateDone = deferred<{ abortedFirst: boolean }>();
  const worker = new Worker({ server: server.url, fetch: rec.fetch }).handle("slow-ts", async (c) => {
    if (c.attempt > 1) return { attempt: c.attempt };
    firstLease = c.leaseId;
    // Ignores its signal on purpose and resolves well after the 1 s lease ended.
    await new Promise((r) => setTimeout(r, 2_000));
    lateDone.resolve({ abortedFirst: c.signal.aborted });
    return { attempt: c.attempt };
  });
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const spec: JobSpec = { steps: [{ name: "s", agent: "slow-ts", timeout: "1s", backoff: { initial: "50ms", max: "50ms" } }] };
    const id = (await client.submit(spec)).id;
    assert.equal((await lateDone.promise).abortedFirst, true, "the signal aborted before the handler ended");
    const job = await client.wait(id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded", JSON.stringify(await client.events(id)));
    assert.equal(job.steps[0]!.attempt, 2);
    assert.deepEqual(job.steps[0]!.result, { attempt: 2 });
  });
  assert.ok(firstLease);
  assert.ok(!reportedLeases(rec.requests).includes(firstLease!), "no report was sent for attempt 1");
});

// Proves a cancel reaches a running handler through its heartbeat: the signal aborts, nothing
// is reported for the lease, and the job ends cancelled.
test("cancel reaches the handler via heartbeat", async () => {
  const rec = recordingFetch();
  const started = deferred<string>();
  const aborted = deferred<void>();
  const worker = new Worker({ server: server.url, fetch: rec.fetch }).handle("long-ts", async (c) => {
    started.resolve(c.leaseId);
    await new Promise<void>((r) => c.signal.addEventListener("abort", () => r(), { once: true }));
    aborted.resolve();
    return "too late";
  });
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const id = (await client.submit({ steps: [{ name: "s", agent: "long-ts", timeout: "900ms" }] })).id;
    const lease = await started.promise;
    await client.cancel(id);
    await aborted.promise;
    const job = await client.wait(id, { timeoutMs: 20_000 });
    assert.equal(job.state, "cancelled");
    assert.ok(!reportedLeases(rec.requests).includes(lease));
    assert.ok(rec.requests.some((r) => r.path === `/v1/leases/${lease}/heartbeat`));
  });
});

// Proves reports that end together go out in `POST /v1/leases:report` batches, and that every
// job of the burst still succeeds with its own result.
test("reports are batched under load", async () => {
  const rec = recordingFetch();
  const worker = new Worker({ server: server.url, fetch: rec.fetch, concurrency: 40 }).handle("burst-ts", (c) => c.payload);
  const client = new Client({ server: server.url });
  const specs: JobSpec[] = Array.from({ length: 120 }, (_, i) => ({ steps: [{ name: "s", agent: "burst-ts", payload: i }] }));
  const jobs = await client.submitBatch(specs);
  await withWorker(worker, async () => {
    for (const [i, j] of jobs.entries()) {
      const done = await client.wait(j.id, { timeoutMs: 30_000 });
      assert.equal(done.state, "succeeded");
      assert.equal(done.steps[0]!.result, i);
    }
  });
  const batches = rec.requests.filter((r) => r.path === "/v1/leases:report");
  assert.ok(batches.length > 0, "some reports went in a batch");
  assert.ok(batches.every((b) => b.body.reports.length >= 2), "a batch holds at least two reports");
  assert.equal(new Set(reportedLeases(rec.requests)).size, 120, "each lease reported once");
});

// Proves fail-over: the first server URL refuses connections, so the worker moves to the second
// and runs the job there.
test("worker fails over to the next server URL", async () => {
  const dead = "http://127.0.0.1:9"; // discard port: nothing listens on loopback there
  const worker = new Worker({ server: [dead, server.url], log: () => {} }).handle("fo-ts", () => "here");
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const job = await client.wait((await client.submit({ steps: [{ name: "s", agent: "fo-ts" }] })).id, { timeoutMs: 20_000 });
    assert.equal(job.steps[0]!.result, "here");
  });
  assert.equal(worker.client.server, server.url);
});

// Proves stop() lets a running handler finish and report before it resolves.
test("stop lets running handlers finish", async () => {
  const started = deferred<void>();
  const release = deferred<void>();
  const worker = new Worker({ server: server.url }).handle("grace-ts", async () => {
    started.resolve();
    await release.promise;
    return "finished";
  });
  const client = new Client({ server: server.url });
  const running = worker.run();
  const id = (await client.submit({ steps: [{ name: "s", agent: "grace-ts" }] })).id;
  await started.promise;
  const stopped = worker.stop();
  release.resolve();
  await stopped;
  await running;
  const job = await client.getJob(id);
  assert.equal(job.state, "succeeded");
  assert.equal(job.steps[0]!.result, "finished");
});

// Proves `ctx.progress` sends nothing by itself: the next regular heartbeat carries it, once, and
// the server keeps it on the step (recording it once for a step with `progress_events`).
test("progress goes with the next heartbeat", async () => {
  const rec = recordingFetch();
  const beats = () => rec.requests.filter((r) => r.path.endsWith("/heartbeat"));
  const worker = new Worker({ server: server.url, fetch: rec.fetch }).handle("progress-ts", async (c) => {
    c.progress({ pct: 25 });
    await until("two heartbeats", () => (beats().length >= 2 ? true : undefined));
    return "done";
  });
  const client = new Client({ server: server.url });
  await withWorker(worker, async () => {
    const id = (await client.submit({ steps: [
      { name: "s", agent: "progress-ts", timeout: "1s", progress_events: true },
    ] })).id;
    const job = await client.wait(id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded");
    const carried = beats().filter((r) => r.body?.progress !== undefined).map((r) => r.body.progress);
    assert.deepEqual(carried, [{ pct: 25 }]);
    assert.deepEqual(job.steps[0]!.progress, { pct: 25 });
    assert.ok(job.steps[0]!.progress_at);
    const kinds = (await client.events(id)).map((e) => e.kind);
    assert.equal(kinds.filter((k) => k === "step_progress").length, 1);
  });
});

// Proves a slot is given back as soon as its handler returns, not when its report is answered,
// and that reports waiting for answers are bounded by REPORTS_PER_SLOT per slot. With
// concurrency 1 and the answers to complete/fail/`leases:report` held back by the injected
// fetch, REPORTS_PER_SLOT + 1 handlers start while no report has been answered: the first
// REPORTS_PER_SLOT attempts each take a reporting permit and give back the slot, and the next
// one runs its handler, then keeps the slot while it waits for a permit. The lease after it
// starts only once the first answer is let through. (Only two report calls are in flight at
// once, see reports.ts, so fewer requests than reports are held: the reports past those queue.)
test("a slot is free once its handler returns, before its report is answered", async () => {
  const held: { path: string; release: () => void }[] = [];
  let holding = true;
  const slowReports: typeof fetch = async (input, init) => {
    const path = new URL(String(input)).pathname;
    const response = await fetch(input, init);
    if (!holding || !/^\/v1\/leases(\/[^/]+\/(complete|fail)|:report)$/.test(path)) return response;
    // The server has committed the report; only its answer is late.
    const gate = deferred<void>();
    held.push({ path, release: gate.resolve });
    await gate.promise;
    return response;
  };
  const releaseAll = () => {
    holding = false;
    for (const h of held.splice(0)) h.release();
  };
  const started: number[] = [];
  const worker = new Worker({ server: server.url, fetch: slowReports, concurrency: 1, log: () => {} })
    .handle("slow-answer-ts", (c) => {
      started.push(c.payload as number);
      return c.payload;
    });
  const client = new Client({ server: server.url });
  // Leases that start before any answer: one per reporting permit, and one more that ends and
  // then holds the only slot while it waits for a permit.
  const early = REPORTS_PER_SLOT + 1;
  const payloads = Array.from({ length: early + 1 }, (_, i) => i + 1);
  const jobs = await client.submitBatch(payloads.map((i): JobSpec => ({
    steps: [{ name: "s", agent: "slow-answer-ts", payload: i, timeout: "30s" }],
  })));
  await withWorker(worker, async () => {
    // Released before the worker is stopped (which waits for the reports), also on failure.
    try {
      await until(`${early} handlers to start while no report is answered`,
        () => (started.length >= early ? true : undefined), 10_000);
      assert.ok(held.length >= 1, "the first report has been sent and is unanswered");
      // The last of them has ended and waits for a reporting permit, keeping its slot.
      await new Promise((r) => setTimeout(r, 700));
      assert.equal(started.length, early, `no handler past ${early} while ${REPORTS_PER_SLOT} reports are unanswered`);
      // All but the last started attempt have a report waiting for its answer.
      assert.ok(started.length - 1 > 1, "more reports wait for answers than there are slots");
      held.shift()!.release();
      await until("the next handler to start once a report is answered",
        () => (started.length > early ? true : undefined), 5_000);
    } finally {
      releaseAll();
    }
    for (const j of jobs) assert.equal((await client.wait(j.id, { timeoutMs: 20_000 })).state, "succeeded");
  });
  assert.deepEqual([...started].sort((x, y) => x - y), payloads);
});

test("a lease request gathers the slots of ending handlers, and never waits for busy ones", async () => {
  // Proves the poll loop's gathering: slots freed by handlers ending now are taken together,
  // and a slot still working is not waited for (no timer).
  const slots = new Semaphore(4);
  const held = [slots.take(), slots.take(), slots.take(), slots.take()];
  held[0].release();
  for (const p of held.slice(1, 3)) setImmediate(() => p.release());
  await slots.gather(4);
  assert.equal(slots.available, 3, "the two ending handlers' slots are gathered");
  const started = performance.now();
  const busy = setTimeout(() => held[3].release(), 5_000);
  await slots.gather(4);
  assert.equal(slots.available, 3);
  assert.ok(performance.now() - started < 1_000, "a busy slot is not waited for");
  clearTimeout(busy);
  held[3].release();
});
