import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, FatalError, OverseerError, Worker, type Job } from "../src/index.js";
import { recordingFetch, startServer, until, type RunningServer } from "./helpers.js";

let server: RunningServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

/** The error a promise rejects with (failing the test if it resolves). */
async function rejection(p: Promise<unknown>): Promise<OverseerError> {
  const e = await p.then(() => assert.fail("expected an error answer"), (e: unknown) => e);
  assert.ok(e instanceof OverseerError, String(e));
  return e;
}

// Proves error answers become OverseerError with the problem+json fields, including the field
// at fault, and that a missing job is a 404 of the same shape.
test("client errors carry the problem fields", async () => {
  const client = new Client({ server: server.url });
  const bad = await rejection(client.submit({ steps: [{ name: "a", agent: "x", depends_on: ["nope"] }] }));
  assert.ok(bad.status === 400 || bad.status === 422, String(bad.status));
  assert.equal(bad.field, "steps[0].depends_on[0]");
  assert.equal(typeof bad.type, "string");
  assert.ok(bad.title.length > 0 && bad.detail.length > 0);
  const missing = await rejection(client.getJob("00000000-0000-0000-0000-000000000000"));
  assert.equal(missing.status, 404);
  assert.equal(missing.field, undefined);
});

// Proves the token is sent as a Bearer header, and OVERSEER_SERVER / OVERSEER_TOKEN are the
// defaults when no option is given.
test("client sends the bearer token and reads its defaults from the environment", async () => {
  const rec = recordingFetch();
  process.env.OVERSEER_SERVER = server.url;
  process.env.OVERSEER_TOKEN = "s3cret";
  try {
    const client = new Client({ fetch: rec.fetch });
    assert.equal(client.server, server.url);
    await client.listJobs({ limit: 1 });
  } finally {
    delete process.env.OVERSEER_SERVER;
    delete process.env.OVERSEER_TOKEN;
  }
  assert.equal(rec.requests[0]!.headers.authorization, "Bearer s3cret");
});

// Proves submit idempotency, batch order, label and state filters, cursor paging and the async
// iterator that walks every page.
test("list filters, pages and iterates", async () => {
  const client = new Client({ server: server.url });
  const first = await client.submit({ idempotency_key: "list-1", labels: { suite: "list" }, steps: [{ name: "s", agent: "nobody" }] });
  const again = await client.submit({ idempotency_key: "list-1", labels: { suite: "list" }, steps: [{ name: "s", agent: "nobody" }] });
  assert.equal(again.id, first.id);
  const batch = await client.submitBatch(
    [1, 2, 3, 4].map((i) => ({ labels: { suite: "list", n: String(i) }, steps: [{ name: "s", agent: "nobody" }] })),
  );
  assert.deepEqual(batch.map((j) => j.labels.n), ["1", "2", "3", "4"]);
  const brief = await client.submitBatchMinimal([{ labels: { suite: "brief" }, steps: [{ name: "s", agent: "nobody" }] }]);
  assert.deepEqual(Object.keys(brief[0]).sort(), ["created", "id", "state"]);
  assert.equal(brief[0].created, true);
  assert.deepEqual((await client.getJob(brief[0].id)).labels, { suite: "brief" });
  const page = await client.listJobs({ labels: { suite: "list" }, limit: 2 });
  assert.equal(page.jobs.length, 2);
  assert.ok(page.next_cursor);
  const all: Job[] = [];
  for await (const j of client.jobs({ labels: { suite: "list" }, limit: 2 })) all.push(j);
  assert.equal(all.length, 5);
  assert.equal(new Set(all.map((j) => j.id)).size, 5);
  const n3 = await client.listJobs({ labels: { suite: "list", n: "3" }, state: "running" });
  assert.deepEqual(n3.jobs.map((j) => j.id), [batch[2]!.id]);
  const cancelled = await client.cancel(batch[0]!.id);
  assert.equal(cancelled.desired_state, "cancelled");
  const cancelledErr = await rejection(client.cancel((await client.wait(batch[0]!.id, { timeoutMs: 10_000 })).id));
  assert.equal(cancelledErr.status, 409);
  const kinds = (await client.events(batch[0]!.id)).map((e) => e.kind);
  assert.equal(kinds[0], "job_submitted");
  assert.equal(kinds.at(-1), "job_cancelled");
});

// Proves the operator actions: a held job blocks on a fatal error, retryStep with by/reason
// gives the step a new attempt that succeeds, and the history records who acted and why.
test("operator retry on a blocked job", async () => {
  let calls = 0;
  const worker = new Worker({ server: server.url }).handle("op-ts", () => {
    calls += 1;
    if (calls === 1) throw new FatalError("needs a human");
    return "fixed";
  });
  const client = new Client({ server: server.url });
  const running = worker.run();
  try {
    const id = (await client.submit({ on_failure: "hold", steps: [{ name: "s", agent: "op-ts" }] })).id;
    await until("the job to block", async () => ((await client.getJob(id)).state === "blocked" ? true : undefined));
    await client.retryStep(id, "s", { by: "alice", reason: "fixed the config" });
    const job = await client.wait(id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded");
    const events = await client.events(id);
    assert.ok(JSON.stringify(events).includes("alice") && JSON.stringify(events).includes("fixed the config"));
    const skipErr = await rejection(client.skipStep(id, "s", { by: "bob" }));
    assert.equal(skipErr.status, 409);
    const resumeErr = await rejection(client.resume(id));
    assert.equal(resumeErr.status, 409);
  } finally {
    await worker.stop();
    await running;
  }
});

// Proves `rerun`: a failed job's rerun from failure is linked both ways, keeps the step that
// succeeded (its handler never runs again) and runs the failed one; a second rerun gets 409.
test("rerun from failure runs only what failed", async () => {
  let fixed = false;
  const runs: string[] = [];
  const worker = new Worker({ server: server.url }).handle("rerun-ts", (c) => {
    runs.push(`${c.jobId}/${c.step}`);
    if (c.step === "b" && !fixed) throw new FatalError("b is broken");
    return { made: c.step };
  });
  const client = new Client({ server: server.url });
  const running = worker.run();
  try {
    const old = await client.submit({ on_failure: "fail", steps: [
      { name: "a", agent: "rerun-ts" },
      { name: "b", agent: "rerun-ts", depends_on: ["a"], max_attempts: 1 },
    ] });
    assert.equal((await client.wait(old.id, { timeoutMs: 20_000 })).state, "failed");
    fixed = true;
    const made = await client.rerun(old.id, { from_failed: true, by: "ts", reason: "fixed" });
    assert.equal(made.rerun_of, old.id);
    assert.equal(made.steps[0]!.state, "succeeded");
    const done = await client.wait(made.id, { timeoutMs: 20_000 });
    assert.equal(done.state, "succeeded");
    assert.equal((await client.getJob(old.id)).rerun_by, made.id);
    assert.ok(!runs.includes(`${made.id}/a`) && runs.includes(`${made.id}/b`), runs.join(" "));
    const again = await rejection(client.rerun(old.id));
    assert.equal(again.status, 409);
    assert.ok(again.detail.includes("already rerun"), again.detail);
  } finally {
    await worker.stop();
    await running;
  }
});

// Proves agent limits can be set, read back, and the agent paused and resumed.
test("agent limits, pause and resume", async () => {
  const client = new Client({ server: server.url });
  const set = await client.setLimits("limited-ts", { max_concurrency: 2, rate: 5 });
  assert.equal(set.max_concurrency, 2);
  assert.deepEqual(await client.getLimits("limited-ts"), { agent: "limited-ts", max_concurrency: 2, rate: 5, paused: false });
  assert.equal((await client.pauseAgent("limited-ts")).paused, true);
  assert.equal((await client.getLimits("limited-ts")).paused, true);
  assert.equal((await client.resumeAgent("limited-ts")).paused, false);
  const bad = await rejection(client.setLimits("limited-ts", { max_concurrency: 0 }));
  assert.equal(bad.field, "max_concurrency");
});

// Proves schedule create, get, list, replace (a macro; a paused one stays paused), pause,
// resume and delete round-trip.
test("schedules CRUD", async () => {
  const client = new Client({ server: server.url });
  const created = await client.createSchedule({
    name: "nightly-ts", cron: "0 30 2 * * *", timezone: "Europe/Berlin",
    job: { steps: [{ name: "report", agent: "reports" }] },
  });
  assert.equal(created.name, "nightly-ts");
  assert.ok(created.next_fire_at);
  assert.equal((await client.getSchedule("nightly-ts")).cron, "0 30 2 * * *");
  assert.deepEqual((await client.listSchedules()).map((s) => s.name), ["nightly-ts"]);
  assert.equal((await client.pauseSchedule("nightly-ts")).paused, true);
  const replaced = await client.updateSchedule("nightly-ts", {
    cron: "@hourly", job: { steps: [{ name: "report", agent: "reports" }] },
  });
  assert.equal(replaced.cron, "@hourly");
  assert.equal(replaced.timezone, "UTC", "a replacement is the whole definition");
  assert.equal(replaced.paused, true);
  assert.equal(replaced.next_fire_at, null);
  const resumed = await client.resumeSchedule("nightly-ts");
  assert.equal(resumed.paused, false);
  assert.match(String(resumed.next_fire_at), /:00:00(\.000)?Z$/);
  await client.deleteSchedule("nightly-ts");
  assert.equal((await rejection(client.getSchedule("nightly-ts"))).status, 404);
});
