"""The change feed for the asyncio client: ``async for event in client.subscribe()``.

A subscription holds a connection of its own, so that the client's calls never wait
behind a stream of events. It resumes by itself, from the last id it yielded, after a
dropped connection, a restart of the server or a close for lagging; a gap it cannot
fill (the events after that id are no longer kept) raises ``FeedGap``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType

from tidal.protocol import Notification

from .errors import CallTimeout, ConnectFailed, ConnectionLost, InvalidParams, Unavailable
from .feed import Cursor
from .transport import ClientProtocol, close_transport, request
from .types import FeedEvent

log = logging.getLogger("tidal.client")

#: heartbeats come every 5 s by default: this long without one, the link is taken for dead
DEAD_AFTER = 30.0


class Subscription:
    def __init__(
        self,
        dial: Callable[[], Awaitable[ClientProtocol]],
        cursor: Cursor,
        *,
        timeout: float | None,
        reconnect: int,
        first_delay: float,
        dead_after: float | None,
    ) -> None:
        self._dial = dial
        self._cursor = cursor
        self._timeout = timeout
        self._attempts = reconnect
        self._first_delay = first_delay
        self._dead_after = dead_after
        self._protocol: ClientProtocol | None = None
        self._inbox: deque[Notification] = deque()
        self._arrived = asyncio.Event()
        self._closed = False

    @property
    def last_id(self) -> int | None:
        """The id of the last event yielded (before the first: where it starts after)."""
        return self._cursor.last

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> FeedEvent:
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
                raise StopAsyncIteration
            protocol = self._protocol
            if protocol is None or protocol.lost is not None:
                self._drop()
                await self._connect()
                continue
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), self._dead_after)
            except TimeoutError:
                log.warning("change feed: nothing for %ss, not even a heartbeat", self._dead_after)
                self._drop()

    async def _connect(self) -> None:
        """Subscribe on a new connection, from the last id yielded; with backoff."""
        delay = self._first_delay
        failure: Exception | None = None
        for attempt in range(self._attempts + 1):
            if attempt:
                await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation
                delay *= 2
            if self._closed:
                return
            try:
                protocol = await self._dial()
            except (ConnectionLost, CallTimeout) as exc:
                failure = exc
                continue
            protocol.notified = self._notified
            try:
                reply = await request(protocol, "subscribe", self._cursor.params(), self._timeout)
            except InvalidParams as exc:
                close_transport(protocol)
                raise self._cursor.refused(exc) from None
            except (ConnectionLost, CallTimeout, Unavailable) as exc:  # a restart, a boot
                protocol.notified = None
                close_transport(protocol)
                failure = exc
                continue
            except BaseException:
                close_transport(protocol)
                raise
            self._cursor.started(reply)
            self._protocol = protocol
            return
        raise ConnectFailed(f"the change feed could not resubscribe: {failure}")

    def _notified(self, note: Notification | None) -> None:
        if note is not None:
            self._inbox.append(note)
        self._arrived.set()

    def _drop(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.notified = None
            close_transport(protocol)

    async def close(self) -> None:
        """Stop: the iteration ends, and its connection is closed."""
        self._closed = True
        self._arrived.set()
        self._drop()

    aclose = close  # as an async generator is closed (``contextlib.aclosing``)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
