"""The asyncio shell around one client: bytes from the socket into the protocol, replies out.

It stays thin: decoding lives in ``tidal.protocol``, meaning in the engine. Replies made
while handling one chunk of input, or by one group commit, leave in one ``transport.write``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from tidal.protocol import (
    DECODING,
    NEED_DATA,
    BadRequest,
    Connection,
    ErrorCode,
    Notification,
    RemoteProtocolError,
    Request,
)
from tidal.protocol.errors import bounded
from tidal.server.config import Config
from tidal.server.core.replies import Listener
from tidal.server.logs import Throttle

from .auth import AUTH_ATTEMPTS, PREAUTH_BYTES, Auth
from .dispose import DECODE_SLICE, LARGE_SLICES
from .flow import Allowance, FlowControl
from .outgoing import Outbox, busy
from .shared import Served, ServerState

log = logging.getLogger("tidal.connection")
#: error replies, a line per code at most every 10 s: a client retrying against a database
#: that is away would otherwise write megabytes of the same line
_replies = Throttle(log)

#: Applying requests from one connection gives the loop back after this long, so that
#: a client with much to do never keeps the others waiting for longer.
SLICE_SECONDS = 0.02
#: A subscriber closed for lagging has this long to read what was sent to it, the last
#: notification saying why, before its connection is cut.
END_SECONDS = 10.0


class ServerConnection(asyncio.Protocol):
    def __init__(self, state: ServerState[Served], config: Config) -> None:
        self._state = state
        self._config = config
        self._max_inflight = config.max_inflight
        self._connections = state.connections
        self._auth = Auth(config.token)
        self.inflight = 0  # requests and notifications applied but not yet committed
        self.closed = False
        self.draining = False
        self._eof = False
        self._input_left = False  # complete requests read but not yet applied
        self._scheduled = False
        self.last_active = time.monotonic()
        self.partial_since: float | None = None  # when the message still arriving began
        self._slices = 0  # of the message being decoded so far: it may span turns
        self._metrics = state.metrics
        self.listener: Listener | None = None  # its change feed subscription, if any
        self._cut: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.peer = self.transport.get_extra_info("peername")
        self.conn = Connection(
            max_message_size=self._config.max_message_size, decode_slice=DECODE_SLICE
        )
        self.outbox = Outbox(self.conn, self._metrics)
        self.flow = FlowControl(self.transport, self._schedule)
        self.allowance = Allowance(self.flow, self.transport, self._config.max_output_buffer)
        if len(self._connections) >= self._config.max_connections:
            log.warning("refusing %s: %d connections open", self.peer, len(self._connections))
            self.closed = True
            self.transport.write(busy(self.conn))
            self.transport.close()
            return
        self._connections.add(self)
        if self._state.held:
            self.flow.set(FlowControl.HELD, True)
        log.debug("connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._connections.discard(self)
        if self.listener is not None:
            self.listener.lost()
        if self._cut is not None:
            self._cut.cancel()
        log.debug("connection from %s closed%s", self.peer, f": {exc}" if exc else "")

    def eof_received(self) -> bool:
        """The client has sent all it will (a half-close): what it sent is still applied
        and answered, as at shutdown, and the connection closes once nothing is owed."""
        self._eof = True
        return self.inflight > 0 or self._input_left  # True keeps our side open

    def pause_writing(self) -> None:
        self.flow.set(FlowControl.BLOCKED, True)

    def resume_writing(self) -> None:
        self.flow.set(FlowControl.BLOCKED, False)
        if self.flow.stopped & FlowControl.READS:
            self.allowance.judge()  # the peer read: its unsent replies no longer fill it
        if self.listener is not None:
            self.listener.writable()

    def data_received(self, data: bytes) -> None:
        if self.draining or self.closed:
            return  # shutting down: what was not read before is not taken on
        try:
            self.conn.receive_data(data)
        except RemoteProtocolError as exc:
            self._protocol_failure(exc)
            return
        self._apply()

    def _schedule(self) -> None:
        """Go on applying what was read, once the loop has served the others."""
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._resume_applying)

    def _resume_applying(self) -> None:
        self._scheduled = False
        if self.flow.stopped & FlowControl.YIELDED:
            self.flow.set(FlowControl.YIELDED, False)  # schedules us again if nothing else holds
        elif not self.flow.stopped and not self.closed:
            self._apply()

    def _apply(self) -> None:
        """Apply the complete requests read, in order, until none is left, flow control
        stops us, or this connection has had its slice of the loop. One state machine
        over what the decoder says (a slice decoded, more bytes needed, a whole message),
        kept whole: the hot path of every request."""
        handle = self._state.handler.handle
        conn = self.conn
        flow = self.flow
        metrics = self._metrics
        began = now = time.monotonic()
        sliced = self._slices  # the message being decoded came in slices: it is large
        self._input_left = True
        try:
            while not (flow.stopped or self.closed):
                event = conn.next_event()
                if event is DECODING:  # a slice of a large message: the clock still runs
                    sliced += 1
                    if not self._auth.done:
                        self._too_much_before_auth()
                        return
                    if time.monotonic() - began > SLICE_SECONDS:
                        flow.set(FlowControl.YIELDED, True)
                        self._schedule()
                    continue
                if event is NEED_DATA:
                    self._input_left = False
                    if not self._auth.done and conn.received > PREAUTH_BYTES:
                        self._too_much_before_auth()
                        return
                    if conn.pending and self.partial_since is None:
                        self.partial_since = now
                    break
                self.last_active = now
                self.partial_since = None
                if not self._auth.done and conn.offset > PREAUTH_BYTES:
                    self._too_much_before_auth()
                    return
                if type(event) is Request:
                    self.inflight += 1
                    if metrics is not None:
                        self.outbox.began(event.msgid, event.method, now)
                    if not self._auth.done or event.method == "auth":
                        if not self._auth.take(event, self):
                            self._auth_refused()
                            return
                    else:
                        handle(self, event.msgid, event.method, event.params)
                elif type(event) is Notification:
                    if self._auth.done:  # work in flight too, until committed
                        self.inflight += 1
                        handle(self, None, event.method, event.params)
                elif type(event) is BadRequest:
                    self.inflight += 1
                    self.reply_error(event.msgid, event.code, event.message)
                # a stray Response is ignored: we never send requests
                if sliced:
                    if sliced > LARGE_SLICES and isinstance(event, (Request, Notification)):
                        self._state.disposer.add(event.params)  # not all at once as it goes
                    sliced = 0
                if self.inflight >= self._max_inflight:
                    flow.set(FlowControl.BUSY, True)
                now = time.monotonic()
                if now - began > SLICE_SECONDS:
                    flow.set(FlowControl.YIELDED, True)
                    self._schedule()
        except RemoteProtocolError as exc:
            self._input_left = False
            self._protocol_failure(exc)
            return
        self._slices = sliced
        self.flush()

    def _too_much_before_auth(self) -> None:
        log.warning("closing %s: over %d bytes before auth", self.peer, PREAUTH_BYTES)
        self.closed = True
        self.transport.abort()

    def _auth_refused(self) -> None:
        log.warning("closing %s after %d failed auth attempts", self.peer, AUTH_ATTEMPTS)
        self.flush()
        self.transport.close()
        self.closed = True

    def _protocol_failure(self, exc: RemoteProtocolError) -> None:
        log.info("closing connection from %s: %s", self.peer, exc)
        if exc.msgid is not None:
            self.inflight += 1
            self.reply_error(exc.msgid, exc.code, str(exc))
        self.flush()
        self.transport.close()

    # -- the Replier the engine answers through ---------------------------

    def reply(self, msgid: int | None, result: Any) -> None:
        """Answer a request; for a notification (``msgid`` None), only its place in flight ends."""
        self.inflight -= 1
        if msgid is not None:
            self.outbox.result(msgid, result, not self.closed)

    def reply_error(self, msgid: int | None, code: int, message: str) -> None:
        self.inflight -= 1
        message = bounded(message)  # every rule quotes input short; this holds it if one does not
        if msgid is None:
            log.debug("notification from %s refused: %s", self.peer, message)
            return
        level = logging.DEBUG if code == ErrorCode.MOVED else logging.WARNING  # routing's
        _replies(code, level, "error %d to %s (msgid %d): %s", code, self.peer, msgid, message)
        self.outbox.error(msgid, code, message, not self.closed)

    def reading(self, bytes_: int) -> None:
        """A read whose reply may take ``bytes_`` began (> 0) or was answered (< 0)."""
        self.allowance.reading(bytes_)

    def hold(self, on: bool) -> None:
        """Apply nothing more of this connection's (True) until told to go on (False)."""
        self.flow.set(FlowControl.DEFERRED, on)

    def flush(self) -> None:
        """Send every reply gathered since the last flush, in one write."""
        if self.outbox.items:
            if not self.closed:
                # Judged before this write: replies just made are not a slow reader, while
                # earlier ones still unread past the limit are (reading stopped long ago).
                if self.transport.get_write_buffer_size() > self._config.max_output_buffer:
                    log.warning("disconnecting %s: it does not read its replies", self.peer)
                    self.closed = True
                    self.transport.abort()
                else:
                    self.transport.write(self.outbox.take())
            self.outbox.items = []
        if self.inflight <= self._max_inflight // 2:
            self.flow.set(FlowControl.BUSY, False)
        if self._eof and not (self.inflight or self._input_left or self.transport.is_closing()):
            self.transport.close()  # a half-closed client has had every answer

    # -- what the change feed pushes through ------------------------------

    def push(self, data: bytes) -> None:
        if self.closed:
            return
        if self.outbox.items:
            self.flush()  # the replies made so far go first: the order they were made in
        if not self.closed:
            self.transport.write(data)

    def unsent(self) -> int:
        return self.transport.get_write_buffer_size()

    def blocked(self) -> bool:
        return bool(self.flow.stopped & FlowControl.BLOCKED)

    def end(self, data: bytes) -> None:
        if self.closed:
            return
        self.push(data)
        self.closed = True
        self.transport.close()  # what is buffered still goes, then the connection closes
        self._cut = asyncio.get_running_loop().call_later(END_SECONDS, self.transport.abort)

    def drain(self) -> None:
        """Stop reading for shutdown; requests already applied are still answered."""
        self.draining = True
        self._input_left = False  # read but not applied: not taken on, so not owed
        self.flow.set(FlowControl.DRAINING, True)
