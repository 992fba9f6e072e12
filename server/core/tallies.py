"""What the board is made of: a tally per aggregate, the scope a ranking reads, and the
shapes of what goes in (a ledger row's contribution) and what a checkpoint writes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

from .ledger import Slot

#: what one ledger row adds to (or, withdrawn, takes off) the aggregates it reached:
#: entity, kind, +1 or -1, weight (signed as the count), at_ns, cohort ids, communities,
#: and whether its ledger layer changes too (a signal, an erase; not a purge)
Contribution: TypeAlias = tuple[str, str, int, float, int, Sequence[int], Sequence[str], bool]

#: count + weight·i per tally in one bucket: one small object (a count is exact as a double)
Bucket: TypeAlias = dict["Tally", complex]
#: the tallies changed since the last checkpoint, and a minute changed (others in
#: ``Board.moved``): the next checkpoint writes their buckets and sums as they then are
Dirty: TypeAlias = dict["Tally", int]


class Tally:
    """One aggregate: (layer, key, kind) of one entity. Compiled, its numbers are stored
    unboxed: about 200 bytes, the window totals included.

    It keeps what it gained in its newest minute and hour itself (``mk``, ``mc``, ``mw``;
    ``hk``, ``hc``, ``hw``), added to its entry in that bucket when a newer one begins:
    most signals then touch no bucket map, which at a million aggregates costs a cache
    miss per lookup. ``epoch`` is the board's while it is dirty (-1 once forgotten), with
    ``dm`` a minute changed."""

    __slots__ = (
        "c0", "c1", "c2", "c3", "count", "dm", "entity", "epoch", "hc", "hk", "hw", "mc", "mk",
        "mw", "scope", "trend", "w0", "w1", "w2", "w3", "weight",
    )  # fmt: skip

    def __init__(self, entity: str, scope: Scope, half_lives: int) -> None:
        self.entity = entity
        self.scope = scope
        self.count = 0
        self.weight = 0.0
        self.c0 = self.c1 = self.c2 = self.c3 = 0  # per window (windows.WINDOWS)
        self.w0 = self.w1 = self.w2 = self.w3 = 0.0
        self.trend = [0.0] * half_lives  # forward-decayed sums, per half-life
        self.mk = self.hk = -1  # no newest minute or hour yet
        self.mc = self.hc = 0
        self.mw = self.hw = 0.0
        self.epoch = self.dm = -1

    def window(self, i: int) -> tuple[int, float]:
        """Count and weight in ``windows.WINDOWS[i]`` (-1: all-time)."""
        if i == 0:
            return self.c0, self.w0
        if i == 1:
            return self.c1, self.w1
        if i == 2:
            return self.c2, self.w2
        if i == 3:
            return self.c3, self.w3
        return self.count, self.weight

    def shift(self, i: int, count: int, weight: float) -> None:
        if i == 0:
            self.c0 += count
            self.w0 += weight
        elif i == 1:
            self.c1 += count
            self.w1 += weight
        elif i == 2:
            self.c2 += count
            self.w2 += weight
        else:
            self.c3 += count
            self.w3 += weight


class Scope:
    """What one ranking reads: the tallies of one (layer, key, kind), and the orders kept
    of them (``ranking.Order``), brought up to date with ``dirty`` when read."""

    __slots__ = ("dirty", "orders", "slot", "tallies")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.tallies: dict[str, Tally] = {}
        self.dirty: set[str] = set()  # entities changed since the orders were read
        self.orders: dict[tuple[int, int], Any] = {}


def bump(bucket: Bucket, tally: Tally, step: complex) -> None:
    entry = bucket.get(tally, 0j) + step
    if entry.real:
        bucket[tally] = entry
    else:
        bucket.pop(tally, None)  # no signal left in it
