"""The board: every aggregate's totals in memory, all-time, per window and decayed, for
ranked reads and windowed counts.

It holds only what is committed: a batch's signals are added when it has
committed (``add``), and what a purge or erase withdrew once it has too. So a
ranked read answers at once from here, and one that must show a write not yet
committed waits for that commit (see ``engine.ranked``). What it is made of is in
``tallies``.

A tally keeps running totals for each window; a window slides by subtracting
the bucket that leaves it (``advance``, in ``sliding``): per tier, a log per bucket of what tallies
gained in it (``Log``), so no signal is visited twice. Memory per aggregate: one
tally, plus a line per minute and per hour it has signals in (a day of minutes, 30
days of hours), and one more per late signal until a checkpoint sums them. The rules of time are in
``windows``; the order of a ranking is kept in ``ranking``; boot rebuilds it with
``restore``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple, TypeAlias

from . import windows
from .ledger import COHORT, COMMUNITY, LEDGER, Slot
from .sliding import Sliding
from .tallies import GONE, Contribution, Dirty, Scope, Tally, siblings
from .windows import HOUR_NS, KEEP, MINUTE_NS

#: a tally's key among its entity's of one kind: a cohort's id, a community's name, or
#: None for the ledger (no community is named None, no cohort id is a str)
Key: TypeAlias = int | str | None


class Changed(NamedTuple):
    """What a checkpoint writes of the board: tallies changed, buckets with lines not on
    disk yet (tier, bucket), and the tallies gone that were written before."""

    dirty: Dirty
    touched: set[tuple[int, int]]
    vanished: list[Tally]


class Board(Sliding):
    def __init__(self, decay: Sequence[tuple[int, int]], now_ns: int) -> None:
        super().__init__(now_ns)
        self.decay = list(decay)  # (half-life in s, base in ns), as persisted
        self.scopes: dict[Slot, Scope] = {}
        #: the same scopes by kind, then cohort id, community name, or None for the ledger:
        #: a signal's aggregates are found in them and in their scope's tallies, and no
        #: key is built for them
        self.keyed: dict[str, dict[Key, Scope]] = {}
        #: each entity's newest tally, the others chained to it (``Tally.sibling``): for
        #: reads of one entity, and no map per entity (they took 400 bytes of every one)
        self.by_entity: dict[str, Tally] = {}
        #: what changed since the last checkpoint: the tallies marked in this epoch, the
        #: logs with lines not on disk, and the aggregates gone
        self.epoch = 0
        self.marked: list[Tally] = []
        self.vanished: list[Tally] = []
        self.tallies = 0
        #: the scopes with orders kept (``ranking``), and when idle ones are next dropped
        self.ordered: set[Scope] = set()
        self.evict_ns = 0

    def scope(self, slot: Slot) -> Scope | None:
        return self.scopes.get(slot)

    def dirty(self) -> bool:
        return bool(self.marked or self.vanished or self.touched)

    # -- changes -----------------------------------------------------------------

    def add(self, rows: Iterable[Contribution]) -> None:
        """Committed signals in, or (count -1) what a committed withdrawal took off."""
        minute = self.minute
        decay = self.decay
        keyed = self.keyed
        last_at = -1
        m = bits = 0
        unit: list[float] = []
        for entity, kind, sign, weight, at_ns, cohorts, communities, ledger_too in rows:
            if at_ns != last_at:  # a batch's signals share their time: worked out once
                last_at = at_ns
                m = at_ns // MINUTE_NS
                bits = (
                    windows.ALL_WINDOWS
                    if m > minute - 60
                    else windows.mask(at_ns, minute, self.hour)
                )
                unit = [windows.decay_factor(at_ns, base, hl) for hl, base in decay]
            factors = unit if weight == 1.0 else [weight * f for f in unit]
            scopes = keyed.get(kind)
            if ledger_too:
                self._one(scopes, None, entity, kind, sign, weight, bits, m, at_ns, factors)
            for cid in cohorts:
                self._one(scopes, cid, entity, kind, sign, weight, bits, m, at_ns, factors)
            for name in communities:
                self._one(scopes, name, entity, kind, sign, weight, bits, m, at_ns, factors)

    def _one(self, scopes: dict[Key, Scope] | None, key: Key, entity: str, kind: str,
             sign: int, weight: float, bits: int, m: int, at_ns: int,
             factors: list[float]) -> None:  # fmt: skip
        scope = None if scopes is None else scopes.get(key)
        tally = None if scope is None else scope.tallies.get(entity)
        if tally is None:
            if sign < 0:
                return  # nothing of it is kept (a cohort dropped since)
            tally = self.tally_for(slot_of(key, kind), entity)
        tally.count += sign
        tally.weight += weight
        if bits == windows.ALL_WINDOWS:
            tally.count_1h += sign
            tally.count_24h += sign
            tally.count_7d += sign
            tally.count_30d += sign
            tally.weight_1h += weight
            tally.weight_24h += weight
            tally.weight_7d += weight
            tally.weight_30d += weight
        elif bits:
            for i in range(4):
                if bits >> i & 1:
                    tally.shift(i, sign, weight)
        h = at_ns // HOUR_NS
        if h == tally.hour:
            tally.hour_count += sign
            tally.hour_weight += weight
        elif h > self.hour - KEEP[1]:
            self._bucket(tally, 1, h, sign, weight)
        if m == tally.minute:  # the common case: its newest minute, no log touched
            tally.minute_count += sign
            tally.minute_weight += weight
        elif m > self.minute - KEEP[0]:
            self._bucket(tally, 0, m, sign, weight)
        if tally.epoch != self.epoch:
            self.mark(tally)
        tally.add_trends(factors)
        scope = tally.scope
        if scope.orders:
            scope.dirty.add(entity)
        if not tally.count:  # a purge took its last signal: gone, as from a recompute
            self.drop(tally)

    def tally_for(self, slot: Slot, entity: str) -> Tally:
        """The entity's tally in ``slot``, made if there is none."""
        scope = self.scope_for(slot)
        tally = scope.tallies.get(entity)
        if tally is not None:
            return tally
        first = self.by_entity.get(entity)
        if first is not None:
            entity = first.entity  # one str per entity
        tally = scope.tallies[entity] = Tally(entity, scope, len(self.decay))
        self.chain(tally, first)
        self.tallies += 1
        return tally

    def chain(self, tally: Tally, first: Tally | None) -> None:
        """``tally`` becomes its entity's newest (``first``: the one that was)."""
        tally.sibling = first
        self.by_entity[tally.entity] = tally

    def find(self, entity: str, kind: str, key: Key) -> Tally | None:
        scope = self.keyed.get(kind, {}).get(key)
        return None if scope is None else scope.tallies.get(entity)

    def scope_for(self, slot: Slot) -> Scope:
        scope = self.scopes.get(slot)
        if scope is None:
            scope = self.scopes[slot] = Scope(slot)
            layer, key, kind = slot
            self.keyed.setdefault(kind, {})[None if layer == LEDGER else key] = scope
        return scope

    def _unscope(self, scope: Scope) -> None:
        """An empty scope no order reads goes."""
        if self.scopes.get(scope.slot) is not scope:
            return
        layer, key, kind = scope.slot
        del self.scopes[scope.slot]
        keyed = self.keyed[kind]
        del keyed[None if layer == LEDGER else key]
        if not keyed:
            del self.keyed[kind]

    def mark(self, tally: Tally) -> None:
        """The tally changed: the next checkpoint writes its record."""
        if tally.epoch != self.epoch:
            tally.epoch = self.epoch
            self.marked.append(tally)

    def _forget(self, tally: Tally) -> None:
        """The tally leaves its scope (the caller takes it out of ``by_entity``)."""
        scope = tally.scope
        tally.epoch = GONE
        if tally.id:  # on disk: its record is buried
            self.vanished.append(tally)
        del scope.tallies[tally.entity]
        self.tallies -= 1
        if scope.orders:
            scope.dirty.add(tally.entity)
        if not scope.tallies and not scope.orders:
            self._unscope(scope)

    def drop(self, tally: Tally) -> None:
        """A tally taken out of its scope and of ``by_entity``, listed as vanished."""
        self._forget(tally)
        self._unindex(tally)

    def _unindex(self, tally: Tally) -> None:
        """``tally`` out of its entity's chain."""
        entity = tally.entity
        first = self.by_entity[entity]
        if first is tally:
            if tally.sibling is None:
                del self.by_entity[entity]
            else:
                self.by_entity[entity] = tally.sibling
        else:
            before = first
            while before.sibling is not tally:
                before = before.sibling  # type: ignore[assignment]
            before.sibling = tally.sibling
        tally.sibling = None

    def tallies_of(self, entity: str) -> list[Tally]:
        return siblings(self.by_entity.get(entity))

    def take_dirty(self) -> Changed:
        """What the next checkpoint writes; the board starts afresh."""
        epoch = self.epoch
        dirty = [tally for tally in self.marked if tally.epoch == epoch]
        changed = Changed(dirty, self.touched, self.vanished)
        self.epoch = epoch + 1
        self.marked, self.touched, self.vanished = [], set(), []
        return changed

    def put_back(self, changed: Changed) -> None:
        """A checkpoint that did not commit: its share is due again."""
        for tally in changed.dirty:
            if tally.epoch >= 0:  # else it vanished since, and is listed so
                self.mark(tally)
        self.touched |= changed.touched
        self.vanished[:0] = changed.vanished

    def unordered(self, scope: Scope) -> None:
        """``scope``'s last order was dropped: its changes are no longer tracked, and it
        goes if nothing is left in it."""
        self.ordered.discard(scope)
        scope.dirty.clear()
        if not scope.tallies:
            self._unscope(scope)

    def keep_cohorts(self, ids: set[int]) -> None:
        """Cohorts dropped or redefined lose their tallies (an id is never used again)."""
        self._drop(
            [s for slot, s in self.scopes.items() if slot[0] == COHORT and slot[1] not in ids]
        )

    def drop_cohorts(self, ids: Collection[int]) -> None:
        """The tallies of the cohorts ``ids`` go (dropped or redefined)."""
        self._drop([s for slot, s in self.scopes.items() if slot[0] == COHORT and slot[1] in ids])

    def _drop(self, gone: list[Scope]) -> None:
        for scope in gone:
            for tally in list(scope.tallies.values()):
                self.drop(tally)
            self._unscope(scope)
        if gone:
            lost = set(gone)
            for tier in self.buckets:
                for log in tier.values():
                    log.drop_scopes(lost)


def slot_of(key: Key, kind: str) -> Slot:
    if key is None:
        return (LEDGER, "", kind)
    return (COHORT, key, kind) if isinstance(key, int) else (COMMUNITY, key, kind)
