"""A consumer group's deliveries, sans-I/O: what a consumer asks the server, and what it
makes of what the server pushes. The asyncio and the blocking consumers are the feed's
subscriptions (``subscription``, ``sync_subscription``) driven by this cursor instead.

Unlike a plain subscription it keeps no place of its own: the group's cursor is on the
server, and a consumer that reconnects is sent again what it had not acknowledged. So
an event can arrive twice (at least once): ``Delivery.id`` is the id to deduplicate on,
and ``deliveries`` says how often it was sent. ``ack`` means "applied", not "received":
acknowledge an event once what it asks is done, and the receipt says so to an auditor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .errors import InvalidArgument, InvalidParams
from .feed import Cursor
from .types import FeedEvent


class Sender(Protocol):
    """The subscription a delivery came on: an ack goes back on its connection."""

    def call(self, method: str, params: list[Any]) -> Any: ...


class Delivery:
    """One event delivered to this consumer: ``event`` (the feed's), ``group``, and how
    often it was sent (``deliveries``). ``ack()`` and ``nack()`` answer it on the
    connection it came on: from the asyncio client, they are awaited."""

    __slots__ = ("_sender", "deliveries", "event", "group")

    def __init__(self, event: FeedEvent, group: str, deliveries: int, sender: Sender) -> None:
        self.event = event
        self.group = group
        self.deliveries = deliveries
        self._sender = sender

    @property
    def id(self) -> int:
        return self.event.id

    @property
    def user_id(self) -> int | None:
        return self.event.user_id

    def ack(self) -> Any:
        """Done: what the event asks is applied (answered once durable on the server)."""
        return self._sender.call("ack", [[self.event.id]])

    def nack(self, *, delay: float = 0.0, dead: bool = False, reason: str | None = None) -> Any:
        """Not done: send it again after ``delay`` seconds, or (``dead``) put it with the
        group's dead letters at once; ``reason`` is kept as its last error."""
        options: dict[str, Any] = {}
        if delay:
            options["delay"] = delay
        if dead:
            options["dead"] = True
        if reason is not None:
            options["reason"] = reason
        return self._sender.call("nack", [[self.event.id], options])

    def __repr__(self) -> str:
        return f"Delivery({self.event!r}, group={self.group!r}, deliveries={self.deliveries})"


class GroupCursor(Cursor):
    def __init__(self, group: str, events: Iterable[str] | None = None) -> None:
        if type(group) is not str or not group:
            raise InvalidArgument(f"group: must be a group's name, not {group!r}")
        super().__init__(None, events)
        self.group = group
        self.sender: Sender | None = None  # set by the subscription that drives it

    def params(self) -> list[Any]:
        options: dict[str, Any] = {"group": self.group}
        if self.events is not None:
            options["events"] = self.events
        return [options]

    def started(self, reply: Any) -> None:
        self.last = int(reply["last_id"])

    def refused(self, exc: InvalidParams) -> InvalidParams:
        """An unknown group, or one that lost events: nothing a retry mends."""
        return exc

    def take(self, method: str, params: Any) -> Any:
        if method == "event" and type(params) is list and len(params) == 2:
            assert self.sender is not None
            meta = params[1]
            event = FeedEvent.from_wire(params[0])
            return Delivery(event, str(meta["group"]), int(meta["deliveries"]), self.sender)
        return super().take(method, params) if method != "event" else None
