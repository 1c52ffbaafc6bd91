import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, before, test } from "node:test";

import { Client, Worker } from "../src/index.js";
import { deferred, startServer, type RunningServer } from "./helpers.js";

let server: RunningServer;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server.stop();
});

// Proves a crashed worker loses nothing: a child process running the step is killed with
// SIGKILL mid-attempt; once the step's 1 s timeout passes the server leases it again (attempt 2)
// to another worker in this process, which finishes it.
test("a step of a SIGKILLed worker is re-leased and finished by another", async () => {
  const client = new Client({ server: server.url });
  const id = (await client.submit({ steps: [{ name: "s", agent: "victim-ts", timeout: "1s", backoff: { initial: "50ms", max: "50ms" } }] })).id;
  const child = spawn(process.execPath, [new URL("./child-worker.js", import.meta.url).pathname, server.url], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.once("exit", (_code, sig) => resolve(sig)));
  const started = deferred<void>();
  child.stdout!.on("data", (d) => String(d).includes("started 1") && started.resolve());
  await started.promise;
  child.kill("SIGKILL");
  assert.equal(await exited, "SIGKILL");

  const rescuer = new Worker({ server: server.url, workerId: "rescuer" }).handle("victim-ts", (c) => ({ by: "rescuer", attempt: c.attempt }));
  const running = rescuer.run();
  try {
    const job = await client.wait(id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded", JSON.stringify(job));
    assert.deepEqual(job.steps[0]!.result, { by: "rescuer", attempt: 2 });
    const leased = (await client.events(id)).filter((e) => e.kind === "step_leased");
    assert.deepEqual(leased.map((e) => (e.detail as any).worker), ["victim", "rescuer"]);
  } finally {
    await rescuer.stop();
    await running;
  }
});
