"""A listening socket, as each of the server's ports takes one: the MessagePack port and
the HTTP edge bind alike, with Nagle's delay off (an answer is one write, sent at once),
and a bind that fails is one line that says why."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from . import host
from .config import Config
from .errors import StartupError


async def listen(
    factory: Callable[[], asyncio.Protocol],
    where: tuple[str, int],
    config: Config,
    tls: ssl.SSLContext | None,
    refusal: str,
) -> asyncio.Server:
    """``refusal``: what a failed bind is reported as, before the system's reason."""
    try:
        server = await asyncio.get_running_loop().create_server(
            factory, *where, reuse_address=True, backlog=config.backlog, ssl=tls,
            ssl_handshake_timeout=10.0 if tls else None,
        )  # fmt: skip
    except OSError as exc:
        raise StartupError(f"{refusal}: {host.why(exc)}") from None
    for sock in server.sockets:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server


def bound(server: asyncio.Server) -> tuple[str, int]:
    """Where ``server`` listens: with port 0, the port the system picked."""
    name, port = server.sockets[0].getsockname()[:2]
    return name, port
