"""The asyncio client: one connection, many calls in flight, matched by msgid.

Shaped like asyncpg's: a public ``Client`` over a small ``asyncio.Protocol``
that owns one future per request id and fails them all when the connection
drops, so no caller waits forever on a reply that cannot come.
"""

from __future__ import annotations

import asyncio
import enum
import ssl as ssl_module
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Final, cast

from tidal.protocol import (
    NEED_DATA,
    Connection,
    RemoteProtocolError,
    Request,
    Response,
)
from tidal.protocol.limits import USER_ID_MAX

from .errors import CallTimeout, ConnectionLost, from_wire
from .types import Counts, Membership, Scalar, Signal, SignalAck, _context

DEFAULT_TIMEOUT = 30.0


class _Default(enum.Enum):
    TIMEOUT = enum.auto()


DEFAULT: Final = _Default.TIMEOUT  # "the client's timeout", distinct from None (no timeout)


class _ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.conn = Connection()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.conn.receive_data(data)
            while (event := self.conn.next_event()) is not NEED_DATA:
                if type(event) is Response:
                    future = self.pending.pop(event.msgid, None)
                    if future is None or future.done():
                        continue  # the caller timed out and moved on
                    if event.error is None:
                        future.set_result(event.result)
                    else:
                        future.set_exception(from_wire(event.error))
        except RemoteProtocolError as exc:
            self.lost = ConnectionLost(f"the server sent something unreadable: {exc}")
            assert self.transport is not None
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            reason = f": {exc}" if exc else ""
            self.lost = ConnectionLost(f"connection lost{reason}")
        for future in self.pending.values():
            if not future.done():
                future.set_exception(self.lost)
        self.pending.clear()
        self._writable.set()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()


class Client:
    """``async with await Client.connect(host, port) as client: await client.leave(42)``"""

    def __init__(self, protocol: _ClientProtocol, timeout: float | None) -> None:
        self._protocol = protocol
        self._timeout = timeout
        self._next_msgid = 0

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = 7411,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> Client:
        """Connect; ``timeout`` bounds the connect and is each call's default timeout.

        With ``token``, the connection authenticates first (``Unauthorized`` if refused).
        With ``ssl`` (e.g. ``ssl.create_default_context(cafile=...)``), it speaks TLS.
        """
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_ClientProtocol, host, port, ssl=ssl), timeout
            )
        except TimeoutError:
            raise CallTimeout(f"could not connect to {host}:{port} in {timeout}s") from None
        client = cls(protocol, timeout)
        if token is not None:
            try:
                await client.call("auth", token)
            except BaseException:
                await client.close()
                raise
        return client

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
        return self._protocol.lost is not None

    async def close(self, timeout: float = 5.0) -> None:
        """Close politely; if the server does not let go in ``timeout`` seconds, abort."""
        transport = self._protocol.transport
        if transport is None or self._protocol.closed.done():
            return
        transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._protocol.closed), timeout)
        except TimeoutError:
            transport.abort()
            await self._protocol.closed

    async def call(
        self, method: str, *params: Any, timeout: float | _Default | None = DEFAULT
    ) -> Any:
        """Send one request and wait for its reply; the raw result, as the server sent it.

        ``timeout`` defaults to the one given to ``connect``; None waits for ever.
        """
        protocol = self._protocol
        if protocol.lost is not None:
            raise protocol.lost
        assert protocol.transport is not None
        msgid = self._next_msgid
        self._next_msgid = (msgid + 1) & 0xFFFFFFFF
        data = protocol.conn.send(Request(msgid, method, list(params)))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        protocol.pending[msgid] = future
        protocol.transport.write(data)
        await protocol.drain()
        limit = self._timeout if isinstance(timeout, _Default) else timeout
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError:
            protocol.pending.pop(msgid, None)
            raise CallTimeout(f"{method}: no reply in {limit}s") from None

    # -- one method per RPC ----------------------------------------------

    async def ping(self) -> str:
        result: str = await self.call("ping")
        return result

    async def signal(
        self,
        user_id: int,
        entity: str,
        kind: str,
        weight: float = 1.0,
        *,
        communities: Iterable[str] | None = None,
        attrs: dict[str, Scalar] | None = None,
    ) -> SignalAck:
        params: list[Any] = [_user_id(user_id), entity, kind, weight]
        context = _context(list(communities) if communities else None, attrs)
        if context:
            params.append(context)
        return SignalAck.from_wire(await self.call("signal", *params))

    async def signal_batch(self, signals: Iterable[Signal]) -> list[SignalAck]:
        items = []
        for item in signals:
            _user_id(item.user_id)
            items.append(item.wire())
        return [SignalAck.from_wire(a) for a in await self.call("signal_batch", items)]

    async def leave(self, user_id: int) -> Membership:
        return Membership.from_wire(await self.call("leave", _user_id(user_id)))

    async def rejoin(self, user_id: int) -> Membership:
        return Membership.from_wire(await self.call("rejoin", _user_id(user_id)))

    async def status(self, user_id: int) -> Membership:
        return Membership.from_wire(await self.call("status", _user_id(user_id)))

    async def define_cohort(self, name: str, predicate: dict[str, Any]) -> bool:
        return bool(await self.call("define_cohort", name, predicate))

    async def drop_cohort(self, name: str) -> bool:
        return bool(await self.call("drop_cohort", name))

    async def cohorts(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = await self.call("cohorts")
        return result

    async def counts(self, entity: str) -> Counts:
        return Counts.from_wire(await self.call("counts", entity))

    async def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("stats")
        return result


def _user_id(value: int) -> int:
    """Refuse here what MessagePack could not carry, before anything is sent."""
    if type(value) is not int or not 0 <= value <= USER_ID_MAX:
        raise ValueError(f"user_id: must be an integer in 0..2**64-1, got {value!r}")
    return value
