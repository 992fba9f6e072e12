"""The answers one HTTP connection owes, in the order their requests came: HTTP/1.1
answers pipelined requests in order, while the engine answers a read at once and a
write at its commit. Each is written once it, and every one before it, is ready."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from tidal.protocol import ErrorCode
from tidal.protocol import http_replies as h
from tidal.protocol.errors import bounded
from tidal.protocol.http_requests import RemoteHttpError

from .routes import Shape

log = logging.getLogger("tidal.http")


class Asked:
    """A request handed on and not yet answered: how its answer is written."""

    __slots__ = ("began", "close", "label", "shape", "stream")

    def __init__(
        self, shape: Shape | None, close: bool, label: str, began: float, stream: bool
    ) -> None:
        self.shape = shape  # None: only an error is written (or a stream's head)
        self.close = close  # the connection's last answer
        self.label = label
        self.began = began
        self.stream = stream  # a stream's subscribe: its head, then its events


class Answers:
    def __init__(self) -> None:
        self._asked: dict[int, Asked] = {}
        self._order: deque[int] = deque()  # ids asked, in order: answered in this order
        self._ready: dict[int, bytes] = {}
        self._next_id = 0

    def __bool__(self) -> bool:
        """Whether any answer is still owed."""
        return bool(self._order)

    def begin(self, label: str, shape: Shape | None, close: bool, stream: bool = False) -> int:
        msgid = self._next_id
        self._next_id += 1
        self._order.append(msgid)
        self._asked[msgid] = Asked(shape, close, label, time.monotonic(), stream)
        return msgid

    def get(self, msgid: int | None) -> Asked | None:
        return None if msgid is None else self._asked.get(msgid)

    def ready(self, msgid: int, data: bytes) -> None:
        self._ready[msgid] = data

    def result(self, msgid: int, asked: Asked, value: Any) -> None:
        """``value`` answered to a method: written as its shape says."""
        assert asked.shape is not None
        try:
            status, body, more = asked.shape(value)
        except Exception:
            log.exception("cannot write the answer to %s", asked.label)
            why = "the result could not be encoded"
            status, body, more = h.error_body(ErrorCode.INTERNAL_ERROR, why)
        self._ready[msgid] = h.response(status, body, close=asked.close, more=more)

    def error(self, msgid: int, asked: Asked, code: int, message: str) -> int:
        """An error answered: its status."""
        status, body, more = h.error_body(code, bounded(message))
        self._ready[msgid] = h.response(status, body, close=asked.close, more=more)
        return status

    def unreadable(self, exc: RemoteHttpError) -> None:
        """A request that could not be read whole: its status (413, 431, or 400 for broken
        HTTP) is the last answer, after those before it."""
        msgid = self.begin("http", None, True)
        _, body, more = h.error_body(exc.code, str(exc))
        self._ready[msgid] = h.response(exc.status, body, close=True, more=more)

    def due(self) -> Iterator[tuple[Asked, bytes]]:
        """The answers ready at the head of the order, each taken as it is yielded."""
        while self._order and self._order[0] in self._ready:
            msgid = self._order.popleft()
            yield self._asked.pop(msgid), self._ready.pop(msgid)
