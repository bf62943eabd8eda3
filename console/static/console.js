// The FedFaaS console's pages, filled from its JSON API (console/app.py).
// Data is written as text only (textContent, attributes), never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const WORKLOADS = ["shapley", "leave-one-out", "multi-krum", "cosine-to-aggregate", "oort", "kmeans"];
const PARAMS = {
  "shapley": "{\"method\": \"gtg\"}",
  "leave-one-out": "{}",
  "multi-krum": "{\"f\": 1}",
  "cosine-to-aggregate": "{}",
  "oort": "{\"k\": 3}",
  "kmeans": "{\"k\": 2}",
};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const c of children) {
    node.append(c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "-" : String(c)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function csrf() {
  return document.querySelector("meta[name=csrf-token]").content;
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin" }, options || {});
  if (opts.method && opts.method !== "GET") {
    opts.headers = Object.assign({ "X-CSRF-Token": csrf(), "Content-Type": "application/json" }, opts.headers || {});
  }
  const r = await fetch(path, opts);
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) {
    window.location.assign("/login");
  }
  if (!r.ok) {
    const detail = body.detail !== undefined ? body.detail : body;
    throw new Error(r.status + ": " + (typeof detail === "string" ? detail : JSON.stringify(detail)));
  }
  return body;
}

function fmt(v, digits) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 3 : digits);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function table(id, headers, rows) {
  const head = el("tr", {}, ...headers.map((h) => el("th", {}, h)));
  const body = rows.map((r) => el("tr", r.attrs || {}, ...r.cells.map((c) => el("td", {}, c instanceof Node ? c : fmt(c)))));
  return el("table", { id: id }, el("thead", {}, head), el("tbody", {}, ...body));
}

function section(id, title, ...content) {
  return el("section", { id: id }, el("h2", {}, title), ...content);
}

function setStatus(text, error) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = error ? "error" : "muted";
}

function replace(id, node) {
  const old = document.getElementById(id);
  if (old) old.replaceWith(node); else document.getElementById("page").append(node);
}

// --- charts -------------------------------------------------------------------------------

function barChart(id, title, values) {
  const labels = Object.keys(values).filter((k) => typeof values[k] === "number");
  const w = Math.max(320, 60 * labels.length + 60), h = 260, top = 30, bottom = 60, left = 50;
  const nums = labels.map((k) => values[k]);
  const max = Math.max(0, ...nums), min = Math.min(0, ...nums);
  const span = max - min || 1;
  const y = (v) => top + (max - v) / span * (h - top - bottom);
  const chart = svg("svg", { id: id, width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
  chart.append(svg("text", { x: left, y: 18, class: "title" }, title));
  chart.append(svg("line", { x1: left, x2: w - 10, y1: y(0), y2: y(0), class: "axis" }));
  chart.append(svg("text", { x: 4, y: y(max) + 4, class: "tick" }, fmt(max)));
  chart.append(svg("text", { x: 4, y: y(min) + 4, class: "tick" }, fmt(min)));
  labels.forEach((k, i) => {
    const v = values[k], x = left + 10 + i * 60;
    const y0 = Math.min(y(v), y(0)), hh = Math.max(1, Math.abs(y(v) - y(0)));
    const bar = svg("rect", { x: x, y: y0, width: 40, height: hh, class: v < 0 ? "bar neg" : "bar", "data-label": k, "data-value": v });
    bar.append(svg("title", {}, `${k}: ${fmt(v, 4)}`));
    chart.append(bar);
    chart.append(svg("text", { x: x, y: h - bottom + 14, class: "label", transform: `rotate(30 ${x} ${h - bottom + 14})` }, k));
  });
  return chart;
}

function lineChart(id, title, xs, series) {
  const w = 480, h = 220, top = 30, bottom = 30, left = 50, right = 90;
  const all = Object.values(series).flat().filter((v) => typeof v === "number");
  const chart = svg("svg", { id: id, width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" });
  chart.append(svg("text", { x: left, y: 18, class: "title" }, title));
  if (!all.length || !xs.length) {
    chart.append(svg("text", { x: left, y: h / 2, class: "tick" }, "no metrics yet (clients send loss or accuracy in their metadata)"));
    return chart;
  }
  const max = Math.max(...all), min = Math.min(...all), span = max - min || 1;
  const xmin = Math.min(...xs), xspan = Math.max(...xs) - xmin || 1;
  const X = (r) => left + (r - xmin) / xspan * (w - left - right);
  const Y = (v) => top + (max - v) / span * (h - top - bottom);
  chart.append(svg("line", { x1: left, x2: w - right, y1: h - bottom, y2: h - bottom, class: "axis" }));
  chart.append(svg("text", { x: 4, y: Y(max) + 4, class: "tick" }, fmt(max)));
  chart.append(svg("text", { x: 4, y: Y(min) + 4, class: "tick" }, fmt(min)));
  Object.entries(series).forEach(([name, ys], n) => {
    const pts = xs.map((x, i) => [x, ys[i]]).filter((p) => typeof p[1] === "number");
    if (!pts.length) return;
    chart.append(svg("polyline", { points: pts.map((p) => `${X(p[0])},${Y(p[1])}`).join(" "), class: `line s${n}`, "data-series": name }));
    pts.forEach((p) => chart.append(svg("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, class: `s${n}` })));
    chart.append(svg("text", { x: w - right + 6, y: top + 16 * n + 10, class: `legend s${n}` }, name));
  });
  xs.forEach((x) => chart.append(svg("text", { x: X(x) - 3, y: h - 10, class: "tick" }, x)));
  return chart;
}

// --- pages --------------------------------------------------------------------------------

function aggregators(a) {
  if (!a || typeof a !== "object") return a;
  return `${fmt(a.endpoints)} endpoints, ${fmt(a.free_endpoints)} free, ${fmt(a.waiting_slots)} slots waiting, queue ${fmt(a.queue)}`;
}

async function overview() {
  const o = await api("/api/overview");
  replace("version", el("p", { id: "version" }, "version ", el("b", {}, o.version)));
  replace("health", section("health", "Health", table("health-table", ["service", "address", "healthy"],
    Object.entries(o.health).map(([name, h]) => ({ attrs: { "data-ok": h.ok }, cells: [name, h.url, h.ok ? "yes" : "NO"] })))));
  const nodes = (o.nodes && o.nodes.nodes) || [];
  replace("nodes", section("nodes", "Nodes (control plane)", table("nodes-table", ["node", "gateway", "healthy", "capacity", "queue estimate", "failures"],
    nodes.map((n) => ({ cells: [n.name, n.url, n.healthy ? "yes" : "NO", n.mc, n.queue_estimate, n.failures] })))));
  replace("gateways", section("gateways", "Node gateways", table("gateways-table", ["node", "address", "router", "why", "jobs", "aggregators", "router endpoints"],
    o.gateways.map((g) => ({ attrs: { "data-router": g.router }, cells: [g.node, g.url, g.router, g.router_reason, g.jobs, aggregators(g.aggregators),
      g.endpoints ? g.endpoints.length : "(admin only)"] })))));
  const agg = o.aggregator;
  replace("aggregator", section("aggregator", "Aggregator replicas",
    el("p", {}, agg ? `${agg.available} ready of ${agg.replicas} (function ${agg.name})` : "no aggregator function deployed")));
  replace("flstore-functions", section("flstore-functions", "FLStore functions", table("flstore-table", ["function", "replicas", "ready"],
    o.flstore_functions.map((f) => ({ cells: [f.name, f.replicas, f.available] })))));
  replace("errors", section("errors", "Errors", el("pre", {}, o.errors.length ? JSON.stringify(o.errors, null, 1) : "none")));
  setStatus("updated " + new Date().toLocaleTimeString());
}

async function jobs() {
  const j = await api("/api/jobs");
  replace("jobs", section("jobs", "Jobs", table("jobs-table", ["job", "rounds done", "of", "open round", "state", "enrolled", "done", "failed"],
    j.jobs.map((x) => ({ attrs: { "data-job": x.job }, cells: [el("a", { href: "/jobs/" + encodeURIComponent(x.job) }, x.job),
      x.completed, x.rounds, x.round, x.round_state, x.enrolled, x.done ? "yes" : "no", x.failed] })))));
  setStatus(j.jobs.length ? "updated " + new Date().toLocaleTimeString() : "no jobs yet");
}

let lastCompleted = -1, seriesAt = 0, seriesComplete = false;

async function job(name) {
  const j = await api("/api/jobs/" + encodeURIComponent(name));
  const v = j.view, cur = v.round || {};
  replace("summary", section("summary", "Summary", table("summary-table", ["rounds done", "of", "state", "aggregation", "selection", "enrolled", "eligible", "lost updates", "privacy (epsilon spent / budget)"],
    [{ cells: [v.completed, v.rounds, v.done ? "done" : (v.failed ? "failed: " + v.failed : (v.waiting_for_clients ? "waiting for clients" : "running")),
      v.aggregation, cur.selected_by ? `${cur.selected_by}${cur.selection_note ? " (" + cur.selection_note + ")" : ""}` : "-",
      v.enrolled, v.eligible, v.lost, v.privacy ? `${fmt(v.privacy.spent)} / ${fmt(v.privacy.epsilon)}` : "no DP"] }])));
  replace("timeline", section("timeline", "Rounds", table("timeline-table", ["round", "state", "seconds", "updates", "published", "reopened", "deadline in (s)", "selected by"],
    j.timeline.map((r) => ({ attrs: { "data-round": r.round, "data-state": r.state }, cells: [r.round, r.state, r.seconds, r.updates, r.published, r.reopened, r.deadline_in_s, r.selected_by] })))));
  replace("clients", section("clients", cur.number ? `Round ${cur.number} (${cur.state}): clients per node and stragglers` : "No round open", table("clients-table", ["node", "clients", "updates in", "stragglers"],
    Object.entries(cur.clients_per_node || {}).map(([node, n]) => ({ cells: [node, n, (cur.received || {})[node] || 0, j.stragglers[node] || 0] })))));
  replace("flagged", section("flagged", "Flagged, excluded and revoked clients",
    el("p", {}, "flagged (dropped from later rounds): " + (Object.keys(v.flagged || {}).length ? JSON.stringify(v.flagged) : "none")),
    el("p", { id: "revoked" }, "revoked (tokens refused, never selected again): " + ((v.revoked || []).length ? v.revoked.join(", ") : "none")),
    el("p", {}, "excluded from the open round: " + (Object.keys(cur.excluded || {}).length ? JSON.stringify(cur.excluded) : "none")),
    el("p", {}, "failed clients of the open round: " + (Object.keys(cur.failures || {}).length ? JSON.stringify(cur.failures) : "none"))));
  if (document.getElementById("page").dataset.scope === "admin" && !document.getElementById("admin")) {
    const stop = el("button", { id: "stop-job", type: "button" }, "Stop and forget this job");
    stop.addEventListener("click", async () => {
      if (!window.confirm("Stop job " + name + "?")) return;
      try { await api(`/api/jobs/${encodeURIComponent(name)}/stop`, { method: "POST" }); setStatus("job stopped"); }
      catch (e) { setStatus(String(e), true); }
    });
    replace("admin", section("admin", "Admin", stop, revokeForm(name)));
  }
  // again when a round ended, and every 5 s while a round's point is missing (FLStore
  // takes in a round's metadata in the background)
  if (v.completed !== lastCompleted || (!seriesComplete && Date.now() - seriesAt > 5000)) {
    lastCompleted = v.completed;
    seriesAt = Date.now();
    try {
      const s = await api(`/api/jobs/${encodeURIComponent(name)}/series`);
      seriesComplete = s.loss.every((x) => x !== null) && s.accuracy.every((x) => x !== null);
      replace("series", section("series", "Per round: clients' mean loss (their metadata) and the global model's accuracy (FLStore)",
        lineChart("series-chart", "per round", s.rounds, { loss: s.loss, accuracy: s.accuracy })));
    } catch (e) {
      lastCompleted = -1;
      replace("series", section("series", "Loss and accuracy per round", el("p", { class: "error" }, String(e))));
    }
  }
  setStatus("updated " + new Date().toLocaleTimeString());
}

function revokeForm(name) {
  const client = el("input", { id: "revoke-client", name: "client", type: "text", maxlength: 64, required: "" });
  const force = el("input", { id: "revoke-force", name: "force", type: "checkbox" });
  const result = el("p", { id: "revoke-result", class: "muted" });
  const form = el("form", { id: "revoke-form" },
    el("label", {}, "revoke client ", client),
    el("label", {}, force, " even if fewer clients than the rounds' goal are left (the goal drops)"),
    el("button", { id: "revoke", type: "submit" }, "Revoke"), result);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const id = client.value.trim();
    if (!window.confirm(`Revoke client ${id} of job ${name}? Its token is refused at every gateway from now on.`)) return;
    const q = force.checked ? "?force=true" : "";
    try {
      const a = await api(`/api/jobs/${encodeURIComponent(name)}/clients/${encodeURIComponent(id)}/revoke${q}`, { method: "POST" });
      result.textContent = `revoked ${a.client}; gateways told: ${a.gateways.join(", ")}`;
      result.className = "muted";
    } catch (e) {
      result.textContent = String(e);
      result.className = "error";
    }
  });
  return form;
}

function answerValues(result) {
  for (const key of ["values", "scores", "cosine", "utility", "labels"]) {
    if (result && result[key] && typeof result[key] === "object") return [key, result[key]];
  }
  return [null, {}];
}

async function flstore() {
  const names = (await api("/api/jobs")).jobs.map((x) => x.job);
  const workload = el("select", { id: "workload", name: "workload" }, ...WORKLOADS.map((w) => el("option", { value: w }, w)));
  const jobSel = el("select", { id: "job", name: "job" }, ...names.map((n) => el("option", { value: n }, n)));
  const round = el("input", { id: "round", name: "round", type: "number", min: 1, value: 1 });
  const params = el("textarea", { id: "params", name: "params", rows: 3, cols: 50 });
  params.value = PARAMS[workload.value];
  workload.addEventListener("change", () => { params.value = PARAMS[workload.value]; });
  const ask = el("button", { id: "ask", type: "submit" }, "Ask");
  const form = el("form", { id: "query-form" },
    el("label", {}, "workload ", workload), el("label", {}, "job ", jobSel),
    el("label", {}, "round ", round), el("label", {}, "parameters (JSON) ", params), ask);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setStatus("asking FLStore...");
    let p;
    try { p = JSON.parse(params.value || "{}"); } catch (e) { setStatus("parameters: not JSON", true); return; }
    try {
      const a = await api("/api/queries", { method: "POST", body: JSON.stringify({ workload: workload.value, job: jobSel.value, round: Number(round.value), params: p }) });
      const [key, values] = answerValues(a.result);
      replace("answer", section("answer", "Answer",
        el("p", { id: "cost" }, `answered in ${fmt(a.latency_s, 3)} s by ${a.function || "-"}; ${a.hit ? "cache hit" : "cache miss"}`),
        barChart("answer-chart", `${workload.value}: ${key || "no per-client values"}`, values),
        el("pre", { id: "answer-json" }, JSON.stringify(a.result, null, 1))));
      setStatus("answered");
    } catch (e) {
      setStatus(String(e), true);
    }
  });
  replace("query", section("query", "Ask FLStore", form));
  setStatus(names.length ? "ready" : "no jobs yet");
}

async function checkpoints() {
  const params = new URLSearchParams(window.location.search);
  const first = await api("/api/checkpoints");
  const chosen = params.get("job") || first.jobs[0];
  const c = chosen ? await api("/api/checkpoints?job=" + encodeURIComponent(chosen)) : first;
  replace("jobs", section("jobs", `Jobs in bucket ${c.bucket}`,
    el("p", {}, ...c.jobs.map((j) => el("a", { href: "/checkpoints?job=" + encodeURIComponent(j), class: j === chosen ? "here" : null }, j + " "))),
    c.minio_console ? el("p", {}, el("a", { id: "minio-console", href: c.minio_console }, "MinIO console")) : el("span")));
  replace("objects", section("objects", chosen ? `Objects of ${chosen} (links valid ${c.link_ttl_s} s)` : "No checkpoints yet",
    table("objects-table", ["object", "bytes", "modified", "download"],
      c.objects.map((o) => ({ cells: [o.key, o.size, o.modified, el("a", { href: o.url, class: "download", "data-key": o.key, rel: "noreferrer" }, "download")] })))));
  setStatus("links made " + new Date().toLocaleTimeString());
}

function bytes(v) {
  if (typeof v !== "number") return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : String(Math.round(v))) + " " + units[i];
}

function perSecond(v, unit) {
  return typeof v === "number" ? (unit === "B" ? bytes(v) : fmt(v, 2)) + "/s" : "-";
}

async function dataplane() {
  const d = await api("/api/dataplane");
  const source = d.rates_from === "prometheus" ? "from Prometheus" : "of the console's polls";
  replace("nodes", section("nodes", `Node gateways (rates over the last ${fmt(d.window_s)} s ${source})`,
    table("dataplane-table", ["node", "router", "endpoints", "ingest", "updates", "updates accepted", "refused", "mean upload (s)", "store objects", "store bytes", "body bytes held"],
      d.nodes.map((n) => {
        const m = n.metrics || {};
        return { attrs: { "data-node": n.node, "data-router": n.router ? n.router.mode : null, "data-objects": m.store_objects, "data-ingest": m.ingest_bytes, "data-rate": m.ingest_bytes_per_s },
          cells: [n.node, n.router ? n.router.mode : "-", n.endpoints.length, perSecond(m.ingest_bytes_per_s, "B"), perSecond(m.updates_per_s),
            m.updates_accepted, JSON.stringify(m.updates_rejected || {}), m.mean_ingest_s, m.store_objects, bytes(m.store_bytes), bytes(m.body_bytes_held)] };
      }))));
  replace("store", section("store", "Store per node and job",
    table("store-table", ["node", "job", "objects", "bytes"],
      d.nodes.flatMap((n) => Object.entries((n.metrics || {}).store || {}).map(([job, st]) => ({ attrs: { "data-node": n.node, "data-job": job }, cells: [n.node, job, st.objects, bytes(st.bytes)] }))))));
  replace("endpoints", section("endpoints", "Router endpoints (the eBPF map's counters, or the userspace router's)",
    table("endpoints-table", ["node", "endpoint", "job", "role", "pid", "frames in", "frames out", "bytes in", "bytes out", "in", "tasks", "mean E (ms)", "drops"],
      d.nodes.flatMap((n) => n.endpoints.map((e) => ({ attrs: { "data-node": n.node, "data-endpoint": e.id, "data-frames": e.msgs_received },
        cells: [n.node, e.id, e.job, e.role || (e.local ? "gateway" : "-"), e.pid, e.msgs_received, e.msgs_sent, bytes(e.bytes_received), bytes(e.bytes_sent),
          perSecond(e.bytes_received_per_s, "B"), e.tasks_completed, e.mean_exec_ms, e.drops] }))))));
  replace("drops", section("drops", "Frames the routers refused, by reason",
    table("drops-table", ["node", "reason", "frames"],
      d.nodes.flatMap((n) => Object.entries(n.drops || {}).map(([why, k]) => ({ cells: [n.node, why, k] }))))));
  replace("errors", section("errors", "Errors", el("pre", {}, d.errors.length ? JSON.stringify(d.errors, null, 1) : "none")));
  setStatus("updated " + new Date().toLocaleTimeString());
}

function poll(fn, ms) {
  const tick = async () => {
    try { await fn(); } catch (e) { setStatus(String(e), true); }
    window.setTimeout(tick, ms);
  };
  tick();
}

document.addEventListener("DOMContentLoaded", () => {
  const logout = document.getElementById("logout");
  if (logout) {
    logout.addEventListener("click", async () => {
      await api("/logout", { method: "POST" }).catch(() => null);
      window.location.assign("/login");
    });
  }
  const page = document.getElementById("page");
  if (!page) return;
  const run = async (fn) => { try { await fn(); } catch (e) { setStatus(String(e), true); } };
  switch (page.dataset.page) {
    case "overview": poll(overview, 5000); break;
    case "jobs": poll(jobs, 2000); break;
    case "job": poll(() => job(page.dataset.job), 1000); break;
    case "flstore": run(flstore); break;
    case "checkpoints": run(checkpoints); break;
    case "dataplane": poll(dataplane, 2000); break;
  }
});
