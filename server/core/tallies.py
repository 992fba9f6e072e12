"""What the board is made of: a tally per aggregate, the scope a ranking reads, and the
shapes of what goes in (a ledger row's contribution) and what a checkpoint writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

from .ledger import Slot

#: what one ledger row adds to (or, withdrawn, takes off) the aggregates it reached:
#: entity, kind, +1 or -1, weight (signed as the count), at_ns, cohort ids, communities,
#: and whether its ledger layer changes too (a signal, an erase; not a purge)
Contribution: TypeAlias = tuple[str, str, int, float, int, Sequence[int], Sequence[str], bool]

#: the tallies changed since the last checkpoint: the next checkpoint writes their records,
#: and what their newest buckets gained since (see ``Log``)
Dirty: TypeAlias = list["Tally"]


#: a tally's epoch once it has left the board, and before it is first marked
GONE: Final = -1
UNMARKED: Final = -2


class Tally:
    """One aggregate: (layer, key, kind) of one entity. Compiled, its numbers are stored
    unboxed: 264 bytes, the window totals and the first trend included.

    ``count_1h`` ... ``weight_30d`` are its totals in each window (``windows.WINDOWS``):
    flat slots, not a list, so that compiled they stay unboxed. It keeps what it gained in
    its newest minute and hour bucket itself (``minute``, the bucket, and ``minute_count``,
    ``minute_weight``; ``hour`` and so on), added to that bucket's log when a newer one
    begins: most signals then touch no bucket, which at a million aggregates costs a cache
    miss each; ``minute_count_written`` and so on are what checkpoints wrote of those.
    ``epoch`` is the board's while it is dirty (``GONE`` once forgotten, ``UNMARKED`` until
    first marked). ``id`` names it on disk (0 until first written) and ``chunk`` is the
    chunk holding its record (see ``chunks``). ``sibling`` is the next tally of its entity
    (``Board.by_entity``)."""

    __slots__ = (
        "chunk",
        "count",
        "count_1h",
        "count_7d",
        "count_24h",
        "count_30d",
        "decayed",
        "entity",
        "epoch",
        "hour",
        "hour_count",
        "hour_count_written",
        "hour_weight",
        "hour_weight_written",
        "id",
        "minute",
        "minute_count",
        "minute_count_written",
        "minute_weight",
        "minute_weight_written",
        "more",
        "scope",
        "sibling",
        "weight",
        "weight_1h",
        "weight_7d",
        "weight_24h",
        "weight_30d",
    )  # fmt: skip

    def __init__(
        self, entity: str, scope: Scope, half_lives: int, count: int = 0, weight: float = 0.0
    ) -> None:
        self.entity = entity
        self.scope = scope
        self.count = count
        self.weight = weight
        self.count_1h = self.count_24h = self.count_7d = self.count_30d = 0
        self.weight_1h = self.weight_24h = self.weight_7d = self.weight_30d = 0.0
        # forward-decayed sums, per half-life: the first unboxed, the others (if any) in a
        # list, as most servers keep one (a list and its float took 88 bytes a tally)
        self.decayed = 0.0
        self.more: list[float] | None = [0.0] * (half_lives - 1) if half_lives > 1 else None
        self.minute = self.hour = -1  # no newest minute or hour yet
        self.minute_count = self.minute_count_written = 0
        self.hour_count = self.hour_count_written = 0
        self.minute_weight = self.minute_weight_written = 0.0
        self.hour_weight = self.hour_weight_written = 0.0
        self.epoch = UNMARKED
        self.id = self.chunk = 0
        self.sibling: Tally | None = None

    def trend(self, i: int) -> float:
        """The forward-decayed sum of the board's ``i``-th half-life."""
        if i == 0:
            return self.decayed
        assert self.more is not None
        return self.more[i - 1]

    def trends(self) -> list[float]:
        return [self.decayed] if self.more is None else [self.decayed, *self.more]

    def add_trends(self, amounts: list[float]) -> None:
        """``amounts[i]`` added to the ``i``-th half-life's sum."""
        if amounts:
            self.decayed += amounts[0]
            more = self.more
            if more is not None:
                for i in range(1, len(amounts)):
                    more[i - 1] += amounts[i]

    def add_trend(self, i: int, amount: float) -> None:
        if i == 0:
            self.decayed += amount
        else:
            assert self.more is not None
            self.more[i - 1] += amount

    def window(self, i: int) -> tuple[int, float]:
        """Count and weight in ``windows.WINDOWS[i]`` (-1: all-time)."""
        if i == 0:
            return self.count_1h, self.weight_1h
        if i == 1:
            return self.count_24h, self.weight_24h
        if i == 2:
            return self.count_7d, self.weight_7d
        if i == 3:
            return self.count_30d, self.weight_30d
        return self.count, self.weight

    def shift(self, i: int, count: int, weight: float) -> None:
        if i == 0:
            self.count_1h += count
            self.weight_1h += weight
        elif i == 1:
            self.count_24h += count
            self.weight_24h += weight
        elif i == 2:
            self.count_7d += count
            self.weight_7d += weight
        else:
            self.count_30d += count
            self.weight_30d += weight


def siblings(first: Tally | None) -> list[Tally]:
    """An entity's tallies, from its newest (``Board.by_entity``) down its chain."""
    out = []
    while first is not None:
        out.append(first)
        first = first.sibling
    return out


class Scope:
    """What one ranking reads: the tallies of one (layer, key, kind), and the orders kept
    of them (``order.Order``), brought up to date with ``dirty`` as each commit is taken
    in (``orders.follow``)."""

    __slots__ = ("dirty", "orders", "slot", "tallies")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.tallies: dict[str, Tally] = {}
        self.dirty: set[str] = set()  # entities changed since the orders were read
        self.orders: dict[tuple[int, int, int], Any] = {}  # (by, which, TOP or DEEP)


class Log:
    """One minute's or hour's bucket: what tallies gained in it, as (tally, count, weight)
    in the order it came, three lists side by side; a tally's entry is the sum of its
    lines, and while this is its newest bucket, what it holds itself (``Tally.minute_count``).

    A log and not a map: a window slides by adding up a bucket's lines, boot builds a
    bucket from its parts on disk as they are (``restore``), and a line costs a slot in
    three lists rather than a map entry and an object. The lines from ``written`` on
    are not on disk yet, nor ``credit``: what a tally's lines repeat of what checkpoints
    wrote of its newest bucket (see ``chunks``). ``newest``: the tallies this bucket was
    the newest of, whose own part a slide takes off too."""

    __slots__ = ("counts", "credit", "newest", "tallies", "weights", "written")

    def __init__(self) -> None:
        self.tallies: list[Tally] = []
        self.counts: list[int] = []
        self.weights: list[float] = []
        self.newest: list[Tally] = []
        self.written = 0
        self.credit: list[tuple[Tally, int, float]] = []

    def add(self, tally: Tally, count: int, weight: float) -> None:
        self.tallies.append(tally)
        self.counts.append(count)
        self.weights.append(weight)

    def sums(self, tier: int = -1, b: int = -1) -> tuple[list[Tally], list[int], list[float]]:
        """Each live tally's lines summed, in the order first seen; with ``tier`` and ``b``
        (this bucket's), what the tallies it is the newest of hold themselves added; those
        left with no signal out. A place per tally in three lists, not a map to a pair: a
        bucket of 800,000 lines took 2.4 s to sum so, here, and held the loop."""
        at: dict[Tally, int] = {}
        tallies: list[Tally] = []
        counts: list[int] = []
        weights: list[float] = []
        lines, line_counts, line_weights = self.tallies, self.counts, self.weights
        for k in range(len(lines)):
            tally = lines[k]
            if tally.epoch == GONE:
                continue
            i = at.get(tally, -1)
            if i < 0:
                at[tally] = len(tallies)
                tallies.append(tally)
                counts.append(line_counts[k])
                weights.append(line_weights[k])
            else:
                counts[i] += line_counts[k]
                weights[i] += line_weights[k]
        look = bool(at)  # a tally is once among ``newest``: found only if among the lines
        for tally in self.newest if tier >= 0 else ():
            if tally.epoch == GONE:
                continue
            if tier == 0 and tally.minute == b:
                count, weight = tally.minute_count, tally.minute_weight
            elif tier == 1 and tally.hour == b:
                count, weight = tally.hour_count, tally.hour_weight
            else:
                continue
            i = at.get(tally, -1) if look else -1
            if i < 0:
                tallies.append(tally)
                counts.append(count)
                weights.append(weight)
            else:
                counts[i] += count
                weights[i] += weight
        if 0 in counts:
            keep = [i for i in range(len(counts)) if counts[i]]
            tallies = [tallies[i] for i in keep]
            counts = [counts[i] for i in keep]
            weights = [weights[i] for i in keep]
        return tallies, counts, weights

    def entry(self, tally: Tally, tier: int, b: int) -> tuple[int, float] | None:
        """The tally's lines summed, with what it holds itself while this is its newest."""
        count, weight = 0, 0.0
        for k, other in enumerate(self.tallies):
            if other is tally:
                count += self.counts[k]
                weight += self.weights[k]
        if tier == 0 and b == tally.minute:
            count, weight = count + tally.minute_count, weight + tally.minute_weight
        elif tier == 1 and b == tally.hour:
            count, weight = count + tally.hour_count, weight + tally.hour_weight
        return (count, weight) if count else None

    def leave(self, tier: int, b: int, window: int) -> None:
        """This bucket (``b`` of ``tier``) leaves ``window``: its lines, and what the
        tallies it is still the newest of hold themselves, come off their totals."""
        tallies, counts, weights = self.tallies, self.counts, self.weights
        for k in range(len(tallies)):
            tally = tallies[k]
            tally.shift(window, -counts[k], -weights[k])
            if tally.scope.orders:
                tally.scope.dirty.add(tally.entity)
        for tally in self.newest:
            if tier == 0 and tally.minute == b:
                tally.shift(window, -tally.minute_count, -tally.minute_weight)
            elif tier == 1 and tally.hour == b:
                tally.shift(window, -tally.hour_count, -tally.hour_weight)
            else:
                continue
            if tally.scope.orders:
                tally.scope.dirty.add(tally.entity)

    def drop_scopes(self, lost: set[Scope]) -> None:
        """The lines of dropped cohorts' tallies out (those not on disk stay so)."""
        if any(t.scope in lost for t in self.tallies):
            keep = [k for k, t in enumerate(self.tallies) if t.scope not in lost]
            self.written = sum(1 for k in keep if k < self.written)
            self.tallies = [self.tallies[k] for k in keep]
            self.counts = [self.counts[k] for k in keep]
            self.weights = [self.weights[k] for k in keep]
        self.newest = [t for t in self.newest if t.scope not in lost]
        self.credit = [c for c in self.credit if c[0].scope not in lost]
