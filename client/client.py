"""The asyncio client: one connection, many calls in flight, matched by msgid.

Shaped like asyncpg's: a public ``Client`` over a small ``asyncio.Protocol``
that owns one future per request id and fails them all when the connection
drops, so no caller waits forever on a reply that cannot come.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final

from . import requests
from .addresses import Addresses, Hosts
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    Unavailable,
)
from .feed import Cursor
from .requests import Call
from .subscription import DEAD_AFTER, Subscription
from .transport import ClientProtocol, moved, open_any, request
from .types import (
    Counts,
    Event,
    LeftUsers,
    Membership,
    Scalar,
    Signal,
    SignalAck,
    Top,
    Withdrawn,
)

DEFAULT_TIMEOUT = 30.0
#: After a dropped connection: this many tries, waiting 0.05 s, then twice as long each time.
RECONNECT_ATTEMPTS = 7
RECONNECT_FIRST_DELAY = 0.05
#: How many times a call that is safe to repeat (a keyed signal) is sent in all.
RETRIES = 4


class _Default(enum.Enum):
    TIMEOUT = enum.auto()


DEFAULT: Final = _Default.TIMEOUT  # "the client's timeout", distinct from None (no timeout)


class Client:
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
        self._auto_keys = auto_keys
        self._reconnect_attempts = reconnect
        self._closed = False
        self._reconnecting = asyncio.Lock()

    @classmethod
    async def connect(
        cls,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        auto_keys: bool = False,
        reconnect: int = RECONNECT_ATTEMPTS,
    ) -> Client:
        """Connect; ``timeout`` bounds the connect and is each call's default timeout.

        With ``token``, the connection authenticates first (``Unauthorized`` if refused).
        With ``ssl`` (e.g. ``ssl.create_default_context(cafile=...)``), it speaks TLS.
        With ``auto_keys``, every signal gets an idempotency key, so that every signal
        in flight when a connection drops is retried safely. ``reconnect`` is how many
        times a call tries to reconnect (0.05 s apart, doubling) before ``ConnectionLost``.

        ``host`` may name several servers, an active tidal and its standbys: ``"h1,h2:7412"``
        or ``[("h1", 7411), ("h2", 7411)]``. The client then uses the one whose health is
        ok, and moves to another when its connection drops or it answers as a standby.
        """
        dial = functools.partial(open_any, Addresses(host, port), timeout, token, ssl)
        return cls(await dial(), dial, timeout, auto_keys, reconnect)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

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

    # -- one method per RPC ----------------------------------------------

    async def ping(self) -> str:
        result: str = await self._send(requests.read("ping"))
        return result

    async def signal(
        self,
        user_id: int,
        entity: str,
        kind: str,
        weight: float = 1.0,
        *,
        communities: Iterable[str] | None = None,
        attrs: Mapping[str, Scalar] | None = None,
        key: str | None = None,
        at_ns: int | None = None,
    ) -> SignalAck:
        """``key`` (1..64 bytes) makes the signal idempotent: a repeat within the
        server's window gets the first acknowledgement and is counted once."""
        key = requests.key_for(key, self._auto_keys)
        call = requests.signal(user_id, entity, kind, weight, communities, attrs, key, at_ns)
        return SignalAck.from_wire(await self._send(call))

    async def signal_batch(self, signals: Iterable[Signal]) -> list[SignalAck]:
        call = requests.signal_batch(signals, self._auto_keys)
        return SignalAck.from_compact(await self._send(call), len(call.params[0]))

    async def leave(self, user_id: int, *, purge: bool = False) -> Membership:
        """With ``purge``, the user's past leaves the cohorts and communities in the same
        step: no read sees them Left with it still counted (``purge`` says how much went)."""
        return Membership.from_wire(await self._send(requests.leave(user_id, purge)))

    async def rejoin(self, user_id: int) -> Membership:
        return Membership.from_wire(await self._send(requests.of_user("rejoin", user_id)))

    async def purge(self, user_id: int) -> Withdrawn:
        """Withdraw the user's signals so far from every cohort and community (the ledger
        keeps counting them); their status does not change."""
        return Withdrawn.from_wire(await self._send(requests.of_user("purge", user_id)))

    async def erase(self, user_id: int) -> Withdrawn:
        """Delete the user's ledger rows and all they added, forget their idempotency
        keys, and leave them Left, so that a stale client's later signals are gated."""
        return Withdrawn.from_wire(await self._send(requests.of_user("erase", user_id)))

    async def history(self, user_id: int, limit: int = 100, after_ns: int = 0) -> list[Event]:
        """The user's leaves, rejoins, purges and erasures after ``after_ns``, oldest first."""
        lines = await self._send(requests.history(user_id, limit, after_ns))
        return [Event.from_wire(line) for line in lines]

    async def left_users(self, after: int | None = None, limit: int = 1000) -> LeftUsers:
        """One page of Left users in user_id order, past ``after``."""
        return LeftUsers.from_wire(await self._send(requests.left_users(after, limit)))

    async def status(self, user_id: int) -> Membership:
        return Membership.from_wire(await self._send(requests.status(user_id)))

    async def define_cohort(self, name: str, predicate: dict[str, Any]) -> bool:
        return bool(await self._send(Call("define_cohort", [name, predicate])))

    async def drop_cohort(self, name: str) -> bool:
        return bool(await self._send(Call("drop_cohort", [name])))

    async def cohorts(self) -> dict[str, dict[str, Any]]:
        """Every cohort, read in pages that each fit a message."""
        return await self._pages("cohorts", None, requests.read("cohorts", {}))

    async def counts(self, entity: str, window: str | None = None) -> Counts:
        """An entity's aggregates, all of them: a busy entity's are read in pages. With
        ``window`` ("1h", "24h", "7d", "30d"), only signals whose event time is in it."""
        page = None if window is None else {"window": window}
        return Counts.from_wire(
            await self._pages("counts", entity, requests.counts(entity, window), page)
        )

    async def top(
        self,
        layer: str,
        name: str | None,
        kind: str,
        *,
        by: str = "count",
        window: str | None = None,
        half_life: str | None = None,
        limit: int = 10,
        after: bytes | None = None,
    ) -> Top:
        """The ``limit`` entities with the highest score in one layer ("ledger",
        "cohort", "community"; ``name`` the cohort's or community's, None for the
        ledger): by "count", "weight" or "trend" (decayed by ``half_life``). More than
        one page's worth is read a page at a time; ``after`` reads on from a ``next``."""
        options = {"by": by, "window": window, "half_life": half_life, "after": after}
        pages = requests.TopPages(layer, name, kind, options, limit)
        call: Call | None = pages.call()
        while call is not None:
            call = pages.took(await self._send(call))
        return Top.from_wire(pages.entities, pages.next, pages.as_of_ns)

    async def _pages(
        self, method: str, first: Any, call: Call | None, page: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        into: dict[str, Any] = {}
        while call is not None:
            call = requests.next_page(method, first, await self._send(call), into, page)
        return into

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

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._send(requests.read("stats"))
        return result

    async def health(self) -> dict[str, Any]:
        """``{"status": "ok" | "starting" | "failing", "storage": ..., "error"?: ...}``"""
        result: dict[str, Any] = await self._send(requests.read("health"))
        return result
