"""Aggregates: per entity, per layer, per kind, a count and a weight sum.

They are a view of the ledger. Every ledger row carries what its signal was
forwarded to (communities and cohort ids), so the aggregates table need not be
written with every group commit: deltas gather in memory, and now and then a
checkpoint writes them in one pass together with the ledger seq they run to (the
watermark). Boot replays the ledger past the watermark. The writer then pays one
ledger row per signal, and one upsert per distinct aggregate per checkpoint
rather than per batch.

A signal is counted once, in memory, when it is read; what is not yet committed
is known from the batches' rows (``uncount``). ``counts`` adds the table as of its
watermark and memory's share above it: what is committed (``committed_page``, read
beside the writer) or, when it must show writes not yet committed, all of it
(``capture``, answered with their batch), into a ``counts.CountsRead``. See ``reads``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from . import ledger
from .counts import Adjustment, CountsRead, Deltas, add_copy
from .ledger import Row, Slot

#: A checkpoint is due after this many signals or this many seconds, whichever first.
CHECKPOINT_SIGNALS: Final = 200_000
CHECKPOINT_SECONDS: Final = 10.0
#: ... or once committed deltas in memory hold this many tallies (about 200 B each)
CHECKPOINT_TALLIES: Final = 500_000


def merge(into: Deltas, more: Deltas) -> int:
    """Add ``more`` to ``into``; ``into`` may take over ``more``'s inner dicts.
    Returns how many tallies ``into`` gained."""
    gained = 0
    for entity, slots in more.items():
        mine = into.get(entity)
        if mine is None:
            into[entity] = slots
            gained += len(slots)
        else:
            before = len(mine)
            add_copy(mine, slots)
            gained += len(mine) - before
    return gained


class Aggregates:
    def __init__(
        self,
        watermark: int,
        *,
        every_signals: int = CHECKPOINT_SIGNALS,
        every_seconds: float = CHECKPOINT_SECONDS,
        every_tallies: int = CHECKPOINT_TALLIES,
    ) -> None:
        self.every_signals = every_signals
        self.every_seconds = every_seconds
        self.every_tallies = every_tallies
        self.tallies = 0  # in ``live``
        self.live: Deltas = {}  # every signal read above the watermark, committed or not
        self.flushing: Deltas | None = None  # in the checkpoint being committed
        # the table holds every signal up to this seq once the flushing checkpoint commits
        # (and, with none in flight, already does)
        self.flushing_to = watermark
        self._signals = 0  # committed since the last checkpoint began
        self._since = time.monotonic()

    def tally(self, entity: str) -> dict[Slot, list[Any]]:
        """Where a signal read now is counted, once: memory is ahead of the disk, and a
        read that must show only committed signals takes off those not yet committed
        (``uncount``), as a failed commit does for good."""
        mine = self.live.get(entity)
        if mine is None:
            mine = self.live[entity] = {}
        return mine

    def signals_committed(self, signals: int) -> None:
        self._signals += signals

    def uncount(self, rows: Iterable[Row], entity: str | None = None) -> Deltas:
        """What ``rows`` (of batches not committed) added, as negative tallies: all of it,
        or only ``entity``'s. Each row counts as the signal did (``ledger.count``)."""
        if entity is not None:
            rows = [row for row in rows if row[2] == entity]
        taken: Deltas = {}
        for _seq, _user, row_entity, kind, weight, _ts, forwarded, context, _at in rows:
            mine = taken.get(row_entity)
            if mine is None:
                mine = taken[row_entity] = {}
            communities, _, cohorts = ledger.decode(context if forwarded else None)
            ledger.withdraw(mine, kind, weight, cohorts, communities, ledger_too=True)
        return taken

    def withdraw(self, deltas: Deltas) -> None:
        """Take off ``deltas`` (negative tallies): what a committed purge or erase withdrew
        from rows above the watermark, or what a refused commit's signals had added. A
        tally that reaches no signal is removed, as a recompute would have none."""
        live = self.live
        for entity, slots in deltas.items():
            mine = live.setdefault(entity, {})
            for slot, (count, weight) in slots.items():
                tally = mine.get(slot)
                if tally is None:  # cannot be (its rows were counted here): kept honest
                    mine[slot] = [count, weight]
                    self.tallies += 1
                    continue
                tally[0] += count
                tally[1] += weight
                if not tally[0]:
                    del mine[slot]
                    self.tallies -= 1
            if not mine:
                del live[entity]

    def due(self) -> bool:
        if not self.live or self.flushing is not None:
            return False
        return (
            self._signals >= self.every_signals
            or self.tallies >= self.every_tallies
            or time.monotonic() - self._since >= self.every_seconds
        )

    def begin_checkpoint(self, upto_seq: int) -> Deltas:
        """Hand the live deltas (every committed signal up to ``upto_seq``) to the writer."""
        self.flushing, self.flushing_to = self.live, upto_seq
        self.live = {}
        self.tallies = 0
        self._signals = 0
        self._since = time.monotonic()
        return self.flushing

    def end_checkpoint(self, committed: bool) -> None:
        flushing, self.flushing = self.flushing, None
        if not committed and flushing is not None:
            merge(flushing, self.live)  # still durable in the ledger: keep them in memory
            self.live = flushing
            self.tallies = sum(map(len, flushing.values()))

    def committed_page(
        self,
        entity: str,
        cohort_names: dict[int, str],
        uncommitted: Iterable[Row],
        after: Slot | None,
        limit: int,
    ) -> CountsRead:
        """What memory holds about ``entity`` that is committed, for the page of ``limit``
        aggregates after ``after``: what is counted, less the ``uncommitted`` rows'. The
        table's share is read next; no checkpoint may be committing (see ``reads``)."""
        assert self.flushing is None
        rest: dict[Slot, list[Any]] = {}
        add_copy(rest, self.live.get(entity), after)
        add_copy(rest, self.uncount(uncommitted, entity).get(entity), after)
        rest = {slot: tally for slot, tally in rest.items() if tally[0]}
        return CountsRead(entity, cohort_names, None, {}, _first(rest, limit + 1), [], after, limit)

    def capture(
        self,
        entity: str,
        cohort_names: dict[int, str],
        pending: Sequence[Adjustment],
        after: Slot | None,
        limit: int,
    ) -> CountsRead:
        """What memory holds about ``entity`` now, committed or not, for the page of
        ``limit`` aggregates after ``after``; the writer adds the table's share later."""
        rest: dict[Slot, list[Any]] = {}
        add_copy(rest, self.live.get(entity), after)
        flushing: dict[Slot, list[Any]] = {}
        if self.flushing is not None:
            add_copy(flushing, self.flushing.get(entity), after)
        return CountsRead(
            entity,
            cohort_names,
            self.flushing_to if self.flushing is not None else None,
            _first(flushing, limit + 1),
            _first(rest, limit + 1),
            pending,
            after,
            limit,
        )

    def replay(
        self, rows: Iterable[tuple[int, str, str, float, int, bytes | None, int]], watermark: int
    ) -> int:
        """Rebuild the live deltas from ledger rows above ``watermark`` (at boot).

        Each row counts as the signal did live (``ledger.count``).
        """
        live = self.live
        count = 0
        for seq, entity, kind, weight, forwarded, context, _at in rows:
            if seq <= watermark:
                continue  # the board's watermark may lag, not this one's
            weight = ledger.row_weight(weight)
            mine = live.get(entity)
            if mine is None:
                mine = live[entity] = {}
            if forwarded and context is not None:
                communities, _, cohorts = ledger.decode(context)
                ledger.count(mine, kind, weight, cohorts, communities)
            else:
                ledger.count(mine, kind, weight, (), ())
            count += 1
        self._signals = count
        self.tallies = sum(map(len, live.values()))
        return count


def _first(slots: dict[Slot, list[Any]], n: int) -> dict[Slot, list[Any]]:
    """The ``n`` first slots in order: no page needs more of any one source."""
    if len(slots) <= n:
        return slots
    return {slot: slots[slot] for slot in heapq.nsmallest(n, slots)}
