"""The asyncio shell around one client: bytes from the socket into the protocol, replies out.

It stays thin: decoding lives in ``tidal.protocol``, meaning in the engine.
Replies produced while handling one chunk of input, or by one group commit,
leave in a single ``transport.write``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from tidal.protocol import (
    NEED_DATA,
    RESPONSE,
    BadRequest,
    Connection,
    ErrorCode,
    LocalProtocolError,
    Notification,
    RemoteProtocolError,
    Request,
)

from .batch import Replier
from .config import Config
from .metrics import Metrics

log = logging.getLogger("tidal.connection")


class Handler(Protocol):
    """What applies requests: the engine, or, while the database loads, a stand-in."""

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None: ...


@dataclass(eq=False)
class ServerState:
    """What every connection shares with the server."""

    handler: Handler
    metrics: Metrics | None
    connections: set[ServerConnection] = field(default_factory=set)


class FlowControl:
    """Reading stops for either of two reasons and resumes only when both have passed:
    too many requests awaiting replies, or a peer that does not read its replies."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._busy = False
        self._blocked = False
        self._reading = True

    def _update(self) -> None:
        want = not (self._busy or self._blocked)
        if want == self._reading or self._transport.is_closing():
            return
        self._reading = want
        if want:
            self._transport.resume_reading()
        else:
            self._transport.pause_reading()

    def busy(self, value: bool) -> None:
        self._busy = value
        self._update()

    def blocked(self, value: bool) -> None:
        self._blocked = value
        self._update()


#: Before ``auth`` succeeds a connection may send this much, and fail this often.
PREAUTH_BYTES = 1024
AUTH_ATTEMPTS = 3


class ServerConnection(asyncio.Protocol):
    def __init__(self, state: ServerState, config: Config) -> None:
        self._state = state
        self._config = config
        self._max_inflight = config.max_inflight
        self._connections = state.connections
        self._out: list[list[Any]] = []  # replies not yet written
        self._token = config.token.encode() if config.token else None
        self.authenticated = self._token is None
        self._preauth_bytes = 0
        self._auth_failures = 0
        self.inflight = 0
        self.closed = False
        self.draining = False
        self._eof = False
        self.last_active = time.monotonic()
        self._metrics = state.metrics
        self._started: dict[int, tuple[str, float]] = {}  # msgid -> (method, read at)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.peer = self.transport.get_extra_info("peername")
        self.conn = Connection(max_message_size=self._config.max_message_size)
        self.flow = FlowControl(self.transport)
        if len(self._connections) >= self._config.max_connections:
            log.warning("refusing %s: %d connections open", self.peer, len(self._connections))
            self.closed = True
            note = [int(ErrorCode.UNAVAILABLE), "too many connections; try again later"]
            self.transport.write(self.conn.send(Notification("error", note)))
            self.transport.close()
            return
        self._connections.add(self)
        log.debug("connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        log.debug("connection from %s closed%s", self.peer, f": {exc}" if exc else "")

    def eof_received(self) -> bool:
        """The client has sent all it will (a half-close): what it sent is still applied
        and answered, as at shutdown, and the connection closes once nothing is owed."""
        self._eof = True
        self.draining = True
        return self.inflight > 0  # True keeps our side open for the replies to come

    def pause_writing(self) -> None:
        self.flow.blocked(True)

    def resume_writing(self) -> None:
        self.flow.blocked(False)

    def data_received(self, data: bytes) -> None:
        if self.draining or self.closed:
            return  # shutting down: what was not read before is not taken on
        if not self.authenticated:
            self._preauth_bytes += len(data)
            if self._preauth_bytes > PREAUTH_BYTES:
                log.warning("closing %s: over %d bytes before auth", self.peer, PREAUTH_BYTES)
                self.transport.abort()
                return
        handle = self._state.handler.handle
        conn = self.conn
        now = time.monotonic()
        metrics = self._metrics
        try:
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is NEED_DATA:
                    break
                self.last_active = now
                if type(event) is Request:
                    self.inflight += 1
                    if metrics is not None:
                        self._started[event.msgid] = (event.method, now)
                    if not self.authenticated or event.method == "auth":
                        if not self._auth(event):
                            break
                        continue
                    handle(self, event.msgid, event.method, event.params)
                elif type(event) is Notification:
                    if self.authenticated:
                        handle(self, None, event.method, event.params)
                elif type(event) is BadRequest:
                    self.inflight += 1
                    self.reply_error(event.msgid, event.code, event.message)
                # a stray Response is ignored: we never send requests
        except RemoteProtocolError as exc:
            self._protocol_failure(exc)
        self.flush()
        if self.inflight >= self._max_inflight:
            self.flow.busy(True)

    def _auth(self, request: Request) -> bool:
        """Answer a request made before ``auth`` succeeded, or ``auth`` itself.

        False when the connection is being closed for too many failures.
        """
        if request.method != "auth":
            self._auth_failed(request.msgid, "unauthorized: the first request must be auth(token)")
        elif len(request.params) != 1 or not isinstance(request.params[0], str | bytes):
            self._auth_failed(request.msgid, "auth takes 1 param (token), a string")
        elif self._token is None:
            self.reply(request.msgid, True)  # no token configured: auth is a no-op
        else:
            given = request.params[0]
            given = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else given
            if hmac.compare_digest(given, self._token):
                self.authenticated = True
                self.reply(request.msgid, True)
            else:
                self._auth_failed(request.msgid, "unauthorized: wrong token")
        if self._auth_failures >= AUTH_ATTEMPTS:
            log.warning("closing %s after %d failed auth attempts", self.peer, AUTH_ATTEMPTS)
            self.flush()
            self.transport.close()
            self.closed = True
            return False
        return True

    def _auth_failed(self, msgid: int, message: str) -> None:
        self._auth_failures += 1
        self.reply_error(msgid, ErrorCode.UNAUTHORIZED, message)

    def _protocol_failure(self, exc: RemoteProtocolError) -> None:
        log.info("closing connection from %s: %s", self.peer, exc)
        if exc.msgid is not None:
            self.inflight += 1
            self.reply_error(exc.msgid, exc.code, str(exc))
        self.flush()
        self.transport.close()

    # -- the Replier the engine answers through ---------------------------

    def reply(self, msgid: int, result: Any) -> None:
        self.inflight -= 1
        if self._metrics is not None:
            self._observe(msgid)
        if not self.closed:
            self._out.append([RESPONSE, msgid, None, result])

    def reply_error(self, msgid: int, code: int, message: str) -> None:
        self.inflight -= 1
        log.warning("error %d to %s (msgid %d): %s", code, self.peer, msgid, message)
        if self._metrics is not None:
            self._observe(msgid)
            self._metrics.error(int(code))
        if not self.closed:
            self._out.append([RESPONSE, msgid, [int(code), message], None])

    def _observe(self, msgid: int) -> None:
        assert self._metrics is not None
        started = self._started.pop(msgid, None)
        if started is not None:
            self._metrics.observe_latency(started[0], time.monotonic() - started[1])

    def flush(self) -> None:
        """Send every reply gathered since the last flush, in one write."""
        if self._out:
            if not self.closed:
                self.transport.write(self._encode(self._out))
                if self.transport.get_write_buffer_size() > self._config.max_output_buffer:
                    log.warning("disconnecting %s: it does not read its replies", self.peer)
                    self.closed = True
                    self.transport.abort()
            self._out = []
        if self.inflight <= self._max_inflight // 2 and not self.draining:
            self.flow.busy(False)
        if self._eof and self.inflight == 0 and not self.transport.is_closing():
            self.transport.close()  # a half-closed client has had every answer

    def _encode(self, replies: list[list[Any]]) -> bytes:
        try:
            return self.conn.send_responses(replies)
        except LocalProtocolError:  # find the reply that cannot be encoded; answer the rest
            parts = []
            for reply in replies:
                try:
                    parts.append(self.conn.send_responses([reply]))
                except LocalProtocolError:
                    log.exception("cannot encode the reply to %d", reply[1])
                    error = [int(ErrorCode.INTERNAL_ERROR), "the result could not be encoded"]
                    parts.append(self.conn.send_responses([[RESPONSE, reply[1], error, None]]))
            return b"".join(parts)

    def close_idle(self, timeout: float) -> None:
        """Close a connection that sent nothing for ``timeout``. One whose replies are still
        unsent is aborted: a peer that has not read them will not, and a polite close
        would wait for ever to flush them, holding its place under --max-connections."""
        self.closed = True
        unsent = self.transport.get_write_buffer_size()
        if unsent:
            log.info(
                "aborting %s: idle for over %ss, %d bytes of replies unread",
                self.peer,
                timeout,
                unsent,
            )
            self.transport.abort()
        else:
            log.info("closing %s: idle for over %ss", self.peer, timeout)
            self.transport.close()

    def drain(self) -> None:
        """Stop reading for shutdown; requests already read are still answered."""
        self.draining = True
        self.flow.busy(True)
