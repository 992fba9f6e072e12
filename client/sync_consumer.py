"""A consumer group's share of the feed for the blocking client: ``for d in
tidal.consume("index")``, ``d.ack()`` once applied (``groupfeed``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

from .blocking import Link
from .consumer import FIRST_DELAY
from .groupfeed import Delivery, GroupCursor
from .sync_subscription import SyncSubscription


class SyncConsumer(SyncSubscription):
    def __next__(self) -> Delivery:  # type: ignore[override]
        return cast(Delivery, super().__next__())

    def __iter__(self) -> SyncConsumer:
        return self


def sync_consumer(
    link: Callable[[], Link],
    group: str,
    events: Iterable[str] | None,
    *,
    timeout: float | None,
    reconnect: int,
    dead_after: float | None,
) -> SyncConsumer:
    """``consumer.consumer``, blocking: on the links ``link`` makes."""
    cursor = GroupCursor(group, events)
    made = SyncConsumer(link, cursor, timeout=timeout, reconnect=reconnect,
                        first_delay=FIRST_DELAY, dead_after=dead_after)  # fmt: skip
    cursor.sender = made
    return made
