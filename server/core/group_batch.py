"""What a batch carries for the consumer groups: the rows of their events and their
cursors, as the requests and the sends of this batch left them, the groups made and
dropped, the pages of the events table they read, and what to put back if it is refused.

Requests change a group in memory at once and record its rows here as they stand (the
last state of a row wins); the sends are decided as the writer takes the batch, so that
an event is pushed only once its count is durable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .feed import Change, FeedRead
from .group_parts import Entry
from .groups import Group


class Undone:
    """An undo made of a function: what a group request changed, put back."""

    __slots__ = ("_undo",)

    def __init__(self, undo: Callable[[], object]) -> None:
        self._undo = undo

    def undo(self) -> None:
        self._undo()

    @classmethod
    def each(cls, step: Callable[[Entry], None], entries: list[Entry]) -> Undone:
        """``step`` for each of ``entries``, the last first."""

        def undo() -> None:
            for entry in reversed(entries):
                step(entry)

        return cls(undo)


@dataclass(slots=True, eq=False)
class GroupPage:
    """A page of the events table for a group behind the feed: what committed before its
    batch (``head``). ``tail``: that batch's own events, taken once the page reached it."""

    group: Group
    read: FeedRead
    head: int
    epoch: int
    tail: list[Change] = field(default_factory=list)


@dataclass(slots=True, eq=False)
class Sent:
    """A send decided as the writer took the batch: undone if the batch is refused."""

    group: Group
    entry: Entry
    deliveries: int
    first_ns: int
    sent_ns: int


@dataclass(slots=True)
class GroupWrites:
    #: the events whose rows this batch writes, by (group, id); and whether with their
    #: data. Their rows are made as the writer takes the batch (``freeze``): an event taken
    #: from the batch before has its data only once that one committed
    touched: dict[tuple[str, int], tuple[Entry, bool]] = field(default_factory=dict)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    #: group -> (the cursor recorded before, the new one): the rows between may go
    cursors: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: groups made (their ``groups`` rows), dropped, and set (cursor, lost) anew
    created: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    reset: dict[str, int] = field(default_factory=dict)
    lost: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    pages: list[GroupPage] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    #: events taken from the batch's own, by group: (the read_to before, the ids, epoch)
    taken: list[tuple[Group, int, list[int], int]] = field(default_factory=list)

    def record(self, group: Group, entry: Entry, with_data: bool = False) -> None:
        """The event's row is to be written as it stands when the batch is taken; with its
        data where the events table may lose it (a dead letter, one sent back)."""
        key = (group.name, entry.id)
        kept = self.touched.get(key)
        self.touched[key] = (entry, with_data or (kept is not None and kept[1]))

    def forget(self, name: str, keep: Callable[[Entry], bool] = lambda e: False) -> None:
        """No row of group ``name`` is written, but those ``keep`` says."""
        for key in [k for k, (e, _) in self.touched.items() if k[0] == name and not keep(e)]:
            del self.touched[key]

    def freeze(self) -> None:
        """As the writer takes the batch: each row as its event stands, (group, id, user,
        kind, at, deliveries, first sent, state, done at, reason, data)."""
        self.rows = [
            (name, e.id, e.user, e.kind, e.at_ns, e.deliveries, e.first_ns, e.state, e.done_ns,
             e.reason, e.data if with_data else None)
            for (name, _), (e, with_data) in self.touched.items()
        ]  # fmt: skip

    def writes(self) -> bool:
        return bool(
            self.touched or self.cursors or self.created or self.dropped or self.reset or self.lost
        )
