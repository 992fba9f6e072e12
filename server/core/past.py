"""A user's past: purge and erase withdraw exactly what the user's ledger rows added.

Every ledger row records what its signal reached: whether it was forwarded, and
in its context the communities it named and the cohorts it matched. So a purge
can withdraw each forwarded row's cohort and community contributions and mark
the row not forwarded, and an erase can withdraw everything a row added, its
ledger layer too, and delete the row. Either way the aggregates stay what a
recompute from the ledger, as it then stands, would give.

The rows are on disk: what a purge withdraws is known only once the writer has
read them, in the transaction that changes them. Nothing waits for that. A
purge takes its place in the order requests are read, as every write does: it
reaches the rows of the user read before it (``before_seq``), and a ``counts`` or
``top`` read after it waits for its commit, when the board has taken off what it
withdrew.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from . import ledger
from .replies import Later
from .tallies import Contribution

LEAVE, REJOIN, PURGE, ERASE = 1, 2, 3, 4
EVENTS: Final = {LEAVE: "leave", REJOIN: "rejoin", PURGE: "purge", ERASE: "erase"}

#: a ledger row as the writer reads it back: seq, entity, kind, weight, forwarded, context,
#: and when it happened (at_ns, or ts_ns where none was given)
PastRow: TypeAlias = tuple[int, str, str, float, int, bytes | None, int]


@dataclass(slots=True, eq=False)
class Withdrawal:
    """One purge or erase of one user. The writer fills in what it withdrew, as the board
    takes it off when the batch has committed: from rows up to the tables' watermark
    (which its transaction also records, see ``storage.buckets``), and from the rest."""

    user_id: int
    before_seq: int  # the user's rows below this seq: those read before the request
    erase: bool
    at_ns: int
    recent: list[int] = field(default_factory=list)  # the user's rows not yet in a block
    signals: int = 0  # rows withdrawn from (purge) or deleted (erase)
    board_table: list[Contribution] = field(default_factory=list)
    board_live: list[Contribution] = field(default_factory=list)
    keys: list[tuple[str, int]] = field(default_factory=list)  # erased: key, seq
    seconds: float = 0.0  # the writer's time on it

    def __str__(self) -> str:
        done = "erased" if self.erase else "purged"
        return f"user {self.user_id}: {self.signals} signals {done} ({self.seconds * 1e3:.1f} ms)"

    def take(self, rows: Iterable[PastRow], watermark: int) -> None:
        """Withdraw ``rows`` (read by the writer); each counts as it was counted. The
        tables hold the rows up to ``watermark``."""
        reached: dict[bytes | None, tuple[list[str], list[int]]] = {}  # contexts repeat
        erase = self.erase
        for seq, entity, kind, weight, forwarded, context, at_ns in rows:
            old = seq <= watermark
            communities: Sequence[str] = ()
            cohorts: Sequence[int] = ()
            if forwarded:
                known = reached.get(context)
                if known is None:
                    names, _, ids = ledger.decode(context)
                    known = reached[context] = (names, ids)
                communities, cohorts = known
            weight = ledger.row_weight(weight)
            taken = (entity, kind, -1, -weight, at_ns, cohorts, communities, erase)
            (self.board_table if old else self.board_live).append(taken)
            self.signals += 1


@dataclass(slots=True)
class Event:
    """A line of a user's history, written with the batch that holds it."""

    user_id: int
    at_ns: int
    event: int
    withdrawal: Withdrawal | None = None  # purge and erase: how many signals, once known

    def signals(self) -> int | None:
        return None if self.withdrawal is None else self.withdrawal.signals

    def wire(self) -> dict[str, Any]:
        return line(self.at_ns, self.event, self.signals())


def line(at_ns: int, event: int, signals: int | None) -> dict[str, Any]:
    """A history line as ``history`` answers it."""
    return {"event": EVENTS[event], "at_ns": at_ns, "signals": signals}


@dataclass(slots=True)
class HistoryRead(Later):
    """``history``: the table's events of the user, read by the writer before its batch's
    writes, then the user's events that batch carries, read before this request."""

    user_id: int
    after_ns: int
    limit: int
    pending: list[Event]  # the open batch's events of the user, when this was read
    rows: list[tuple[int, int, int | None]] = field(default_factory=list)  # at, event, n

    def answer(self) -> list[dict[str, Any]]:
        lines = [line(*row) for row in self.rows]
        # event times increase across all events: the batch's come after the table's
        lines += [e.wire() for e in self.pending if e.at_ns > self.after_ns]
        return lines[: self.limit]


@dataclass(slots=True)
class LeftRead(Later):
    """``left_users``: a page of the memberships table, read by the writer before its
    batch's writes, with the leaves and rejoins that batch carries laid over it."""

    after: int | None
    limit: int
    changes: dict[int, tuple[bool, int]]  # the open batch's, past ``after``, when read
    rows: list[tuple[int, int]] = field(default_factory=list)  # user_id, left_at_ns

    def wanted(self) -> int:
        """Rows the table must give: the page, one more, and one per user the batch
        may have taken out of it."""
        return self.limit + 1 + len(self.changes)

    def answer(self) -> dict[str, Any]:
        left = dict(self.rows)
        for user_id, (is_left, at) in self.changes.items():
            if is_left:
                left[user_id] = at
            else:
                left.pop(user_id, None)
        users = sorted(left.items())
        more = len(users) > self.limit
        users = users[: self.limit]
        return {"users": [list(u) for u in users], "next": users[-1][0] if more else None}
