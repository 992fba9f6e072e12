"""One connection as the asyncio client holds it: a small ``asyncio.Protocol`` that
owns one future per request id, and fails them all when the connection drops, so
no caller waits forever on a reply that cannot come."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Callable
from typing import Any, cast

from tidal.protocol import (
    NEED_DATA,
    Connection,
    LocalProtocolError,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
)

from .addresses import Addresses, Choice
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    ServerError,
    closed_by_server,
    from_wire,
    unsendable,
)

log = logging.getLogger("tidal.client")


class ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.conn = Connection()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_msgid = 0
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        #: given the server's notifications (a subscription's), and None once it is lost
        self.notified: Callable[[Notification | None], None] | None = None

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
                elif type(event) is Notification:
                    if event.method == "error":
                        # the server says why it is about to close: the calls it ends say so
                        self.lost = closed_by_server(event.params)
                        log.warning("%s", self.lost)
                    if self.notified is not None:
                        self.notified(event)
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
        if self.notified is not None:
            self.notified(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()


async def request(
    protocol: ClientProtocol, method: str, params: list[Any], timeout: float | None
) -> Any:
    if protocol.lost is not None:
        raise protocol.lost
    assert protocol.transport is not None
    msgid = protocol.next_msgid
    protocol.next_msgid = (msgid + 1) & 0xFFFFFFFF
    try:
        data = protocol.conn.send(Request(msgid, method, params))
    except LocalProtocolError as exc:
        raise unsendable(exc) from None
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    protocol.pending[msgid] = future
    protocol.transport.write(data)
    await protocol.drain()
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        protocol.pending.pop(msgid, None)
        raise CallTimeout(f"{method}: no reply in {timeout}s") from None


async def open_connection(
    host: str,
    port: int,
    timeout: float | None,
    token: str | None,
    ssl: ssl_module.SSLContext | None,
) -> ClientProtocol:
    """A new connection, authenticated when there is a token: each client's first, every
    reconnect, and each change feed subscription's."""
    loop = asyncio.get_running_loop()
    try:
        _, protocol = await asyncio.wait_for(
            loop.create_connection(ClientProtocol, host, port, ssl=ssl), timeout
        )
    except TimeoutError:
        raise CallTimeout(f"could not connect to {host}:{port} in {timeout}s") from None
    except OSError as exc:
        raise ConnectFailed(f"could not connect to {host}:{port}: {exc}") from exc
    if token is not None:
        try:
            await request(protocol, "auth", [token], timeout)
        except BaseException:
            close_transport(protocol)
            raise
    return protocol


async def open_any(
    addresses: Addresses,
    timeout: float | None,
    token: str | None,
    ssl: ssl_module.SSLContext | None,
) -> ClientProtocol:
    """A connection to the server that is serving: with one address, that one; with
    several, the one whose ``health`` is ok (``addresses.Choice``)."""
    if not addresses.several:
        return await open_connection(*addresses.all[0], timeout, token, ssl)
    choice = Choice(addresses)
    held: ClientProtocol | None = None
    for address in addresses.rotation():
        try:  # a refused token is raised: it is this client's mistake, not a server's state
            protocol = await open_connection(*address, timeout, token, ssl)
        except (OSError, CallTimeout) as exc:
            choice.failed(address, exc)
            continue
        try:
            health = await request(protocol, "health", [], timeout)
        except (OSError, CallTimeout, ServerError) as exc:
            close_transport(protocol)
            choice.failed(address, exc)
            continue
        verdict = choice.answered(address, health)
        if verdict == "use":
            if held is not None:
                close_transport(held)
            return protocol
        if verdict == "hold":
            held = protocol
        else:
            close_transport(protocol)
    if held is not None:
        return held
    raise choice.none()


def moved(protocol: ClientProtocol) -> None:
    """The server is a standby: drop the connection, so that the next call dials again."""
    close_transport(protocol)
    if protocol.lost is None:
        protocol.lost = ConnectionLost("the server is a standby")


def close_transport(protocol: ClientProtocol) -> None:
    if protocol.transport is not None:
        protocol.transport.close()
