"""A connection's replies on their way out: gathered until a flush, then into bytes, all
of a flush in one message stream, any reply that cannot be encoded, or is over the
message limit a peer could read, replaced by an error that says so (the others still
go); and each request's time from read to reply, for the metrics."""

from __future__ import annotations

import logging
import time
from typing import Any

from tidal.protocol import (
    RESPONSE,
    Connection,
    ErrorCode,
    LocalProtocolError,
    Notification,
    error_data,
)
from tidal.server.metrics import Metrics

log = logging.getLogger("tidal.connection")


class Outbox:
    def __init__(self, conn: Connection, metrics: Metrics | None) -> None:
        self._conn = conn
        self._metrics = metrics
        self.items: list[list[Any]] = []  # replies not yet written
        self._started: dict[int, tuple[str, float]] = {}  # msgid -> (method, read at)

    def began(self, msgid: int, method: str, now: float) -> None:
        """A request read (metrics on): its reply's latency is observed."""
        self._started[msgid] = (method, now)

    def result(self, msgid: int, result: Any, keep: bool) -> None:
        """``keep``: whether it is written (not if the connection is closed)."""
        if self._metrics is not None:
            self._observe(msgid, self._metrics)
        if keep:
            self.items.append([RESPONSE, msgid, None, result])

    def error(self, msgid: int, code: int, message: str, keep: bool) -> None:
        if self._metrics is not None:
            self._observe(msgid, self._metrics)
            self._metrics.error(int(code))
        if keep:
            self.items.append(
                [RESPONSE, msgid, [int(code), message, error_data(code, message)], None]
            )

    def take(self) -> bytes:
        """Every reply gathered, in one stream of bytes."""
        data = encode(self._conn, self.items)
        self.items = []
        return data

    def _observe(self, msgid: int, metrics: Metrics) -> None:
        started = self._started.pop(msgid, None)
        if started is not None:
            metrics.observe_latency(started[0], time.monotonic() - started[1])


def busy(conn: Connection) -> bytes:
    """What a connection refused at --max-connections is told before it is closed."""
    why = "too many connections; try again later"
    note = [int(ErrorCode.UNAVAILABLE), why, error_data(ErrorCode.UNAVAILABLE, why)]
    return conn.send(Notification("error", note))


def encode(conn: Connection, replies: list[list[Any]]) -> bytes:
    try:
        data = conn.send_responses(replies)
    except LocalProtocolError:
        return _each(conn, replies)
    if len(data) > conn.max_message_size:
        return _each(conn, replies)  # one of them may be over the limit alone
    return data


def _each(conn: Connection, replies: list[list[Any]]) -> bytes:
    parts = []
    limit = conn.max_message_size
    for reply in replies:
        try:
            part = conn.send_responses([reply])
        except LocalProtocolError:
            log.exception("cannot encode the reply to %d", reply[1])
            error = [int(ErrorCode.INTERNAL_ERROR), "the result could not be encoded", {}]
            part = conn.send_responses([[RESPONSE, reply[1], error, None]])
        if len(part) > limit:
            log.error("the reply to %d is %d bytes, over the limit", reply[1], len(part))
            message = f"the result is {len(part)} bytes, over the message limit of {limit}"
            error = [int(ErrorCode.TOO_LARGE), message, {}]
            part = conn.send_responses([[RESPONSE, reply[1], error, None]])
        parts.append(part)
    return b"".join(parts)
