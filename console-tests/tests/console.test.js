// Browser tests of the console against a real server and real command agents (see harness.js).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, mkdirSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Env, ROOT, until } from "../harness.js";

let env;
// The screenshots go under target/ so that running the tests leaves the checkout as it was;
// `OVERSEER_SCREENSHOTS=docs/screenshots` refreshes the README's pictures.
const SHOTS = resolve(ROOT, process.env.OVERSEER_SCREENSHOTS || "target/console-screenshots");

before(async () => {
  env = await Env.start();
  for (const a of ["accounts", "dns", "storage", "deploy"]) env.agent(a, `examples/agents/${a}.sh`);
  mkdirSync(SHOTS, { recursive: true });
});
after(async () => { await env?.stop(); });

test("the walkthrough job appears live and its DAG puts the parallel steps side by side", async () => {
  // The jobs list is open before the job exists; it must appear without a reload (live stream),
  // then its page must draw 4 nodes with provision-dns and provision-storage in one layer.
  const page = await env.page("#/jobs");
  await page.waitForSelector("#live.on");
  const spec = JSON.parse(readFileSync(join(ROOT, "examples/provision-site.json"), "utf8"));
  const job = await env.api("/v1/jobs", spec);
  await page.waitForSelector(`tr[data-job="${job.id}"]`, { timeout: 15000 });
  await page.click(`tr[data-job="${job.id}"] a`);
  await page.waitForSelector(".dag g.node");
  assert.equal(await page.locator(".dag g.node").count(), 4);
  const layer = (s) => page.getAttribute(`.dag g.node[data-step="${s}"]`, "data-layer");
  assert.equal(await layer("provision-dns"), await layer("provision-storage"));
  assert.notEqual(await layer("create-account"), await layer("provision-dns"));
  await page.waitForSelector("h1 .badge.s-succeeded", { timeout: 20000 });
  await page.click('.dag g.node[data-step="deploy-site"]');
  await page.waitForSelector("text=Step deploy-site");
  await page.screenshot({ path: join(SHOTS, "job-detail.png"), fullPage: true });
  await page.goto(env.url + "/#/overview");
  await page.waitForSelector(".grid .card");
  // The counts are the server's (GET /v1/stats), and the finished job is in this hour's chart.
  const stats = await env.api("/v1/stats");
  for (const { state, count } of stats.jobs)
    assert.equal(await page.textContent(`[data-count="${state}"] .n`), count.toLocaleString("en-US"), state);
  assert.match(await page.textContent("svg[data-chart=succeeded] + .muted"), /^[1-9]\d* in the hour/);
  await page.screenshot({ path: join(SHOTS, "overview.png") });
  assert.deepEqual(env.pageErrors || [], []);
});

test("a held job is retried from the UI and finishes", async () => {
  // The step fails for good on attempt 1 (max_attempts 1), so `hold` blocks the job; the
  // operator's retry from the page gives attempt 2, which the script lets succeed.
  env.agent("picky", env.script("picky", 'if [ "$OVERSEER_ATTEMPT" = 1 ]; then echo "boom 42" >&2; exit 1; fi\necho \'{"ok":true}\''));
  const job = await env.api("/v1/jobs", { on_failure: "hold", steps: [{ name: "once", agent: "picky", max_attempts: 1 }] });
  await until("the job to block", async () => (await env.api(`/v1/jobs/${job.id}`)).state === "blocked");
  const page = await env.page(`#/job/${job.id}`);
  await page.click('button[data-retry="once"]');
  await page.fill("#confirm-by", "console-test");
  await page.fill("#confirm-reason", "fixed the cause");
  await page.click("#confirm-ok");
  await page.waitForSelector("h1 .badge.s-succeeded", { timeout: 20000 });
  const events = await env.api(`/v1/jobs/${job.id}/events`);
  assert.ok(events.events.some((e) => JSON.stringify(e).includes("console-test")), "the retry records who did it");
});

test("a paused agent's step says so", async () => {
  // Pausing `sleepy` must be the reason shown for its ready step, on the step row.
  await env.api("/v1/agents/sleepy/pause", {});
  const job = await env.api("/v1/jobs", { steps: [{ name: "nap", agent: "sleepy" }] });
  const page = await env.page(`#/job/${job.id}`);
  const reason = await page.waitForSelector('tr[data-step-row="nap"] [data-reason="agent_paused"]');
  assert.match(await reason.textContent(), /agent `sleepy` paused/);
  await page.goto(env.url + "/#/agents");
  await page.waitForSelector('tr[data-agent="sleepy"]');
  await page.screenshot({ path: join(SHOTS, "agents.png") });
});

test("a cancelled job shows its undos", async () => {
  // `a` succeeds and declares an undo; `b` waits on an agent nobody runs. Cancelling from the
  // page must compensate `a`, and the page must show `a` as undone.
  const job = await env.api("/v1/jobs", { steps: [
    { name: "a", agent: "accounts", compensate: { agent: "accounts", payload: { undo: true } } },
    { name: "b", agent: "nobody", depends_on: ["a"] }] });
  await until("step a to succeed", async () => (await env.api(`/v1/jobs/${job.id}`)).steps[0].state === "succeeded");
  const page = await env.page(`#/job/${job.id}`);
  await page.click("text=Cancel job");
  await page.fill("#confirm-reason", "customer left");
  await page.click("#confirm-ok");
  const undone = await page.waitForSelector("[data-compensated]", { timeout: 20000 });
  assert.match(await undone.textContent(), /\ba\b/);
  await page.waitForSelector("h1 .badge.s-cancelled");
  assert.ok(await page.locator("text=↶ undo a").count() >= 1, "the timeline shows the undo attempt");
});

test("a delayed job runs now from its page", async () => {
  // Due in an hour; "Run now" (a PATCH of run_at with the confirmation's by/reason) must start
  // it at once, and the history must say who moved it.
  const runAt = new Date(Date.now() + 3600e3).toISOString();
  const job = await env.api("/v1/jobs", { run_at: runAt, steps: [{ name: "a", agent: "accounts" }] });
  const page = await env.page(`#/job/${job.id}`);
  await page.waitForSelector("h1 .badge.s-pending");
  await page.click("button[data-run-now]");
  await page.fill("#confirm-by", "console-test");
  await page.fill("#confirm-reason", "customer is waiting");
  await page.click("#confirm-ok");
  await page.waitForSelector("h1 .badge.s-succeeded", { timeout: 20000 });
  const events = (await env.api(`/v1/jobs/${job.id}/events`)).events;
  const moved = events.find((e) => e.kind === "job_rescheduled");
  assert.ok(moved, "the move is in the history");
  assert.equal(moved.detail.by, "console-test");
  assert.equal(Date.parse(moved.detail.run_at.from), Date.parse(runAt));
  assert.ok(Date.parse(moved.detail.run_at.to) < Date.parse(runAt), "moved earlier");
  assert.equal(await page.locator("button[data-run-now]").count(), 0, "no run-now on a started job");
});

test("bulk retry resumes the selected blocked jobs", async () => {
  // Two jobs block on their first attempt (hold); selecting both in the filtered list and
  // "Retry selected" must resume each, and both then succeed on attempt 2.
  env.agent("picky2", env.script("picky2", 'if [ "$OVERSEER_ATTEMPT" = 1 ]; then echo "boom" >&2; exit 1; fi\necho \'{"ok":true}\''));
  const spec = { on_failure: "hold", labels: { bulk: "retry" }, steps: [{ name: "once", agent: "picky2", max_attempts: 1 }] };
  const jobs = [await env.api("/v1/jobs", spec), await env.api("/v1/jobs", spec)];
  for (const j of jobs) await until(`job ${j.id} to block`, async () => (await env.api(`/v1/jobs/${j.id}`)).state === "blocked");
  const page = await env.page("#/jobs?state=blocked&label=bulk:retry");
  for (const j of jobs) await page.check(`tr[data-job="${j.id}"] input[type=checkbox]`);
  await page.click('button[data-bulk="retry"]');
  await page.fill("#confirm-by", "console-test");
  await page.click("#confirm-ok");
  for (const j of jobs) await until(`job ${j.id} to succeed`, async () => (await env.api(`/v1/jobs/${j.id}`)).state === "succeeded");
  for (const j of jobs) {
    const events = (await env.api(`/v1/jobs/${j.id}/events`)).events;
    assert.ok(events.some((e) => e.kind === "job_resumed" && e.detail?.by === "console-test"), "each resume records who did it");
  }
  assert.deepEqual(env.pageErrors || [], []);
});

test("the overview lists the alerts raised recently", async () => {
  // The held jobs above raised `job_blocked` alerts; the Overview reads them from /v1/alerts
  // (no webhook is set, so they are shown as logged).
  const page = await env.page("#/overview");
  const row = await page.waitForSelector('tr[data-alert="job_blocked"]');
  assert.match(await row.textContent(), /is blocked/);
  assert.match(await row.textContent(), /logged/);
  const listed = (await env.api("/v1/alerts")).alerts.filter((a) => a.kind === "job_blocked").length;
  assert.ok(listed >= 3, `three jobs blocked above, ${listed} alerts listed`);
  assert.deepEqual(env.pageErrors || [], []);
});

test("the jobs list filters on the server and pages through the matches", async () => {
  // Three jobs on `filt-b`, then 120 newer ones on `filt-a`: the agent filter must find the
  // three (they are not among the newest 100), an id prefix must find one job, and paging must
  // walk the 120 in pages of 100 and 20.
  const b = [];
  for (let i = 0; i < 3; i++) b.push(await env.api("/v1/jobs", { steps: [{ name: "s", agent: "filt-b" }] }));
  await env.api("/v1/jobs:batch", { jobs: Array.from({ length: 120 }, () => ({ steps: [{ name: "s", agent: "filt-a" }] })) });
  const page = await env.page("#/jobs?agent=filt-b");
  await until("three rows", async () => (await page.locator("tr[data-job]").count()) === 3);
  for (const j of b) assert.equal(await page.locator(`tr[data-job="${j.id}"]`).count(), 1);
  await page.fill('input[name="q"]', b[1].id.slice(0, 36));
  await until("one row", async () => (await page.locator("tr[data-job]").count()) === 1);
  assert.equal(await page.locator(`tr[data-job="${b[1].id}"]`).count(), 1);
  await page.goto(env.url + "/#/jobs?agent=filt-a");
  await until("a full page", async () => (await page.locator("tr[data-job]").count()) === 100);
  await page.click("text=Older →");
  await until("the last 20", async () => (await page.locator("tr[data-job]").count()) === 20);
  assert.match(await page.textContent("[data-info]"), /page 2 · 20 job/);
  assert.deepEqual(env.pageErrors || [], []);
});

test("a failed job is rerun from its failure, and a step's progress shows on its row", async () => {
  // `gate` fails until a file exists, after telling its progress; `accounts` succeeds. The rerun
  // from failure must run only `gate` again: the new job's `a` keeps its result with one attempt
  // of the old job, and the pages link the two jobs. Progress travels with the next heartbeat
  // (every third of `timeout`), so the script outlives one; the timeout leaves a loaded machine
  // seconds of slack (at 600 ms, one late heartbeat under load expired the rerun's only attempt).
  const open = join(env.dir, "gate-open");
  env.agent("gate", env.script("gate", `echo 'overseer:progress {"pct":50}' >&2; sleep 2\nif [ ! -f ${open} ]; then echo "gate closed" >&2; exit 1; fi\necho 1`));
  const job = await env.api("/v1/jobs", { steps: [
    { name: "a", agent: "accounts" },
    { name: "gate", agent: "gate", depends_on: ["a"], max_attempts: 1, timeout: "3s" }] });
  await until("the job to fail", async () => (await env.api(`/v1/jobs/${job.id}`)).state === "failed", 30000);
  const page = await env.page(`#/job/${job.id}`);
  await page.waitForSelector("h1 .badge.s-failed");
  assert.match(await page.textContent('[data-progress="gate"]'), /"pct":50/);
  writeFileSync(open, "");
  await page.click('button[data-rerun="failed"]');
  await page.fill("#confirm-by", "console-test");
  await page.fill("#confirm-reason", "gate fixed");
  await page.click("#confirm-ok");
  await page.waitForFunction((old) => location.hash.startsWith("#/job/") && !location.hash.endsWith(old), job.id);
  await page.waitForSelector("h1 .badge.s-succeeded", { timeout: 30000 });
  assert.match(await page.textContent("[data-rerun-links]"), new RegExp(`Rerun of ${job.id}`));
  const rerun = await env.api(`/v1/jobs/${(await env.api(`/v1/jobs/${job.id}`)).rerun_by}`);
  assert.equal(rerun.rerun_of, job.id);
  assert.equal(rerun.steps[0].attempt, 0, "the kept step was not leased again");
  assert.equal(rerun.steps[0].state, "succeeded");
  await page.goto(env.url + `/#/job/${job.id}`);
  await page.waitForSelector("[data-rerun-links]");
  assert.equal(await page.locator("button[data-rerun]").count(), 0, "a job is rerun once");
  assert.deepEqual(env.pageErrors || [], []);
});
