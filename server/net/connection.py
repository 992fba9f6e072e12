"""The asyncio shell around one client: bytes from the socket into the protocol, replies out.

It stays thin: decoding lives in ``tidal.protocol``, meaning in the engine.
Replies produced while handling one chunk of input, or by one group commit,
leave in a single ``transport.write``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from tidal.protocol import (
    DECODING,
    NEED_DATA,
    RESPONSE,
    BadRequest,
    Connection,
    ErrorCode,
    Notification,
    RemoteProtocolError,
    Request,
    error_data,
)
from tidal.protocol.errors import bounded
from tidal.server.config import Config
from tidal.server.core.replies import Listener
from tidal.server.logs import Throttle

from .auth import AUTH_ATTEMPTS, PREAUTH_BYTES, Auth
from .flow import FlowControl
from .outgoing import encode
from .shared import ServerState

log = logging.getLogger("tidal.connection")
#: error replies, a line per code at most every 10 s: a client retrying against a database
#: that is away would otherwise write megabytes of the same line
_replies = Throttle(log)


#: Applying requests from one connection gives the loop back after this long, so that
#: a client with much to do never keeps the others waiting for longer.
SLICE_SECONDS = 0.02
#: A larger message is decoded, and let go of, this many bytes' worth at a time.
DECODE_SLICE = 64 * 1024
#: Large reads (``counts``) one connection may have awaiting replies.
MAX_PENDING_READS = 16
#: A subscriber closed for lagging has this long to read what was sent to it, the last
#: notification saying why, before its connection is cut.
END_SECONDS = 10.0


class ServerConnection(asyncio.Protocol):
    def __init__(self, state: ServerState[ServerConnection], config: Config) -> None:
        self._state = state
        self._config = config
        self._max_inflight = config.max_inflight
        self._connections = state.connections
        self._out: list[list[Any]] = []  # replies not yet written
        self._auth = Auth(config.token)
        self.inflight = 0  # requests and notifications applied but not yet committed
        self._reads = 0  # reads awaiting their batch
        self._reserved = 0  # ... and the most bytes their replies may take
        self.closed = False
        self.draining = False
        self._eof = False
        self._input_left = False  # complete requests read but not yet applied
        self._scheduled = False
        self.last_active = time.monotonic()
        self.partial_since: float | None = None  # when the message still arriving began
        self._metrics = state.metrics
        self._started: dict[int, tuple[str, float]] = {}  # msgid -> (method, read at)
        self.listener: Listener | None = None  # its change feed subscription, if any
        self._cut: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.peer = self.transport.get_extra_info("peername")
        self.conn = Connection(
            max_message_size=self._config.max_message_size, decode_slice=DECODE_SLICE
        )
        self.flow = FlowControl(self.transport, self._schedule)
        if len(self._connections) >= self._config.max_connections:
            log.warning("refusing %s: %d connections open", self.peer, len(self._connections))
            self.closed = True
            busy = "too many connections; try again later"
            note = [int(ErrorCode.UNAVAILABLE), busy, error_data(ErrorCode.UNAVAILABLE, busy)]
            self.transport.write(self.conn.send(Notification("error", note)))
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
            self._judge_reads()  # the peer read: its unsent replies no longer fill the allowance
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
        stops us, or this connection has had its slice of the loop."""
        handle = self._state.handler.handle
        conn = self.conn
        flow = self.flow
        metrics = self._metrics
        began = now = time.monotonic()
        sliced = False  # the message being decoded came in slices: it is large
        self._input_left = True
        try:
            while not (flow.stopped or self.closed):
                event = conn.next_event()
                if event is DECODING:  # a slice of a large message: the clock still runs
                    sliced = True
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
                        self._started[event.msgid] = (event.method, now)
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
                    sliced = False
                    if type(event) is Request or type(event) is Notification:
                        # freed a slice at a time, not all at once when ``event`` goes
                        self._state.disposer.add(event.params)
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
        if msgid is None:
            return
        if self._metrics is not None:
            self._observe(msgid)
        if not self.closed:
            self._out.append([RESPONSE, msgid, None, result])

    def reply_error(self, msgid: int | None, code: int, message: str) -> None:
        self.inflight -= 1
        message = bounded(message)  # every rule quotes input short; this holds it if one does not
        if msgid is None:
            log.debug("notification from %s refused: %s", self.peer, message)
            return
        level = logging.DEBUG if code == ErrorCode.MOVED else logging.WARNING  # routing's
        _replies(code, level, "error %d to %s (msgid %d): %s", code, self.peer, msgid, message)
        if self._metrics is not None:
            self._observe(msgid)
            self._metrics.error(int(code))
        if not self.closed:
            self._out.append(
                [RESPONSE, msgid, [int(code), message, error_data(code, message)], None]
            )

    def reading(self, bytes_: int) -> None:
        """A read whose reply may take ``bytes_`` began (> 0) or was answered (< 0): only a
        few may wait at once, and what their replies may take, with what is still unsent,
        counts against the connection's output allowance (--max-output-buffer). Past it,
        nothing more is applied until replies are written out and read."""
        self._reads += 1 if bytes_ > 0 else -1
        self._reserved += bytes_
        self._judge_reads()

    def _judge_reads(self) -> None:
        full = self._reserved + self.transport.get_write_buffer_size()
        self.flow.set(
            FlowControl.READS,
            self._reads >= MAX_PENDING_READS or full >= self._config.max_output_buffer,
        )

    def hold(self, on: bool) -> None:
        """Apply nothing more of this connection's (True) until told to go on (False)."""
        self.flow.set(FlowControl.DEFERRED, on)

    def _observe(self, msgid: int) -> None:
        assert self._metrics is not None
        started = self._started.pop(msgid, None)
        if started is not None:
            self._metrics.observe_latency(started[0], time.monotonic() - started[1])

    def flush(self) -> None:
        """Send every reply gathered since the last flush, in one write."""
        if self._out:
            if not self.closed:
                # Judged before this write: replies just made are not a slow reader, while
                # earlier ones still unread past the limit are (reading stopped long ago).
                if self.transport.get_write_buffer_size() > self._config.max_output_buffer:
                    log.warning("disconnecting %s: it does not read its replies", self.peer)
                    self.closed = True
                    self.transport.abort()
                else:
                    self.transport.write(encode(self.conn, self._out))
            self._out = []
        if self.inflight <= self._max_inflight // 2:
            self.flow.set(FlowControl.BUSY, False)
        if self._eof and not (self.inflight or self._input_left or self.transport.is_closing()):
            self.transport.close()  # a half-closed client has had every answer

    # -- what the change feed pushes through ------------------------------

    def push(self, data: bytes) -> None:
        if self.closed:
            return
        if self._out:
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

    def close_stalled(self, timeout: float) -> None:
        """A message begun over ``timeout`` ago is still not whole: what it sent so far is
        held for it, so a sender that stalls must not keep it for ever."""
        log.warning(
            "closing %s: a message of which %d bytes arrived is not whole after %ss",
            self.peer,
            self.conn.pending,
            timeout,
        )
        self.closed = True
        self.transport.abort()

    def drain(self) -> None:
        """Stop reading for shutdown; requests already applied are still answered."""
        self.draining = True
        self._input_left = False  # read but not applied: not taken on, so not owed
        self.flow.set(FlowControl.DRAINING, True)
