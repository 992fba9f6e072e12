"""The change feed for the blocking client: ``for event in tidal.subscribe(): ...``.

The same rules as the asyncio ``Subscription`` (``feed.Cursor`` holds them), on a
socket of its own, iterated by one thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

from tidal.protocol import Notification

from .blocking import Link
from .errors import CallTimeout, ConnectFailed, ConnectionLost, InvalidParams, Unavailable
from .feed import Cursor
from .types import FeedEvent

log = logging.getLogger("tidal.client")


class SyncSubscription:
    def __init__(
        self,
        link: Callable[[], Link],
        cursor: Cursor,
        *,
        timeout: float | None,
        reconnect: int,
        first_delay: float,
        dead_after: float | None,
    ) -> None:
        self._new_link = link
        self._cursor = cursor
        self._timeout = timeout
        self._attempts = reconnect
        self._first_delay = first_delay
        self._dead_after = dead_after
        self._link: Link | None = None
        self._inbox: deque[Notification] = deque()
        self._closed = False

    @property
    def last_id(self) -> int | None:
        """The id of the last event yielded (before the first: where it starts after)."""
        return self._cursor.last

    def __iter__(self) -> SyncSubscription:
        return self

    def __next__(self) -> FeedEvent:
        while True:
            try:
                event = self._cursor.next_in(self._inbox)
            except ConnectionLost as exc:  # lagging, or closed: resume where we are
                log.info("change feed: %s; resuming after event %s", exc, self.last_id)
                self._drop()
            else:
                if event is not None:
                    return event
            if self._closed:
                raise StopIteration
            link = self._link
            if link is None or link.sock is None:
                self._connect()
                continue
            try:
                self._inbox.extend(link.notifications(self._dead_after))
            except CallTimeout:
                log.warning("change feed: nothing for %ss, not even a heartbeat", self._dead_after)
                self._drop()
            except ConnectionLost:
                self._drop()

    def _connect(self) -> None:
        delay = self._first_delay
        failure: Exception | None = None
        for attempt in range(self._attempts + 1):
            if attempt:
                time.sleep(delay)  # backoff: this client blocks by design
                delay *= 2
            link = self._new_link()
            try:
                link.dial()
                reply = link.roundtrip(
                    "subscribe", self._cursor.params(), self._timeout, self._inbox.append
                )
            except InvalidParams as exc:
                link.drop()
                raise self._cursor.refused(exc) from None
            except (OSError, ConnectionLost, CallTimeout, Unavailable) as exc:
                link.drop()
                failure = exc
                continue
            except BaseException:
                link.drop()
                raise
            self._cursor.started(reply)
            self._link = link
            return
        raise ConnectFailed(f"the change feed could not resubscribe: {failure}")

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.drop()

    def close(self) -> None:
        self._closed = True
        self._drop()

    def __enter__(self) -> SyncSubscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
