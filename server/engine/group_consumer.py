"""A consumer, as its connection and the groups see it: what its connection tells (room,
or gone), what is pushed to it, and the error that ends a group's consumers when the
group lost events."""

from __future__ import annotations

from typing import Final, Protocol

import msgpack

from tidal.protocol import notification_head
from tidal.server.core.group_batch import Sent
from tidal.server.core.group_parts import Consumer
from tidal.server.core.groups import Group
from tidal.server.core.replies import Replier

#: ``[2, "event", [event, {group, deliveries}]]``: the feed's event, and its delivery
GROUP_EVENT: Final = notification_head("event")[:-1] + b"\x92"
HEARTBEAT: Final = notification_head("heartbeat")


def lost_message(name: str, lost: tuple[int, int]) -> str:
    first, last = lost
    return (
        f"group {name!r} lost events {first}..{last}: --event-retention deleted them before"
        " the group acknowledged them; rebuild what it feeds, then group_reset"
    )


def push(sent: list[Sent]) -> None:
    out: dict[Consumer, list[bytes]] = {}
    for s in sent:
        consumer = s.entry.consumer
        if consumer is None or s.group.consumers.get(consumer.conn) is not consumer:
            continue  # its consumer went as it committed: it is sent to another
        meta = msgpack.packb({"group": s.group.name, "deliveries": s.entry.deliveries})
        out.setdefault(consumer, []).append(GROUP_EVENT + s.entry.data + meta)
    for consumer, notes in out.items():
        consumer.conn.push(b"".join(notes))


class Owner(Protocol):
    """The groups, as a consumer's connection calls back to them."""

    def due(self) -> None: ...

    def leave(self, group: Group, consumer: Consumer) -> None: ...


class Link:
    """A consumer's connection tells its group when it can take more, and when it ends."""

    __slots__ = ("consumer", "group", "groups")

    def __init__(self, groups: Owner, group: Group, consumer: Consumer) -> None:
        self.groups = groups
        self.group = group
        self.consumer = consumer

    def writable(self) -> None:
        self.groups.due()

    def lost(self) -> None:
        self.groups.leave(self.group, self.consumer)


def consumer_of(conn: Replier) -> tuple[Group, Consumer] | None:
    """The group this connection consumes as one of, and its consumer there."""
    listener = conn.listener
    return (listener.group, listener.consumer) if isinstance(listener, Link) else None


def address(peer: object) -> str:
    """``host:port`` of a consumer's connection ("?" if unknown, a path for a socket file)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "?" if not peer else str(peer)
