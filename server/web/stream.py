"""The change feed's notifications, as Server-Sent Events.

The feed and the groups push MessagePack notifications (``[2, "event", [event]]``, a
heartbeat, ``lagging``, an ``error`` that ends it) to whatever connection subscribed:
an HTTP stream takes the same bytes and writes each as its frame. An event's ``id:`` is
its event id, so a reconnecting EventSource resumes from it with ``Last-Event-ID``; a
heartbeat is a comment; ``lagging`` and the error that ends a stream are named events
without an id, after which the server closes it.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

from tidal.protocol import error_data
from tidal.protocol import http_replies as h
from tidal.protocol.jsonmap import Mapping, dumps, outward
from tidal.protocol.methods import BY_NAME
from tidal.protocol.schemas import FEED_EVENT

_EVENT: Final = outward(FEED_EVENT)
#: ``subscribe``'s answer, the first event of a stream
SUBSCRIBED: Final = Mapping(BY_NAME["subscribe"])


class Events:
    """A connection's event stream: its head once ``subscribe`` is answered, then each
    push as events; what is pushed before the head is written waits behind it."""

    __slots__ = ("early", "started")

    def __init__(self) -> None:
        self.started = False  # the head is written
        self.early: list[bytes] = []  # events pushed before it

    def head(self, answer: dict[str, Any], consumer: str | None) -> bytes:
        """The stream's head, ``retry``, and its first event: ``subscribed``."""
        hello = SUBSCRIBED.answer(answer)
        if consumer is not None:
            hello["consumer"] = consumer
        started = h.retry(h.RECONNECT_MS) + h.named("subscribed", dumps(hello))
        return h.head(200, None, kind=h.EVENT_STREAM) + started

    def begin(self) -> list[bytes]:
        """The head is written: what waited for it goes next."""
        self.started = True
        early, self.early = self.early, []
        return early

    def frames(self, data: bytes) -> bytes | None:
        """The events of a push, to write now; None if they wait for the head."""
        out = frames(data)
        if self.started:
            return out
        self.early.append(out)
        return None

    def waiting(self) -> int:
        return sum(map(len, self.early))


def as_json(event: dict[str, Any]) -> dict[str, Any]:
    """An event as JSON carries it: its wide integers as strings."""
    assert _EVENT is not None
    out: dict[str, Any] = _EVENT(event)
    return out


def frames(data: bytes) -> bytes:
    """The Server-Sent Events of ``data``, one or more notifications."""
    out = []
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    for _, method, args in unpacker:
        if method == "event":
            event = as_json(args[0])
            if len(args) > 1:  # a group's delivery: its group and how often it went out
                event.update(args[1])
            out.append(h.event(event["id"], event["event"], dumps(event)))
        elif method == "heartbeat":
            out.append(h.comment(f"heartbeat last_id={args[0]['last_id']}"))
        elif method == "lagging":
            sent = {"last_sent": str(args[0]["last_sent"])}
            out.append(h.named("lagging", dumps(sent)))
        else:  # "error": what ends the stream, [code, message]
            code, message = args[0], args[1]
            error = {"code": code, "message": message, "data": error_data(code, message)}
            out.append(h.named("end", dumps({"error": error})))
    return b"".join(out)
