"""The orders ``top`` reads: per scope, per score, per window or half-life, the head of
the ranking, its ``HEAD`` best ``(-score, entity)`` pairs sorted, built when first read
and kept while it is read. Every entity left out of the head ranks below its ``floor``;
so a changed entity is compared with the floor, and only one that ranks above it is
moved into the sorted list. The entities each commit changes (``Scope.dirty``) are
taken into the orders kept as the board takes the commit in (``follow``), so a read
finds little left to do, and what an order holds is bounded whatever the scope's size.
A page past the head reads the whole scope (``Order.below``).

What a read costs is its own: building an order of a big scope, or looking at many
changed entities (``pending``), is done ``SLICE`` entities at a time (``prepare``),
between which the server serves everyone else; the read answers once the rest is small.
An order not read for ``ORDER_IDLE_NS`` is dropped (``evict``), and with it the tracking
of its scope's changes (docs/DESIGN.md, "Rankings and windows").
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
#: is built (about 2 ms of work here); a quarter as many moved into a built order
SLICE: Final = 4096
#: pairs an order keeps at the head of its ranking, the rest left below its floor; twice
#: ``ranking.TOP_LIMIT``, so that a page of the most answers from it
HEAD: Final = 2048
#: changed entities an order takes in as a commit is taken in (``follow``); more wait
#: for the next commit or read
FOLLOW: Final = SLICE
#: an order that took in this many times its scope's entities in changes since it was
#: last read is built again at its next read, and takes nothing in until then: a reader
#: that comes back every few seconds to an order written as fast as the server can
#: finds it ready (with 1, a build of each read in turn, of the 11 orders of a scope
#: of 200,000, let the changes to the others pass that before their turn)
BEHIND: Final = 4
#: an order not read for this long is dropped; the next read builds it again
ORDER_IDLE_NS: Final = 60 * 10**9
#: how often kept orders are looked at for dropping
EVICT_EVERY_NS: Final = 5 * 10**9


class Order:
    """The head of a scope's ranking: its ``HEAD`` best pairs (-score, entity) with
    signals in the window, sorted. Every entity left out ranks below ``floor``, the worst
    pair taken in when it was built (None: none was left out). ``pending``: entities whose
    key may have changed since they were looked at. ``building``: the steps that fill it
    from scratch, until they are done. ``followed``: changes taken in since it was last
    read; ``behind``: so many that its next read builds it again, and none is taken in
    until then (``follow``)."""

    __slots__ = (
        "behind", "building", "by", "floor", "followed", "keys", "pending", "ranked", "read_ns",
        "which",
    )  # fmt: skip

    def __init__(self, by: int, which: int, now_ns: int) -> None:
        self.by = by
        self.which = which  # a window (-1: all) or, for trend, a half-life's place
        self.keys: dict[str, tuple[float, str]] = {}  # of the entities in the head
        self.ranked: SortedList[tuple[float, str]] = SortedList()
        self.floor: tuple[float, str] | None = None
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
        """Its new place: in the head if it ranks above the floor, else left out with the
        others below it (a member that fell below it leaves the head)."""
        old = self.keys.pop(entity, None)
        if old is not None:
            self.ranked.remove(old)
        key = None if tally is None else self.key(tally)
        if key is not None:
            floor = self.floor
            # most changes rank below the floor: told apart without a pair made for them
            if floor is None or key < floor[0] or (key == floor[0] and entity <= floor[1]):
                pair = (key, entity)
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
        """A head grown past twice its size gives back its worst, the floor rising to the
        last kept."""
        if len(self.ranked) > 2 * HEAD:
            for _, entity in self.ranked[HEAD:]:
                del self.keys[entity]
            del self.ranked[HEAD:]
            self.floor = self.ranked[-1]

    def short(self) -> bool:
        """Too few left in the head above the floor (members fell below it): built again."""
        return self.floor is not None and len(self.ranked) < HEAD // 2

    def build(self, scope: Scope) -> Iterator[None]:
        """Fills it from scratch, a slice a step: keys computed in runs of ``SLICE``, the
        best ``HEAD`` kept as they come. What changes meanwhile is handed out as
        ``pending``."""
        self.keys, self.ranked, self.pending, self.floor = {}, SortedList(), set(), None
        entities = list(scope.tallies)
        best: list[tuple[float, str]] = []
        ranked = 0
        key, tallies = self.key, scope.tallies
        for i in range(0, len(entities), SLICE):
            run = []
            for entity in entities[i : i + SLICE]:
                tally = tallies.get(entity)
                k = None if tally is None else key(tally)
                if k is not None:
                    run.append((k, entity))
            ranked += len(run)
            if len(best) == HEAD:
                worst = best[-1]
                run = [pair for pair in run if pair < worst]
            if run:
                best = sorted(best + run)[:HEAD]
            yield
        self.ranked = SortedList(best)
        self.keys = {pair[1]: pair for pair in best}
        self.floor = best[-1] if ranked > len(best) else None
        self.building = None

    def below(
        self, scope: Scope, after: tuple[float, str] | None, n: int
    ) -> list[tuple[float, str]]:
        """The ``n`` best pairs past the head (and past ``after``): a page beyond the head
        reads every entity of the scope, as a build does, but keeps nothing."""
        assert self.floor is not None
        start = self.floor if after is None or after < self.floor else after
        key = self.key
        pairs = []
        for entity, tally in scope.tallies.items():
            k = key(tally)
            if k is not None and (pair := (k, entity)) > start:
                pairs.append(pair)
        return heapq.nsmallest(n, pairs)


def _hand_out(scope: Scope) -> None:
    """The entities changed since the last read go to each order's ``pending``."""
    if scope.dirty:
        for kept in scope.orders.values():
            if not kept.behind:
                kept.pending |= scope.dirty
        scope.dirty.clear()


def follow(board: Board) -> None:
    """A commit's changes taken into the orders kept, as the board takes the commit in:
    a read then finds little left to do, however fast its order changes. An entity
    changed costs each order kept a key and, in most cases, a comparison with its floor
    (0.5 µs here; 1-2 µs when it moves into the head). Past ``FOLLOW`` changes at once
    (a scope changed whole), or while an order is built, they wait as ``pending``,
    ``FOLLOW`` of them taken in per commit, and a read takes the rest in a slice per turn
    of the loop (``prepare``). An order that took in ``BEHIND`` times as many changes
    since its last read as its scope has entities is left ``behind`` until its next read
    builds it again: following it costs at most a few builds between reads (a change
    taken in costs 1.5-2 times what an entity costs a build), however seldom it is read
    and however fast it is written."""
    for scope in board.ordered:
        dirty = scope.dirty
        if not dirty:
            continue
        now: list[Order] = []
        most = max(FOLLOW, BEHIND * len(scope.tallies))
        for kept in scope.orders.values():
            if kept.behind:
                continue
            if kept.building is not None:
                kept.pending |= dirty
                continue
            kept.followed += len(dirty)
            if kept.followed > most:
                kept.behind = True
                kept.pending = set()
            elif kept.pending or len(dirty) > FOLLOW:
                kept.pending |= dirty
                kept.catch_up(scope.tallies, FOLLOW)
            else:
                now.append(kept)
        if now:
            tallies = scope.tallies
            for entity in dirty:  # each entity's tally looked up once for every order
                tally = tallies.get(entity)
                for kept in now:
                    kept.update(entity, tally)
            for kept in now:
                kept.trim()
        dirty.clear()


def _kept(board: Board, scope: Scope, by: int, which: int, now_ns: int) -> Order:
    """The order, kept from now on, built from scratch if new, if its head ran short, or if
    half the scope changed (a build costs half as much per entity as looking at a change:
    0.47 µs and 0.94 µs here)."""
    _hand_out(scope)
    kept = scope.orders.get((by, which))
    if kept is None:
        kept = scope.orders[(by, which)] = Order(by, which, now_ns)
        board.ordered.add(scope)
        kept.building = kept.build(scope)
    assert isinstance(kept, Order)
    kept.followed = 0
    if kept.building is None and (
        kept.behind or len(kept.pending) > max(SLICE, len(scope.tallies) // 2) or kept.short()
    ):
        kept.behind = False  # what changes from now on is taken in as it comes
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
    """Orders kept, and the entities in their heads."""
    orders = [kept for scope in board.ordered for kept in scope.orders.values()]
    return len(orders), sum(len(kept.keys) for kept in orders)
