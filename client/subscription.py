"""The change feed for the asyncio client: ``async for event in client.subscribe()``.

A subscription holds a connection of its own, so that the client's calls never wait
behind a stream of events. It resumes by itself, from the last id it yielded, after a
dropped connection, a restart of the server or a close for lagging; a gap it cannot
fill (the events after that id are no longer kept) raises ``FeedGap``. What it shares
with the blocking one is in ``feed.Following``; here is only how it waits and sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from tidal.protocol import Notification

from .closing import AsyncClosing
from .errors import ConnectionLost
from .feed import CLOSED, DEAD_AFTER, Cursor, Following
from .transport import ClientProtocol, close_transport, request
from .types import FeedEvent

__all__ = ["DEAD_AFTER", "Subscription"]


class Subscription(Following, AsyncClosing):
    def __init__(self, dial: Callable[[], Awaitable[ClientProtocol]], cursor: Cursor, *,
                 timeout: float | None, reconnect: int, first_delay: float,
                 dead_after: float | None) -> None:  # fmt: skip
        super().__init__(cursor, timeout=timeout, reconnect=reconnect, first_delay=first_delay,
                         dead_after=dead_after)  # fmt: skip
        self._dial = dial
        self._protocol: ClientProtocol | None = None
        self._arrived = asyncio.Event()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> FeedEvent:
        while True:
            got = self.ready()
            if got is CLOSED:
                raise StopAsyncIteration
            if got is not None:
                return cast(FeedEvent, got)
            protocol = self._protocol
            if protocol is None or protocol.lost is not None:
                self._drop()
                await self._connect()
                continue
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), self._dead_after)
            except TimeoutError:
                self.silent()

    async def _connect(self) -> None:
        """Subscribe on a new connection, from the last id yielded (``Following.tries``)."""
        tries = self.tries()
        delay = next(tries)
        while delay is not None:
            await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation
            delay = tries.send(None if self._closed else await self._subscribe())

    async def _subscribe(self) -> BaseException | None:
        """One try: a connection, and the subscription on it; what failed, if anything."""
        protocol: ClientProtocol | None = None
        try:
            protocol = await self._dial()
            protocol.notified = self._notified
            reply = await request(protocol, "subscribe", self._cursor.params(), self._timeout)
        except BaseException as exc:
            if protocol is not None:
                protocol.notified = None
                close_transport(protocol)
            return exc
        self._cursor.started(reply)
        self._protocol = protocol
        return None

    def _notified(self, note: Notification | None) -> None:
        if note is not None:
            self._inbox.append(note)
        self._arrived.set()

    def _drop(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.notified = None
            close_transport(protocol)

    async def call(self, method: str, params: list[Any]) -> Any:
        """A request on this subscription's own connection (a group's ``ack``, which only
        the connection an event was delivered on may send)."""
        protocol = self._protocol
        if protocol is None or protocol.lost is not None:
            raise ConnectionLost("this consumer's connection is gone: the event is sent again")
        return await request(protocol, method, params, self._timeout)

    async def close(self) -> None:
        """Stop: the iteration ends, and its connection is closed."""
        self._closed = True
        self._arrived.set()
        self._drop()

    aclose = close  # as an async generator is closed (``contextlib.aclosing``)
