// Starts what the browser tests need: a real `overseer server` on a temp SQLite file, real
// command agents, and Debian's Chromium through playwright-core. Everything on 127.0.0.1.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync, chmodSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const BIN = process.env.OVERSEER_BIN || join(ROOT, "target/debug/overseer");

const PORT_SPAN = 10000;
let nextPort = 0;

// The lowest port of the kernel's ephemeral range (`ip_local_port_range`).
function ephemeralLow() {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) ? low : 32768;
  } catch {
    return 32768;
  }
}

function bindable(port) {
  return new Promise((res) => {
    const s = createServer();
    s.once("error", () => res(false));
    s.listen(port, "127.0.0.1", () => s.close(() => res(true)));
  });
}

// A free loopback port from below the ephemeral range. A port the kernel handed out for
// `listen(0)` and that was then closed can be handed out again at once, to any outgoing
// connection, before the server started on it binds it; ports below the ephemeral range are
// never handed out that way. The pid spreads concurrent test processes over the span.
async function freePort() {
  const below = ephemeralLow() - PORT_SPAN;
  if (below < 1024) throw new Error("the ephemeral range starts too low to pick ports below it");
  const start = process.pid * 7919;
  for (let i = 0; i < PORT_SPAN; i++) {
    const port = below + ((start + nextPort++) % PORT_SPAN);
    if (await bindable(port)) return port;
  }
  throw new Error(`no free port in ${below}..${below + PORT_SPAN}`);
}

// Polls `fn` until it returns a truthy value; fails after `ms` with `what`.
export async function until(what, fn, ms = 20000) {
  const end = Date.now() + ms;
  for (;;) {
    try { const v = await fn(); if (v) return v; } catch { /* not yet */ }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export class Env {
  static async start() {
    const env = new Env();
    env.dir = mkdtempSync(join(tmpdir(), "overseer-console-"));
    env.port = await freePort();
    env.url = `http://127.0.0.1:${env.port}`;
    env.procs = [];
    env.spawn(["server", "--db", `sqlite://${join(env.dir, "o.db")}`, "--listen", `127.0.0.1:${env.port}`, "--sweep-interval", "200ms"]);
    await until("the server to answer /healthz", async () => (await fetch(env.url + "/healthz")).ok);
    env.browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox", "--disable-dev-shm-usage"] });
    return env;
  }

  spawn(args, extraEnv = {}) {
    const p = spawn(BIN, args, { cwd: ROOT, env: { ...process.env, EXAMPLE_STEP_SECONDS: "0.3", ...extraEnv }, stdio: ["ignore", "ignore", "pipe"] });
    p.stderr.on("data", (d) => { if (process.env.CONSOLE_TEST_VERBOSE) process.stderr.write(d); });
    this.procs.push(p);
    return p;
  }

  agent(name, script) {
    return this.spawn(["agent", "--agent", name, "--server", this.url, "--", script]);
  }

  // A throw-away agent script: `body` is shell run with the lease on stdin.
  script(name, body) {
    const path = join(this.dir, `${name}.sh`);
    writeFileSync(path, `#!/bin/sh\ncat >/dev/null\n${body}\n`);
    chmodSync(path, 0o755);
    return path;
  }

  async api(path, body, method = body === undefined ? "GET" : "POST") {
    const res = await fetch(this.url + path, { method, headers: { "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  }

  async page(hash = "#/overview") {
    const ctx = await this.browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await ctx.newPage();
    page.on("pageerror", (e) => { this.pageErrors = (this.pageErrors || []).concat(String(e)); });
    await page.goto(this.url + "/" + hash);
    return page;
  }

  async stop() {
    await this.browser?.close();
    for (const p of this.procs) p.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}
