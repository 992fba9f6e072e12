"""A consumer group's share of the feed for the blocking client: ``for d in
tidal.consume("index")``, ``d.ack()`` once applied (``groupfeed``)."""

from __future__ import annotations

from typing import cast

from .groupfeed import Delivery
from .sync_subscription import SyncSubscription


class SyncConsumer(SyncSubscription):
    def __next__(self) -> Delivery:  # type: ignore[override]
        return cast(Delivery, super().__next__())

    def __iter__(self) -> SyncConsumer:
        return self
