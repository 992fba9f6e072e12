"""The orders ``top`` reads, kept per scope, per score, per window or half-life
(``order.Order``): the head of each ranking, its ``HEAD`` best ``(-score, entity)``
pairs, built when first read and kept while it is read, and for pages past the head
a segment of ``SEGMENT`` pairs past a page's cursor, built when a page first needs it.
The entities each commit changes (``Scope.dirty``) are taken into the orders kept as
the board takes the commit in (``follow``), so a read finds little left to do, and what
an order holds is bounded whatever the scope's size.

What a read costs is its own: building an order of a big scope (a head, or a segment
deeper down), or looking at many changed entities (``pending``), is done ``SLICE``
entities at a time (``prepare``), between which the server serves everyone else; the
read answers once the rest is small. An order not read for ``ORDER_IDLE_NS`` is dropped
(``evict``), and with it the tracking of its scope's changes (docs/DESIGN.md, "Rankings
and windows").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from .board import Board
from .ledger import Slot
from .order import SLICE, Order, Pair
from .tallies import Scope

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
#: the third part of a kept order's name: the head, or the segment deep pages read
TOP, DEEP = 0, 1


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


def _kept(board: Board, scope: Scope, by: int, which: int, ceiling: Pair | None,
          now_ns: int) -> Order:  # fmt: skip
    """The order (the head, or with a ``ceiling`` the deep segment past it), kept from now
    on, built from scratch if new, if a segment must start elsewhere, if its range ran
    short, or if half the scope changed (a build costs half as much per entity as looking
    at a change: 0.47 µs and 0.94 µs here)."""
    _hand_out(scope)
    name = (by, which, TOP if ceiling is None else DEEP)
    kept = scope.orders.get(name)
    if kept is None:
        kept = scope.orders[name] = Order(by, which, now_ns, ceiling)
        board.ordered.add(scope)
        kept.building = kept.build(scope)
    assert isinstance(kept, Order)
    kept.followed = 0
    if kept.ceiling != ceiling:  # a segment past another cursor: a new one (the one it
        # replaces may be being built for a reader, who then finds this one)
        kept = scope.orders[name] = Order(by, which, now_ns, ceiling)
        kept.building = kept.build(scope)
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


def _ready(kept: Order) -> bool:
    return kept.building is None and len(kept.pending) <= SLICE


def _deep(board: Board, scope: Scope, head: Order, after: Pair | None, limit: int,
          now_ns: int) -> Order | None:  # fmt: skip
    """The segment a page past ``after`` is read from, when the head does not hold the
    page: the one kept if it does, else one built past ``after``. Sequential pages of a
    deep reader find the segment holding them, a build for about every seventh page."""
    if head.serves(after, limit):
        return None
    kept = scope.orders.get((head.by, head.which, DEEP))
    if isinstance(kept, Order) and kept.building is None and kept.serves(after, limit):
        return _kept(board, scope, head.by, head.which, kept.ceiling, now_ns)
    return _kept(board, scope, head.by, head.which, after, now_ns)


def prepare(board: Board, slot: Slot, by: int, which: int, after: Pair | None, limit: int,
            now_ns: int) -> Iterator[None] | None:  # fmt: skip
    """The work a read of a page past ``after`` has to do before it answers, if more than a
    slice: steps of about ``SLICE`` entities each, to run one per turn of the event loop,
    after which what is left is small; None if it is small already."""
    scope = board.scope(slot)
    if scope is None:
        return None
    head = _kept(board, scope, by, which, None, now_ns)
    if not _ready(head):
        return _both(board, scope, head, after, limit, now_ns)
    deep = _deep(board, scope, head, after, limit, now_ns)
    if deep is None or _ready(deep):
        return None
    return _steps(scope, deep)


def _both(board: Board, scope: Scope, head: Order, after: Pair | None, limit: int,
          now_ns: int) -> Iterator[None]:  # fmt: skip
    yield from _steps(scope, head)
    deep = _deep(board, scope, head, after, limit, now_ns)
    if deep is not None and not _ready(deep):
        yield from _steps(scope, deep)


def _steps(scope: Scope, kept: Order) -> Iterator[None]:
    if kept.building is not None:
        yield from kept.building
    _hand_out(scope)  # what changed meanwhile
    while len(kept.pending) > SLICE:
        kept.catch_up(scope.tallies, SLICE // 4)
        yield
        _hand_out(scope)


def order(board: Board, scope: Scope, by: int, which: int, after: Pair | None, limit: int,
          now_ns: int) -> Order:  # fmt: skip
    """The order a page of ``limit`` past ``after`` is read from (the head, or the deep
    segment holding it), up to date with every change taken in (all at once: ``prepare``
    first, to keep that small)."""
    head = _current(board, scope, _kept(board, scope, by, which, None, now_ns))
    deep = _deep(board, scope, head, after, limit, now_ns)
    return head if deep is None else _current(board, scope, deep)


def _current(board: Board, scope: Scope, kept: Order) -> Order:
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
