// A Node client of tidal's HTTP edge that shares no code with tidal: Node's built-in fetch
// for the methods, and the eventsource package for the feed, which reconnects by itself
// with Last-Event-ID when the server goes away and comes back.
//   node client.mjs BASE TOKEN EVENTS
// prints a JSON line per answer and per event, and exits once EVENTS events have come.
import { EventSource } from "eventsource";

const [base, token, wanted] = process.argv.slice(2);
const auth = { Authorization: `Bearer ${token}` };
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");

async function call(method, params) {
  const response = await fetch(`${base}/v1/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...auth },
    body: JSON.stringify(params),
  });
  return { status: response.status, answer: await response.json() };
}

say({ signal: await call("signal", { user_id: "9", entity: "song-17", kind: "view" }) });
say({ status: await call("status", ["18446744073709551615"]) });
say({ refused: await call("status", [-1]) });

const seen = [];
const feed = new EventSource(`${base}/v1/events?from=0`, {
  fetch: (input, init) => fetch(input, { ...init, headers: { ...init.headers, ...auth } }),
});
feed.addEventListener("leave", (event) => {
  seen.push(event.lastEventId);
  say({ event: event.lastEventId, data: JSON.parse(event.data) });
  if (seen.length === Number(wanted)) {
    feed.close();
  }
});
feed.addEventListener("error", () => say({ reconnecting: seen.at(-1) ?? null }));
