"""A client of a cluster (``tidal serve --cluster``): each request about a user goes to
the node serving the user's partition; the others go to any node.

It reads ``partition_map`` from a node it is given, keeps a ``Client`` per node it
talks to, and follows ``moved``: a node that no longer serves a partition names the one
that does (or none yet), and the request goes there. ``signal_batch`` is split by node:
each part is one ``signal_batch`` and one durable unit on its node, sent side by side.
A part refused after others were acknowledged raises ``PartlyApplied``, which says
which signals were acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl as ssl_module
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

from .addresses import Hosts
from .client import DEFAULT_TIMEOUT, Client
from .errors import ConnectionLost, Moved, TidalError, Unavailable
from .routing import Router, address
from .types import Counts, Event, LeftUsers, Membership, Signal, SignalAck, Top

T = TypeVar("T")
#: a request follows ``moved`` this many times before the error is the caller's
MOVES: Final = 8
#: a node's client tries to reconnect once: a node gone is left for the map's next owner
#: (taken over within a tick of the cluster's), not waited for
NODE_RECONNECTS: Final = 1
#: seconds between tries while a partition is between owners (``moved`` to no node)
BETWEEN_OWNERS: Final = 0.1


class PartlyApplied(TidalError):
    """Some parts of a split ``signal_batch`` were acknowledged, and another failed:
    ``acks`` has the acknowledgement of each signal that was (None for the others), and
    ``error`` is the first part's failure. Sending the rest again (with keys) is safe."""

    def __init__(self, acks: list[SignalAck | None], error: BaseException) -> None:
        done = sum(ack is not None for ack in acks)
        super().__init__(f"{done} of {len(acks)} signals acknowledged; the rest failed: {error}")
        self.acks = acks
        self.error = error


class ClusterClient:
    """``async with await ClusterClient.connect("h1:7411,h2:7411") as c: await c.leave(42)``"""

    def __init__(self, first: Client, router: Router, options: dict[str, Any]) -> None:
        self._any = first
        self.router = router
        self._options = options
        self._nodes: dict[str, Client] = {}
        self._dialing: dict[str, asyncio.Lock] = {}

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
    ) -> ClusterClient:
        """``host`` names one node or several (``Client.connect``'s forms); the others are
        found from the partition map, each connected to when first needed."""
        options: dict[str, Any] = {
            "timeout": timeout, "token": token, "ssl": ssl, "auto_keys": auto_keys,
        }  # fmt: skip
        first = await Client.connect(host, port, **options)
        try:
            router = Router(await first.call("partition_map"))
        except BaseException:
            await first.close()
            raise
        return cls(first, router, options)

    async def __aenter__(self) -> ClusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(self._any.close(), *(c.close() for c in self._nodes.values()))

    async def refresh(self) -> None:
        """Read the partition map again."""
        self.router = Router(await self._any.call("partition_map"))

    async def node(self, owner: str | None) -> Client:
        """The client of the node ``owner`` (any node's for None)."""
        if owner is None:
            return self._any
        client = self._nodes.get(owner)
        if client is not None:
            return client
        lock = self._dialing.setdefault(owner, asyncio.Lock())
        async with lock:  # concurrent callers share one connection
            client = self._nodes.get(owner)
            if client is None:
                host, port = address(owner)
                client = self._nodes[owner] = await Client.connect(
                    host, port, reconnect=NODE_RECONNECTS, **self._options
                )
        return client

    async def routed(self, user_id: int, call: Callable[[Client], Awaitable[T]]) -> T:
        """``call`` on the node serving ``user_id``, following ``moved``. A node that cannot
        be reached is left for the map's next owner; one lost with the request sent raises
        ``ConnectionLost`` (what became of it is unknown: keyed signals are safe to send
        again), and the map is read again for the next call."""
        for attempt in range(MOVES):
            owner = self.router.owner(user_id)
            try:
                client = await self.node(owner)
            except (ConnectionLost, OSError):
                await self._lost(owner)
                await asyncio.sleep(BETWEEN_OWNERS * (attempt + 1))  # a pace, not a sync
                continue
            try:
                return await call(client)
            except Moved as moved:
                await self._follow(user_id, moved, attempt)
            except Unavailable as exc:
                if not (exc.starting or exc.retry) or attempt + 1 == MOVES:
                    raise  # else nothing was applied: a partition loading, cohorts changing
                await asyncio.sleep(BETWEEN_OWNERS * (attempt + 1))  # a pace, not a sync
            except ConnectionLost:
                await self._lost(owner)
                raise
        return await call(await self.node(self.router.owner(user_id)))

    async def _lost(self, owner: str | None) -> None:
        """A node gone: its client dropped, and the map read again (its partitions are
        taken over within a tick of the cluster's)."""
        client = self._nodes.pop(owner, None) if owner is not None else None
        if client is not None:
            await client.close()
        with contextlib.suppress(TidalError):
            await self.refresh()

    async def _follow(self, user_id: int | None, moved: Moved, attempt: int) -> None:
        """Where ``moved`` says; with no owner yet (or a batch), the map read again."""
        if moved.address is None:  # between owners: the next takes it within a tick
            await asyncio.sleep(BETWEEN_OWNERS * (attempt + 1))  # a pace, not a sync
        if moved.address is None or user_id is None:
            await self.refresh()
        else:
            self.router.moved(user_id, moved.address)

    # -- one user's requests: to its node -----------------------------------

    async def signal(self, user_id: int, entity: str, kind: str, **options: Any) -> SignalAck:
        return await self.routed(user_id, lambda c: c.signal(user_id, entity, kind, **options))

    async def leave(self, user_id: int, *, purge: bool = False) -> Membership:
        return await self.routed(user_id, lambda c: c.leave(user_id, purge=purge))

    async def rejoin(self, user_id: int) -> Membership:
        return await self.routed(user_id, lambda c: c.rejoin(user_id))

    async def status(self, user_id: int) -> Membership:
        return await self.routed(user_id, lambda c: c.status(user_id))

    async def history(self, user_id: int, limit: int = 100, after_ns: int = 0) -> list[Event]:
        return await self.routed(user_id, lambda c: c.history(user_id, limit, after_ns))

    async def signal_batch(self, signals: Iterable[Signal]) -> list[SignalAck]:
        """Split by node; each part one durable unit. ``PartlyApplied`` if a part failed
        after another was acknowledged."""
        items = list(signals)
        acks: list[SignalAck | None] = [None] * len(items)
        groups = self.router.split([s.user_id for s in items])

        async def part(indexes: list[int], attempt: int = 0) -> None:
            split = self.router.split([items[i].user_id for i in indexes])
            if len(split) > 1:  # the map changed since: one part per node again
                parts = [part([indexes[j] for j in ix], attempt) for ix in split.values()]
                await _all(parts)
                return
            client = await self.node(self.router.owner(items[indexes[0]].user_id))
            try:
                sent = await client.signal_batch([items[i] for i in indexes])
            except Moved as moved:
                if attempt + 1 >= MOVES:
                    raise
                await self._follow(None, moved, attempt)
                await part(indexes, attempt + 1)
                return
            for i, ack in zip(indexes, sent, strict=True):
                acks[i] = ack

        results = await asyncio.gather(
            *(part(ix) for ix in groups.values()), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            if all(ack is None for ack in acks):
                raise failed[0]
            raise PartlyApplied(acks, failed[0])
        return [ack for ack in acks if ack is not None]

    # -- the rest: any node ----------------------------------------------------

    async def call(self, method: str, *params: Any) -> Any:
        return await self._any.call(method, *params)

    async def partition_map(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._any.call("partition_map")
        return result

    async def counts(self, entity: str, window: str | None = None) -> Counts:
        return await self._any.counts(entity, window)

    async def top(self, layer: str, name: str | None, kind: str, **options: Any) -> Top:
        return await self._any.top(layer, name, kind, **options)

    async def cohorts(self) -> dict[str, dict[str, Any]]:
        return await self._any.cohorts()

    async def define_cohort(self, name: str, predicate: dict[str, Any]) -> bool:
        return await self._any.define_cohort(name, predicate)

    async def drop_cohort(self, name: str) -> bool:
        return await self._any.drop_cohort(name)

    async def left_users(self, after: int | None = None, limit: int = 1000) -> LeftUsers:
        return await self._any.left_users(after, limit)

    async def health(self) -> dict[str, Any]:
        return await self._any.health()

    async def stats(self) -> dict[str, Any]:
        return await self._any.stats()


async def _all(parts: Sequence[Awaitable[None]]) -> None:
    """Every part runs to its end; then the first failure, if any, is raised."""
    for result in await asyncio.gather(*parts, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
