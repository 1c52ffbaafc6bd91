// Shared by the tests: a real `overseer server` process on a free loopback port with a temp
// SQLite store, and a fetch that records what the SDK sends.

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface RunningServer {
  url: string;
  stop(): Promise<void>;
}

const PORT_SPAN = 10_000;
let nextPort = 0;

/** The lowest port of the kernel's ephemeral range (`ip_local_port_range`). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
    return Number.isInteger(low) ? low : 32_768;
  } catch {
    return 32_768;
  }
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

/**
 * A free loopback port from below the ephemeral range. A port the kernel handed out for
 * `listen(0)` and that was then closed can be handed out again at once, to any outgoing
 * connection, before the server started on it binds it; ports below the ephemeral range are
 * never handed out that way. The pid spreads concurrent test processes over the span.
 */
export async function freePort(): Promise<number> {
  const below = ephemeralLow() - PORT_SPAN;
  if (below < 1024) throw new Error(`the ephemeral range starts too low to pick ports below it`);
  const start = process.pid * 7_919;
  for (let i = 0; i < PORT_SPAN; i++) {
    const port = below + ((start + nextPort++) % PORT_SPAN);
    if (await bindable(port)) return port;
  }
  throw new Error(`no free port in ${below}..${below + PORT_SPAN}`);
}

/** Starts the binary named by OVERSEER_BIN and waits until `/readyz` answers. */
export async function startServer(port?: number): Promise<RunningServer> {
  const bin = process.env.OVERSEER_BIN;
  if (!bin) throw new Error("OVERSEER_BIN must name the overseer binary");
  const dir = mkdtempSync(join(tmpdir(), "overseer-ts-"));
  port ??= await freePort();
  const url = `http://127.0.0.1:${port}`;
  const child: ChildProcess = spawn(
    bin,
    ["server", "--db", `sqlite://${join(dir, "o.db")}`, "--listen", `127.0.0.1:${port}`, "--sweep-interval", "100ms"],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  child.stderr!.on("data", (d) => (log += d));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const stop = async () => {
    child.kill("SIGKILL");
    await exited;
    rmSync(dir, { recursive: true, force: true });
  };
  for (let i = 0; i < 200; i++) {
    if (child.exitCode !== null) throw new Error(`server exited: ${log}`);
    try {
      if ((await fetch(`${url}/readyz`)).ok) return { url, stop };
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop();
  throw new Error(`server did not become ready: ${log}`);
}

export interface Recorded {
  method: string;
  path: string;
  body: any;
  headers: Record<string, string>;
}

/** A fetch that records each request; `refuse` may make one fail as if the network did. */
export function recordingFetch(refuse: (r: Recorded) => boolean = () => false) {
  const requests: Recorded[] = [];
  const f: typeof fetch = async (input, init) => {
    const url = new URL(String(input));
    const body = typeof init?.body === "string" ? JSON.parse(init.body) : undefined;
    const rec = {
      method: init?.method ?? "GET", path: url.pathname, body,
      headers: { ...(init?.headers as Record<string, string>) },
    };
    if (refuse(rec)) throw new TypeError("fetch failed (refused by the test)");
    requests.push(rec);
    return fetch(input, init);
  };
  return { fetch: f, requests };
}

/** Resolves once `check` returns a value other than undefined, polling every 20 ms. */
export async function until<T>(what: string, check: () => T | undefined | Promise<T | undefined>, ms = 20_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Lease ids named in reports: own complete/fail calls and batch entries. */
export function reportedLeases(requests: Recorded[]): string[] {
  const ids: string[] = [];
  for (const r of requests) {
    const m = /^\/v1\/leases\/([^/]+)\/(complete|fail)$/.exec(r.path);
    if (m) ids.push(decodeURIComponent(m[1]!));
    if (r.path === "/v1/leases:report") for (const x of r.body.reports) ids.push(x.lease_id);
  }
  return ids;
}

/** A promise with its resolve function outside. */
export function deferred<T = void>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
