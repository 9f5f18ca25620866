// veloxd dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
// The page loads api/state and api/logs once, then follows api/stream (server-sent events).
// Every value from the daemon is inserted as text (never as HTML): log lines are arbitrary.
"use strict";

const MAX_LOG_LINES = 2000;
// Ten colours readable on both themes; past ten servers the colours come round again with a dash
// pattern (dashed, dotted, dash-dot), so the first 40 servers each have a line of their own.
const PALETTE = ["#2f6fbf", "#1a7f37", "#bc4c00", "#8250df", "#cf222e", "#0a7e8c", "#9a6700", "#6e7781",
  "#bf3989", "#5c6f00"];
const DASHES = [[], [6, 3], [2, 3], [8, 3, 2, 3]];
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
    ? (reload.ok ? `config ok (${reload.source}, ${clock(reload.at)})` : `last reload FAILED at ${clock(reload.at)}`)
    : "";
  // A failed reload is a banner with its first error (the rest are in the log, one click away).
  const failed = !!reload && !reload.ok;
  $("reload-failed").hidden = !failed;
  if (failed) {
    const errors = reload.errors || [];
    const more = errors.length > 1 ? ` (and ${errors.length - 1} more)` : "";
    $("reload-failed-text").textContent =
      `at ${clock(reload.at)}: ${errors[0] || "see the log"}${more}. ` +
      (reload.kept_config_sha256 ? "The last good config still runs." : "No valid config was loaded before: no server runs.");
  }
}
function showReloadFailure(event) {
  event.preventDefault();
  $("log-server").value = "";
  $("log-filter").value = "config_reload_failed";
  renderLogs();
  const lines = $("log-lines").children;
  const last = lines[lines.length - 1];
  if (last) { last.classList.add("flash"); last.scrollIntoView({ block: "nearest" }); }
}

// ---- servers ----------------------------------------------------------------------------
function modelCell(model) {
  // A local model directory shows its name; the full path is the tooltip.
  const text = String(model || "");
  const cell = el("td", "model", text.startsWith("/") ? text.split("/").filter(Boolean).pop() : text);
  cell.title = text;
  return cell;
}
function kvPerToken(s) {
  // An evicting cache stops growing at its cap: say so rather than show its flat slope as "0 B/token".
  if (s.kv_cap_tokens) return `capped at ${s.kv_cap_tokens} tokens (${bytes(s.kv_capped_bytes)})`;
  return s.kv_bytes_per_token ? `${num(s.kv_bytes_per_token)} B/token` : "";
}
function tokensText(n) {
  return n % 1024 === 0 ? `${n / 1024}k` : String(n);
}
function kvRatioCell(s) {
  const cell = el("td", "num kv");
  if (s.kv_ratio === null || s.kv_ratio === undefined) { cell.textContent = "–"; return cell; }
  cell.append(el("span", "ratio", `${(s.kv_ratio * 100).toFixed(1)}%`));
  if (s.kv_ratio_tokens) cell.append(el("span", "sub", `at ${tokensText(s.kv_ratio_tokens)} tokens`));
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
    const perToken = kvPerToken(s);
    if (perToken) method.append(el("span", "sub kv-per-token", perToken));
    row.replaceChildren(
      name, state, modelCell(s.model), method, kvRatioCell(s),
      el("td", "num memory wide", bytes(s.rss_bytes)),
      el("td", "num uptime wide", duration(s.uptime_s)),
      el("td", "num restarts wide", s.restarts),
      el("td", "num requests wide", num(s.requests)),
      el("td", "num tps", num(s.tokens_per_s, 1)),
      el("td", "error wide", s.last_error ? `${s.last_error}${s.last_error_at ? ` (at ${s.last_error_at})` : ""}` : ""),
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

// ---- memory (the gateway's budget and what admission decides with) ----------------------
function admissionText(a) {
  if (!a) return "";
  if (!a.fits) return a.message;
  return a.would_unload.length ? `starting it would unload ${a.would_unload.join(", ")}` : "fits: starts at once";
}
function renderMemory(m) {
  $("memory").hidden = !m;
  if (!m) return;
  const budget = m.budget_bytes, used = m.in_use_bytes || 0;
  $("memory-summary").textContent =
    `budget ${bytes(budget)} (${m.budget_source}) · running servers need ${bytes(used)}` +
    (m.always_over_budget.length ? ` · over budget from: ${m.always_over_budget.join(", ")}` : "");
  const bar = $("memory-bar");
  bar.style.width = budget ? `${Math.min(100, (100 * used) / budget).toFixed(1)}%` : "0";
  bar.parentElement.classList.toggle("over", !!budget && used > budget);
  const body = document.querySelector("#memory-table tbody");
  body.replaceChildren(...m.entries.map((e) => {
    const row = el("tr");
    row.dataset.entry = e.name;
    const admission = el("td", "admission" + (e.admission && !e.admission.fits ? " refused" : ""), admissionText(e.admission));
    row.append(
      el("td", "name", e.name), el("td", null, e.start), el("td", `state state-${e.state}`, e.state),
      el("td", "num need", bytes(e.need_bytes)),
      el("td", "num wide", `${bytes(e.weights_bytes)} (${e.weights_source})`),
      el("td", "num wide", e.kv_per_token), admission,
    );
    return row;
  }));
}

// ---- charts (canvas, drawn by hand) -----------------------------------------------------
function niceStep(raw) {
  // 1, 2 or 5 times a power of ten: ticks people read at a glance (not 258.8 MiB, 53 tok/s).
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
}
function byteScale(max) {
  const units = [["B", 1], ["KiB", 1024], ["MiB", 1024 ** 2], ["GiB", 1024 ** 3]];
  let pick = units[0];
  for (const u of units) if (max >= u[1]) pick = u;
  return pick;
}
function seriesStyle(index) {
  return { color: PALETTE[index % PALETTE.length], dash: DASHES[Math.floor(index / PALETTE.length) % DASHES.length] };
}
const CHART_FONT = "11px system-ui, sans-serif";
const PLOT_HEIGHT = 180; // the plot with its axis labels; the legend's rows come on top of it
const LEGEND_ROW = 16, SWATCH = 18, LEGEND_GAP = 14, LEGEND_EDGE = 8;
function layoutLegend(ctx, names, width) {
  // Entries left to right, a new row when the next would cross the right edge: every series is
  // named in full however many there are (a name wider than the chart alone is cut with "…").
  const room = width - 2 * LEGEND_EDGE;
  const entries = [];
  let x = 0, row = 0;
  names.forEach((name) => {
    let text = name;
    const fits = (t) => SWATCH + 4 + ctx.measureText(t).width <= room;
    while (text.length > 1 && !fits(text + (text === name ? "" : "…"))) text = text.slice(0, -1);
    if (text !== name) text += "…";
    const w = Math.ceil(SWATCH + 4 + ctx.measureText(text).width);
    if (x > 0 && x + w > room) { x = 0; row += 1; }
    entries.push({ name, text, x: LEGEND_EDGE + x, y: 4 + row * LEGEND_ROW, w, h: LEGEND_ROW - 2 });
    x += w + LEGEND_GAP;
  });
  return { entries, height: names.length ? 4 + (row + 1) * LEGEND_ROW : 0 };
}
function drawChart(canvas, key, kind, names) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const ctx = canvas.getContext("2d");
  ctx.font = CHART_FONT;
  const all = page.servers.map((s) => s.name);
  const legend = layoutLegend(ctx, names, width);
  const height = PLOT_HEIGHT + legend.height; // the canvas grows by the legend: it never covers the lines
  canvas.style.height = `${height}px`;
  canvas.width = width * ratio; canvas.height = height * ratio; // (resets the context's state)
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const style = getComputedStyle(document.body);
  const muted = style.getPropertyValue("--muted") || "#888", line = style.getPropertyValue("--line") || "#ddd";
  const points = page.history;
  const left = 64, right = 10, top = legend.height + 8, bottom = 22;
  const w = width - left - right, h = height - top - bottom;
  let peak = 0;
  points.forEach((p) => names.forEach((n) => { const v = ((p.servers || {})[n] || {})[key]; if (v > peak) peak = v; }));
  const [unit, scale] = kind === "bytes" ? byteScale(peak) : ["", 1];
  const step = niceStep(Math.max(peak / scale, kind === "bytes" ? 1 : 0.5) / 4);
  const ticks = Math.max(1, Math.ceil(peak / scale / step));
  const max = ticks * step * scale;
  const label = (v) => {
    const shown = Number((v / scale).toFixed(6));
    return kind === "bytes" ? `${shown} ${unit}` : String(shown);
  };
  ctx.font = CHART_FONT;
  ctx.fillStyle = muted; ctx.strokeStyle = line; ctx.lineWidth = 1;
  canvas.dataset.ticks = "";
  for (let i = 0; i <= ticks; i += 1) {
    const y = top + h - (h * i) / ticks;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke();
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    const text = label(i * step * scale);
    ctx.fillText(text, left - 6, y);
    canvas.dataset.ticks += (i ? "|" : "") + text; // what was drawn, for tests and curious readers
  }
  canvas.dataset.series = names.join("|");
  canvas.dataset.plotTop = String(top);
  // A server keeps its colour and dash in both charts: its place among all servers picks them.
  const styles = names.map((n) => seriesStyle(Math.max(0, all.indexOf(n))));
  ctx.textAlign = "left"; ctx.textBaseline = "middle"; ctx.lineWidth = 2;
  legend.entries.forEach((e, i) => {
    const { color, dash } = styles[i], mid = e.y + e.h / 2;
    ctx.strokeStyle = color; ctx.setLineDash(dash);
    ctx.beginPath(); ctx.moveTo(e.x, mid); ctx.lineTo(e.x + SWATCH, mid); ctx.stroke();
    ctx.fillStyle = color; ctx.fillText(e.text, e.x + SWATCH + 4, mid);
  });
  ctx.setLineDash([]);
  canvas.dataset.legend = JSON.stringify(legend.entries.map((e, i) => ({ ...e, ...styles[i], swatch: SWATCH }))); // as drawn
  ctx.fillStyle = muted;
  if (points.length < 2) {
    ctx.textAlign = "center"; ctx.fillText("collecting…", left + w / 2, top + h / 2);
    return;
  }
  const t0 = points[0].t, t1 = points[points.length - 1].t, span = Math.max(t1 - t0, 1);
  ctx.textAlign = "left"; ctx.textBaseline = "top";
  ctx.fillText(`${duration(span)} ago`, left, top + h + 6);
  ctx.textAlign = "right"; ctx.fillText("now", left + w, top + h + 6);
  names.forEach((n, i) => {
    ctx.strokeStyle = styles[i].color; ctx.setLineDash(styles[i].dash); ctx.lineWidth = 1.6; ctx.beginPath();
    let drawing = false;
    points.forEach((p) => {
      const v = ((p.servers || {})[n] || {})[key];
      if (v === null || v === undefined) { drawing = false; return; }
      const x = left + ((p.t - t0) / span) * w, y = top + h - (v / max) * h;
      if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
  });
  ctx.setLineDash([]);
}
function renderCharts() {
  const names = page.servers.map((s) => s.name);
  drawChart($("chart-memory"), "rss", "bytes", names);
  // @gateway and @dashboard generate no tokens: only model servers belong in that chart.
  drawChart($("chart-tps"), "tps", "count", names.filter((n) => !n.startsWith("@")));
}

// ---- log tail ---------------------------------------------------------------------------
function eventText(e) {
  // `text` is the console's rendering of the event's few keys (veloxd/daemon/console.py).
  return (e.event === "server_output" ? "" : `${e.event} `) + (e.text || e.line || "");
}
// mlx_lm logs several lines per request (prompt progress, prompt-cache sizes): noise in a tail.
const PROGRESS = /^(?:\S+ - )?(?:INFO[ :-]+)?(?:Prompt processing progress: \d+\/\d+|Prompt Cache: \d+ sequences|- \w+: \d+ sequences, )/;
function isProgress(e) {
  return e.event === "server_output" && PROGRESS.test(String(e.line || e.text || "").trim());
}
function logMatches(e) {
  const server = $("log-server").value, needle = $("log-filter").value.trim().toLowerCase();
  if (server && e.server !== server) return false;
  if (!$("log-progress").checked && isProgress(e)) return false;
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
  renderMemory(s.memory);
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
$("log-progress").addEventListener("change", renderLogs);
$("reload-failed-link").addEventListener("click", showReloadFailure);
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("veloxd-token", $("token").value);
  $("token").value = "";
  $("action-result").textContent = "token set for this tab";
});
$("reload-config").addEventListener("click", () => act("api/reload"));
window.addEventListener("resize", renderCharts);
load().catch((err) => { $("daemon").textContent = `cannot load: ${err}`; }).finally(connect);
