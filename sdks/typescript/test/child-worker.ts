// A worker process for the SIGKILL test: runs steps of agent `victim-ts` by printing
// "started <attempt>" and then never finishing, until the test kills the process.
import { Worker } from "../src/index.js";

const worker = new Worker({ server: process.argv[2]!, workerId: "victim" });
worker.handle("victim-ts", (c) => {
  process.stdout.write(`started ${c.attempt}\n`);
  return new Promise(() => {});
});
await worker.run({ signals: true });
