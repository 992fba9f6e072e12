"""A ``catalog`` page: what the board holds, named, so that a newcomer can look around
without knowing a name (as Redis's ``SCAN`` or ``\\dt`` let one): the ledger's kinds, the
cohorts or the communities, in name order, each with its aggregates and the signals they
count (all-time, as committed).

The names are gathered from the board's scopes (one per layer, key and kind: far fewer
than aggregates); only the page's are summed, so a page costs its own aggregates, not
the layer's.
"""

from __future__ import annotations

from typing import Any

from .board import Board
from .ledger import COHORT, LEDGER
from .tallies import Scope


def page(
    board: Board, cohort_names: dict[int, str], layer: int, after: str | None, limit: int
) -> dict[str, Any]:
    scopes: dict[str, list[Scope]] = {}
    if layer == COHORT:  # a defined cohort is listed, counted or not
        scopes.update((defined, []) for defined in cohort_names.values())
    for (on, key, kind), scope in board.scopes.items():
        if on != layer or not scope.tallies:
            continue
        if layer == LEDGER:
            name: str | None = kind
        elif layer == COHORT:
            name = cohort_names.get(key) if isinstance(key, int) else None
        else:
            name = str(key)
        if name is not None:
            scopes.setdefault(name, []).append(scope)
    names = sorted(n for n in scopes if after is None or n > after)
    listed = names[:limit]
    items = [
        {
            "name": name,
            "aggregates": sum(len(s.tallies) for s in scopes[name]),
            "count": sum(t.count for s in scopes[name] for t in s.tallies.values()),
        }
        for name in listed
    ]
    return {"items": items, "next": listed[-1] if len(names) > limit else None}
