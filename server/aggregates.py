"""Aggregates: per entity, per layer, per kind, a count and a weight sum.

They are a view of the ledger. Every ledger row carries what its signal was
forwarded to (communities and cohort ids), so the aggregates table need not be
written with every group commit: committed deltas gather in memory, and now and
then a checkpoint writes them in one pass together with the ledger seq they run
to (the watermark). Boot replays the ledger past the watermark. The writer then
pays one ledger row per signal, and one upsert per distinct aggregate per
checkpoint rather than per batch.

``counts`` adds three things: the table as of its watermark, the deltas in
memory above it, and the deltas of batches not yet committed (its reply waits
for those, like any read that can see a write).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import msgpack

from tidal.protocol.limits import WEIGHT_MAX

LEDGER, COHORT, COMMUNITY = 0, 1, 2

#: (layer, key, kind): key is "" for the ledger, a cohort id, or a community name
Slot: TypeAlias = tuple[int, int | str, str]
#: entity -> slot -> [count, weight]
Deltas: TypeAlias = dict[str, dict[Slot, list[Any]]]

#: A checkpoint is due after this many signals or this many seconds, whichever first.
CHECKPOINT_SIGNALS: Final = 200_000
CHECKPOINT_SECONDS: Final = 10.0


def merge(into: Deltas, more: Deltas) -> None:
    """Add ``more`` to ``into``; ``into`` may take over ``more``'s inner dicts."""
    for entity, slots in more.items():
        mine = into.get(entity)
        if mine is None:
            into[entity] = slots
        else:
            _add_copy(mine, slots)


def bump(tallies: dict[Slot, list[Any]], slot: Slot, weight: float) -> None:
    """One signal more in ``slot``."""
    tally = tallies.get(slot)
    if tally is None:
        tallies[slot] = [1, weight]
    else:
        tally[0] += 1
        tally[1] += weight


def _add_copy(into: dict[Slot, list[Any]], slots: dict[Slot, list[Any]] | None) -> None:
    if slots:
        for slot, (count, weight) in slots.items():
            tally = into.get(slot)
            if tally is None:
                into[slot] = [count, weight]
            else:
                tally[0] += count
                tally[1] += weight


class Aggregates:
    def __init__(
        self,
        watermark: int,
        *,
        every_signals: int = CHECKPOINT_SIGNALS,
        every_seconds: float = CHECKPOINT_SECONDS,
    ) -> None:
        self.every_signals = every_signals
        self.every_seconds = every_seconds
        self.live: Deltas = {}  # committed above the watermark
        self.flushing: Deltas | None = None  # in the checkpoint being committed
        # the table holds every signal up to this seq once the flushing checkpoint commits
        # (and, with none in flight, already does)
        self.flushing_to = watermark
        self._signals = 0  # absorbed since the last checkpoint began
        self._since = time.monotonic()

    def absorb(self, deltas: Deltas, signals: int) -> None:
        """A batch committed: its deltas are now durable, in the ledger."""
        merge(self.live, deltas)
        self._signals += signals

    def due(self) -> bool:
        if not self.live or self.flushing is not None:
            return False
        return (
            self._signals >= self.every_signals
            or time.monotonic() - self._since >= self.every_seconds
        )

    def begin_checkpoint(self, upto_seq: int) -> Deltas:
        """Hand the live deltas (every committed signal up to ``upto_seq``) to the writer."""
        self.flushing, self.flushing_to = self.live, upto_seq
        self.live = {}
        self._signals = 0
        self._since = time.monotonic()
        return self.flushing

    def end_checkpoint(self, committed: bool) -> None:
        flushing, self.flushing = self.flushing, None
        if not committed and flushing is not None:
            merge(flushing, self.live)  # still durable in the ledger: keep them in memory
            self.live = flushing

    def capture(
        self, entity: str, cohort_names: dict[int, str], uncommitted: Iterable[Deltas]
    ) -> CountsRead:
        """Everything in memory about ``entity`` now; the writer adds the table later."""
        rest: dict[Slot, list[Any]] = {}
        _add_copy(rest, self.live.get(entity))
        for deltas in uncommitted:
            _add_copy(rest, deltas.get(entity))
        flushing: dict[Slot, list[Any]] = {}
        if self.flushing is not None:
            _add_copy(flushing, self.flushing.get(entity))
        return CountsRead(
            entity,
            cohort_names,
            self.flushing_to if self.flushing is not None else None,
            flushing,
            rest,
        )

    def replay(self, rows: Iterable[tuple[str, str, float, int, bytes | None]]) -> int:
        """Rebuild the live deltas from ledger rows above the watermark (at boot).

        A row's context is ``[communities, attrs, cohort ids]`` (see ``Engine._record``).
        """
        live = self.live
        count = 0
        for entity, kind, weight, forwarded, context in rows:
            if not -WEIGHT_MAX <= weight <= WEIGHT_MAX:
                # written by a tidal that did not bound weights: counted at the bound, so
                # that no sum becomes inf - inf = NaN, which no checkpoint could store
                weight = math.copysign(WEIGHT_MAX, weight) if weight == weight else 0.0
            slots: list[Slot] = [(LEDGER, "", kind)]
            if forwarded and context is not None:
                communities, _, cohorts = msgpack.unpackb(context, raw=False)
                slots += [(COHORT, cid, kind) for cid in cohorts]
                slots += [(COMMUNITY, name, kind) for name in communities]
            mine = live.setdefault(entity, {})
            for slot in slots:
                bump(mine, slot, weight)
            count += 1
        self._signals = count
        return count


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
    rows: list[tuple[int, int | str, str, int, float]] | None = None
    table_watermark: int = 0

    def answer(self) -> dict[str, dict[str, Any]]:
        totals: dict[Slot, list[Any]] = {}
        for layer, key, kind, count, weight in self.rows or ():
            totals[(layer, key, kind)] = [count, weight]
        if self.flushing_to is not None and self.table_watermark < self.flushing_to:
            _add_copy(totals, self.flushing)
        _add_copy(totals, self.rest)
        ledger: dict[str, Any] = {}
        cohorts: dict[str, dict[str, Any]] = {}
        communities: dict[str, dict[str, Any]] = {}
        for (layer, key, kind), (count, weight) in sorted(totals.items(), key=_slot_order):
            entry = {"count": count, "weight": weight}
            if layer == LEDGER:
                ledger[kind] = entry
            elif layer == COHORT:
                name = self.cohort_names.get(key) if isinstance(key, int) else None
                if name is not None:
                    cohorts.setdefault(name, {})[kind] = entry
            else:
                communities.setdefault(str(key), {})[kind] = entry
        return {"ledger": ledger, "cohorts": cohorts, "communities": communities}


def _slot_order(item: tuple[Slot, list[Any]]) -> tuple[int, str, str]:
    (layer, key, kind), _ = item
    return (layer, str(key), kind)
