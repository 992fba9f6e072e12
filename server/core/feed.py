"""The change feed's events: what a batch records of each leave, rejoin, purge, erase and
cohort change, and the page a subscriber replays.

An event is recorded when its change is applied, in the order requests are read. It
takes its id when the writer takes its batch: one writer commits batches in order, so
ids follow the committed order, and a refused batch gives its ids back before any
later batch takes one. The writer encodes it in the transaction that commits it (a
purge's count is known only there); those bytes are the row, the push and the replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import msgpack

from tidal.protocol.limits import FEED_EVENTS

if TYPE_CHECKING:
    from .past import Withdrawal

#: the kind stored in the events table, in the order of ``FEED_EVENTS`` (their names)
LEAVE, REJOIN, PURGE, ERASE, DEFINE_COHORT, DROP_COHORT = range(1, len(FEED_EVENTS) + 1)
NAMES: Final = dict(enumerate(FEED_EVENTS, start=1))
KINDS: Final = {name: kind for kind, name in NAMES.items()}
#: events a replay reads per trip through the writer: small enough to hold the writer
#: briefly (each row is about 100 bytes; a define_cohort's predicate up to 64 KiB)
PAGE: Final = 500
#: events retention deletes per commit: a small, bounded share of one
RETIRE_EVENTS: Final = 10_000


@dataclass(slots=True, eq=False)
class Change:
    """One event, as its batch carries it to the writer."""

    kind: int
    at_ns: int
    user_id: int | None = None
    left_at_ns: int | None = None
    withdrawal: Withdrawal | None = None  # purge, erase, leave with purge: its count
    name: str | None = None  # a cohort's
    predicate: Any = None  # a defined cohort's
    id: int = 0  # given when the writer takes the batch
    data: bytes = b""  # the event, msgpack-encoded by the writer

    def wire(self) -> dict[str, Any]:
        event: dict[str, Any] = {"id": self.id, "event": NAMES[self.kind], "at_ns": self.at_ns}
        if self.user_id is not None:
            event["user_id"] = self.user_id
        if self.left_at_ns is not None:
            event["left_at_ns"] = self.left_at_ns
        w = self.withdrawal
        if w is not None:
            event["erased" if w.erase else "purged"] = w.signals
        if self.name is not None:
            event["name"] = self.name
        if self.kind == DEFINE_COHORT:
            event["predicate"] = self.predicate
        return event

    def encode(self) -> tuple[int, int, int, bytes]:
        """The table's row (id, at_ns, kind, data), once the batch's withdrawals are done."""
        self.data = msgpack.packb(self.wire(), use_bin_type=True)
        return (self.id, self.at_ns, self.kind, self.data)


#: a row of the events table as a replay reads it: id, kind, data
EventRow: TypeAlias = tuple[int, int, bytes]


@dataclass(slots=True, eq=False)
class FeedRead:
    """A page of the events table, read by the writer before its batch's writes: every
    event committed before that batch, past ``after``."""

    after: int
    rows: list[EventRow] = field(default_factory=list)
    oldest: int | None = None  # the oldest event kept, None if none is
