"""The asyncio shell around one HTTP client, as ``net.connection`` is around a MessagePack
one: bytes into the request reader, each request to the engine as its method, answers
out in the order asked (a client may pipeline), in one write per flush.

It holds the same bounds: --max-connections (shared with the TCP port), the body and
head sizes (``protocol.http_requests``), --max-inflight, --max-output-buffer, and the
idle and message timeouts (``net.sweep``). A connection that asks for an event stream
becomes one: it reads nothing more, and what the feed pushes is written as events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, cast

from tidal.protocol import ErrorCode
from tidal.protocol import http_replies as h
from tidal.protocol.http_requests import CONTINUE, HttpRequest, RemoteHttpError, RequestReader
from tidal.server.config import Config
from tidal.server.core.replies import Listener
from tidal.server.net.flow import Allowance, FlowControl
from tidal.server.net.shared import ServerState

from . import routes
from .answers import Answers, Asked
from .auth import HttpAuth
from .consumers import Consumers, OnBehalf
from .stream import Events

log = logging.getLogger("tidal.http")

#: as ``net.connection``: a connection gives the loop back after applying this long
SLICE_SECONDS = 0.02
#: a stream cut for lagging has this long to take what was sent before it is aborted
END_SECONDS = 10.0


class HttpConnection(asyncio.Protocol):
    def __init__(self, state: ServerState[Any], config: Config, consumers: Consumers) -> None:
        self._state = state
        self._config = config
        self._consumers = consumers
        self._auth = HttpAuth(config.token, config.insecure)
        self._metrics = state.metrics
        self.inflight = 0
        self.closed = False
        self.draining = False
        self.last_active = time.monotonic()
        self.partial_since: float | None = None
        self.listener: Listener | None = None
        self.consumer: str | None = None  # a group stream's id, for acks sent elsewhere
        self.group: str | None = None
        #: read and not yet handed on; a request that could not be read, last
        self._requests: deque[HttpRequest | RemoteHttpError] = deque()
        self._answers = Answers()
        self._scheduled = False
        self._events = Events()  # once it streams
        self._closing = False  # the last request to answer before closing is read
        self._eof = False  # the client half-closed
        self._current_close = False  # the request being routed is the connection's last
        self._cut: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.peer = self.transport.get_extra_info("peername")
        self.conn = RequestReader(self._config.max_message_size)  # as the sweep calls it
        self.flow = FlowControl(self.transport, self._schedule)
        self.allowance = Allowance(self.flow, self.transport, self._config.max_output_buffer)
        if len(self._state.connections) >= self._config.max_connections:
            log.warning("refusing %s: too many connections", self.peer)
            self.closed = True
            self.transport.write(h.busy())
            self.transport.close()
            return
        self._state.connections.add(self)
        if self._state.held:
            self.flow.set(FlowControl.HELD, True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._state.connections.discard(self)
        self._consumers.forget(self)
        if self.listener is not None:
            self.listener.lost()
        if self._cut is not None:
            self._cut.cancel()

    def eof_received(self) -> bool:
        """The client sent all it will: what it sent is still answered, then it closes."""
        self._eof = True
        return bool(self._answers or self._requests)  # True keeps our side open

    def pause_writing(self) -> None:
        self.flow.set(FlowControl.BLOCKED, True)

    def resume_writing(self) -> None:
        self.flow.set(FlowControl.BLOCKED, False)
        if self.flow.stopped & FlowControl.READS:
            self.allowance.judge()
        if self.listener is not None:
            self.listener.writable()

    def data_received(self, data: bytes) -> None:
        if self.draining or self.closed or self._closing:
            return  # a stream reads nothing more; nor does a connection that is ending
        now = time.monotonic()
        try:
            self._requests.extend(self.conn.receive_data(data))
        except RemoteHttpError as exc:
            log.info("closing %s: %s", self.peer, exc)
            self._requests.extend(exc.before)  # answered first, then the error, then closed
            self._requests.append(exc)
            self._closing = True
            self._apply()
            return
        self.last_active = now
        self.partial_since = (self.partial_since or now) if self.conn.pending else None
        if self.conn.expects_continue and not (self._answers or self._requests):
            self.conn.expects_continue = False  # nothing owed before it: ask for the body
            self.transport.write(CONTINUE)
        self._apply()

    def _schedule(self) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._scheduled = False
        if self.flow.stopped & FlowControl.YIELDED:
            self.flow.set(FlowControl.YIELDED, False)
        elif not self.flow.stopped and not self.closed:
            self._apply()

    def _apply(self) -> None:
        began = time.monotonic()
        requests = self._requests
        while requests and not (self.flow.stopped or self.closed):
            req = requests.popleft()
            if isinstance(req, RemoteHttpError):  # what could not be read: the last answer
                self._answers.unreadable(req)
                if self._metrics is not None:
                    self._metrics.error(int(req.code))
                break
            self._current_close = not req.keep_alive
            if self._current_close:
                self._closing = True
                requests.clear()
            routes.route(self, req, self._auth.judge(req.headers))
            if self.inflight >= self._config.max_inflight:
                self.flow.set(FlowControl.BUSY, True)
            if time.monotonic() - began > SLICE_SECONDS:
                self.flow.set(FlowControl.YIELDED, True)
                self._schedule()
        self.flush()

    def _begin(
        self,
        label: str,
        shape: routes.Shape | None = None,
        close: bool = False,
        stream: bool = False,
    ) -> int:
        self.inflight += 1
        return self._answers.begin(label, shape, close, stream)

    # -- what a route does (``routes.Asking``) -------------------------------------------

    def ask(self, method: str, params: list[Any], shape: routes.Shape, label: str) -> None:
        msgid = self._begin(label, shape, self._current_close)
        self._state.handler.handle(self, msgid, method, params)

    def answer_now(self, status: int, body: bytes, kind: str = h.JSON) -> None:
        msgid = self._begin("static", None, self._current_close)
        self.inflight -= 1
        close = self._current_close
        page = h.response(status, body, kind=kind, close=close, more=routes.PAGE_HEADERS)
        self._answers.ready(msgid, page)

    def refuse(self, code: int, message: str) -> None:
        close = self._current_close or code == ErrorCode.UNAUTHORIZED
        if close:
            self._closing = True
            self._requests.clear()
        self.reply_error(self._begin("http", None, close), code, message)

    def stream(self, options: dict[str, Any]) -> None:
        """This connection becomes the stream: ``subscribe``, answered with its head."""
        self._closing = True
        self._requests.clear()
        msgid = self._begin("subscribe", None, True, stream=True)
        self._state.handler.handle(self, msgid, "subscribe", [options])

    def on_behalf(
        self, group: str, consumer: str, method: str, params: list[Any], shape: routes.Shape
    ) -> None:
        msgid = self._begin(method, shape, self._current_close)
        stream = self._consumers.find(group, consumer)
        if stream is None:
            message = f"consumer: {consumer[:40]!r} is no stream of group {group[:100]!r} now"
            self.reply_error(msgid, ErrorCode.INVALID_PARAMS, message)
            return
        self._state.handler.handle(OnBehalf(stream, self), msgid, method, params)

    # -- the Replier the engine answers through ------------------------------------------

    def reply(self, msgid: int | None, result: Any) -> None:
        self.inflight -= 1
        asked = self._answers.get(msgid)
        if msgid is None or asked is None:
            return
        self._observe(asked)
        if asked.stream:
            self._answers.ready(msgid, self._stream_head(result))
        else:
            self._answers.result(msgid, asked, result)

    def reply_error(self, msgid: int | None, code: int, message: str) -> None:
        self.inflight -= 1
        asked = self._answers.get(msgid)
        if msgid is None or asked is None:
            return
        self._observe(asked)
        if self._metrics is not None:
            self._metrics.error(int(code))
        status = self._answers.error(msgid, asked, code, message)
        if status >= 500 or code == ErrorCode.UNAUTHORIZED:
            log.warning("%d to %s (%s): %s", status, self.peer, asked.label, message[:300])
        if asked.stream:
            self.listener = None

    def _observe(self, asked: Asked) -> None:
        if self._metrics is not None:
            self._metrics.observe_latency(asked.label, time.monotonic() - asked.began)

    def _stream_head(self, result: Any) -> bytes:
        self.group = result.get("group")
        if self.group is not None:
            self.consumer = self._consumers.add(self)
        return self._events.head(result, self.consumer)

    def reading(self, bytes_: int) -> None:
        self.allowance.reading(bytes_)

    def hold(self, on: bool) -> None:
        self.flow.set(FlowControl.DEFERRED, on)

    def flush(self) -> None:
        """Every answer ready at the head of the order, in one write."""
        out = []
        close = False
        for asked, data in self._answers.due():
            out.append(data)
            if asked.stream and self.listener is not None:
                out.extend(self._events.begin())
            elif asked.close:
                close = True
        if out and not self.closed:
            if self.transport.get_write_buffer_size() > self._config.max_output_buffer:
                log.warning("disconnecting %s: it does not read its answers", self.peer)
                self.closed = True
                self.transport.abort()
                return
            self.transport.write(b"".join(out))
        if (close or (self._eof and not (self._answers or self._requests))) and not self.closed:
            self.closed = True
            self.transport.close()
        if self.inflight <= self._config.max_inflight // 2:
            self.flow.set(FlowControl.BUSY, False)

    # -- what the change feed pushes through ------------------------------------------

    def push(self, data: bytes) -> None:
        if not self.closed and (out := self._events.frames(data)) is not None:
            self.transport.write(out)

    def unsent(self) -> int:
        return self.transport.get_write_buffer_size() + self._events.waiting()

    def blocked(self) -> bool:
        return bool(self.flow.stopped & FlowControl.BLOCKED)

    def end(self, data: bytes) -> None:
        if self.closed:
            return
        self.push(data)
        self.flush()
        self.closed = True
        self.listener = None
        self.transport.close()
        self._cut = asyncio.get_running_loop().call_later(END_SECONDS, self.transport.abort)

    def drain(self) -> None:
        """Stop reading for shutdown; requests already handed on are still answered."""
        self.draining = True
        self._requests.clear()
        self.flow.set(FlowControl.DRAINING, True)
