"""What a consumer group is made of (``groups``): its settings as made, an event as it
holds it (and its stored row), a consumer and what it has out, and what boot read of
the events past its cursor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from . import feed
from .replies import Replier

#: events a group holds unsettled in memory; past it the group reads on as it settles
WINDOW: Final = 10_000
#: events out to one consumer, unacknowledged, at most
INFLIGHT: Final = 1_000
#: the events a receipt follows: a user's opt-outs
OPTOUTS: Final = frozenset({feed.LEAVE, feed.PURGE, feed.ERASE})
#: the states of a group's stored row of an event
PENDING, DEAD, ACKED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Spec:
    """A group as ``group_create`` made it."""

    name: str
    start: int  # it takes the events after this id
    ack_wait_ns: int
    max_deliveries: int
    wait: bool  # order "wait": a user's later events wait behind their dead letter
    kinds: frozenset[int] | None  # None: every kind
    created_ns: int

    def takes(self, kind: int) -> bool:
        return self.kinds is None or kind in self.kinds


@dataclass(slots=True, eq=False)
class Entry:
    """One event, as a group holds it."""

    id: int
    kind: int
    user: int | None
    at_ns: int
    data: bytes
    deliveries: int = 0
    first_ns: int = 0  # first sent
    sent_ns: int = 0  # last sent
    not_before: int = 0  # a nack's delay
    consumer: Consumer | None = None  # out to it, unacknowledged
    reason: str = ""  # the last a consumer gave (nack), or why it is dead
    done_ns: int = 0  # acknowledged or dead-lettered at
    state: int = PENDING
    revived: bool = False  # a dead letter sent back: held apart from the window


class Consumer:
    """One connection of a group: what it has out."""

    __slots__ = ("conn", "key", "out", "peer", "users")

    def __init__(self, conn: Replier, key: int, peer: str) -> None:
        self.conn = conn
        self.key = key  # its place in the hashing: unique in the group
        self.peer = peer
        self.out: dict[int, Entry] = {}
        self.users: dict[int | None, int] = {}  # user -> events of theirs out here


@dataclass(slots=True)
class Recorded:
    """What a group's rows said of an event past its cursor, at boot: its count, or that
    it was acknowledged out of order."""

    state: int
    deliveries: int
    first_ns: int
