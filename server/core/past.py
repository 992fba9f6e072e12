"""A user's past: purge and erase withdraw exactly what the user's ledger rows added.

Every ledger row records what its signal reached: whether it was forwarded, and
in its context the communities it named and the cohorts it matched. So a purge
can withdraw each forwarded row's cohort and community contributions and mark
the row not forwarded, and an erase can withdraw everything a row added, its
ledger layer too, and delete the row. Either way the aggregates stay what a
recompute from the ledger, as it then stands, would give.

The rows are on disk, across the whole ledger. A purge takes its place in the
order requests are read: it reaches the rows of the user read before it
(``before_seq``). A survey then reads them beside the writer, at one snapshot
(``Survey``); the withdrawal takes effect in the next commit, where the writer
adds the few rows the snapshot could not see, takes the sums off, and records
the rule that the rows are then read through (``rewrites``); the rows themselves
are rewritten over the commits after. A ``counts`` or ``top`` read after the purge
waits for the commit where it takes effect (``engine.withdrawals``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from tidal.protocol.limits import HISTORY_LINE_BYTES, LEFT_USER_BYTES

from . import ledger
from .replies import Later
from .rewrites import GONE, NO_RULE, Rule, reach
from .sums import aggregate_rows, bucket_rows
from .tallies import Contribution

LEAVE, REJOIN, PURGE, ERASE = 1, 2, 3, 4
EVENTS: Final = {LEAVE: "leave", REJOIN: "rejoin", PURGE: "purge", ERASE: "erase"}

#: a ledger row as the writer reads it back: seq, entity, kind, weight, forwarded, context,
#: and when it happened (at_ns, or ts_ns where none was given)
PastRow: TypeAlias = tuple[int, str, str, float, int, bytes | None, int]


def withdrawn(
    rows: Iterable[PastRow], rule: Rule, erase: bool
) -> tuple[list[int], list[Contribution]]:
    """The seqs of ``rows`` (a user's, in seq order) that a withdrawal reaches, read
    through the user's rule, and what each takes off: a purge, a forwarded row's cohorts
    and communities; an erase, the whole row."""
    seqs: list[int] = []
    taken: list[Contribution] = []
    reached: dict[bytes | None, tuple[list[str], list[int]]] = {}  # contexts repeat
    for seq, entity, kind, weight, forwarded, context, at_ns in rows:
        forwarded = reach(rule, seq, forwarded)
        if forwarded == GONE or not (forwarded or erase):
            continue
        communities: Sequence[str] = ()
        cohorts: Sequence[int] = ()
        if forwarded:
            known = reached.get(context)
            if known is None:
                names, _, ids = ledger.decode(context)
                known = reached[context] = (names, ids)
            communities, cohorts = known
        amount = ledger.row_weight(weight)
        taken.append((entity, kind, -1, -amount, at_ns, cohorts, communities, erase))
        seqs.append(seq)
    return seqs, taken


@dataclass(slots=True)
class Survey:
    """A withdrawal's rows below ``through`` (those the blocks of ``ledger_users`` listed),
    read at one snapshot beside the writer, with what they take off. ``table`` sums those
    up to the snapshot's table watermark, the heavy part of the ``withdrawals`` record."""

    through: int
    watermark: int
    seqs: list[int]
    taken: list[Contribution]
    table: tuple[list[Any], list[Any]]  # aggregates rows, bucket rows

    @classmethod
    def of(cls, through: int, watermark: int, seqs: list[int], taken: list[Contribution],
           decay: Sequence[tuple[int, int]], now_ns: int) -> Survey:  # fmt: skip
        old = taken[: bisect_right(seqs, watermark)]
        return cls(
            through, watermark, seqs, taken, (aggregate_rows(old), bucket_rows(old, decay, now_ns))
        )


@dataclass(slots=True, eq=False)
class Withdrawal:
    """One purge or erase of one user. It reaches the user's rows below ``before_seq``: the
    survey's, and those the writer finds past it (``add``) when it takes effect."""

    user_id: int
    before_seq: int  # the user's rows below this seq: those read before the request
    erase: bool
    at_ns: int = 0  # when it took effect: set as it joins its batch
    rule: Rule = NO_RULE  # the user's, when surveyed (a later one waits for this one)
    survey: Survey | None = None
    recent: list[int] = field(default_factory=list)  # the user's rows not yet in a block
    signals: int = 0  # rows withdrawn from (purge) or deleted (erase)
    seqs: list[int] = field(default_factory=list)  # ... their seqs, to rewrite
    board: list[Contribution] = field(default_factory=list)  # off the board once committed
    seconds: float = 0.0  # the writer's time on it
    left_at_ns: int | None = None  # an erase: when the user left, which its event tells

    def __str__(self) -> str:
        done = "erased" if self.erase else "purged"
        return f"user {self.user_id}: {self.signals} signals {done} ({self.seconds * 1e3:.1f} ms)"

    def add(self, rows: Iterable[PastRow], watermark: int, decay: Sequence[tuple[int, int]],
            now_ns: int) -> tuple[list[Any], list[Any]]:  # fmt: skip
        """The rows past the survey, read by the writer; returns what comes off the tables
        (which hold the rows up to ``watermark``), to add to the survey's ``table``."""
        survey = self.survey
        assert survey is not None
        seqs, taken = withdrawn(rows, self.rule, self.erase)
        self.seqs = survey.seqs + seqs
        self.board = survey.taken + taken
        self.signals = len(self.seqs)
        # rows past the survey's watermark and up to this one: summed here (few)
        late = survey.taken[bisect_right(survey.seqs, survey.watermark) :
                            bisect_right(survey.seqs, watermark)]  # fmt: skip
        late += taken[: bisect_right(seqs, watermark)]
        return aggregate_rows(late), bucket_rows(late, decay, now_ns)


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

    def bound(self) -> int:
        return self.limit * HISTORY_LINE_BYTES

    def answer(self) -> list[dict[str, Any]]:
        lines = [line(*row) for row in self.rows]
        self.rows = []  # let go of as soon as answered: the batch's other reads are built next
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

    def bound(self) -> int:
        return self.limit * LEFT_USER_BYTES

    def wanted(self) -> int:
        """Rows the table must give: the page, one more, and one per user the batch
        may have taken out of it."""
        return self.limit + 1 + len(self.changes)

    def answer(self) -> dict[str, Any]:
        left = dict(self.rows)
        self.rows = []  # let go of as soon as answered: the batch's other reads are built next
        for user_id, (is_left, at) in self.changes.items():
            if is_left:
                left[user_id] = at
            else:
                left.pop(user_id, None)
        users = sorted(left.items())
        more = len(users) > self.limit
        users = users[: self.limit]
        return {"users": [list(u) for u in users], "next": users[-1][0] if more else None}
