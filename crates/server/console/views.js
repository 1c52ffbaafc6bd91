// The console's pages. Each view renders into `root` and returns { refresh(changes) }, called
// (debounced) when the live stream reports transitions.
import { api, h, badge, ago, fmtTime, toast, confirmAction } from "./app.js";
import { drawDag, drawTimeline } from "./dag.js";

const STATES = ["pending", "running", "compensating", "blocked", "succeeded", "failed", "cancelled"];
const enc = encodeURIComponent;
// replaceChildren without the "undefined"/"null" text nodes that optional parts would leave.
const fill = (el, ...kids) => el.replaceChildren(...kids.flat().filter((k) => k != null && k !== false));

function jsonBlock(title, value) {
  if (value === undefined || value === null) return null;
  const text = JSON.stringify(value, null, 2);
  return h("div", h("div.actions", h("strong", title),
    h("button", { type: "button", onclick: () => navigator.clipboard?.writeText(text).then(() => toast("Copied")) }, "Copy")),
  h("pre.mono", text));
}

// ---------- Overview ----------
async function overview(root) {
  // The agents and alerts panels keep their last content while a redraw is in flight, and
  // reserve their height (CSS), so nothing jumps when their answers arrive.
  const agentsBox = h("div.panel", h("p.muted", "Loading agents…"));
  const alertsBox = h("div.panel", h("p.muted", "Loading alerts…"));
  const draw = async () => {
    // Counts first: /v1/stats is answered from indexes however many jobs are stored, so the
    // page shows its numbers without waiting for the slower per-agent counts, which are asked
    // for only then (on a busy server they would otherwise compete with the counts).
    const [ready, stats] = await Promise.all([api("/readyz").catch((e) => ({ status: e.message })), api("/v1/stats")]);
    const agentsP = api("/v1/agents"), alertsP = api("/v1/alerts?limit=20");
    const cards = stats.jobs.map(({ state, count }) => h("a.card", { href: `#/jobs?state=${state}`, "data-count": state, style: "text-decoration:none;color:inherit" },
      h("div", badge(state)), h("div.n", count.toLocaleString())));
    const pm = stats.per_minute;
    fill(root,
      h("h1", "Overview"),
      h("p.muted", `Node ${ready.node ?? "?"} · ${ready.leader ? "this node is the leader" : "not the leader (another node runs the supervisor)"} · store ${ready.status}`),
      h("div.grid", cards),
      h("div.two", h("div", h("h2", "Succeeded per minute, last hour"), chart(pm, "succeeded")),
        h("div", h("h2", "Failed and cancelled per minute"), chart(pm, "failed", "cancelled"))),
      h("h2", "Alerts raised recently"), alertsBox,
      h("h2", "Agents"), agentsBox);
    // Not awaited: the router shows the page as soon as the counts are drawn.
    agentsP.then((a) => agentsBox.replaceChildren(agentTable(a.agents, null)), (e) => agentsBox.replaceChildren(h("p.bad-text", e.message)));
    alertsP.then((a) => alertsBox.replaceChildren(alertTable(a)), (e) => alertsBox.replaceChildren(h("p.bad-text", e.message)));
  };
  await draw();
  // At most one draw every 2 s however busy the stream is.
  let last = Date.now(), queued = false;
  const refresh = () => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; last = Date.now(); draw(); }, Math.max(0, 2000 - (Date.now() - last)));
  };
  return { refresh };
}

function alertTable({ alerts, webhook }) {
  const note = webhook ? "Delivered to the alert webhook with retries; kept a week once delivered."
    : "No alert webhook is set on this node: alerts are logged and counted in /metrics, and listed here.";
  if (!alerts.length) return h("div", h("p", "No alert raised recently."), h("p.muted", note));
  const shown = { waiting: "waiting", delivered: webhook ? "delivered" : "logged", given_up: "given up" };
  return h("div", h("div.scroll", h("table", h("thead", h("tr", h("th", "When"), h("th", "Alert"), h("th", "Job"), h("th", "Message"), h("th", "Delivery"))),
    h("tbody", alerts.map((a) => h("tr", { "data-alert": a.kind },
      h("td", { title: a.created_at }, ago(a.created_at)), h("td", a.kind + (a.step ? ` · ${a.step}` : "")),
      h("td.mono", h("a", { href: `#/job/${a.job_id}` }, a.job_id.slice(0, 8) + "…")),
      h("td", a.message.slice(0, 160)),
      h("td", { title: a.last_error || "" }, shown[a.delivery] + (a.delivery === "waiting" && a.attempts ? ` (${a.attempts} tries)` : ""))))))),
  h("p.muted", note));
}

// Bars of `per_minute[i][field]` (plus `extra`, stacked as one bar), oldest first.
function chart(perMinute, field, extra) {
  const values = perMinute.map((m) => m[field] + (extra ? m[extra] : 0));
  const max = Math.max(1, ...values);
  const NS = "http://www.w3.org/2000/svg";
  const s = document.createElementNS(NS, "svg");
  s.setAttribute("viewBox", "0 0 600 90"); s.setAttribute("class", "chart"); s.setAttribute("preserveAspectRatio", "none");
  s.setAttribute("data-chart", field);
  values.forEach((n, i) => {
    const r = document.createElementNS(NS, "rect");
    const hgt = (n / max) * 80;
    Object.entries({ x: i * 10 + 1, y: 85 - hgt, width: 8, height: Math.max(hgt, n ? 2 : 0.5), class: field === "succeeded" ? "bar" : "bar bad" }).forEach(([k, v]) => r.setAttribute(k, v));
    const t = document.createElementNS(NS, "title");
    t.textContent = `${new Date(perMinute[i].minute).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}: ${n}`;
    r.append(t);
    s.append(r);
  });
  const total = values.reduce((a, b) => a + b, 0);
  return h("div.card", s, h("div.muted", `${total.toLocaleString()} in the hour · peak ${max}/min`));
}

// ---------- Jobs ----------
function hashQuery() {
  const q = location.hash.split("?")[1] || "";
  return Object.fromEntries(new URLSearchParams(q));
}

// A search that looks like the start of a job id goes to the server as `id_prefix`.
const idLike = (q) => /^[0-9a-f][0-9a-f-]{3,}$/i.test(q);

async function jobs(root) {
  const f = { state: "", label: "", agent: "", key: "", q: "", since: "", until: "", ...hashQuery() };
  let cursors = [null], page = 0, shown = [], selected = new Set();
  const input = (name, attrs = {}) => h("input", { name, value: f[name], ...attrs, oninput: (e) => { f[name] = e.target.value; schedule(); } });
  const stateSel = h("select", { name: "state", onchange: (e) => { f.state = e.target.value; reset(); } },
    h("option", { value: "" }, "any state"), STATES.map((s) => h("option", { value: s, selected: f.state === s }, s)));
  const table = h("div.scroll");
  const info = h("span.muted", { "data-info": "" });
  let t = null;
  const schedule = () => { clearTimeout(t); t = setTimeout(reset, 300); };
  const reset = () => { cursors = [null]; page = 0; load(); };
  // State, labels (comma-separated key:value), agent, created since/until and an id prefix are
  // the server's filters (GET /v1/jobs), so paging walks the matching jobs, not a page of all.
  const url = (cursor) => {
    const p = new URLSearchParams({ limit: "100" });
    if (f.state) p.set("state", f.state);
    for (const l of f.label.split(",").map((x) => x.trim()).filter((x) => x.includes(":"))) p.append("label", l);
    if (f.agent.trim()) p.set("agent", f.agent.trim());
    if (Number(f.since) > 0) p.set("since", new Date(Date.now() - Number(f.since) * 3600e3).toISOString());
    if (f.until && !Number.isNaN(Date.parse(f.until))) p.set("until", new Date(f.until).toISOString());
    if (idLike(f.q.trim())) p.set("id_prefix", f.q.trim().toLowerCase());
    if (cursor) p.set("cursor", cursor);
    return "/v1/jobs?" + p;
  };
  // The API has no ordering-key or idempotency-key filter: those two apply to the fetched page.
  const keep = (j) => (!f.key || j.ordering_key === f.key) &&
    (!f.q.trim() || idLike(f.q.trim()) || (j.idempotency_key || "").includes(f.q.trim()));
  async function load() {
    let r;
    try { r = await api(url(cursors[page])); }
    catch (e) { info.textContent = `${e.problem?.field ? e.problem.field + ": " : ""}${e.message}`; info.className = "bad-text"; return; }
    info.className = "muted";
    cursors[page + 1] = r.next_cursor;
    shown = r.jobs.filter(keep);
    const local = f.key || (f.q.trim() && !idLike(f.q.trim()));
    info.textContent = `page ${page + 1} · ${shown.length} job(s)` + (local ? ` (${r.jobs.length} fetched, then filtered by ordering key / idempotency key)` : "") + (r.next_cursor ? " · more →" : "");
    draw();
  }
  function draw() {
    const rows = shown.map((j) => h("tr", { "data-href": `#/job/${j.id}`, "data-job": j.id },
      h("td", h("input", { type: "checkbox", "aria-label": "select", checked: selected.has(j.id), onchange: (e) => { e.target.checked ? selected.add(j.id) : selected.delete(j.id); } })),
      h("td.mono", h("a", { href: `#/job/${j.id}` }, j.id.slice(0, 8) + "…" + j.id.slice(-4))),
      h("td", badge(j.state)),
      h("td", j.steps.map((s) => s.name).join(" → ").slice(0, 60)),
      h("td", Object.entries(j.labels).map(([k, v]) => `${k}=${v}`).join(", ")),
      h("td.mono", j.idempotency_key || ""),
      h("td", { title: j.created_at }, ago(j.created_at))));
    table.replaceChildren(h("table", h("thead", h("tr", h("th", ""), h("th", "Job"), h("th", "State"), h("th", "Steps"), h("th", "Labels"), h("th", "Idempotency key"), h("th", "Created"))), h("tbody", rows)));
  }
  const exportAs = (kind) => {
    const body = kind === "json" ? JSON.stringify(shown, null, 2)
      : ["id,state,created_at,idempotency_key,labels,steps"].concat(shown.map((j) => [j.id, j.state, j.created_at, j.idempotency_key || "", Object.entries(j.labels).map(([k, v]) => `${k}=${v}`).join(";"), j.steps.map((s) => s.name).join(";")].map((v) => `"${String(v).replace(/"/g, '""')}"`).join(","))).join("\n");
    const a = h("a", { href: URL.createObjectURL(new Blob([body], { type: kind === "json" ? "application/json" : "text/csv" })), download: `jobs.${kind}` });
    a.click();
  };
  const bulkCancel = async () => {
    if (!selected.size) return toast("Select jobs first");
    const ok = await confirmAction(`Cancel ${selected.size} jobs`, "Running steps are told to stop; succeeded steps with an undo are compensated.");
    if (!ok) return;
    let done = 0;
    for (const id of selected) { try { await api(`/v1/jobs/${id}/cancel`, { method: "POST", body: ok }); done++; } catch { /* finished already */ } }
    selected.clear(); toast(`Cancelled ${done}`); load();
  };
  // Retry = resume: every failed step (or failed undo) of each selected blocked job gets a
  // fresh budget. Jobs that are not blocked are left alone and counted.
  const bulkRetry = async () => {
    const blocked = shown.filter((j) => selected.has(j.id) && j.state === "blocked");
    if (!blocked.length) return toast("Select blocked jobs first");
    const others = selected.size - blocked.length;
    const ok = await confirmAction(`Retry ${blocked.length} blocked jobs`, "Every failed step and failed undo of each gets a fresh attempt budget." + (others ? ` ${others} selected job(s) are not blocked and are left alone.` : ""));
    if (!ok) return;
    let done = 0;
    for (const j of blocked) { try { await api(`/v1/jobs/${j.id}/resume`, { method: "POST", body: ok }); done++; } catch { /* unblocked meanwhile */ } }
    selected.clear(); toast(`Retried ${done}`); load();
  };
  fill(root, h("h1", "Jobs"),
    h("div.filters", h("label", "State", stateSel), h("label", "Labels (key:value, …)", input("label", { placeholder: "customer:acme" })),
      h("label", "Agent", input("agent")), h("label", "Ordering key", input("key")),
      h("label", "Created within (h)", input("since", { type: "number", min: 0, style: "width:7em" })),
      h("label", "Created before", input("until", { type: "datetime-local" })),
      h("label", "Id prefix or idempotency key (/)", input("q", { "data-search": true, placeholder: "press /" }))),
    h("div.actions", h("button", { type: "button", onclick: () => { if (page > 0) { page--; load(); } } }, "← Newer"),
      h("button", { type: "button", onclick: () => { if (cursors[page + 1]) { page++; load(); } } }, "Older →"), info,
      h("span", { style: "flex:1" }), h("button", { type: "button", "data-bulk": "retry", onclick: bulkRetry }, "Retry selected"),
      h("button", { type: "button", "data-bulk": "cancel", onclick: bulkCancel }, "Cancel selected"),
      h("button", { type: "button", onclick: () => exportAs("csv") }, "Export CSV"), h("button", { type: "button", onclick: () => exportAs("json") }, "Export JSON")),
    table);
  await load();
  return { refresh: () => (page === 0 ? load() : null) };
}

// ---------- Job detail ----------
async function job(root, [id]) {
  let pick = null;
  const draw = async () => {
    const [j, ev] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/jobs/${id}/events`)]);
    const stepBox = h("div");
    const showStep = (name) => { pick = name; stepBox.replaceChildren(stepDetail(j, j.steps.find((s) => s.name === name))); };
    fill(root, 
      h("h1", "Job ", h("span.mono", j.id), " ", badge(j.state)),
      h("p.muted", `created ${fmtTime(j.created_at)} · updated ${ago(j.updated_at)}` + (j.ordering_key ? ` · ordering key ${j.ordering_key}` : "") + ` · on_failure ${j.on_failure}` +
        (j.job_attempts ? ` · round ${j.round} of ${j.job_attempts}` : "") + (j.removable_at ? ` · removed ${ago(j.removable_at)}` : "")),
      (j.rerun_of || j.rerun_by) && h("p", { "data-rerun-links": "" }, j.rerun_of ? ["Rerun of ", h("a.mono", { href: `#/job/${j.rerun_of}` }, j.rerun_of), " "] : null,
        j.rerun_by ? ["Rerun as ", h("a.mono", { href: `#/job/${j.rerun_by}` }, j.rerun_by)] : null),
      j.waiting_reason && h("div.reason", { "data-reason": j.waiting_reason.code }, h("strong", "Waiting: "), j.waiting_reason.text),
      j.blocked_reason && h("div.reason.error", h("strong", "Blocked: "), j.blocked_reason),
      j.compensated?.length ? h("div.reason", { "data-compensated": "" }, h("strong", "Undone: "), j.compensated.join(", ")) : null,
      jobActions(j, draw),
      h("h2", "Steps"), h("div.dag", drawDag(j.steps, showStep)),
      h("div.scroll", stepTable(j, showStep)),
      stepBox,
      h("h2", "Attempts"), drawTimeline(j.steps, ev.events) || h("p.muted", "No attempt yet."),
      h("h2", "Labels and payloads"), jsonBlock("Labels", j.labels),
      h("h2", "History"), h("div.scroll", eventTable(ev.events)));
    if (pick) showStep(pick);
  };
  await draw();
  return { refresh: (changes) => (changes.some((c) => c.resync || !c.job || c.job === id) ? draw() : null) };
}

function stepTable(j, showStep) {
  return h("table", h("thead", h("tr", h("th", "Step"), h("th", "Agent"), h("th", "State"), h("th", "Attempt"), h("th", "Worker"), h("th", "Why not running / last error"), h("th", "Progress"))),
    h("tbody", j.steps.map((s) => h("tr", { "data-step-row": s.name },
      h("td", h("a", { href: "javascript:void 0", onclick: () => showStep(s.name) }, s.name)), h("td", s.agent), h("td", badge(s.state)),
      h("td", `${s.attempt}${s.max_attempts ? "/" + s.max_attempts : ""}`), h("td.mono", s.worker || ""),
      h("td", s.waiting_reason ? h("span", { "data-reason": s.waiting_reason.code }, s.waiting_reason.text) : s.last_error ? h("span.mono", s.last_error.slice(0, 160)) : ""),
      h("td.mono", { "data-progress": s.name }, s.progress != null ? JSON.stringify(s.progress).slice(0, 80) : "")))));
}

function stepDetail(j, s) {
  return h("div.card", h("h2", `Step ${s.name}`),
    h("div.actions", j.state === "blocked" && s.state === "failed" || s.comp_phase === "failed" ? [
      h("button.primary", { type: "button", onclick: () => act(j, `steps/${enc(s.name)}/retry`, `Retry ${s.name}`) }, "Retry step"),
      h("button", { type: "button", onclick: () => act(j, `steps/${enc(s.name)}/skip`, `Skip ${s.name}`) }, "Skip step")] : null),
    jsonBlock("Payload", s.payload), jsonBlock("Result", s.result), s.last_error && jsonBlock("Last error", s.last_error),
    s.progress != null && jsonBlock(`Progress (${ago(s.progress_at)})`, s.progress),
    jsonBlock("Compensate", s.compensate));
}

// An action on one job, after a confirmation whose by/reason go into the job's history.
// `body(ok)` builds the request body from them (default: just by/reason).
async function act(j, path, title, after, { method = "POST", body = (ok) => ok, text } = {}) {
  const ok = await confirmAction(title, text || `Job ${j.id}. This is recorded in the job's history with who and why.`);
  if (!ok) return;
  const url = path ? `/v1/jobs/${j.id}/${path}` : `/v1/jobs/${j.id}`;
  try { const res = await api(url, { method, body: body(ok) }); toast(`${title}: done`); after?.(res); }
  catch (e) { toast(`${title} failed: ${e.message}`); }
}

// A rerun is a new job with the same spec; from a failure, the steps that succeeded keep their
// results and do not run again. The console follows the new job.
const rerun = (j, fromFailed) => act(j, "rerun", fromFailed ? "Rerun from failure" : "Rerun", (res) => { location.hash = `#/job/${res.id}`; }, {
  body: (ok) => ({ ...ok, from_failed: fromFailed }),
  text: `Job ${j.id} ${j.state}. A new job runs its spec again` + (fromFailed ? ": the steps that succeeded keep their results and are not run again." : ", every step from the start.") + " Recorded in both jobs' history with who and why.",
});

// "Run now": a pending job's run_at moved to this moment (PATCH /v1/jobs/{id}). An unkeyed job
// starts at once; a keyed one still waits for the jobs ahead of it in its key.
const runNow = (j, redraw) => act(j, "", "Run now", redraw, {
  method: "PATCH",
  body: (ok) => ({ ...ok, run_at: new Date().toISOString() }),
  text: `Job ${j.id} is due ${j.run_at ? ago(j.run_at) : "when its ordering key frees"}. Start it now` +
    (j.ordering_key ? ` (it still waits for the jobs ahead of it in key ${j.ordering_key})` : "") + "? Recorded with who and why.",
});

function jobActions(j, redraw) {
  const out = [];
  if (j.state === "pending")
    out.push(h("button.primary", { type: "button", "data-run-now": "", onclick: () => runNow(j, redraw) }, "Run now"));
  if (!["succeeded", "failed", "cancelled"].includes(j.state))
    out.push(h("button.danger", { type: "button", onclick: () => act(j, "cancel", "Cancel job", redraw) }, "Cancel job"));
  if (["failed", "cancelled"].includes(j.state) && !j.rerun_by) {
    out.push(h("button.primary", { type: "button", "data-rerun": "failed", onclick: () => rerun(j, true) }, "Rerun from failure"),
      h("button", { type: "button", "data-rerun": "all", onclick: () => rerun(j, false) }, "Rerun all"));
  }
  if (["succeeded", "failed", "cancelled"].includes(j.state))
    out.push(h("button.danger", { type: "button", "data-delete": "", onclick: () => act(j, "", "Delete job", () => { location.hash = "#/jobs"; }, {
      method: "DELETE", body: () => undefined,
      text: `Job ${j.id} and its history are removed now` + (j.removable_at ? ` (its retention would remove it ${ago(j.removable_at)})` : "") + ". This cannot be undone.",
    }) }, "Delete"));
  if (j.state === "blocked") {
    out.push(h("button.primary", { type: "button", onclick: () => act(j, "resume", "Resume job", redraw) }, "Resume (retry all failed)"));
    for (const s of j.steps.filter((s) => s.state === "failed" || s.comp_phase === "failed"))
      out.push(h("button", { type: "button", "data-retry": s.name, onclick: () => act(j, `steps/${enc(s.name)}/retry`, `Retry ${s.name}`, redraw) }, `Retry ${s.name}`),
        h("button", { type: "button", onclick: () => act(j, `steps/${enc(s.name)}/skip`, `Skip ${s.name}`, redraw) }, `Skip ${s.name}`));
  }
  return h("div.actions", out);
}

function eventTable(events) {
  return h("table", h("thead", h("tr", h("th", "#"), h("th", "At"), h("th", "Event"), h("th", "Step"), h("th", "Attempt"), h("th", "Detail"))),
    h("tbody", events.slice().reverse().map((e) => h("tr", h("td", e.seq), h("td", { title: e.at }, new Date(e.at).toLocaleTimeString()), h("td", e.kind), h("td", e.step || ""), h("td", e.attempt ?? ""), h("td.mono", e.detail ? JSON.stringify(e.detail).slice(0, 200) : "")))));
}

// ---------- Failures ----------
// Same agent + same error text once numbers, ids and quoted values are masked.
export const shape = (text) => (text || "").replace(/[0-9a-f]{8}-[0-9a-f-]{27,}/gi, "<id>").replace(/\d+(\.\d+)?/g, "<n>").replace(/"[^"]*"|'[^']*'/g, "<s>").slice(0, 200);

async function failures(root) {
  const draw = async () => {
    const lists = await Promise.all(["blocked", "failed"].map((s) => api(`/v1/jobs?state=${s}&limit=500`)));
    const groups = new Map();
    for (const j of lists.flatMap((l) => l.jobs)) {
      const s = j.steps.find((s) => s.state === "failed" || s.comp_phase === "failed") || j.steps.find((s) => s.last_error);
      const key = `${s?.agent ?? "-"}\u0000${shape(s?.last_error || j.blocked_reason)}`;
      const g = groups.get(key) || { agent: s?.agent, shape: shape(s?.last_error || j.blocked_reason), jobs: [], sample: s?.last_error || j.blocked_reason, first: j.updated_at, last: j.updated_at };
      g.jobs.push(j);
      if (j.updated_at < g.first) g.first = j.updated_at;
      if (j.updated_at > g.last) g.last = j.updated_at;
      groups.set(key, g);
    }
    const rows = [...groups.values()].sort((a, b) => b.jobs.length - a.jobs.length).map((g) => {
      const blocked = g.jobs.filter((j) => j.state === "blocked");
      return h("tr", h("td", g.agent), h("td", h("strong", g.jobs.length)), h("td.mono", g.shape), h("td", ago(g.first)), h("td", ago(g.last)),
        h("td", h("a", { href: `#/job/${g.jobs[0].id}` }, "sample"), h("pre.mono", (g.sample || "").slice(0, 300))),
        h("td", blocked.length ? [h("button.primary", { type: "button", onclick: () => bulk(blocked, "resume", `Resume ${blocked.length} blocked jobs`) }, "Retry all"), " ",
          h("button", { type: "button", onclick: () => bulk(blocked, "cancel", `Cancel ${blocked.length} blocked jobs`) }, "Cancel all")] : h("span.muted", "finished")));
    });
    fill(root, h("h1", "Failures"), h("p.muted", "Blocked and failed jobs (newest 500 of each), grouped by agent and error shape (numbers, ids and quoted values masked). Retry all resumes the blocked jobs of a group."),
      rows.length ? h("div.scroll", h("table", h("thead", h("tr", h("th", "Agent"), h("th", "Jobs"), h("th", "Error shape"), h("th", "First"), h("th", "Last"), h("th", "Sample"), h("th", "Action"))), h("tbody", rows))) : h("p", "No failures. 🎉"));
  };
  const bulk = async (list, verb, title) => {
    const ok = await confirmAction(title, "Each job gets its own history entry with who and why.");
    if (!ok) return;
    let n = 0;
    for (const j of list) { try { await api(`/v1/jobs/${j.id}/${verb}`, { method: "POST", body: ok }); n++; } catch { /* moved on meanwhile */ } }
    toast(`${title}: ${n} done`); draw();
  };
  await draw();
  return { refresh: draw };
}

// ---------- Agents ----------
function agentTable(agents, settings) {
  return h("div.scroll", h("table", h("thead", h("tr", h("th", "Agent"), h("th", "Ready"), h("th", "Running"), h("th", "Limit"), h("th", "Paused"), h("th", "Workers (last poll)"), settings ? h("th", "Actions") : null)),
    h("tbody", agents.map((a) => {
      const s = settings?.[a.agent];
      return h("tr", { "data-agent": a.agent }, h("td", h("strong", a.agent)), h("td", a.ready), h("td", a.running),
        h("td", s ? `${s.max_concurrency ?? "∞"} · ${s.rate ?? "∞"}/s` : "—"), h("td", s ? (s.paused ? h("span.badge.s-blocked", "paused") : "no") : "—"),
        h("td", a.workers.length ? a.workers.map((w) => h("div.mono", `${w.worker} · ${ago(w.last_seen_at)}`)) : h("span.muted", "no worker seen by this node")),
        settings ? h("td", agentActions(a.agent, s)) : null);
    }))));
}

function agentActions(agent, s) {
  const conc = h("input", { type: "number", min: 1, placeholder: "max", value: s?.max_concurrency ?? "", style: "width:5em", "aria-label": "max concurrency" });
  const rate = h("input", { type: "number", min: 0, step: "any", placeholder: "rate/s", value: s?.rate ?? "", style: "width:6em", "aria-label": "rate" });
  const post = async (path, body, method = "POST") => { try { await api(`/v1/agents/${enc(agent)}/${path}`, { method, body }); toast(`${agent}: ${path} done`); current?.(); } catch (e) { toast(e.message); } };
  return h("div.actions",
    s?.paused ? h("button.primary", { type: "button", onclick: () => post("resume") }, "Resume") : h("button", { type: "button", onclick: () => post("pause") }, "Pause"),
    conc, rate, h("button", { type: "button", onclick: () => post("limits", { max_concurrency: conc.value ? Number(conc.value) : null, rate: rate.value ? Number(rate.value) : null }, "PUT") }, "Set limits"));
}
let current = null;

async function agents(root) {
  const draw = async () => {
    const list = (await api("/v1/agents")).agents;
    const settings = Object.fromEntries(await Promise.all(list.map((a) => api(`/v1/agents/${enc(a.agent)}/limits`).then((s) => [a.agent, s]))));
    fill(root, h("h1", "Agents"), h("p.muted", "Workers are those that asked this node for leases in the last ten minutes."), agentTable(list, settings));
  };
  current = draw;
  await draw();
  return { refresh: draw };
}

// ---------- Schedules ----------
async function schedules(root) {
  const draw = async () => {
    const r = await api("/v1/schedules");
    const list = r.schedules || r;
    const post = async (name, verb) => { await api(`/v1/schedules/${enc(name)}/${verb}`, { method: "POST" }); draw(); };
    fill(root, h("h1", "Schedules"), list.length ? h("div.scroll", h("table", h("thead", h("tr", h("th", "Name"), h("th", "Cron"), h("th", "Zone"), h("th", "Next fire"), h("th", "Last fire"), h("th", "Last job"), h("th", ""))),
      h("tbody", list.map((s) => h("tr", h("td", h("strong", s.name)), h("td.mono", s.cron), h("td", s.timezone || "UTC"), h("td", s.paused ? h("span.badge.s-blocked", "paused") : `${fmtTime(s.next_fire_at)} (${ago(s.next_fire_at)})`),
        h("td", fmtTime(s.last_fire_at)), h("td", s.last_job_id ? h("a.mono", { href: `#/job/${s.last_job_id}` }, s.last_job_id.slice(0, 8)) : ""),
        h("td", h("button", { type: "button", onclick: () => post(s.name, s.paused ? "resume" : "pause") }, s.paused ? "Resume" : "Pause"))))))) : h("p.muted", "No schedules. Create one with `overseer schedules create FILE`."));
  };
  await draw();
  return { refresh: () => null };
}

// ---------- Ordered keys ----------
async function keys(root) {
  const out = h("div");
  const look = async (key) => {
    if (!key) return;
    const r = await api(`/v1/ordering-keys/${enc(key)}`);
    out.replaceChildren(h("div.card", h("h2", `Key ${r.key}`), r.head ? h("p", "Head: ", h("a.mono", { href: `#/job/${r.head.id}` }, r.head.id), " ", badge(r.head.state)) : h("p.muted", "No unfinished job holds this key."),
      h("p", `${r.waiting} job(s) wait behind it.`)));
  };
  const input = h("input", { "data-search": true, placeholder: "cust-42", onkeydown: (e) => { if (e.key === "Enter") look(e.target.value.trim()); } });
  fill(root, h("h1", "Ordered keys"), h("div.filters", h("label", "Ordering key", input), h("button", { type: "button", onclick: () => look(input.value.trim()) }, "Look up")), out);
  return { refresh: () => look(input.value.trim()) };
}

// ---------- Submit ----------
async function submit(root) {
  const area = h("textarea", { spellcheck: "false", "aria-label": "Job spec JSON" });
  area.value = localStorage.getItem("overseer.draft") || JSON.stringify({ labels: { customer: "acme" }, steps: [{ name: "a", agent: "accounts", payload: {} }] }, null, 2);
  const status = h("div.reason");
  const btn = h("button.primary", { type: "button" }, "Submit");
  let t = null;
  const check = async () => {
    localStorage.setItem("overseer.draft", area.value);
    let spec;
    try { spec = JSON.parse(area.value); } catch (e) { status.className = "reason error"; status.textContent = `Not JSON: ${e.message}`; btn.disabled = true; return; }
    try { const r = await api("/v1/jobs:validate", { method: "POST", body: spec }); status.className = "reason"; status.textContent = `Valid: ${r.steps} step(s).`; btn.disabled = false; }
    catch (e) { status.className = "reason error"; status.textContent = `${e.problem?.field ? e.problem.field + ": " : ""}${e.message}`; btn.disabled = true; }
  };
  area.addEventListener("input", () => { clearTimeout(t); t = setTimeout(check, 250); });
  btn.addEventListener("click", async () => {
    try { const j = await api("/v1/jobs", { method: "POST", body: area.value }); location.hash = `#/job/${j.id}`; } catch (e) { toast(e.message); }
  });
  fill(root, h("h1", "Submit a job"), h("p.muted", "Checked by the server (POST /v1/jobs:validate) as you type."), area, status, h("div.actions", btn));
  await check();
  return { refresh: () => null };
}

export const routes = { overview, jobs, job, failures, agents, schedules, keys, submit };
