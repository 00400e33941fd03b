// The Shoal console: read-only pages filled from the admin API (/admin/v1/...).
//
// One page per hash route (#overview, #nodes, #buckets, #usage, #runs); the shown page
// reads its endpoints again every few seconds. Every string from the API reaches the page
// as text (textContent, text nodes), never as HTML: bucket and account names are user input.
// A panel whose endpoint fails says so in words, and the rest of the page still shows.
"use strict";

const REFRESH_MS = 5000;
const FETCH_TIMEOUT_MS = 10000;
const LOGIN = "/console/login";
const SVG = "http://www.w3.org/2000/svg";

const PAGES = {
  overview: showOverview,
  nodes: showNodes,
  buckets: showBuckets,
  usage: showUsage,
  runs: showRuns,
};

// ---- Reading the API ----------------------------------------------------------------------

// The JSON at `path`; throws an Error whose message a person can read. `acceptedStatus`:
// statuses whose body is an answer too (/ready says 503 with its reasons when not ready).
async function getJson(path, acceptedStatus = []) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, {
      cache: "no-store",
      credentials: "same-origin",
      headers: { Accept: "application/json" },
      signal: abort.signal,
    });
  } catch (error) {
    const why = error.name === "AbortError" ? "no answer in time" : "no answer";
    throw new Error(`${path}: ${why} from the admin listener`);
  } finally {
    clearTimeout(timer);
  }
  if (response.status === 401) {
    // The session has ended (expired, or the token changed): back to the login form.
    window.location.assign(LOGIN);
    throw new Error("the session has ended: log in again");
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok && !acceptedStatus.includes(response.status)) {
    const said = body && typeof body.error === "string" ? body.error : response.statusText;
    throw new Error(`${path} answered ${response.status}${said ? ": " + said : ""}`);
  }
  if (body === null || typeof body !== "object") {
    throw new Error(`${path} did not answer JSON`);
  }
  return body;
}

// Fill the element `selector` with what `render()` returns, or with why it could not.
async function fill(selector, render) {
  const target = document.querySelector(selector);
  try {
    const nodes = await render();
    target.replaceChildren(
      ...[nodes]
        .flat(Infinity)
        .filter((node) => node !== null && node !== undefined && node !== false),
    );
  } catch (error) {
    target.replaceChildren(el("p", { class: "error" }, `Could not load: ${error.message}`));
  }
}

// ---- Building the page (text only, never HTML) ----------------------------------------------

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attributes);
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(child instanceof Node ? child : String(child));
    }
  }
  return node;
}

function svg(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  setAttributes(node, attributes);
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function setAttributes(node, attributes) {
  for (const [name, value] of Object.entries(attributes || {})) {
    if (name.toLowerCase().startsWith("on")) throw new Error(`no handler attributes: ${name}`);
    if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
}

// A table; a heading given as a <th> (numberHeading) stays as it is.
function table(headings, rows, footer) {
  const cells = headings.map((heading) =>
    heading instanceof Node ? heading : el("th", {}, heading),
  );
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, cells)),
    el("tbody", {}, rows),
    footer ? el("tfoot", {}, footer) : null,
  );
}

function row(...cells) {
  return el(
    "tr",
    {},
    cells.map((cell) =>
      cell instanceof Node && cell.tagName === "TD" ? cell : el("td", {}, cell),
    ),
  );
}

function numberCell(content) {
  return el("td", { class: "number" }, content);
}

function numberHeading(text) {
  return el("th", { class: "number" }, text);
}

function badge(text, kind) {
  return el("span", { class: `badge ${kind}` }, text);
}

function note(text) {
  return el("p", { class: "muted" }, text);
}

// ---- Readable figures -----------------------------------------------------------------------

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

function size(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${value} B`;
  const digits = value < 10 ? 2 : value < 100 ? 1 : 0;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

const NUMBERS = new Intl.NumberFormat("en");

function count(value) {
  return value === null || value === undefined ? "—" : NUMBERS.format(value);
}

// "1 bucket", "2 buckets".
function counted(value, singular, plural = `${singular}s`) {
  return `${count(value)} ${value === 1 ? singular : plural}`;
}

function rate(perSecond) {
  if (perSecond === null || perSecond === undefined) return "—";
  const value = Number(perSecond);
  return `${value.toFixed(value >= 100 ? 0 : value >= 10 ? 1 : 2)}/s`;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const value = Number(seconds);
  if (value < 60) return `${value.toFixed(value < 10 ? 1 : 0)} s`;
  if (value < 3600) return twoUnits(value, 60, "min", 1, "s");
  if (value < 86400) return twoUnits(value, 3600, "h", 60, "min");
  return twoUnits(value, 86400, "d", 3600, "h");
}

// "3 min 4 s", or "3 min" when the smaller unit is nought.
function twoUnits(seconds, big, bigName, small, smallName) {
  const whole = Math.floor(seconds / big);
  const rest = Math.round((seconds % big) / small);
  return rest ? `${whole} ${bigName} ${rest} ${smallName}` : `${whole} ${bigName}`;
}

function secondsAgo(seconds) {
  const value = Math.max(0, Number(seconds));
  if (value < 1) return "just now";
  if (value < 60) return `${Math.round(value)} s ago`;
  if (value < 3600) return `${Math.round(value / 60)} min ago`;
  if (value < 86400) return `${Math.round(value / 3600)} h ago`;
  return `${Math.round(value / 86400)} d ago`;
}

// A timestamp of the API as a <time>: relative, the exact moment in its tooltip.
function when(iso, missing = "never") {
  if (!iso) return el("span", { class: "muted" }, missing);
  const moment = Date.parse(iso);
  if (Number.isNaN(moment)) return String(iso);
  return el("time", { datetime: iso, title: iso }, secondsAgo((Date.now() - moment) / 1000));
}

function percent(part, whole) {
  return whole > 0 ? Math.min(100, Math.max(0, (100 * part) / whole)) : 0;
}

// The sum of the known values of `field` (null when none is known).
function sum(items, field) {
  let total = null;
  for (const item of items) {
    if (item[field] !== null && item[field] !== undefined) total += Number(item[field]);
  }
  return total;
}

// ---- Overview -------------------------------------------------------------------------------

async function showOverview() {
  await Promise.all([
    fill("#overview-ready .body", async () => {
      const ready = await getJson("/ready", [503]);
      const parts = [
        el(
          "p",
          { class: `big ${ready.ready ? "ok" : "bad"}` },
          ready.ready ? "ready" : "not ready",
        ),
      ];
      if (!ready.ready) parts.push(el("p", {}, ready.reason));
      const hung = ready.shards_not_committing || [];
      if (hung.length) {
        const refused = `writes refused: shard(s) ${hung.join(", ")} do not commit`;
        parts.push(el("p", { class: "bad" }, refused));
      }
      if (ready.storage_nodes_answering !== undefined) {
        const needed = ready.storage_nodes_needed;
        const of = needed === null || needed === undefined ? "" : ` (${needed} needed)`;
        parts.push(note(`${ready.storage_nodes_answering} storage nodes answering${of}`));
      }
      return parts;
    }),
    fill("#overview-shards .body", async () => {
      const cluster = await getJson("/admin/v1/cluster");
      const shards = cluster.shards || [];
      const silent = shards.filter((shard) => !shard.reachable).map((shard) => shard.name);
      const reachable = shards.length - silent.length;
      const parts = [
        el(
          "p",
          { class: `big ${silent.length ? "bad" : "ok"}` },
          `${reachable} of ${shards.length} reachable`,
        ),
      ];
      if (silent.length) parts.push(el("p", {}, `Not answering: ${silent.join(", ")}`));
      if (cluster.ring) {
        parts.push(
          note(`ring version ${cluster.ring.version}, ${count(cluster.ring.vnodes)} vnodes`),
        );
      }
      return parts;
    }),
    fill("#overview-nodes .body", async () => {
      const nodes = (await getJson("/admin/v1/nodes")).nodes || [];
      const silent = nodes.filter((node) => node.state !== "alive").map((node) => node.name);
      const capacity = sum(nodes, "capacity_bytes");
      const free = sum(nodes, "free_bytes");
      const parts = [
        el(
          "p",
          { class: `big ${silent.length || !nodes.length ? "bad" : "ok"}` },
          `${nodes.length - silent.length} of ${nodes.length} alive`,
        ),
      ];
      if (silent.length) parts.push(el("p", {}, `Silent: ${silent.join(", ")}`));
      if (capacity !== null && free !== null) {
        parts.push(note(`${size(capacity - free)} used of ${size(capacity)}`));
      }
      return parts;
    }),
    fill("#overview-requests .body", async () => {
      const requests = await getJson("/admin/v1/requests");
      const errors = Number(requests.errors_per_second || 0);
      const operations = (requests.by_operation || [])
        .slice()
        .sort((a, b) => b.requests_per_second - a.requests_per_second)
        .slice(0, 5);
      return [
        el("p", { class: "big" }, `${rate(requests.requests_per_second)} requests`),
        el("p", { class: errors > 0 ? "bad" : "" }, `${rate(errors)} errors (5xx)`),
        note(`over the last ${duration(requests.window_seconds)}`),
        operations.length
          ? el(
              "ul",
              { class: "plain" },
              operations.map((op) =>
                el("li", {}, `${op.operation}: ${rate(op.requests_per_second)}`),
              ),
            )
          : null,
      ];
    }),
    fill("#overview-gc .body", async () => {
      const gc = await getJson("/admin/v1/gc");
      const backlog = gc.backlog || [];
      const oldest = backlog
        .map((shard) => shard.oldest)
        .filter(Boolean)
        .sort()[0];
      return [
        el("p", { class: "big" }, `${count(sum(backlog, "records"))} records`),
        el("p", {}, `${size(sum(backlog, "bytes"))} to reclaim`),
        oldest ? el("p", {}, "oldest deleted ", when(oldest)) : null,
        gc.paused ? el("p", { class: "bad" }, "GC is paused") : null,
        gc.computed_at ? el("p", { class: "muted" }, "counted ", when(gc.computed_at)) : null,
      ];
    }),
  ]);
}

// ---- Nodes ----------------------------------------------------------------------------------

async function showNodes() {
  await fill("#nodes-panel", async () => {
    const nodes = (await getJson("/admin/v1/nodes")).nodes || [];
    if (!nodes.length) return note("No storage node has registered.");
    return table(
      ["Node", "Datacenter", "State", "Heartbeat", "Disk", numberHeading("Blocks")],
      nodes.map((node) =>
        row(
          el("td", {}, el("strong", {}, node.name), el("div", { class: "muted" }, node.url || "")),
          node.datacenter || "—",
          badge(node.state, node.state === "alive" ? "ok" : "bad"),
          el(
            "td",
            { title: node.heartbeat || "" },
            node.heartbeat_age_seconds === null || node.heartbeat_age_seconds === undefined
              ? "never"
              : secondsAgo(node.heartbeat_age_seconds),
          ),
          el("td", { class: "disk" }, fillBar(node)),
          numberCell(count(node.blocks)),
        ),
      ),
    );
  });
}

function fillBar(node) {
  if (node.capacity_bytes === null || node.capacity_bytes === undefined) {
    return el("span", { class: "muted" }, "disk size not reported");
  }
  const capacity = Number(node.capacity_bytes);
  const free = Number(node.free_bytes || 0);
  const used = capacity - free;
  const filled = percent(used, capacity);
  const level = filled >= 90 ? "bad" : filled >= 75 ? "warn" : "ok";
  const bar = el("div", { class: `fill ${level}` });
  bar.style.width = `${filled.toFixed(1)}%`; // CSSOM, not an inline style attribute
  return [
    el("div", { class: "bar", title: `${filled.toFixed(1)}% full` }, bar),
    el("div", { class: "muted" }, `${size(used)} used of ${size(capacity)}, ${size(free)} free`),
  ];
}

// ---- Buckets --------------------------------------------------------------------------------

async function showBuckets() {
  await fill("#buckets-panel", async () => {
    const answer = await getJson("/admin/v1/accounts");
    const accounts = answer.accounts || [];
    const buckets = accounts.reduce((total, account) => total + (account.buckets || []).length, 0);
    const metered = answer.metered_at
      ? el(
          "p",
          { class: "muted" },
          "Objects and bytes as the meter job counted them ",
          when(answer.metered_at),
          ".",
        )
      : note("Objects and bytes: not metered yet (the meter pipeline job has not run).");
    const objects = sum(accounts, "objects");
    const bytes = sum(accounts, "bytes");
    const meteredTotals = objects === null ? "" : `, ${count(objects)} objects, ${size(bytes)}`;
    return [
      el(
        "p",
        { class: "summary" },
        `${counted(accounts.length, "account")}, ${counted(buckets, "bucket")}${meteredTotals}`,
      ),
      metered,
      accounts.map(accountSection),
    ];
  });
}

function accountSection(account) {
  const buckets = account.buckets || [];
  const unmetered = () => el("span", { class: "muted" }, "not metered yet");
  const figure = (value, format) =>
    numberCell(value === null || value === undefined ? unmetered() : format(value));
  return el(
    "section",
    { class: "account" },
    el("h2", {}, account.name),
    buckets.length
      ? table(
          ["Bucket", "Created", numberHeading("Objects"), numberHeading("Bytes")],
          buckets.map((bucket) =>
            row(
              el("td", { class: "name" }, bucket.name),
              when(bucket.created),
              figure(bucket.objects, count),
              figure(bucket.bytes, size),
            ),
          ),
          row(
            el("td", {}, counted(buckets.length, "bucket")),
            "",
            figure(account.objects, count),
            figure(account.bytes, size),
          ),
        )
      : note("No buckets."),
  );
}

// ---- Usage ----------------------------------------------------------------------------------

async function showUsage() {
  await fill("#usage-panel", async () => {
    const days = (await getJson("/admin/v1/usage")).days || [];
    if (!days.length) {
      return note("No usage history yet: it grows by a day each time the meter pipeline job runs.");
    }
    const byAccount = new Map();
    for (const day of days) {
      if (!byAccount.has(day.account)) byAccount.set(day.account, []);
      byAccount.get(day.account).push(day);
    }
    return [...byAccount.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([account, history]) => usageFigure(account, history));
  });
}

function usageFigure(account, history) {
  const points = history.slice().sort((a, b) => (a.date < b.date ? -1 : a.date > b.date ? 1 : 0));
  const last = points[points.length - 1];
  return el(
    "section",
    { class: "account usage" },
    el("h2", {}, account),
    el(
      "p",
      { class: "muted" },
      `${size(last.bytes)} in ${count(last.objects)} objects on ${last.date}`,
    ),
    bytesPlot(points),
  );
}

// A line of bytes over days, drawn as SVG: dates spaced by time, the y axis from zero.
function bytesPlot(points) {
  const width = 720;
  const height = 220;
  const margin = { left: 80, right: 44, top: 12, bottom: 30 };
  const plotWidth = width - margin.left - margin.right;
  const plotHeight = height - margin.top - margin.bottom;
  const times = points.map((point) => Date.parse(point.date));
  const first = Math.min(...times);
  const span = Math.max(...times) - first;
  const top = niceCeiling(Math.max(...points.map((point) => Number(point.bytes)), 1));
  const x = (time) =>
    margin.left + (span > 0 ? ((time - first) / span) * plotWidth : plotWidth / 2);
  const y = (bytes) => margin.top + plotHeight - (Number(bytes) / top) * plotHeight;

  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    class: "plot",
    role: "img",
    "aria-label": "bytes stored per day",
  });
  for (const fraction of [0, 0.25, 0.5, 0.75, 1]) {
    const level = y(top * fraction);
    chart.append(
      svg("line", {
        x1: margin.left,
        x2: width - margin.right,
        y1: level,
        y2: level,
        class: "grid",
      }),
    );
    chart.append(
      svg(
        "text",
        { x: margin.left - 8, y: level + 4, class: "axis", "text-anchor": "end" },
        size(top * fraction),
      ),
    );
  }
  const labelled =
    points.length > 2
      ? [points[0], points[Math.floor(points.length / 2)], points[points.length - 1]]
      : points;
  for (const point of new Set(labelled)) {
    chart.append(
      svg(
        "text",
        { x: x(Date.parse(point.date)), y: height - 8, class: "axis", "text-anchor": "middle" },
        point.date,
      ),
    );
  }
  const coordinates = points.map((point, index) => `${x(times[index])},${y(point.bytes)}`);
  chart.append(svg("polyline", { points: coordinates.join(" "), class: "line" }));
  points.forEach((point, index) => {
    const dot = svg("circle", { cx: x(times[index]), cy: y(point.bytes), r: 3.5, class: "dot" });
    dot.append(
      svg("title", {}, `${point.date}: ${size(point.bytes)}, ${count(point.objects)} objects`),
    );
    chart.append(dot);
  });
  return chart;
}

// The smallest of 1, 2 or 5 times a power of 1024 or 10 at or above `value`, for a round axis.
function niceCeiling(value) {
  const power = 1024 ** Math.floor(Math.log(value) / Math.log(1024));
  const scaled = value / power;
  const decade = 10 ** Math.floor(Math.log10(scaled));
  for (const step of [1, 2, 5, 10]) {
    if (step * decade >= scaled) return step * decade * power;
  }
  return value;
}

// ---- Runs -----------------------------------------------------------------------------------

async function showRuns() {
  await Promise.all([
    fill("#gc-panel", async () => {
      const gc = await getJson("/admin/v1/gc");
      const backlog = gc.backlog || [];
      const runs = gc.runs || [];
      return [
        el(
          "p",
          {},
          gc.paused ? badge("paused", "bad") : badge("not paused", "ok"),
          " Backlog counted ",
          when(gc.computed_at),
        ),
        backlog.length
          ? table(
              [
                "Shard",
                numberHeading("Records"),
                numberHeading("Bytes"),
                "Oldest deleted",
                numberHeading("Windows"),
              ],
              backlog.map((shard) =>
                row(
                  shard.shard,
                  numberCell(count(shard.records)),
                  numberCell(size(shard.bytes)),
                  when(shard.oldest, "—"),
                  numberCell(count(shard.windows)),
                ),
              ),
            )
          : note("No backlog reported."),
        el("h3", {}, "Last runs"),
        runs.length
          ? table(
              [
                "Kind",
                "Started",
                ...[
                  "Took",
                  "Found",
                  "Reclaimed",
                  "Failed",
                  "Blocks deleted",
                  "Bytes reclaimed",
                  "Windows dropped",
                ].map(numberHeading),
              ],
              runs.map((run) =>
                row(
                  run.kind,
                  when(run.started),
                  numberCell(duration(run.duration_seconds)),
                  numberCell(count(run.records_found)),
                  numberCell(count(run.records_reclaimed)),
                  el(
                    "td",
                    { class: run.records_failed ? "number bad" : "number" },
                    count(run.records_failed),
                  ),
                  numberCell(count(run.blocks_deleted)),
                  numberCell(size(run.bytes_reclaimed)),
                  numberCell(count(run.windows_dropped)),
                ),
              ),
            )
          : note("No GC run yet."),
      ];
    }),
    fill("#pipeline-panel", async () => {
      const runs = (await getJson("/admin/v1/pipeline")).runs || [];
      if (!runs.length) return note("No pipeline run yet.");
      const outcomes = { ok: "ok", problems: "warn", failed: "bad" };
      return table(
        [numberHeading("Run"), "Job", "Started", numberHeading("Took"), "Outcome", "Details"],
        runs.map((run) =>
          row(
            numberCell(run.id),
            run.job,
            when(run.started),
            numberCell(duration(run.duration_seconds)),
            badge(run.outcome, outcomes[run.outcome] || "warn"),
            el("td", { class: "details" }, runDetails(run)),
          ),
        ),
      );
    }),
  ]);
}

function runDetails(run) {
  const lines = [];
  if (run.error) lines.push(el("div", { class: "bad" }, run.error));
  for (const problem of run.problems || []) lines.push(el("div", { class: "warn" }, problem));
  const figures = Object.entries(run.figures || {}).map(
    ([name, value]) => `${name}: ${typeof value === "object" ? JSON.stringify(value) : value}`,
  );
  if (figures.length) lines.push(el("div", { class: "muted" }, figures.join(", ")));
  return lines;
}

// ---- Navigation and refresh -----------------------------------------------------------------

let refreshTimer = null;
let showing = 0; // counts page loads, so that only the newest schedules the next refresh

function currentPage() {
  const name = window.location.hash.slice(1);
  return Object.hasOwn(PAGES, name) ? name : "overview";
}

async function show() {
  const name = currentPage();
  for (const section of document.querySelectorAll(".page")) {
    section.hidden = section.id !== `page-${name}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  clearTimeout(refreshTimer);
  const mine = ++showing;
  try {
    await PAGES[name]();
  } finally {
    if (mine === showing) {
      document.getElementById("refreshed").textContent =
        `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.shown = name;
      refreshTimer = setTimeout(show, REFRESH_MS);
    }
  }
}

window.addEventListener("hashchange", show);
show();
