"""What every connection shares with the server: who applies requests, the metrics,
the set of open connections, and the one switch that holds them all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from tidal.server.core.replies import Replier
from tidal.server.metrics import Metrics

from .dispose import Disposer
from .flow import FlowControl


class Handler(Protocol):
    """What applies requests: the engine, or, while the database loads, a stand-in."""

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None: ...


class Flowing(Protocol):
    """A connection, as the switch sees it (``connection.ServerConnection``)."""

    @property
    def flow(self) -> FlowControl: ...


class Decoding(Protocol):
    """What a connection reads its requests with, as the idle sweep sees it."""

    @property
    def pending(self) -> int: ...

    def rest(self) -> None: ...


class Served(Flowing, Protocol):
    """A connection of either port (MessagePack, or HTTP: ``web.connection``), as the
    server, the idle sweep and the shutdown see it."""

    closed: bool
    inflight: int
    last_active: float
    partial_since: float | None
    listener: Any
    peer: Any

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def conn(self) -> Decoding: ...

    def drain(self) -> None: ...


C = TypeVar("C", bound=Flowing)


@dataclass(eq=False)
class ServerState(Generic[C]):
    handler: Handler
    metrics: Metrics | None
    connections: set[C] = field(default_factory=set)
    #: the engine holds all the uncommitted work it may: no connection applies more
    held: bool = False
    disposer: Disposer = field(default_factory=Disposer)

    def hold(self, on: bool) -> None:
        """Stop, or let go on, every connection: the engine's back-pressure, one switch
        for all, so that memory waiting for a commit stays bounded however many write."""
        if on == self.held:
            return
        self.held = on
        for conn in self.connections:
            conn.flow.set(FlowControl.HELD, on)
