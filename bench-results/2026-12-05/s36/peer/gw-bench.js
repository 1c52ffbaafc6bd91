// gw-bench.js: graphile-worker 0.18 on the local PostgreSQL, measured as `overseer bench` measures
// `submit_batch` and `drain`: N no-op jobs added in batches of 1,000 (16 in parallel), then one
// worker process with a local queue drains them; drain = first handler start -> no job left in
// the table (completions committed). Env: DATABASE_URL, N (40000), C (concurrency, 24),
// LQ (local queue size, 500), BD (completeJobBatchDelay ms, -1 = off).
const { run, makeWorkerUtils, Logger } = require("graphile-worker");
// Silent, as Overseer's bench logs nothing per job.
const logger = new Logger(() => () => {});
const { Client } = require("pg");
const N = +(process.env.N || 40000), C = +(process.env.C || 24);
const LQ = +(process.env.LQ || 500), BD = +(process.env.BD ?? -1);
const cs = process.env.DATABASE_URL;
const secs = (a, b) => Number(b - a) / 1e9;

(async () => {
  const utils = await makeWorkerUtils({ connectionString: cs, logger });
  await utils.migrate();
  const t0 = process.hrtime.bigint();
  let next = 0;
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (next < N) {
      const start = next; next += 1000;
      const specs = [];
      for (let i = start; i < Math.min(N, start + 1000); i++) specs.push({ identifier: "noop", payload: { i } });
      await utils.addJobs(specs);
    }
  }));
  const t1 = process.hrtime.bigint();
  let first = null, done = 0, resolve;
  const handled = new Promise((r) => (resolve = r));
  const runner = await run({
    connectionString: cs, concurrency: C, noHandleSignals: true, pollInterval: 1000, logger,
    taskList: { noop: async () => { if (first === null) first = process.hrtime.bigint(); if (++done === N) resolve(); } },
    preset: { worker: { localQueue: { size: LQ }, completeJobBatchDelay: BD, maxPoolSize: C + 2 } },
  });
  await handled;
  const pg = new Client({ connectionString: cs }); await pg.connect();
  for (;;) {
    const r = await pg.query("select count(*)::int as n from graphile_worker._private_jobs");
    if (r.rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 2));
  }
  const t2 = process.hrtime.bigint();
  await pg.end(); await runner.stop(); await utils.release();
  console.log(JSON.stringify({ peer: "graphile-worker 0.18.0", N, C, LQ, BD,
    submit_batch_per_s: Math.round(N / secs(t0, t1)), drain_per_s: Math.round(N / secs(first, t2)) }));
})().catch((e) => { console.error(e); process.exit(1); });
