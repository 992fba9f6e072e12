"""HTTP answers as bytes, sans-I/O: a status for each error tidal answers, a response's
head, and the frames of a Server-Sent Events stream (docs/PROTOCOL.md, HTTP)."""

from __future__ import annotations

from typing import Any, Final

from .errors import ErrorCode, error_data
from .jsonmap import dumps

REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    413: "Content Too Large",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}
#: seconds a client told 503 waits before it asks again
RETRY_AFTER: Final = "1"
#: milliseconds an EventSource waits before it reconnects: a restart takes about this long
RECONNECT_MS: Final = 1000
JSON: Final = "application/json"
EVENT_STREAM: Final = "text/event-stream"

_OK_JSON: Final = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
_STATUS: Final[dict[int, int]] = {
    ErrorCode.PARSE_ERROR: 400,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_PARAMS: 400,
    ErrorCode.METHOD_NOT_FOUND: 404,
    ErrorCode.INTERNAL_ERROR: 500,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.MOVED: 421,
}


def status_of(code: int, data: dict[str, Any]) -> int:
    """The status of error ``code`` whose data is ``data`` (``error_data``): 507 for
    ``full:``, 503 for the rest of error 2 (starting, standby, retry, stopping, storage
    unavailable)."""
    if code == ErrorCode.UNAVAILABLE:
        return 507 if data.get("kind") == "full" else 503
    return _STATUS.get(code, 500)


def head(
    status: int,
    length: int | None,
    *,
    close: bool = False,
    kind: str = JSON,
    more: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A response's status line and headers; ``length`` None: a stream, sent until the
    connection closes (an event stream)."""
    if status == 200 and length is not None and kind == JSON and not (close or more):
        return _OK_JSON % length  # the usual answer, from a template
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", f"content-type: {kind}"]
    if length is None:
        lines.append("cache-control: no-store")
        lines.append("x-accel-buffering: no")  # a proxy passes each event on as it comes
    else:
        lines.append(f"content-length: {length}")
    if close:
        lines.append("connection: close")
    lines.extend(f"{k}: {v}" for k, v in more)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def error_body(code: int, message: str) -> tuple[int, bytes, tuple[tuple[str, str], ...]]:
    """Status, body and headers of an error: ``{"error": {code, message, data}}``, with
    ``Retry-After`` on 503 and ``tidal-owner`` on 421 (the node that serves it)."""
    data = error_data(code, message)
    status = status_of(code, data)
    more: tuple[tuple[str, str], ...] = ()
    if status == 401:  # a browser asks for Basic credentials (the console), the rest Bearer
        more = (("www-authenticate", 'Basic realm="tidal", Bearer realm="tidal"'),)
    elif status == 503:
        more = (("retry-after", RETRY_AFTER),)
    elif status == 421 and data.get("owner"):
        more = (("tidal-owner", str(data["owner"])),)
    if "user_id" in data:
        data["user_id"] = str(data["user_id"])
    body = dumps({"error": {"code": int(code), "message": message, "data": data}})
    return status, body, more


def busy() -> bytes:
    """What a connection refused at --max-connections is told before it is closed."""
    _, body, more = error_body(ErrorCode.UNAVAILABLE, "too many connections; try again later")
    return response(503, body, close=True, more=more)


def response(
    status: int,
    body: bytes,
    *,
    close: bool = False,
    kind: str = JSON,
    more: tuple[tuple[str, str], ...] = (),
) -> bytes:
    return head(status, len(body), close=close, kind=kind, more=more) + body


def event(event_id: str, name: str, data: bytes) -> bytes:
    """One Server-Sent Event; ``data`` is a line of JSON (no newline in it)."""
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event_id.encode(), name.encode(), data)


def named(name: str, data: bytes) -> bytes:
    """An event without an id: it moves no reconnecting client's Last-Event-ID."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), data)


def retry(milliseconds: int) -> bytes:
    """How long a client waits before it reconnects, once the stream is cut."""
    return b"retry: %d\n\n" % milliseconds


def comment(text: str) -> bytes:
    """A comment line, which every client ignores: a heartbeat."""
    return b": %s\n\n" % text.encode()
