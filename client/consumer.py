"""A consumer group's share of the feed for the asyncio client: ``async for d in
client.consume("index")``, a ``Delivery`` each (``groupfeed``), ``await d.ack()`` once
applied. It is the feed's subscription, driven by a group's cursor."""

from __future__ import annotations

from typing import cast

from .groupfeed import Delivery
from .subscription import Subscription


class Consumer(Subscription):
    async def __anext__(self) -> Delivery:  # type: ignore[override]
        return cast(Delivery, await super().__anext__())

    def __aiter__(self) -> Consumer:
        return self
