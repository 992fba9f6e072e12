"""A subscription's place in the change feed, sans-I/O: what to ask the server, and what
to make of what it sends. The asyncio and the blocking subscriptions share it.

It resumes from the last id it yielded, so across a reconnect nothing is missed and
what arrives twice is dropped by id. An event it yields follows the one before with no
gap: ids increase by exactly 1 per event, so when every event is asked for, a jump is
an error, never a silent skip.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from tidal.protocol import Notification
from tidal.protocol.limits import FEED_EVENTS

from .errors import ConnectionLost, FeedGap, InvalidArgument, InvalidParams, closed_by_server
from .types import FeedEvent


class Behind(ConnectionLost):
    """The server closed the subscription for lagging: resume where it stopped."""


class Cursor:
    def __init__(self, from_id: int | None, events: Iterable[str] | None) -> None:
        if from_id is not None and (type(from_id) is not int or from_id < 0):
            raise InvalidArgument(f"from_id: must be an event id, an integer >= 0, not {from_id!r}")
        names = None if events is None else list(events)
        if names is not None:
            unknown = [n for n in names if n not in FEED_EVENTS]
            if unknown or not names:
                raise InvalidArgument(
                    f"events: {', '.join(map(repr, unknown)) or 'none given'}; each one of"
                    f" {', '.join(FEED_EVENTS)}"
                )
        self.last = from_id  # the last id yielded (or the one to start after)
        self.events = names

    def params(self) -> list[Any]:
        """``subscribe``'s params: from the last id yielded, once there is one."""
        options: dict[str, Any] = {}
        if self.last is not None:
            options["from"] = self.last
        if self.events is not None:
            options["events"] = self.events
        return [options]

    def started(self, reply: Any) -> None:
        if self.last is None:
            self.last = int(reply["last_id"])

    def refused(self, exc: InvalidParams) -> InvalidParams:
        """A ``from`` too old for what the server keeps (``data.oldest``) is a gap this
        cannot fill."""
        oldest = exc.data.get("oldest")
        if isinstance(exc, FeedGap) or type(oldest) is not int:
            return exc
        return FeedGap(exc.message, oldest)

    def take(self, method: str, params: Any) -> FeedEvent | None:
        """The event to yield, or None (a heartbeat, an event yielded already). Raises
        ``Behind`` or ``ConnectionLost`` when the server closes the subscription."""
        if method == "event":
            event = FeedEvent.from_wire(params[0])
            last = self.last
            if last is not None and event.id <= last:
                return None  # sent again after a reconnect: yielded already
            if last is not None and self.events is None and event.id != last + 1:
                raise FeedGap(f"the change feed went from event {last} to {event.id}")
            self.last = event.id
            return event
        if method == "lagging":
            raise Behind(f"closed by the server for lagging: {params!r}")
        if method == "error":
            raise closed_by_server(params)
        return None  # a heartbeat: the link is alive

    def next_in(self, inbox: deque[Notification]) -> FeedEvent | None:
        """The next event to yield from what has arrived, or None once nothing is left
        but heartbeats and repeats; raises as ``take`` does (the rest is not wanted: the
        subscription resumes after the last id yielded)."""
        while inbox:
            note = inbox.popleft()
            event = self.take(note.method, note.params)
            if event is not None:
                return event
        return None
