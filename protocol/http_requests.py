"""HTTP/1.1 requests from bytes, sans-I/O: llhttp (through ``httptools``, as uvicorn
parses) does the grammar; this holds every request to tidal's bounds.

``receive_data(bytes)`` returns the requests made whole by those bytes, in order (a
client may pipeline); a request that breaks a rule raises ``RemoteHttpError`` with the
status to answer before the connection closes. Bounded: the request line and headers
together (``MAX_HEAD_BYTES``, 431), and a body (``max_body``, 413, judged by its
Content-Length before any of it is read, and by what arrives when it is chunked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import httptools

from .errors import ErrorCode, quoted

#: the request line and headers together, at most (h11's default, and nginx's large buffers)
MAX_HEAD_BYTES: Final = 16 * 1024
#: headers one request may send
MAX_HEADERS: Final = 100
#: the interim answer to ``Expect: 100-continue``: send the body (curl asks so past 1 KiB)
CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class RemoteHttpError(Exception):
    """The client broke HTTP or a bound: answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST):
        super().__init__(message)
        self.status = status
        self.code = code
        #: the requests made whole before it by the same bytes: answered first
        self.before: list[HttpRequest] = []


@dataclass(slots=True, eq=False)
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    body: bytes = b""
    keep_alive: bool = True


class RequestReader:
    """The requests on one connection, as their bytes arrive."""

    def __init__(self, max_body: int) -> None:
        self._max_body = max_body
        self._parser = httptools.HttpRequestParser(self)
        self._done: list[HttpRequest] = []
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._head = 0  # bytes of the request line and headers so far
        self._size = 0  # bytes of the body so far
        self.pending = 0  # bytes of a request begun and not yet whole (0 between requests)
        #: the request being read asked to be told to send its body (Expect: 100-continue)
        self.expects_continue = False

    def receive_data(self, data: bytes) -> list[HttpRequest]:
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            failure = _failure(exc)
            failure.before, self._done = self._done, []
            raise failure from None
        if self.pending:
            self.pending += len(data)
        done, self._done = self._done, []
        return done

    def rest(self) -> None:
        """Nothing to let go of between requests: kept for the idle sweep's sake."""

    # -- llhttp's callbacks --------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._head = self._size = 0
        self.pending = 1

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if len(self._headers) >= MAX_HEADERS:
            raise RemoteHttpError(431, f"headers: more than {MAX_HEADERS}")
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in self._headers:
            if key in ("authorization", "content-length", "host", "idempotency-key"):
                raise RemoteHttpError(400, f"headers: {key} given twice")
            text = f"{self._headers[key]}, {text}"
        self._headers[key] = text

    def on_headers_complete(self) -> None:
        self.expects_continue = self._headers.get("expect", "").lower() == "100-continue"
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            raise RemoteHttpError(
                413,
                f"body: {length} bytes, over the limit of {self._max_body} (--max-message-size)",
                ErrorCode.TOO_LARGE,
            )

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._max_body:
            raise RemoteHttpError(
                413,
                f"body: over the limit of {self._max_body} bytes (--max-message-size)",
                ErrorCode.TOO_LARGE,
            )
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        target = self._url.decode("latin-1")
        path, _, query = target.partition("?")
        self._done.append(
            HttpRequest(
                parser.get_method().decode("latin-1"),
                path,
                query,
                self._headers,
                b"".join(self._body),
                parser.should_keep_alive(),
            )
        )
        self._body = []
        self.pending = 0
        self.expects_continue = False

    def _count(self, n: int) -> None:
        self._head += n
        if self._head > MAX_HEAD_BYTES:
            shown = quoted(self._url.decode("latin-1"), 60)
            raise RemoteHttpError(
                431, f"headers: the request line and headers of {shown} pass {MAX_HEAD_BYTES} bytes"
            )


def _failure(exc: Exception) -> RemoteHttpError:
    """What llhttp's error, or one of ours raised in its callbacks, answers."""
    cause = exc.__context__
    if isinstance(cause, RemoteHttpError):
        return cause
    if isinstance(exc, httptools.HttpParserUpgrade):
        return RemoteHttpError(400, "upgrade: tidal speaks HTTP/1.1 only")
    return RemoteHttpError(400, f"bad request: {exc}")
