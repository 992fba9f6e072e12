"""A ``counts`` read: what memory held about an entity when it was processed, the table's
rows read after, and the withdrawals still pending, merged into one page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from .ledger import COHORT, LEDGER, Slot

#: entity -> slot -> [count, weight]
Deltas: TypeAlias = dict[str, dict[Slot, list[Any]]]


class Adjustment(Protocol):
    """What a ``counts`` read must take off what it captured: a purge or erase read
    before it and not yet committed (``past.Pending``), known here by its shape."""

    def apply(self, entity: str, totals: dict[Slot, list[Any]]) -> None: ...


def add_copy(
    into: dict[Slot, list[Any]], slots: dict[Slot, list[Any]] | None, after: Slot | None = None
) -> None:
    if slots:
        for slot, (count, weight) in slots.items():
            if after is not None and slot <= after:
                continue
            tally = into.get(slot)
            if tally is None:
                into[slot] = [count, weight]
            else:
                tally[0] += count
                tally[1] += weight


@dataclass(slots=True)
class CountsRead:
    """One ``counts`` request: memory captured when it was processed, the table read later.

    If a checkpoint was being committed at capture, ``flushing`` holds the
    entity's share of it; whether the table already includes it is told by the
    watermark read with the rows. Rows of cohorts dropped or redefined since
    (ids not in ``cohort_names``) are not shown.
    """

    entity: str
    cohort_names: dict[int, str]
    flushing_to: int | None
    flushing: dict[Slot, list[Any]]
    rest: dict[Slot, list[Any]]
    pending: Sequence[Adjustment]  # purges and erases read before it, not committed then
    after: Slot | None  # the page starts past this aggregate
    limit: int  # and holds at most this many
    rows: list[tuple[int, int | str, str, int, float]] | None = None
    table_watermark: int = 0

    def answer(self) -> dict[str, Any]:
        """The page: each source gave its first ``limit + 1`` aggregates past ``after``, so
        the first ``limit`` of them all are exact, and one more says the page was cut."""
        totals: dict[Slot, list[Any]] = {}
        for layer, key, kind, count, weight in self.rows or ():
            totals[(layer, key, kind)] = [count, weight]
        if self.flushing_to is not None and self.table_watermark < self.flushing_to:
            add_copy(totals, self.flushing)
        add_copy(totals, self.rest)
        for withdrawal in self.pending:
            withdrawal.apply(self.entity, totals)
        ordered = sorted(totals.items())
        more = None
        if len(ordered) > self.limit:
            ordered = ordered[: self.limit]
            more = list(ordered[-1][0])
        # an aggregate a purge emptied is gone, as from a recompute (the page may be short)
        ordered = [item for item in ordered if item[1][0]]
        ledger: dict[str, Any] = {}
        cohorts: dict[str, dict[str, Any]] = {}
        communities: dict[str, dict[str, Any]] = {}
        for (layer, key, kind), (count, weight) in sorted(ordered, key=_slot_order):
            entry = {"count": count, "weight": weight}
            if layer == LEDGER:
                ledger[kind] = entry
            elif layer == COHORT:
                name = self.cohort_names.get(key) if isinstance(key, int) else None
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
