// Measures the console's first load against a store of N jobs (default 100,000), submitted with
// POST /v1/jobs:batch in batches of 1000: bytes transferred, first contentful paint, and the
// time until the Overview and Jobs pages show their data. Not part of CI (it takes minutes).
//   OVERSEER_BIN=target/release/overseer node console-tests/measure.js [N]
import { Env } from "./harness.js";

const N = Number(process.argv[2] || 100000);
const env = await Env.start();
try {
  const t0 = Date.now();
  for (let i = 0; i < N; i += 1000) {
    const jobs = Array.from({ length: Math.min(1000, N - i) }, (_, k) => ({
      labels: { batch: String(i / 1000) }, idempotency_key: `m-${i + k}`,
      steps: [{ name: "a", agent: "measure" }] }));
    await env.api("/v1/jobs:batch", { jobs });
  }
  console.log(`submitted ${N} jobs in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  // Let the store finish what the burst left behind (the WAL checkpoint) before timing pages.
  await new Promise((r) => setTimeout(r, 5000));
  // Each page three times (a fresh browser context each: nothing cached); the median is what
  // BENCHMARKS.md reports.
  for (const [hash, ready] of [["#/overview", ".grid .card"], ["#/overview", "#main .panel table"], ["#/jobs", "tr[data-job]"]])
  for (let run = 1; run <= 3; run++) {
    const ctx = await env.browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await ctx.newPage();
    const cdp = await ctx.newCDPSession(page);
    await cdp.send("Network.enable");
    let bytes = 0, requests = 0;
    cdp.on("Network.loadingFinished", (e) => { bytes += e.encodedDataLength; requests++; });
    const start = Date.now();
    await page.goto(env.url + "/" + hash);
    await page.waitForSelector(ready, { timeout: 120000 });
    const data = Date.now() - start;
    const fcp = await page.evaluate(() => performance.getEntriesByName("first-contentful-paint")[0]?.startTime);
    const assets = await page.evaluate(() => performance.getEntriesByType("resource").filter((r) => r.name.includes("/console/")).reduce((s, r) => s + r.transferSize, 0) + performance.getEntriesByType("navigation")[0].transferSize);
    // How long the API calls themselves took, as the browser saw them (server time + transfer).
    const apiMs = await page.evaluate(() => Object.fromEntries(performance.getEntriesByType("resource")
      .filter((r) => /\/(v1|readyz)/.test(r.name) && !r.name.includes("/stream"))
      .map((r) => [new URL(r.name).pathname, Math.round(r.responseEnd - r.startTime)])));
    const load = (await import("node:os")).loadavg()[0].toFixed(1);
    console.log(JSON.stringify({ page: hash, ready, run, jobs: N, load, api_ms: apiMs, requests, bytes_total: bytes, bytes_shell: assets, first_contentful_paint_ms: Math.round(fcp), data_rendered_ms: data }));
    await ctx.close();
  }
} finally {
  await env.stop();
}
