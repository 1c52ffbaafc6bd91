import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, Worker } from "../src/index.js";
import { freePort, startServer, until } from "./helpers.js";

// Proves a worker started while its server is down keeps retrying (with backoff) and runs
// work once the server comes up on that address.
test("worker reconnects once the server is up", async () => {
  const port = await freePort();
  const errors: string[] = [];
  const worker = new Worker({ server: `http://127.0.0.1:${port}`, log: (level, m) => level === "warn" && errors.push(m) })
    .handle("late-ts", () => "ran");
  const running = worker.run();
  // The worker has failed at least once before the server exists.
  await until("a failed lease request", () => (errors.length > 0 ? true : undefined));
  const server = await startServer(port);
  try {
    const client = new Client({ server: server.url });
    const job = await client.wait((await client.submit({ steps: [{ name: "s", agent: "late-ts" }] })).id, { timeoutMs: 20_000 });
    assert.equal(job.state, "succeeded");
    assert.equal(job.steps[0]!.result, "ran");
  } finally {
    await worker.stop();
    await running;
    await server.stop();
  }
});
