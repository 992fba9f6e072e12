// tidal's console: read-only, over the public HTTP methods (POST /v1/METHOD) and the
// feed's Server-Sent Events. No framework, no build step. Where the server has a token,
// the browser's Basic auth (asked once, for GET /) goes with every request here.
"use strict";

const $ = (id) => document.getElementById(id);
let previous = null; // the last stats, to work out signals per second

async function call(method, params) {
  const response = await fetch(`/v1/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(params || []),
  });
  const answer = await response.json();
  if (answer.error) throw new Error(`${method}: ${answer.error.message}`);
  return answer.result;
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
}

function rows(body, lines) {
  body.replaceChildren();
  for (const line of lines) {
    const row = document.createElement("tr");
    for (const text of line) cell(row, text);
    body.appendChild(row);
  }
}

async function health() {
  const response = await fetch("/health");
  const answer = await response.json();
  $("health").textContent = answer.status;
  $("health").className = answer.status === "ok" ? "ok" : "bad";
}

async function figures() {
  const stats = await call("stats");
  const now = performance.now();
  $("version").textContent = stats.version;
  if (previous) {
    const seconds = (now - previous.at) / 1000;
    $("rate").textContent = Math.round((stats.signals - previous.signals) / seconds);
  }
  previous = { at: now, signals: stats.signals };
  const p50 = stats.commit_p50_ms, p99 = stats.commit_p99_ms;
  $("commit").textContent = p50 === null ? "–" : `${p50} / ${p99}`;
  $("last-id").textContent = stats.last_event_id;
  $("left").textContent = await call("count_left");
  const map = await call("partition_map");
  $("role").textContent = map.cluster ? `cluster node ${map.node}` : "primary";
}

async function groups() {
  const listed = await call("groups");
  rows($("groups"), listed.map((g) => [
    g.name, g.lag_events, g.lag_seconds.toFixed(1), g.pending, g.dead_letters, g.consumers.length,
  ]));
}

async function unconfirmed() {
  const found = await call("unconfirmed");
  rows($("unconfirmed"), found.users.map((u) => [
    u.user_id, u.event, u.id, u.groups.join(", "),
  ]));
}

async function refresh() {
  for (const part of [health, figures, groups, unconfirmed]) {
    try { await part(); } catch (error) { console.warn(error); }
  }
  document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
}

$("receipt-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const user = $("receipt-user").value.trim();
  try {
    $("receipt").textContent = JSON.stringify(await call("receipt", [user]), null, 2);
  } catch (error) {
    $("receipt").textContent = String(error.message);
  }
});

const feed = new EventSource("/v1/events");
for (const kind of ["leave", "rejoin", "purge", "erase", "define_cohort", "drop_cohort"]) {
  feed.addEventListener(kind, (event) => {
    const line = document.createElement("pre");
    line.textContent = `${event.lastEventId} ${kind} ${event.data}`;
    $("events").prepend(line);
    while ($("events").childElementCount > 200) $("events").lastChild.remove();
  });
}

refresh();
setInterval(refresh, 2000);
