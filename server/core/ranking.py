"""Ranked reads over the board: the top of one (layer, key, kind) by count, weight or
trend, a page at a time, and an entity's counts in a window.

A page is a range of the ranking's order (``orders``) past the last pair of the one
before, so pages neither repeat nor skip while nothing changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import msgpack

from tidal.protocol.errors import quoted
from tidal.protocol.limits import ENTITY_MAX_BYTES, KIND_MAX_BYTES, NAME_MAX_BYTES
from tidal.protocol.refusals import InvalidParams
from tidal.protocol.schemas import WINDOW_ALIASES

from . import counts, params, windows
from .board import Board
from .ledger import COHORT, COMMUNITY, LEDGER, Slot
from .order import BY, COUNT, TREND, WEIGHT
from .orders import order


def top(board: Board, slot: Slot, by: int, which: int, limit: int, after: tuple[Any, str] | None,
        as_of_ns: int) -> dict[str, Any]:  # fmt: skip
    """A page of the ranking, as ``top`` answers it. The board has been advanced to
    ``as_of_ns``."""
    scope = board.scope(slot)
    if scope is None:
        return {"entities": [], "next": None, "as_of_ns": as_of_ns}
    kept = order(board, scope, by, which, after, limit, as_of_ns)
    head = (
        kept.ranked.irange(minimum=after, inclusive=(False, False))
        if after is not None
        else iter(kept.ranked)
    )
    pairs = list(itertools.islice(head, limit + 1))  # one more: is there a next page?
    if len(pairs) <= limit and kept.floor is not None:  # past what the order holds (rare)
        pairs += kept.below(scope, after, limit + 1 - len(pairs))
    more = len(pairs) > limit
    factor = 1.0
    if by == TREND:
        half_life, base = board.decay[which]
        factor = windows.score_factor(as_of_ns, base, half_life)
    entities: list[dict[str, Any]] = []
    last: tuple[Any, str] | None = None
    for pair in pairs[:limit]:
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
    layer_name, name, kind_value = params.string(args[0]), args[1], args[2]
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
            raise InvalidParams(f"name: no cohort named {quoted(cohort)} (see cohorts())")
        key = cohorts[cohort]
    else:
        key = params.text(name, "name", NAME_MAX_BYTES)
    kind = params.text(kind_value, "kind", KIND_MAX_BYTES)
    given = params.options(args[3] if len(args) > 3 else None, "options", "top", _OPTIONS)
    by_name = params.string(given.get("by", "count"))
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
    value = params.string(value)
    if type(value) is str:
        value = WINDOW_ALIASES.get(value, value)
    if type(value) is not str or value not in windows.WINDOW_NAMES:
        names = [*windows.WINDOW_NAMES, *WINDOW_ALIASES]
        raise InvalidParams(
            f"{where}: must be one of {', '.join(map(repr, names))}, got {_shown(value)}"
        )
    return windows.window_index(value)


def _half_life(value: object, decay: Sequence[tuple[int, int]]) -> int:
    value = params.string(value)
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
