"""A consumer group's share of the feed for the asyncio client: ``async for d in
client.consume("index")``, a ``Delivery`` each (``groupfeed``), ``await d.ack()`` once
applied. It is the feed's subscription, driven by a group's cursor."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Final, cast

from .groupfeed import Delivery, GroupCursor
from .subscription import Subscription
from .transport import ClientProtocol

#: seconds before a consumer's first reconnect, doubling
FIRST_DELAY: Final = 0.05


class Consumer(Subscription):
    async def __anext__(self) -> Delivery:  # type: ignore[override]
        return cast(Delivery, await super().__anext__())

    def __aiter__(self) -> Consumer:
        return self


def consumer(
    dial: Callable[[], Awaitable[ClientProtocol]],
    group: str,
    events: Iterable[str] | None,
    *,
    timeout: float | None,
    reconnect: int,
    dead_after: float | None,
) -> Consumer:
    """A consumer of ``group`` on connections ``dial`` makes: the client's own server, or a
    cluster's node that serves the groups (``ClusterClient.consume``)."""
    cursor = GroupCursor(group, events)
    made = Consumer(dial, cursor, timeout=timeout, reconnect=reconnect, first_delay=FIRST_DELAY,
                    dead_after=dead_after)  # fmt: skip
    cursor.sender = made
    return made
