// The console shell: API calls with the bearer token, the hash router, live updates from
// /v1/events/stream, and keyboard navigation. Views live in views.js.
import { routes } from "./views.js";

const TOKEN_KEY = "overseer.token";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

function authHeaders() {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: `Bearer ${t}` } : {};
}

// Asks for a token (kept in sessionStorage, never in a URL) and resolves once one is given.
let tokenPrompt = null;
function askToken() {
  if (tokenPrompt) return tokenPrompt;
  const dlg = document.getElementById("token-dialog");
  tokenPrompt = new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      const v = document.getElementById("token-input").value.trim();
      if (v) sessionStorage.setItem(TOKEN_KEY, v);
      tokenPrompt = null;
      resolve();
    }, { once: true });
    dlg.showModal();
  });
  return tokenPrompt;
}

export async function api(path, { method = "GET", body, raw = false } = {}) {
  for (let tries = 0; ; tries++) {
    const headers = { Accept: "application/json", ...authHeaders() };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : (typeof body === "string" ? body : JSON.stringify(body)) });
    if (res.status === 401 && tries < 3) { await askToken(); continue; }
    if (raw) return res;
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = text; }
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }
}

// Tiny element builder: h("div.card", {onclick}, child, "text").
export function h(sel, attrs, ...kids) {
  const [tag, ...classes] = sel.split(".");
  const el = document.createElement(tag || "div");
  if (classes.length) el.className = classes.join(" ");
  if (attrs != null && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) { kids.unshift(attrs); attrs = null; }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "html") el.innerHTML = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat(Infinity)) if (k != null && k !== false) el.append(k instanceof Node ? k : String(k));
  return el;
}

export const badge = (state) => h("span.badge.s-" + state, state);
export function ago(ts) {
  if (!ts) return "—";
  const s = Math.round((Date.now() - Date.parse(ts)) / 1000);
  const f = (n, u) => `${n} ${u}`;
  const abs = Math.abs(s);
  const t = abs < 90 ? f(abs, "s") : abs < 5400 ? f(Math.round(abs / 60), "min") : abs < 129600 ? f(Math.round(abs / 3600), "h") : f(Math.round(abs / 86400), "d");
  return s >= 0 ? `${t} ago` : `in ${t}`;
}
export const fmtTime = (ts) => (ts ? new Date(ts).toLocaleString() : "—");

export function toast(msg) {
  const el = h("div.toast", { role: "status" }, msg);
  document.body.append(el);
  setTimeout(() => el.remove(), 3500);
}

// Confirmation dialog with `by`/`reason`; resolves to {by, reason} or null.
export function confirmAction(title, text) {
  const dlg = document.getElementById("confirm-dialog");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-by").value = localStorage.getItem("overseer.by") || "";
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => {
      if (dlg.returnValue !== "ok") return resolve(null);
      const by = document.getElementById("confirm-by").value.trim();
      if (by) localStorage.setItem("overseer.by", by);
      resolve({ by: by || undefined, reason: document.getElementById("confirm-reason").value.trim() || undefined });
    }, { once: true });
    dlg.returnValue = "";
    dlg.showModal();
  });
}

// ---- router ----
let current = null; // { refresh(changes) }
async function route() {
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [name, ...rest] = hash.split("?")[0].split("/");
  for (const a of document.querySelectorAll("#nav a")) {
    const here = a.getAttribute("href") === "#/" + (name === "job" ? "jobs" : name);
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const view = routes[name] || routes.overview;
  const main = document.getElementById("main");
  const root = h("div");
  try {
    current = await view(root, rest.map(decodeURIComponent));
    main.replaceChildren(root);
  } catch (e) {
    current = null;
    main.replaceChildren(h("div.reason.error", `Could not load: ${e.message}`));
  }
}

// ---- live updates: fetch-based SSE so the Authorization header can be sent ----
let pending = [];
let timer = null;
function changed(change) {
  pending.push(change);
  if (timer) return;
  // Debounced: a burst of transitions costs one refetch.
  timer = setTimeout(() => {
    const batch = pending; pending = []; timer = null;
    current?.refresh?.(batch);
  }, 400);
}

async function live() {
  const ind = document.getElementById("live");
  for (let delay = 1000; ; delay = Math.min(delay * 2, 30000)) {
    try {
      const res = await api("/v1/events/stream", { raw: true });
      if (!res.ok) throw new Error(`HTTP ${res.status}`);
      ind.textContent = "● live"; ind.className = "live on"; delay = 1000;
      await readEvents(res.body, (ev, data) => {
        if (ev === "change") changed(JSON.parse(data));
        if (ev === "resync") changed({ resync: true });
      });
    } catch { /* reconnect below */ }
    ind.textContent = "○ reconnecting"; ind.className = "live";
    await new Promise((r) => setTimeout(r, delay));
    changed({ resync: true });
  }
}

async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i); buf = buf.slice(i + 2);
      let ev = "message", data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) ev = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(ev, data.join("\n"));
    }
  }
}

// ---- keyboard: `/` focuses search, j/k move in lists, Enter opens ----
document.addEventListener("keydown", (e) => {
  const typing = /INPUT|TEXTAREA|SELECT/.test(document.activeElement?.tagName);
  if (e.key === "/" && !typing) {
    const q = document.querySelector("[data-search]");
    if (q) { e.preventDefault(); q.focus(); }
    return;
  }
  if (typing || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key !== "j" && e.key !== "k" && e.key !== "Enter") return;
  const rows = [...document.querySelectorAll("tr[data-href]")];
  if (!rows.length) return;
  let i = rows.findIndex((r) => r.classList.contains("sel"));
  if (e.key === "Enter") { if (i >= 0) location.hash = rows[i].dataset.href; return; }
  rows[i]?.classList.remove("sel");
  i = e.key === "j" ? Math.min(i + 1, rows.length - 1) : Math.max(i - 1, 0);
  rows[i].classList.add("sel");
  rows[i].scrollIntoView({ block: "nearest" });
});

window.addEventListener("hashchange", route);
route();
live();
