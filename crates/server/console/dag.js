// SVG drawings for a job: the step DAG (layered by dependency depth, siblings side by side)
// and a per-step attempt timeline built from the job's events.
const NS = "http://www.w3.org/2000/svg";
const COLORS = {
  waiting: "#8a94a3", ready: "#0e9aa7", running: "#2f6fde", succeeded: "#1f8a4c", failed: "#c8352e",
  skipped: "#6b7280", cancelled: "#6b7280", compensating: "#8e44ad", compensated: "#5f8f6f",
};

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const k of kids) el.append(k);
  return el;
}

// Depth of each step = 1 + the deepest of its dependencies (roots are 0).
export function layers(steps) {
  const byName = new Map(steps.map((s) => [s.name, s]));
  const depth = new Map();
  const visit = (s) => {
    if (depth.has(s.name)) return depth.get(s.name);
    depth.set(s.name, 0); // cycles are refused by the server; this only guards
    const d = Math.max(-1, ...s.depends_on.map((n) => (byName.has(n) ? visit(byName.get(n)) : -1))) + 1;
    depth.set(s.name, d);
    return d;
  };
  steps.forEach(visit);
  const out = [];
  for (const s of steps) (out[depth.get(s.name)] ||= []).push(s);
  return out;
}

export function drawDag(steps, onPick) {
  const rows = layers(steps);
  const W = 170, H = 44, GX = 30, GY = 46;
  const widest = Math.max(...rows.map((r) => r.length));
  const width = widest * (W + GX) + GX, height = rows.length * (H + GY);
  const pos = new Map();
  rows.forEach((row, y) => {
    const offset = (width - row.length * (W + GX) + GX) / 2;
    row.forEach((s, x) => pos.set(s.name, { x: offset + x * (W + GX), y: GY / 2 + y * (H + GY), layer: y }));
  });
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "Step graph", style: `height:${height}px` });
  for (const s of steps) for (const d of s.depends_on) {
    const a = pos.get(d), b = pos.get(s.name);
    if (!a || !b) continue;
    const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y, my = (y1 + y2) / 2;
    root.append(svg("path", { class: "edge", d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}` }));
  }
  for (const s of steps) {
    const p = pos.get(s.name);
    const label = s.name.length > 22 ? s.name.slice(0, 21) + "…" : s.name;
    const g = svg("g", { class: "node", "data-step": s.name, "data-layer": p.layer, "data-state": s.state, tabindex: "0", transform: `translate(${p.x},${p.y})`, style: "cursor:pointer" },
      svg("title", {}, `${s.name} — ${s.state} (agent ${s.agent})`),
      svg("rect", { width: W, height: H, rx: 8, fill: COLORS[s.state] || "#888" }),
      svg("text", { x: 10, y: 18, "font-weight": 600 }, label),
      svg("text", { x: 10, y: 34, opacity: 0.9 }, `${s.state} · ${s.agent}${s.attempt ? " · #" + s.attempt : ""}`));
    g.addEventListener("click", () => onPick?.(s.name));
    g.addEventListener("keydown", (e) => { if (e.key === "Enter") onPick?.(s.name); });
    root.append(g);
  }
  return root;
}

// Attempts from events: step_leased opens a bar, the next outcome for that step closes it.
export function attempts(events, now = Date.now()) {
  const open = new Map(), bars = [];
  for (const e of events) {
    if (!e.step) continue;
    const key = e.step;
    const undo = /compensat|undo/.test(e.kind);
    if (/leased/.test(e.kind)) {
      open.set(key, { step: e.step, attempt: e.attempt, start: Date.parse(e.at), worker: e.detail?.worker, undo });
    } else if (open.has(key) && /succeeded|failed|expired|cancelled|retry|compensated|completed/.test(e.kind)) {
      const b = open.get(key); open.delete(key);
      bars.push({ ...b, end: Date.parse(e.at), outcome: e.kind });
    }
  }
  for (const b of open.values()) bars.push({ ...b, end: now, outcome: "running" });
  return bars;
}

export function drawTimeline(steps, events) {
  const bars = attempts(events);
  if (!bars.length) return null;
  const t0 = Math.min(...bars.map((b) => b.start)), t1 = Math.max(...bars.map((b) => b.end), t0 + 1000);
  const names = steps.map((s) => s.name);
  const rowsOf = [];
  for (const n of names) { rowsOf.push({ name: n, undo: false }); if (bars.some((b) => b.step === n && b.undo)) rowsOf.push({ name: n, undo: true }); }
  const L = 190, W = 760, RH = 24;
  const root = svg("svg", { viewBox: `0 0 ${L + W + 10} ${rowsOf.length * RH + 24}`, class: "gantt", role: "img", "aria-label": "Attempt timeline" });
  const x = (t) => L + ((t - t0) / (t1 - t0)) * W;
  rowsOf.forEach((r, i) => {
    root.append(svg("text", { x: 4, y: i * RH + 16 }, r.undo ? `↶ undo ${r.name}` : r.name));
    for (const b of bars.filter((b) => b.step === r.name && b.undo === r.undo)) {
      const bad = /failed|expired|retry/.test(b.outcome);
      root.append(svg("rect", { x: x(b.start), y: i * RH + 4, width: Math.max(3, x(b.end) - x(b.start)), height: RH - 8, rx: 3, class: r.undo ? "undo" : bad ? "bad" : "work" },
        svg("title", {}, `${r.undo ? "undo " : ""}attempt ${b.attempt ?? "?"} by ${b.worker ?? "?"}: ${new Date(b.start).toLocaleTimeString()} → ${b.outcome} after ${((b.end - b.start) / 1000).toFixed(2)} s`)));
    }
  });
  root.append(svg("text", { x: L, y: rowsOf.length * RH + 18 }, new Date(t0).toLocaleTimeString()));
  root.append(svg("text", { x: L + W - 60, y: rowsOf.length * RH + 18 }, `+${((t1 - t0) / 1000).toFixed(1)} s`));
  return root;
}
