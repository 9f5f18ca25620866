// veloxd dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
// The page loads api/state and api/logs once, then follows api/stream (server-sent events).
// Every value from the daemon is inserted as text (never as HTML): log lines are arbitrary.
"use strict";

const MAX_LOG_LINES = 2000;
const PALETTE = ["#2f6fbf", "#1a7f37", "#bc4c00", "#8250df", "#cf222e", "#0a7e8c", "#9a6700", "#6e7781"];
const page = { servers: [], history: [], logs: [], actions: false, serverActions: ["restart"], historyMax: 900 };

const $ = (id) => document.getElementById(id);
const el = (tag, cls, text) => {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
};

// ---- formatting -------------------------------------------------------------------------
function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}
function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s % 60}s`;
  return `${s}s`;
}
const num = (v, digits = 0) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
function clock(iso) {
  const t = new Date(iso);
  return isNaN(t) ? String(iso || "") : t.toLocaleTimeString([], { hour12: false });
}

// ---- header -------------------------------------------------------------------------------
function renderHeader(s) {
  const daemon = $("daemon");
  if (!s.reachable) {
    daemon.textContent = "daemon not reachable";
    daemon.title = s.error || "";
  } else {
    daemon.textContent = `daemon pid ${s.daemon.pid} · v${s.daemon.version}` + (s.degraded ? " · no valid config" : "");
    daemon.title = s.config_path || "";
  }
  const reload = s.last_reload;
  $("reload").textContent = reload
    ? (reload.ok ? `config ok (${reload.source}, ${clock(reload.at)})` : `last reload FAILED at ${clock(reload.at)}: ${(reload.errors || []).join("; ")}`)
    : "";
}

// ---- servers ----------------------------------------------------------------------------
function modelCell(model) {
  // A local model directory shows its name; the full path is the tooltip.
  const text = String(model || "");
  const cell = el("td", "model", text.startsWith("/") ? text.split("/").filter(Boolean).pop() : text);
  cell.title = text;
  return cell;
}
// Rows and their action buttons persist across updates (a click never lands on a replaced node).
const rows = new Map();
function serverRow(name) {
  if (!rows.has(name)) {
    const row = el("tr");
    row.dataset.server = name;
    const actions = el("td", "actions-col");
    const buttons = {};
    for (const action of ["restart", "start", "unload"]) { // start/unload: on-demand servers, on a gateway's page
      const button = el("button", action, action);
      button.addEventListener("click", () => act(`api/servers/${encodeURIComponent(name)}/${action}`));
      actions.append(button);
      buttons[action] = button;
    }
    rows.set(name, { row, actions, buttons });
  }
  return rows.get(name);
}
function offered(s, action) {
  if (!page.actions || !page.serverActions.includes(action)) return false;
  if (action === "restart") return true;
  return s.start === "on_demand" && s.state === (action === "start" ? "stopped" : "ready");
}
function renderServers() {
  const body = document.querySelector("#servers tbody");
  $("no-servers").hidden = page.servers.length > 0;
  const shown = new Set();
  page.servers.forEach((s, index) => {
    const { row, actions, buttons } = serverRow(s.name);
    shown.add(s.name);
    row.dataset.state = s.state;
    for (const [action, button] of Object.entries(buttons)) button.hidden = !offered(s, action);
    const name = el("td", "name");
    name.append(el("strong", null, s.name));
    if (s.description) name.append(el("span", "sub", s.description));
    name.append(el("span", "sub", `${s.host}:${s.port}` + (s.pid ? ` · pid ${s.pid}` : "")));
    const state = el("td");
    state.append(el("span", `state state-${s.state}`, s.state));
    if (s.download && s.state === "downloading") state.append(el("span", "sub", `${num(s.download.percent, 0)}% of ${bytes(s.download.total_bytes)}`));
    const method = el("td", "method", s.method + (s.bits !== null && s.bits !== undefined ? ` · ${s.bits} bit` : ""));
    if (s.kv_bytes_per_token) method.append(el("span", "sub", `${num(s.kv_bytes_per_token)} B/token`));
    row.replaceChildren(
      name, state, modelCell(s.model), method,
      el("td", "num kv", s.kv_ratio === null || s.kv_ratio === undefined ? "–" : `${(s.kv_ratio * 100).toFixed(1)}%`),
      el("td", "num memory", bytes(s.rss_bytes)),
      el("td", "num uptime", duration(s.uptime_s)),
      el("td", "num restarts", s.restarts),
      el("td", "num requests", num(s.requests)),
      el("td", "num tps", num(s.tokens_per_s, 1)),
      el("td", "error", s.last_error || ""),
      actions,
    );
    if (body.children[index] !== row) body.insertBefore(row, body.children[index] || null);
  });
  rows.forEach((entry, name) => {
    if (!shown.has(name)) { entry.row.remove(); rows.delete(name); }
  });
  const select = $("log-server");
  const chosen = select.value;
  const names = page.servers.map((s) => s.name);
  const have = Array.from(select.options).slice(1).map((o) => o.value);
  if (names.join("\n") !== have.join("\n")) {
    select.replaceChildren(el("option", null, "all servers"));
    select.options[0].value = "";
    names.forEach((n) => { const o = el("option", null, n); o.value = n; select.append(o); });
    select.value = names.includes(chosen) ? chosen : "";
  }
}

// ---- charts (canvas, drawn by hand) -----------------------------------------------------
function drawChart(canvas, key, format) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight || 180;
  canvas.width = width * ratio; canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const style = getComputedStyle(document.body);
  const muted = style.getPropertyValue("--muted") || "#888", line = style.getPropertyValue("--line") || "#ddd";
  const points = page.history;
  const names = page.servers.map((s) => s.name);
  const left = 64, right = 10, top = 8, bottom = 22;
  const w = width - left - right, h = height - top - bottom;
  let max = 0;
  points.forEach((p) => names.forEach((n) => { const v = ((p.servers || {})[n] || {})[key]; if (v > max) max = v; }));
  max = max > 0 ? max * 1.1 : 1;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = muted; ctx.strokeStyle = line; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i += 1) {
    const y = top + h - (h * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    ctx.fillText(format((max * i) / 4), left - 6, y);
  }
  if (points.length < 2) {
    ctx.textAlign = "center"; ctx.fillText("collecting…", left + w / 2, top + h / 2);
    return;
  }
  const t0 = points[0].t, t1 = points[points.length - 1].t, span = Math.max(t1 - t0, 1);
  ctx.textAlign = "left"; ctx.textBaseline = "top";
  ctx.fillText(`${duration(span)} ago`, left, top + h + 6);
  ctx.textAlign = "right"; ctx.fillText("now", left + w, top + h + 6);
  names.forEach((n, i) => {
    ctx.strokeStyle = PALETTE[i % PALETTE.length]; ctx.lineWidth = 1.6; ctx.beginPath();
    let drawing = false;
    points.forEach((p) => {
      const v = ((p.servers || {})[n] || {})[key];
      if (v === null || v === undefined) { drawing = false; return; }
      const x = left + ((p.t - t0) / span) * w, y = top + h - (v / max) * h;
      if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
    ctx.fillStyle = PALETTE[i % PALETTE.length]; ctx.textAlign = "left"; ctx.textBaseline = "top";
    ctx.fillText(`■ ${n}`, left + 8 + i * 110, top + 2);
  });
}
function renderCharts() {
  drawChart($("chart-memory"), "rss", bytes);
  drawChart($("chart-tps"), "tps", (v) => v.toFixed(v < 10 ? 1 : 0));
}

// ---- log tail ---------------------------------------------------------------------------
function eventText(e) {
  // `text` is the console's rendering of the event's few keys (veloxd/daemon/console.py).
  return (e.event === "server_output" ? "" : `${e.event} `) + (e.text || e.line || "");
}
function logMatches(e) {
  const server = $("log-server").value, needle = $("log-filter").value.trim().toLowerCase();
  if (server && e.server !== server) return false;
  return !needle || `${e.server || ""} ${eventText(e)}`.toLowerCase().includes(needle);
}
function logLine(e) {
  const li = el("li", `lv-${e.level || "info"}`);
  li.dataset.server = e.server || "";
  li.append(el("span", "t", clock(e.timestamp) + " "));
  if (e.server) li.append(el("span", "srv", `${e.server} `));
  if (e.event !== "server_output") li.append(el("span", "ev", `${e.event} `));
  li.append(document.createTextNode(e.text || e.line || ""));
  return li;
}
function renderLogs() {
  const list = $("log-lines");
  list.replaceChildren(...page.logs.filter(logMatches).slice(-500).map(logLine));
  if ($("log-follow").checked) list.scrollTop = list.scrollHeight;
}
function appendLogs(events) {
  page.logs.push(...events);
  if (page.logs.length > MAX_LOG_LINES) page.logs.splice(0, page.logs.length - MAX_LOG_LINES);
  const list = $("log-lines");
  events.filter(logMatches).forEach((e) => list.append(logLine(e)));
  while (list.children.length > 500) list.firstChild.remove();
  if ($("log-follow").checked) list.scrollTop = list.scrollHeight;
}

// ---- actions (bearer token; never stored beyond this tab) ---------------------------------
async function act(path) {
  const token = sessionStorage.getItem("veloxd-token") || "";
  const result = $("action-result");
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Authorization": `Bearer ${token}`, "Content-Type": "application/json" },
      body: "{}",
    });
    const answer = await response.json();
    result.textContent = answer.ok ? "done" : `refused: ${answer.error || (answer.errors || []).join("; ")}`;
  } catch (err) {
    result.textContent = `failed: ${err}`;
  }
  $("actions").open = true;
}
function renderActions() {
  $("actions-off").hidden = page.actions;
  $("token-form").hidden = !page.actions;
}

// ---- data flow --------------------------------------------------------------------------
function applyState(s) {
  page.servers = s.servers || [];
  renderHeader(s);
  renderServers();
}
async function load() {
  const state = await (await fetch("api/state")).json();
  page.actions = !!state.actions;
  page.serverActions = state.server_actions || ["restart"];
  $("actions-setting").textContent = state.actions_setting || "dashboard.api_key_env"; // the gateway's key, if it serves the page
  page.historyMax = state.history_max || 900;
  page.history = state.history || [];
  applyState(state);
  renderActions();
  renderCharts();
  const logs = await (await fetch("api/logs?limit=2000")).json();
  page.logs = logs.events || [];
  renderLogs();
}
function connect() {
  const source = new EventSource("api/stream");
  let wasDown = false;
  source.onopen = () => {
    $("live").classList.add("on");
    if (wasDown) load().catch(() => {}); // the web process may have restarted: its history is new
    wasDown = false;
  };
  source.onerror = () => { $("live").classList.remove("on"); wasDown = true; };
  source.addEventListener("state", (message) => {
    const s = JSON.parse(message.data);
    applyState(s);
    if (s.point) {
      page.history.push(s.point);
      if (page.history.length > page.historyMax) page.history.splice(0, page.history.length - page.historyMax);
      renderCharts();
    }
  });
  source.addEventListener("logs", (message) => appendLogs(JSON.parse(message.data)));
}

$("log-server").addEventListener("change", renderLogs);
$("log-filter").addEventListener("input", renderLogs);
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("veloxd-token", $("token").value);
  $("token").value = "";
  $("action-result").textContent = "token set for this tab";
});
$("reload-config").addEventListener("click", () => act("api/reload"));
window.addEventListener("resize", renderCharts);
load().catch((err) => { $("daemon").textContent = `cannot load: ${err}`; }).finally(connect);
