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
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeVar, Unpack

from . import routing
from .addresses import Hosts
from .client import Client
from .connecting import Connecting, ConnectOptions
from .consumer import Consumer, consumer
from .errors import ConnectionLost, TidalError
from .faces import AsyncFace, Commands
from .plans import Options
from .requests import Call
from .routing import GROUPS, Router, address, route
from .subscription import DEAD_AFTER
from .transport import ClientProtocol
from .types import SignalAck

T = TypeVar("T")
#: a node's client tries to reconnect once: a node gone is left for the map's next owner
#: (taken over within a tick of the cluster's), not waited for
NODE_RECONNECTS: Final = 1


class PartlyApplied(TidalError):
    """Some parts of a split ``signal_batch`` were acknowledged, and another failed:
    ``acks`` has the acknowledgement of each signal that was (None for the others), and
    ``error`` is the first part's failure. Sending the rest again (with keys) is safe."""

    def __init__(self, acks: list[SignalAck | None], error: BaseException) -> None:
        done = sum(ack is not None for ack in acks)
        super().__init__(f"{done} of {len(acks)} signals acknowledged; the rest failed: {error}")
        self.acks = acks
        self.error = error


def whole(acks: list[SignalAck | None], failed: list[BaseException]) -> list[SignalAck]:
    """A split batch's acknowledgements, once every part is done: all of them, or the
    first failure (``PartlyApplied`` if another part was acknowledged)."""
    if failed:
        if all(ack is None for ack in acks):
            raise failed[0]
        raise PartlyApplied(acks, failed[0])
    return [ack for ack in acks if ack is not None]


class ClusterClient(AsyncFace, Commands):
    """``async with await ClusterClient.connect("h1:7411,h2:7411") as c: await c.leave(42)``"""

    def __init__(self, first: Client, router: Router, options: ConnectOptions) -> None:
        self.options = Options(options.get("auto_keys", False))
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
        **options: Unpack[ConnectOptions],
    ) -> ClusterClient:
        """``host`` names one node or several (``Client.connect``'s forms); the others are
        found from the partition map, each connected to when first needed, with the same
        ``options`` (``ConnectOptions``)."""
        options = Connecting(**options).options()
        first = await Client.connect(host, port, **options)
        try:
            router = Router(await first.call("partition_map"))
        except BaseException:
            await first.close()
            raise
        return cls(first, router, options)

    async def close(self) -> None:
        await asyncio.gather(self._any.close(), *(c.close() for c in self._nodes.values()))

    def consume(
        self, group: str, events: Iterable[str] | None = None, *,
        dead_after: float | None = DEAD_AFTER,
    ) -> Consumer:  # fmt: skip
        """``Client.consume``, on a connection to the node serving the consumer groups
        (partition 0's), found from the partition map read again at each reconnect: a
        node that lets the groups go ends its consumers with ``moved``."""

        async def dial() -> ClientProtocol:
            with contextlib.suppress(TidalError, OSError):
                await self.refresh()
            return await (await self.node(self.router.serving(GROUPS)))._dial()

        first = self._any
        return consumer(dial, group, events, timeout=first._timeout,
                        reconnect=first._reconnect_attempts, dead_after=dead_after)  # fmt: skip

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
        """``call`` on the node serving ``user_id``, following ``moved`` (``Router.after``).
        A node lost with the request sent raises ``ConnectionLost``, and the map is read
        again for the next call."""
        return await self.at(self.router.part(user_id), call)

    async def at(self, part: int, call: Callable[[Client], Awaitable[T]]) -> T:
        """``call`` on the node serving partition ``part``, following ``moved``."""
        attempt = 0
        while True:
            owner = self.router.serving(part)
            sent = False
            try:
                client = await self.node(owner)
                sent = True
                return await call(client)
            except (TidalError, OSError) as exc:
                if not await self._next(exc, part, attempt, owner, sent):
                    raise
            attempt += 1

    async def _next(
        self, exc: BaseException, part: int | None, attempt: int, owner: str | None, sent: bool
    ) -> bool:
        """The step ``Router.after`` says, taken; False: the caller raises ``exc``."""
        step = self.router.after(exc, part, attempt, sent=sent)
        if step is None:
            if isinstance(exc, ConnectionLost):
                await self._drop(owner, refresh=True)
            return False
        await asyncio.sleep(step.wait)  # a pace, not a synchronisation
        await self._drop(owner if step.drop else None, refresh=step.refresh)
        return True

    async def _drop(self, owner: str | None, *, refresh: bool) -> None:
        """A node gone: its client closed; and the map read again, if asked."""
        client = self._nodes.pop(owner, None) if owner is not None else None
        if client is not None:
            await client.close()
        if refresh:
            with contextlib.suppress(TidalError, OSError):
                await self.refresh()

    # -- each call: to the node of its user, or to any node -----------------

    async def _send(self, call: Call) -> Any:
        """``call`` where the method table routes it (``protocol.methods``)."""
        if call.method == "signal_batch":
            return await self._batch(call)
        where = route(call.method)
        if where == "user":
            user_id: int = call.params[0]
            return await self.routed(user_id, lambda c: c._send(call))
        if where == "groups":
            return await self.at(GROUPS, lambda c: c._send(call))
        return await self._any._send(call)

    async def call(self, method: str, *params: Any) -> Any:
        """One request as given, where the method table routes it; the raw result (a
        ``signal_batch`` goes whole to the node of its first signal's user)."""
        if method == "signal_batch":
            first = routing.first_user(params)
            if first is not None:
                return await self.routed(first, lambda c: c.call(method, *params))
            return await self._any.call(method, *params)
        return await self._send(Call(method, list(params)))

    async def _batch(self, call: Call) -> list[SignalAck]:
        """Split by node, side by side; each part one durable unit. ``PartlyApplied`` if a
        part failed after another was acknowledged."""
        items, options = call.params
        acks: list[SignalAck | None] = [None] * len(items)

        async def part(indexes: list[int]) -> None:
            attempt = 0
            while True:
                split = self.router.split([items[i][0] for i in indexes])
                if len(split) > 1:  # the map changed since: one part per node again
                    await _all([part([indexes[j] for j in ix]) for ix in split.values()])
                    return
                owner = self.router.owner(items[indexes[0]][0])
                sent = False
                try:
                    client = await self.node(owner)
                    sent = True
                    one = Call(
                        "signal_batch", [[items[i] for i in indexes], options], call.repeatable
                    )
                    acked = SignalAck.from_compact(await client._send(one), len(indexes))
                except (TidalError, OSError) as exc:
                    if not await self._next(exc, None, attempt, owner, sent):
                        raise
                    attempt += 1
                    continue
                for i, ack in zip(indexes, acked, strict=True):
                    acks[i] = ack
                return

        groups = self.router.split([item[0] for item in items])
        results = await asyncio.gather(
            *(part(ix) for ix in groups.values()), return_exceptions=True
        )
        return whole(acks, [r for r in results if isinstance(r, BaseException)])


async def _all(parts: Sequence[Awaitable[None]]) -> None:
    """Every part runs to its end; then the first failure, if any, is raised."""
    for result in await asyncio.gather(*parts, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
