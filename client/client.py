"""The asyncio client: one connection, many calls in flight, matched by msgid.

Shaped like asyncpg's: a public ``Client`` over a small ``asyncio.Protocol``
that owns one future per request id and fails them all when the connection
drops, so no caller waits forever on a reply that cannot come.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Unpack

from . import requests
from .addresses import Addresses, Hosts
from .connecting import DEFAULT_TIMEOUT as DEFAULT_TIMEOUT
from .connecting import Connecting, ConnectOptions
from .consumer import Consumer, consumer
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    Unavailable,
)
from .faces import AsyncFace, Commands
from .feed import Cursor
from .plans import Options
from .requests import Call
from .subscription import DEAD_AFTER, Subscription
from .transport import ClientProtocol, moved, open_any, request

#: After a dropped connection: this many tries, waiting 0.05 s, then twice as long each time.
RECONNECT_ATTEMPTS = 7
RECONNECT_FIRST_DELAY = 0.05
#: How many times a call that is safe to repeat (a keyed signal) is sent in all.
RETRIES = 4


class _Default(enum.Enum):
    TIMEOUT = enum.auto()


DEFAULT: Final = _Default.TIMEOUT  # "the client's timeout", distinct from None (no timeout)


class Client(AsyncFace, Commands):
    """``async with await Client.connect(host, port) as client: await client.leave(42)``

    After a dropped connection, the next call reconnects (with backoff). Calls in
    flight when it dropped fail with ``ConnectionLost``, except reads and signals
    that carry an idempotency key: those are sent again once reconnected (the
    server counts each key once).
    """

    def __init__(
        self,
        protocol: ClientProtocol,
        dial: Callable[[], Awaitable[ClientProtocol]],
        timeout: float | None,
        auto_keys: bool,
        reconnect: int,
    ) -> None:
        self._protocol = protocol
        self._dial = dial
        self._timeout = timeout
        self.options = Options(auto_keys)
        self._reconnect_attempts = reconnect
        self._closed = False
        self._reconnecting = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        *,
        reconnect: int = RECONNECT_ATTEMPTS,
        **options: Unpack[ConnectOptions],
    ) -> Client:
        """Connect, with ``options`` (``timeout``, ``token``, ``ssl``, ``auto_keys``: see
        ``ConnectOptions``). ``reconnect`` is how many times a call tries to reconnect
        (0.05 s apart, doubling) before ``ConnectionLost``.

        ``host`` may name several servers, an active tidal and its standbys: ``"h1,h2:7412"``
        or ``[("h1", 7411), ("h2", 7411)]``. The client then uses the one whose health is
        ok, and moves to another when its connection drops or it answers as a standby.
        """
        c = Connecting(**options)
        dial = functools.partial(open_any, Addresses(host, port), c.timeout, c.token, c.ssl)
        return cls(await dial(), dial, c.timeout, c.auto_keys, reconnect)

    @property
    def is_closed(self) -> bool:
        """Closed by ``close()``: calls raise ``ConnectionLost`` and do not reconnect."""
        return self._closed

    @property
    def is_connected(self) -> bool:
        """The connection is up now (the next call would reconnect otherwise)."""
        return self._protocol.lost is None

    async def close(self, timeout: float = 5.0) -> None:
        """Close politely; if the server does not let go in ``timeout`` seconds, abort."""
        self._closed = True
        protocol = self._protocol
        if protocol.transport is None or protocol.closed.done():
            return
        protocol.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(protocol.closed), timeout)
        except TimeoutError:
            protocol.transport.abort()
            await protocol.closed

    async def _connection(self) -> ClientProtocol:
        """The live connection, reconnecting first if it dropped."""
        protocol = self._protocol
        if protocol.lost is None:
            return protocol
        if self._closed:
            raise ConnectionLost("the client is closed")
        async with self._reconnecting:  # concurrent callers share one reconnect
            if self._protocol.lost is None:
                return self._protocol
            delay = RECONNECT_FIRST_DELAY
            failure: Exception = self._protocol.lost or ConnectionLost("connection lost")
            for _ in range(self._reconnect_attempts):
                try:
                    self._protocol = await self._dial()
                    return self._protocol
                except (OSError, CallTimeout) as exc:
                    failure = exc
                await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation
                delay *= 2
            raise ConnectFailed(f"could not reconnect: {failure}")

    async def call(
        self, method: str, *params: Any, timeout: float | _Default | None = DEFAULT
    ) -> Any:
        """Send one request and wait for its reply; the raw result, as the server sent it.

        ``timeout`` defaults to the one given to ``connect``; None waits for ever.
        """
        protocol = await self._connection()
        limit = self._timeout if isinstance(timeout, _Default) else timeout
        return await request(protocol, method, list(params), limit)

    async def _send(self, call: Call) -> Any:
        """Send a built call, and again as ``requests.Retries`` says."""
        retries = requests.Retries(call, RETRIES, self._reconnect_attempts, RECONNECT_FIRST_DELAY)
        while True:
            try:
                return await self.call(call.method, *call.params)
            except (ConnectionLost, Unavailable) as exc:
                delay = retries.after(exc, self._closed)
                if delay is None:
                    raise
                if isinstance(exc, Unavailable) and exc.standby:
                    moved(self._protocol)
                if delay:
                    await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation

    def consume(
        self,
        group: str,
        events: Iterable[str] | None = None,
        *,
        dead_after: float | None = DEAD_AFTER,
    ) -> Consumer:
        """A consumer group's share of the feed: ``async for d in client.consume("index")``
        yields ``Delivery`` objects; ``await d.ack()`` once applied. On a connection of its
        own, which reconnects by itself (what was not acknowledged is sent again)."""
        return consumer(self._dial, group, events, timeout=self._timeout,
                        reconnect=self._reconnect_attempts, dead_after=dead_after)  # fmt: skip

    def subscribe(
        self,
        from_id: int | None = None,
        events: Iterable[str] | None = None,
        *,
        dead_after: float | None = DEAD_AFTER,
    ) -> Subscription:
        """The change feed: ``async for event in client.subscribe(): ...``, on a connection
        of its own. ``from_id``: replay the events after it first; ``events``: only these
        ("leave", "rejoin", "purge", "erase", "define_cohort", "drop_cohort"). It resumes
        by itself from the last id it yielded (``FeedGap`` if the server keeps no more);
        ``dead_after`` seconds without a heartbeat, it takes the link for dead."""
        return Subscription(
            self._dial,
            Cursor(from_id, events),
            timeout=self._timeout,
            reconnect=self._reconnect_attempts,
            first_delay=RECONNECT_FIRST_DELAY,
            dead_after=dead_after,
        )
