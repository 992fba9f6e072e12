"""A subscription's place in the change feed, sans-I/O: what to ask the server, and what
to make of what it sends. The asyncio and the blocking subscriptions share it.

It resumes from the last id it yielded, so across a reconnect nothing is missed and
what arrives twice is dropped by id. An event it yields follows the one before with no
gap: ids increase by exactly 1 per event, so when every event is asked for, a jump is
an error, never a silent skip.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Final

from tidal.protocol import Notification
from tidal.protocol.limits import FEED_EVENTS

from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    FeedGap,
    InvalidArgument,
    InvalidParams,
    Moved,
    Unavailable,
    closed_by_server,
)
from .types import FeedEvent

log = logging.getLogger("tidal.client")


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


#: ``Following.ready``: the subscription was closed, the iteration ends
CLOSED: Final = object()
#: heartbeats come every 5 s by default: this long without one, the link is taken for dead
DEAD_AFTER = 30.0


class Following:
    """What the asyncio and the blocking subscriptions share: where the feed stands, what
    has arrived, when to try again, and what a failed ``subscribe`` means. Each adds only
    how it waits and how it sends (its transport)."""

    def __init__(self, cursor: Cursor, *, timeout: float | None, reconnect: int,
                 first_delay: float, dead_after: float | None) -> None:  # fmt: skip
        self._cursor = cursor
        self._timeout = timeout
        self._attempts = reconnect
        self._first_delay = first_delay
        self._dead_after = dead_after
        self._inbox: deque[Notification] = deque()
        self._closed = False

    @property
    def last_id(self) -> int | None:
        """The id of the last event yielded (before the first: where it starts after)."""
        return self._cursor.last

    def _drop(self) -> None:
        raise NotImplementedError

    def ready(self) -> FeedEvent | object | None:
        """The next event that has arrived, ``CLOSED``, or None: wait for more, or
        (re)subscribe. A close for lagging drops the link: it resumes where it is."""
        try:
            event = self._cursor.next_in(self._inbox)
        except ConnectionLost as exc:  # lagging, or closed: resume where we are
            log.info("change feed: %s; resuming after event %s", exc, self.last_id)
            self._drop()
        else:
            if event is not None:
                return event
        return CLOSED if self._closed else None

    def silent(self) -> None:
        """Nothing came for ``dead_after`` seconds, not even a heartbeat: the link is dead."""
        log.warning("change feed: nothing for %ss, not even a heartbeat", self._dead_after)
        self._drop()

    def tries(self) -> Generator[float | None, BaseException | None, None]:
        """The reconnect loop, written once for both faces, as a plan is for both backends:
        it yields the pause before each try to subscribe, is sent how that try went (None:
        subscribed, or closed meanwhile), and then yields None, done. It raises what ends
        the subscription: a failure no try can mend (``failed``), or the last try's."""
        failure: BaseException | None = None
        for delay in self.delays():
            outcome = yield delay
            if outcome is None:
                break
            if (stop := self.failed(outcome)) is not None:
                raise stop from None
            failure = outcome
        else:
            raise self.gave_up(failure)
        yield None

    def delays(self) -> Iterator[float]:
        """Before each try to subscribe: 0, then the first delay, doubling."""
        delay = self._first_delay
        for attempt in range(self._attempts + 1):
            yield delay if attempt else 0.0
            if attempt:
                delay *= 2

    def failed(self, exc: BaseException) -> BaseException | None:
        """A try to subscribe failed with ``exc``: what to raise (a gap this cannot fill,
        or no passing failure), or None to try again (a restart, a boot, a lost link)."""
        if isinstance(exc, InvalidParams):
            return self._cursor.refused(exc)
        if isinstance(exc, (OSError, ConnectionLost, CallTimeout, Unavailable, Moved)):
            return None  # a cluster's consumer dials the groups' node anew (``moved``)
        return exc

    @staticmethod
    def gave_up(failure: BaseException | None) -> ConnectFailed:
        return ConnectFailed(f"the change feed could not resubscribe: {failure}")
