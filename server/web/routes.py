"""What each HTTP request is: a method of the table (``POST /v1/METHOD``), a stream of the
feed or of a group (``GET /v1/events``, ``GET /v1/groups/NAME/events``), a group's ack
or nack, health for probes, the OpenRPC document, or the console's files.

Each is handed to the engine as the same method, params and ``Replier`` a MessagePack
request is; what differs is only how its answer is written (its ``Shape``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Protocol

from tidal.protocol import ErrorCode
from tidal.protocol import http_replies as h
from tidal.protocol.http_requests import HttpRequest
from tidal.protocol.jsonmap import JsonError, Mapping, dumps, loads
from tidal.protocol.limits import FEED_EVENTS, INT64_MAX
from tidal.protocol.methods import TABLE

from .auth import Verdict

#: an answer: status, body, extra headers
Answer = tuple[int, bytes, tuple[tuple[str, str], ...]]
Shape = Callable[[Any], Answer]

#: methods that are a connection's own, not a request's: over HTTP they are routes
_NOT_POSTED: Final = {
    "auth": "send the token as Authorization: Bearer TOKEN",
    "subscribe": "GET /v1/events streams the feed, GET /v1/groups/NAME/events a group's share",
    "unsubscribe": "close the event stream",
    "ack": "POST /v1/groups/NAME/ack with {ids, consumer}",
    "nack": "POST /v1/groups/NAME/nack with {ids, consumer, options}",
}
MAPPINGS: Final = {m.name: Mapping(m) for m in TABLE if m.name not in _NOT_POSTED}


class Asking(Protocol):
    """The connection, as a route hands a request on through it."""

    def ask(self, method: str, params: list[Any], shape: Shape, label: str) -> None: ...

    def answer_now(self, status: int, body: bytes, kind: str = h.JSON) -> None: ...

    def refuse(self, code: int, message: str) -> None: ...

    def stream(self, options: dict[str, Any]) -> None: ...

    def on_behalf(
        self, group: str, consumer: str, method: str, params: list[Any], shape: Shape
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Refused(Exception):
    code: int
    message: str


def _page(name: str, kind: str) -> tuple[bytes, str]:
    return (resources.files(__package__).joinpath("console", name).read_bytes(), kind)


#: what a page of the console is sent with: it runs only its own script, and is not framed
PAGE_HEADERS: Final = (
    (
        "content-security-policy",
        "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("cache-control", "no-cache"),
)
#: the console: a page and its script, read once (``console/``)
CONSOLE: Final = {
    "/": _page("index.html", "text/html; charset=utf-8"),
    "/console.js": _page("console.js", "text/javascript; charset=utf-8"),
}


def result(mapping: Mapping) -> Shape:
    def shape(value: Any) -> Answer:
        return 200, dumps({"result": mapping.answer(value)}), ()

    return shape


def health(ready: bool) -> Shape:
    """``/health``: alive, so not while starting; ``/ready``: serving (``ok``) only."""

    def shape(value: Any) -> Answer:
        status = value.get("status")
        up = status == "ok" if ready else status != "starting"
        body = dumps(value)
        return (200, body, ()) if up else (503, body, (("retry-after", h.RETRY_AFTER),))

    return shape


def document(value: Any) -> Answer:
    return 200, dumps(value), ()


def route(conn: Asking, req: HttpRequest, verdict: Verdict) -> None:
    """Hand ``req`` on, or answer it; ``verdict``: what its credentials proved."""
    path, method = req.path, req.method
    if method == "GET" and path in ("/health", "/ready"):
        conn.ask("health", [], health(path == "/ready"), "health")
        return
    if not verdict.ok:
        conn.refuse(ErrorCode.UNAUTHORIZED, verdict.message)
        return
    page = CONSOLE.get(path)
    if page is not None and method == "GET":
        conn.answer_now(200, *page)
        return
    try:
        if path == "/v1/events":
            _only(req, "GET")
            conn.stream(feed_options(req, None))
        elif path == "/v1/openrpc.json":
            _only(req, "GET")
            conn.ask("rpc.discover", [], document, "rpc.discover")
        elif path.startswith("/v1/groups/"):
            _group(conn, req, path[len("/v1/groups/") :])
        elif path.startswith("/v1/"):
            _posted(conn, req, path[len("/v1/") :])
        else:
            raise Refused(ErrorCode.METHOD_NOT_FOUND, f"not found: {path[:200]}")
    except (JsonError, Refused) as exc:
        conn.refuse(exc.code, str(exc) if isinstance(exc, JsonError) else exc.message)


def _only(req: HttpRequest, method: str) -> None:
    if req.method != method:
        raise Refused(
            ErrorCode.INVALID_REQUEST, f"{req.path[:200]} takes {method}, not {req.method[:20]}"
        )


def _posted(conn: Asking, req: HttpRequest, name: str) -> None:
    mapping = MAPPINGS.get(name)
    if mapping is None:
        hint = _NOT_POSTED.get(name)
        why = f"method not found: {name[:100]!r}" + (f"; {hint}" if hint else "")
        raise Refused(ErrorCode.METHOD_NOT_FOUND, why)
    _only(req, "POST")
    params = mapping.params(body(req))
    key = req.headers.get("idempotency-key")
    if key is not None:
        params = _keyed(name, params, key)
    conn.ask(name, params, result(mapping), name)


def body(req: HttpRequest) -> Any:
    """A request's JSON body (None if it has none). A body must say it is JSON: a browser
    sends another site's form or text/plain without asking, never application/json."""
    if not req.body:
        return None
    kind = req.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != h.JSON:
        raise Refused(
            ErrorCode.INVALID_REQUEST,
            f"content-type: a body must be {h.JSON}, got {kind[:100] or 'none'}",
        )
    return loads(req.body)


def _keyed(name: str, params: list[Any], key: str) -> list[Any]:
    """``Idempotency-Key``: a signal's ``context.id``, as if the body had said it."""
    if name != "signal":
        raise Refused(
            ErrorCode.INVALID_PARAMS,
            "Idempotency-Key: only signal takes one (a batch's signals each carry context.id)",
        )
    mapping = MAPPINGS[name]
    while len(params) < mapping.method.most:
        params.append(mapping.method.params[len(params)].default)
    context = params[4]
    if not isinstance(context, dict):
        return params  # the edge says what is wrong with it
    if context.get("id", key) != key:
        raise Refused(ErrorCode.INVALID_PARAMS, "Idempotency-Key: differs from context.id")
    params[4] = {**context, "id": key}
    return params


def feed_options(req: HttpRequest, group: str | None) -> dict[str, Any]:
    """``subscribe``'s options from the query (``from``, ``events``), and from
    ``Last-Event-ID``, which a reconnecting EventSource sends and which wins over ``from``."""
    try:
        query = urllib.parse.parse_qs(req.query, keep_blank_values=True, max_num_fields=10)
    except ValueError:
        raise Refused(ErrorCode.INVALID_PARAMS, "query: more than 10 fields") from None
    options: dict[str, Any] = {}
    after = req.headers.get("last-event-id") or (query.get("from") or [""])[-1]
    if after:
        if not after.isdigit() or int(after) > INT64_MAX:
            raise Refused(
                ErrorCode.INVALID_PARAMS, f"from: must be an event id, got {after[:30]!r}"
            )
        options["from"] = int(after)
    if "events" in query:
        names = [n for n in query["events"][-1].split(",") if n]
        for n in names:
            if n not in FEED_EVENTS:
                raise Refused(
                    ErrorCode.INVALID_PARAMS,
                    f"events: {n[:60]!r} is no event; they are {', '.join(FEED_EVENTS)}",
                )
        options["events"] = names
    if group is not None:
        options["group"] = group
    return options


def _group(conn: Asking, req: HttpRequest, rest: str) -> None:
    name, _, what = rest.rpartition("/")
    name = urllib.parse.unquote(name)
    if what == "events":
        _only(req, "GET")
        conn.stream(feed_options(req, name))
        return
    if what not in ("ack", "nack"):
        raise Refused(ErrorCode.METHOD_NOT_FOUND, f"not found: {req.path[:200]}")
    _only(req, "POST")
    given = body(req)
    if not isinstance(given, dict) or not isinstance(given.get("consumer"), str):
        raise Refused(
            ErrorCode.INVALID_PARAMS,
            f"body: {{ids, consumer}}: consumer is the id the stream of {name!r} named",
        )
    consumer = given.pop("consumer")
    mapping = _ACKS[what]
    conn.on_behalf(name, consumer, what, mapping.params(given), result(mapping))


#: a group's ack and nack over HTTP: their params mapped as the table's (made once)
_ACKS: Final = {m.name: Mapping(m) for m in TABLE if m.name in ("ack", "nack")}
