"""One kept order of a scope's ranking (``Order``): a range of its ``(-score, entity)``
pairs sorted, the head (from the top) or a segment deeper down (past a ``ceiling``), and
what it needs to stay exact as its scope changes: every entity left out ranks below its
``floor`` (or at or above its ceiling), so a changed entity is compared with those and
only one that falls between them is moved into the sorted list. ``orders`` keeps them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

from sortedcontainers import SortedList

from .tallies import Scope, Tally

BY: Final = ("count", "weight", "trend")
COUNT, WEIGHT, TREND = 0, 1, 2

#: entities whose keys are computed and sorted per turn of the event loop when an order
#: is built (about 2 ms of work here); a quarter as many moved into a built order
SLICE: Final = 4096
#: pairs the head of an order keeps, the rest left below its floor; twice
#: ``ranking.TOP_LIMIT``, so that a page of the most answers from it
HEAD: Final = 2048
#: pairs a deep segment keeps: a reader paging on past the head, 1,000 at a time, builds
#: one for about every seventh page (with ``HEAD``, every page or second page: each
#: build reads the whole scope, in slices)
SEGMENT: Final = 4 * HEAD

Pair = tuple[float, str]


class Order:
    """A range of a scope's ranking: its ``size`` best pairs (-score, entity) with signals
    in the window, sorted, past ``ceiling`` if it has one (a segment read by deep pages,
    ``SEGMENT`` of them; None: the head, from the top, ``HEAD``). Every entity left out
    ranks below ``floor``, the worst pair taken in when it was built (None: none was left
    out), or at or above the ceiling. ``pending``: entities whose key may have changed
    since they were looked at. ``building``: the steps that fill it from scratch, until
    they are done. ``followed``: changes taken in since it was last read; ``behind``: so
    many that its next read builds it again, and none is taken in until then
    (``orders.follow``)."""

    __slots__ = (
        "behind", "building", "by", "ceiling", "floor", "followed", "keys", "pending", "ranked",
        "read_ns", "size", "which",
    )  # fmt: skip

    def __init__(self, by: int, which: int, now_ns: int, ceiling: Pair | None = None) -> None:
        self.by = by
        self.which = which  # a window (-1: all) or, for trend, a half-life's place
        self.ceiling = ceiling
        self.size = HEAD if ceiling is None else SEGMENT
        self.keys: dict[str, Pair] = {}  # of the entities in the range
        self.ranked: SortedList[Pair] = SortedList()
        self.floor: Pair | None = None
        self.pending: set[str] = set()
        self.read_ns = now_ns
        self.building: Iterator[None] | None = None
        self.followed = 0
        self.behind = False

    def key(self, tally: Tally) -> float | None:
        if self.by == TREND:
            return -tally.trend(self.which)
        count, weight = tally.window(self.which)
        if not count:
            return None
        return -count if self.by == COUNT else -weight

    def update(self, entity: str, tally: Tally | None) -> None:
        """Its new place: in the range if it ranks above the floor (and below the ceiling),
        else left out with the others (a member that fell out leaves it)."""
        old = self.keys.pop(entity, None)
        if old is not None:
            self.ranked.remove(old)
        key = None if tally is None else self.key(tally)
        if key is not None:
            floor = self.floor
            # most changes rank below the floor: told apart without a pair made for them
            if floor is None or key < floor[0] or (key == floor[0] and entity <= floor[1]):
                pair = (key, entity)
                if self.ceiling is None or pair > self.ceiling:
                    self.keys[entity] = pair
                    self.ranked.add(pair)

    def catch_up(self, tallies: dict[str, Tally], most: int) -> None:
        """Moves in at most ``most`` of the pending entities."""
        pending, update = self.pending, self.update
        if most >= len(pending):
            for entity in pending:
                update(entity, tallies.get(entity))
            pending.clear()
        else:
            for _ in range(most):
                entity = pending.pop()
                update(entity, tallies.get(entity))
        self.trim()

    def trim(self) -> None:
        """Grown past twice its size, it gives back its worst, the floor rising to the last
        kept."""
        size = self.size
        if len(self.ranked) > 2 * size:
            for _, entity in self.ranked[size:]:
                del self.keys[entity]
            del self.ranked[size:]
            self.floor = self.ranked[-1]

    def short(self) -> bool:
        """Too few left above the floor (members fell below it): built again."""
        return self.floor is not None and len(self.ranked) < self.size // 2

    def build(self, scope: Scope) -> Iterator[None]:
        """Fills it from scratch, a slice a step: keys computed in runs of ``SLICE``, the
        best ``size`` past the ceiling kept as they come. What changes meanwhile is handed
        out as ``pending``."""
        self.keys, self.ranked, self.pending, self.floor = {}, SortedList(), set(), None
        entities = list(scope.tallies)
        best: list[Pair] = []
        ranked = 0
        key, tallies, ceiling, size = self.key, scope.tallies, self.ceiling, self.size
        for i in range(0, len(entities), SLICE):
            run = []
            for entity in entities[i : i + SLICE]:
                tally = tallies.get(entity)
                k = None if tally is None else key(tally)
                if k is not None:
                    run.append((k, entity))
            if ceiling is not None:
                run = [pair for pair in run if pair > ceiling]
            ranked += len(run)
            if len(best) == size:
                worst = best[-1]
                run = [pair for pair in run if pair < worst]
            if run:
                best = sorted(best + run)[:size]
            yield
        self.ranked = SortedList(best)
        self.keys = {pair[1]: pair for pair in best}
        self.floor = best[-1] if ranked > len(best) else None
        self.building = None

    def past(self, after: Pair | None) -> int:
        """Pairs it holds past ``after`` (all: None)."""
        return len(self.ranked) - (0 if after is None else self.ranked.bisect_right(after))

    def serves(self, after: Pair | None, limit: int) -> bool:
        """A page of ``limit`` past ``after`` (and whether there is a next) comes from it."""
        ceiling = self.ceiling
        if ceiling is not None and (after is None or after < ceiling):
            return False
        return self.floor is None or self.past(after) > limit

    def below(self, scope: Scope, after: Pair | None, n: int) -> list[Pair]:
        """The ``n`` best pairs past its floor (and past ``after``): it reads every entity of
        the scope, as a build does, but keeps nothing. Only a page that ``serves`` no more
        by the time it is answered (see ``orders.prepare``) comes here."""
        assert self.floor is not None
        start = self.floor if after is None or after < self.floor else after
        key = self.key
        pairs = []
        for entity, tally in scope.tallies.items():
            k = key(tally)
            if k is not None and (pair := (k, entity)) > start:
                pairs.append(pair)
        return heapq.nsmallest(n, pairs)
