"""The orders ``top`` reads: per scope, per score, per window or half-life, a sorted
list of ``(-score, entity)``, built when first read and kept while it is read. Each read
first moves in the entities changed since the last (``Scope.dirty``, handed to each
order as its ``pending``), so its cost follows what changed, not how many entities
there are.

What a read costs is its own: building an order of a big scope, or moving many
entities into one, is done ``SLICE`` entities at a time (``prepare``), between which
the server serves everyone else; the read answers once the rest is small. An order
not read for ``ORDER_IDLE_NS`` is dropped (``evict``), and with it the tracking of its
scope's changes: each kept order costs about 250 bytes per entity ranked
(docs/DESIGN.md, "Rankings and windows").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Final

from sortedcontainers import SortedList

from .board import Board
from .ledger import Slot
from .tallies import Scope, Tally

BY: Final = ("count", "weight", "trend")
COUNT, WEIGHT, TREND = 0, 1, 2

#: entities whose keys are computed and sorted per turn of the event loop when an order
#: is built (about 1 ms of work here); a quarter as many moved into a built order
SLICE: Final = 1024
#: an order not read for this long is dropped; the next read builds it again
ORDER_IDLE_NS: Final = 60 * 10**9
#: how often kept orders are looked at for dropping
EVICT_EVERY_NS: Final = 5 * 10**9


class Order:
    """The tallies of a scope with signals in the window, highest score first, then by
    entity. ``pending``: entities whose key may have changed since they were moved in.
    ``building``: the steps that fill it from scratch, until they are done."""

    __slots__ = ("building", "by", "keys", "pending", "ranked", "read_ns", "which")

    def __init__(self, by: int, which: int, now_ns: int) -> None:
        self.by = by
        self.which = which  # a window (-1: all) or, for trend, a half-life's place
        self.keys: dict[str, tuple[float, str]] = {}
        self.ranked: SortedList[tuple[float, str]] = SortedList()
        self.pending: set[str] = set()
        self.read_ns = now_ns
        self.building: Iterator[None] | None = None

    def key(self, tally: Tally) -> float | None:
        if self.by == TREND:
            return -tally.trend[self.which]
        count, weight = tally.window(self.which)
        if not count:
            return None
        return -count if self.by == COUNT else -weight

    def update(self, entity: str, tally: Tally | None) -> None:
        old = self.keys.pop(entity, None)
        if old is not None:
            self.ranked.remove(old)
        key = None if tally is None else self.key(tally)
        if key is not None:
            new = self.keys[entity] = (key, entity)
            self.ranked.add(new)

    def catch_up(self, tallies: dict[str, Tally], most: int) -> None:
        """Moves in at most ``most`` of the pending entities."""
        pending, update = self.pending, self.update
        for _ in range(min(most, len(pending))):
            entity = pending.pop()
            update(entity, tallies.get(entity))

    def build(self, scope: Scope) -> Iterator[None]:
        """Fills it from scratch, a slice a step: keys computed and sorted in runs of
        ``SLICE``, the runs merged, then taken in at once (a sorted list is checked in
        one pass). What changes meanwhile is handed out as ``pending``."""
        self.keys, self.ranked, self.pending = {}, SortedList(), set()
        entities = list(scope.tallies)
        runs: list[list[tuple[float, str]]] = []
        key, keys, tallies = self.key, self.keys, scope.tallies
        for i in range(0, len(entities), SLICE):
            run = []
            for entity in entities[i : i + SLICE]:
                tally = tallies.get(entity)
                k = None if tally is None else key(tally)
                if k is not None:
                    run.append(pair := (k, entity))
                    keys[entity] = pair
            run.sort()
            runs.append(run)
            yield
        merged: list[tuple[float, str]] = []
        for n, pair in enumerate(heapq.merge(*runs), 1):
            merged.append(pair)
            if n % (SLICE * 4) == 0:
                yield
        self.ranked = SortedList(merged)
        self.building = None


def _hand_out(scope: Scope) -> None:
    """The entities changed since the last read go to each order's ``pending``."""
    if scope.dirty:
        for kept in scope.orders.values():
            kept.pending |= scope.dirty
        scope.dirty.clear()


def _kept(board: Board, scope: Scope, by: int, which: int, now_ns: int) -> Order:
    """The order, kept from now on, built from scratch if new or if most of it changed
    (a build costs a few times less per entity than moving one)."""
    _hand_out(scope)
    kept = scope.orders.get((by, which))
    if kept is None:
        kept = scope.orders[(by, which)] = Order(by, which, now_ns)
        board.ordered.add(scope)
        kept.building = kept.build(scope)
    assert isinstance(kept, Order)
    if kept.building is None and len(kept.pending) > max(SLICE, len(kept.keys) // 4):
        kept.building = kept.build(scope)
    if kept.building is not None and len(scope.tallies) <= SLICE:  # a slice: now
        for _ in kept.building:
            pass
    kept.read_ns = now_ns
    return kept


def prepare(board: Board, slot: Slot, by: int, which: int, now_ns: int) -> Iterator[None] | None:
    """The work a read of this order has to do before it answers, if more than a slice:
    steps of about ``SLICE`` entities each, to run one per turn of the event loop, after
    which what is left is small; None if it is small already."""
    scope = board.scope(slot)
    if scope is None:
        return None
    kept = _kept(board, scope, by, which, now_ns)
    if kept.building is None and len(kept.pending) <= SLICE:
        return None
    return _steps(scope, kept)


def _steps(scope: Scope, kept: Order) -> Iterator[None]:
    if kept.building is not None:
        yield from kept.building
    _hand_out(scope)  # what changed meanwhile
    while len(kept.pending) > SLICE:
        kept.catch_up(scope.tallies, SLICE // 4)
        yield
        _hand_out(scope)


def order(board: Board, scope: Scope, by: int, which: int, now_ns: int) -> Order:
    """``scope``'s order by ``by``, up to date with every change taken in (all at once:
    ``prepare`` first, to keep that small)."""
    kept = _kept(board, scope, by, which, now_ns)
    if kept.building is not None:
        for _ in kept.building:
            pass
        _hand_out(scope)
    kept.catch_up(scope.tallies, len(kept.pending))
    return kept


def evict(board: Board, now_ns: int) -> None:
    """Drops the orders not read for ``ORDER_IDLE_NS`` (looked at every few seconds)."""
    if now_ns < board.evict_ns:
        return
    board.evict_ns = now_ns + EVICT_EVERY_NS
    for scope in list(board.ordered):
        for name, kept in list(scope.orders.items()):
            if now_ns - kept.read_ns > ORDER_IDLE_NS:
                del scope.orders[name]
        if not scope.orders:
            board.unordered(scope)


def kept_orders(board: Board) -> tuple[int, int]:
    """Orders kept, and the entities ranked in them."""
    orders = [kept for scope in board.ordered for kept in scope.orders.values()]
    return len(orders), sum(len(kept.keys) for kept in orders)
