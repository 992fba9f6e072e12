"""Ranked reads over the board: the top of one (layer, key, kind) by count, weight or
trend, a page at a time, and an entity's counts in a window.

An order (one per scope, per score, per window or half-life) is a sorted list of
``(-score, entity)``, built when first read and kept while it is read: each read
first moves the entities changed since the last (``Scope.dirty``, handed to each
order as its ``pending``), so its cost follows what changed, not how many entities
there are. A page starts past the last pair of the one before, so pages neither
repeat nor skip while nothing changes.

What a read costs is its own: building an order of a big scope, or moving many
entities into one, is done ``SLICE`` entities at a time (``prepare``), between which
the server serves everyone else; the read answers once the rest is small. An order
not read for ``ORDER_IDLE_NS`` is dropped (``evict``), and with it the tracking of its
scope's changes: each kept order costs about 250 bytes per entity ranked
(docs/DESIGN.md, "Rankings and windows").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple

import msgpack
from sortedcontainers import SortedList

from tidal.protocol.limits import ENTITY_MAX_BYTES, KIND_MAX_BYTES, NAME_MAX_BYTES
from tidal.server.errors import InvalidParams

from . import counts, params, windows
from .board import Board
from .ledger import COHORT, COMMUNITY, LEDGER, Slot
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


def top(board: Board, slot: Slot, by: int, which: int, limit: int, after: tuple[Any, str] | None,
        as_of_ns: int) -> dict[str, Any]:  # fmt: skip
    """A page of the ranking, as ``top`` answers it. The board has been advanced to
    ``as_of_ns``."""
    scope = board.scope(slot)
    if scope is None:
        return {"entities": [], "next": None, "as_of_ns": as_of_ns}
    kept = order(board, scope, by, which, as_of_ns)
    pairs = (
        kept.ranked.irange(minimum=after, inclusive=(False, False))
        if after is not None
        else iter(kept.ranked)
    )
    factor = 1.0
    if by == TREND:
        half_life, base = board.decay[which]
        factor = windows.score_factor(as_of_ns, base, half_life)
    entities: list[dict[str, Any]] = []
    last: tuple[Any, str] | None = None
    more = False
    for pair in pairs:
        if len(entities) == limit:
            more = True
            break
        tally = scope.tallies[pair[1]]
        count, weight = tally.window(-1 if by == TREND else which)
        score = float(count) if by == COUNT else weight if by == WEIGHT else -pair[0] * factor
        entities.append({"entity": pair[1], "count": count, "weight": weight, "score": score})
        last = pair
    cursor = _cursor(by, which, last) if more and last is not None else None
    return {"entities": entities, "next": cursor, "as_of_ns": as_of_ns}


def _cursor(by: int, which: int, last: tuple[Any, str]) -> bytes:
    return msgpack.packb([by, which, last[0], last[1]], use_bin_type=True)


def read_cursor(value: object, by: int, which: int) -> tuple[Any, str]:
    """The ``next`` of a previous page of the same ranking, given back as ``after``."""
    wrong = InvalidParams(
        "options.after: must be the 'next' of a previous top reply with the same layer,"
        " name, kind, by, window and half_life"
    )
    if type(value) is not bytes or len(value) > 1024:
        raise wrong
    try:
        parts = msgpack.unpackb(value, raw=False, max_bin_len=0, max_ext_len=0)
    except Exception:
        raise wrong from None
    if type(parts) is not list or len(parts) != 4 or parts[:2] != [by, which]:
        raise wrong
    key, entity = parts[2], parts[3]
    if type(key) not in (int, float) or type(entity) is not str or key != key:
        raise wrong
    return (key, entity)


def window_counts(
    board: Board, entity: str, window: int, cohort_names: dict[int, str],
    after: Slot | None, limit: int,
) -> dict[str, Any]:  # fmt: skip
    """``counts(entity)``, all-time (``window`` -1) or in a window, from the board."""
    totals: dict[Slot, list[Any]] = {}
    for tally in board.tallies_of(entity):
        slot = tally.scope.slot
        count, weight = tally.window(window)
        if count and (after is None or slot > after):
            totals[slot] = [count, weight]
    return counts.page(entity, cohort_names, totals, after, limit)


LAYERS: Final = {"ledger": LEDGER, "cohort": COHORT, "community": COMMUNITY}
_OPTIONS: Final = ("by", "window", "half_life", "limit", "after")
TOP_LIMIT: Final = 1000
#: what one entity adds to a reply, at most (an entity of ENTITY_MAX_BYTES, and the rest)
TOP_ENTRY_BYTES: Final = ENTITY_MAX_BYTES + 64


class TopRequest(NamedTuple):
    slot: Slot
    by: int
    which: int
    limit: int
    after: tuple[Any, str] | None


def top_request(
    args: list[Any], cohorts: dict[str, int], decay: Sequence[tuple[int, int]], budget: int
) -> TopRequest:
    """``top(layer, name, kind, options={})``, checked: each argument and option by name."""
    params.arity(args, "top", "layer, name, kind, options={}", 3, 4)
    layer_name, name, kind_value = args[0], args[1], args[2]
    if type(layer_name) is bytes:
        layer_name = layer_name.decode("utf-8", "replace")
    if type(layer_name) is not str or layer_name not in LAYERS:  # a list is no dict key
        raise InvalidParams(
            f"layer: must be 'ledger', 'cohort' or 'community', got {_shown(layer_name)}"
        )
    layer = LAYERS[layer_name]
    key: int | str = ""
    if layer == LEDGER:
        if name is not None:
            raise InvalidParams(f"name: must be nil for the ledger layer, got {_shown(name)}")
    elif layer == COHORT:
        cohort = params.text(name, "name", NAME_MAX_BYTES)
        if cohort not in cohorts:
            raise InvalidParams(f"name: no cohort named {cohort!r} (see cohorts())")
        key = cohorts[cohort]
    else:
        key = params.text(name, "name", NAME_MAX_BYTES)
    kind = params.text(kind_value, "kind", KIND_MAX_BYTES)
    options = args[3] if len(args) > 3 and args[3] is not None else {}
    if type(options) is not dict:
        raise InvalidParams(f"options: must be a map, got {params.describe(options)}")
    given: dict[str, Any] = {}
    for raw, value in options.items():
        option = raw.decode("utf-8", "replace") if type(raw) is bytes else raw
        if option not in _OPTIONS:
            raise InvalidParams(
                f"options: unknown option {_shown(option)}; top takes"
                f" {', '.join(map(repr, _OPTIONS))}"
            )
        given[option] = value
    by_name = given.get("by", "count")
    if by_name not in BY:
        raise InvalidParams(
            f"options.by: must be 'count', 'weight' or 'trend', got {_shown(by_name)}"
        )
    by = BY.index(by_name)
    if by == TREND:
        if "window" in given:
            raise InvalidParams("options.window: not with by 'trend' (a trend decays instead)")
        which = _half_life(given.get("half_life"), decay)
    else:
        if "half_life" in given:
            raise InvalidParams("options.half_life: only with by 'trend'")
        which = _window(given.get("window", "all"), "options.window")
    limit = given.get("limit", 10)
    if type(limit) is not int or not 1 <= limit <= TOP_LIMIT:
        raise InvalidParams(f"options.limit: must be an integer in 1..{TOP_LIMIT}")
    after = given.get("after")
    cursor = None if after is None else read_cursor(after, by, which)
    # a reply never passes the message limit: a shorter page, and its cursor, instead
    limit = max(1, min(limit, budget // TOP_ENTRY_BYTES))
    return TopRequest((layer, key, kind), by, which, limit, cursor)


def window_option(value: object) -> int:
    """``counts``' ``window``: -1 for all-time, else the window's place."""
    return _window(value, "page.window")


def _window(value: object, where: str) -> int:
    if type(value) is not str or value not in windows.WINDOW_NAMES:
        raise InvalidParams(
            f"{where}: must be one of {', '.join(map(repr, windows.WINDOW_NAMES))},"
            f" got {_shown(value)}"
        )
    return windows.window_index(value)


def _half_life(value: object, decay: Sequence[tuple[int, int]]) -> int:
    if value is None:
        return 0
    offered = ", ".join(repr(windows.show_half_life(hl)) for hl, _ in decay)
    wrong = InvalidParams(
        f"options.half_life: must be one the server ranks trends by ({offered};"
        f" see --trend-half-lives), got {_shown(value)}"
    )
    if type(value) is not str:
        raise wrong
    try:
        seconds = windows.parse_half_life(value)
    except ValueError:
        raise wrong from None
    for i, (hl, _) in enumerate(decay):
        if hl == seconds:
            return i
    raise wrong


def _shown(value: object) -> str:
    return repr(value) if type(value) is str and len(value) <= 64 else params.describe(value)
