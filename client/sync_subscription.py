"""The change feed for the blocking client: ``for event in tidal.subscribe(): ...``.

The same rules as the asyncio ``Subscription`` (``feed.Following`` holds them), on a
socket of its own, iterated by one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from .blocking import Link
from .closing import Closing
from .errors import CallTimeout, ConnectionLost
from .feed import CLOSED, Cursor, Following
from .types import FeedEvent


class SyncSubscription(Following, Closing):
    def __init__(self, link: Callable[[], Link], cursor: Cursor, *, timeout: float | None,
                 reconnect: int, first_delay: float, dead_after: float | None) -> None:  # fmt: skip
        super().__init__(cursor, timeout=timeout, reconnect=reconnect, first_delay=first_delay,
                         dead_after=dead_after)  # fmt: skip
        self._new_link = link
        self._link: Link | None = None

    def __iter__(self) -> SyncSubscription:
        return self

    def __next__(self) -> FeedEvent:
        while True:
            got = self.ready()
            if got is CLOSED:
                raise StopIteration
            if got is not None:
                return cast(FeedEvent, got)
            link = self._link
            if link is None or link.sock is None:
                self._connect()
                continue
            try:
                self._inbox.extend(link.notifications(self._dead_after))
            except CallTimeout:
                self.silent()
            except ConnectionLost:
                self._drop()

    def _connect(self) -> None:
        """Subscribe on a new link, from the last id yielded (``Following.tries``)."""
        tries = self.tries()
        delay = next(tries)
        while delay is not None:
            time.sleep(delay)  # backoff: this client blocks by design
            delay = tries.send(None if self._closed else self._subscribe())

    def _subscribe(self) -> BaseException | None:
        """One try: a link, and the subscription on it; what failed, if anything."""
        link = self._new_link()
        try:
            link.dial()
            params = self._cursor.params()
            reply = link.roundtrip("subscribe", params, self._timeout, self._inbox.append)
        except BaseException as exc:
            link.drop()
            return exc
        self._cursor.started(reply)
        self._link = link
        return None

    def _drop(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.drop()

    def call(self, method: str, params: list[Any]) -> Any:
        """A request on this subscription's own socket (a group's ``ack``)."""
        link = self._link
        if link is None or link.sock is None:
            raise ConnectionLost("this consumer's connection is gone: the event is sent again")
        try:
            return link.roundtrip(method, params, self._timeout, self._inbox.append)
        except ConnectionLost:
            self._drop()
            raise

    def close(self) -> None:
        self._closed = True
        self._drop()
