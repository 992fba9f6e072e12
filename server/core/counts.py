"""A ``counts`` reply: an entity's aggregates in pages."""

from __future__ import annotations

from typing import Any

from .ledger import COHORT, LEDGER, Slot


def page(
    entity: str,
    cohort_names: dict[int, str],
    totals: dict[Slot, list[Any]],
    after: Slot | None,
    limit: int,
) -> dict[str, Any]:
    """The page of ``limit`` aggregates past ``after``, in slot order, and ``more`` if it
    was cut. Aggregates of cohorts dropped or redefined since (ids not in
    ``cohort_names``) are not shown, nor an aggregate a purge emptied (the page may be
    short), as from a recompute."""
    ordered = sorted(totals.items())
    more = None
    if len(ordered) > limit:
        ordered = ordered[:limit]
        more = list(ordered[-1][0])
    ordered = [item for item in ordered if item[1][0]]
    ledger: dict[str, Any] = {}
    cohorts: dict[str, dict[str, Any]] = {}
    communities: dict[str, dict[str, Any]] = {}
    for (layer, key, kind), (count, weight) in sorted(ordered, key=_slot_order):
        entry = {"count": count, "weight": weight}
        if layer == LEDGER:
            ledger[kind] = entry
        elif layer == COHORT:
            name = cohort_names.get(key) if isinstance(key, int) else None
            if name is not None:
                cohorts.setdefault(name, {})[kind] = entry
        else:
            communities.setdefault(str(key), {})[kind] = entry
    result: dict[str, Any] = {"ledger": ledger, "cohorts": cohorts, "communities": communities}
    if more is not None:
        result["more"] = more  # give it back as page "after" for the next page
    return result


def _slot_order(item: tuple[Slot, list[Any]]) -> tuple[int, str, str]:
    (layer, key, kind), _ = item
    return (layer, str(key), kind)
