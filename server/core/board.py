"""The board: every aggregate's totals in memory, all-time, per window and decayed, for
ranked reads and windowed counts.

It holds only what is committed: a batch's signals are added when it has
committed (``add``), and what a purge or erase withdrew once it has too. So a
ranked read answers at once from here, and one that must show a write not yet
committed waits for that commit (see ``engine.ranked``). What it is made of is in
``tallies``.

A tally keeps running totals for each window; a window slides by subtracting
the bucket that leaves it (``advance``), found in a map per tier from bucket to
the tallies with signals in it, so no signal is visited twice. Memory per
aggregate: one tally, plus one small entry per minute and per hour it has
signals in (a day of minutes, 30 days of hours). The rules of time are in
``windows``; the order of a ranking is kept in ``ranking``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, NamedTuple

from . import ledger, windows
from .ledger import COHORT, COMMUNITY, LEDGER, Slot
from .tallies import Bucket, Contribution, Dirty, Scope, Tally, bump
from .windows import HOUR_NS, MINUTE_NS

#: the tiers' bucket maps are kept this far back (and the windows read no further)
_KEEP: Final = tuple(n for _, n in windows.TIERS)


class Changed(NamedTuple):
    """What a checkpoint writes of the board: tallies changed (with a minute each, and
    more minutes in ``moved``), and the aggregates gone."""

    dirty: Dirty
    moved: set[tuple[Tally, int]]
    vanished: list[tuple[str, Slot]]


class Board:
    def __init__(self, decay: Sequence[tuple[int, int]], now_ns: int) -> None:
        self.decay = list(decay)  # (half-life in s, base in ns), as persisted
        self.scopes: dict[Slot, Scope] = {}
        self.by_entity: dict[str, list[Tally]] = {}
        self.minute = now_ns // MINUTE_NS
        self.hour = now_ns // HOUR_NS
        self.buckets: tuple[dict[int, Bucket], dict[int, Bucket]] = ({}, {})
        #: what changed since the last checkpoint (see ``Dirty``), and the aggregates gone
        self.dirty: Dirty = {}
        self.moved: set[tuple[Tally, int]] = set()
        self.vanished: list[tuple[str, Slot]] = []
        self.tallies = 0

    def scope(self, slot: Slot) -> Scope | None:
        return self.scopes.get(slot)

    # -- changes -----------------------------------------------------------------

    def add(self, rows: Iterable[Contribution]) -> None:
        """Committed signals in, or (count -1) what a committed withdrawal took off."""
        minute, hour = self.minute, self.hour
        keep_minute, keep_hour = minute - _KEEP[0], hour - _KEEP[1]
        minutes, hours = self.buckets
        decay = self.decay
        one = self._one
        for entity, kind, sign, weight, at_ns, cohorts, communities, ledger_too in rows:
            m = at_ns // MINUTE_NS
            h = at_ns // HOUR_NS
            bits = windows.ALL_WINDOWS if m > minute - 60 else windows.mask(at_ns, minute, hour)
            mb: Bucket | None = None  # the buckets it falls in, if still kept
            if m > keep_minute:
                mb = minutes.get(m)
                if mb is None:
                    mb = minutes[m] = {}
            hb: Bucket | None = None
            if h > keep_hour:
                hb = hours.get(h)
                if hb is None:
                    hb = hours[h] = {}
            step = complex(sign, weight)
            factors = [weight * windows.decay_factor(at_ns, base, hl) for hl, base in decay]
            if ledger_too:
                one((LEDGER, "", kind), entity, sign, weight, bits, m, mb, hb, step, factors)
            for cid in cohorts:
                one((COHORT, cid, kind), entity, sign, weight, bits, m, mb, hb, step, factors)
            for name in communities:
                one((COMMUNITY, name, kind), entity, sign, weight, bits, m, mb, hb, step, factors)

    def _one(self, slot: Slot, entity: str, sign: int, weight: float, bits: int, m: int,
             mb: Bucket | None, hb: Bucket | None, step: complex,
             factors: list[float]) -> None:  # fmt: skip
        scope = self.scopes.get(slot)
        if scope is None:
            if sign < 0:
                return  # a cohort dropped since: nothing of it is kept
            scope = self.scopes[slot] = Scope(slot)
        tally = scope.tallies.get(entity)
        if tally is None:
            if sign < 0:
                return
            tally = scope.tallies[entity] = Tally(entity, scope, len(self.decay))
            self.by_entity.setdefault(entity, []).append(tally)
            self.tallies += 1
        tally.count += sign
        tally.weight += weight
        if bits == windows.ALL_WINDOWS:
            tally.c0 += sign
            tally.c1 += sign
            tally.c2 += sign
            tally.c3 += sign
            tally.w0 += weight
            tally.w1 += weight
            tally.w2 += weight
            tally.w3 += weight
        elif bits:
            for i in range(4):
                if bits >> i & 1:
                    tally.shift(i, sign, weight)
        if mb is not None:
            bump(mb, tally, step)
        if hb is not None:
            bump(hb, tally, step)
        trend = tally.trend
        for i, f in enumerate(factors):
            trend[i] += f
        first = self.dirty.get(tally)
        if first is None:
            self.dirty[tally] = m
        elif first != m:
            self.moved.add((tally, m))
        if scope.orders:
            scope.dirty.add(entity)
        if not tally.count:  # a purge took its last signal: gone, as from a recompute
            self._forget(tally)

    def _forget(self, tally: Tally) -> None:
        scope = tally.scope
        self.dirty.pop(tally, None)
        self.vanished.append((tally.entity, scope.slot))
        del scope.tallies[tally.entity]
        mine = self.by_entity[tally.entity]
        mine.remove(tally)
        if not mine:
            del self.by_entity[tally.entity]
        self.tallies -= 1
        if scope.orders:
            scope.dirty.add(tally.entity)
        if not scope.tallies and not scope.orders:
            del self.scopes[scope.slot]

    def take_dirty(self) -> Changed:
        """What the next checkpoint writes; the board starts afresh."""
        changed = Changed(self.dirty, self.moved, self.vanished)
        self.dirty, self.moved, self.vanished = {}, set(), []
        return changed

    def put_back(self, changed: Changed) -> None:
        """A checkpoint that did not commit: its share is due again."""
        for tally, m in changed.dirty.items():
            if tally.count:  # else it vanished since, and is listed so
                first = self.dirty.get(tally)
                if first is None:
                    self.dirty[tally] = m
                elif first != m:
                    self.moved.add((tally, m))
        self.moved |= changed.moved
        self.vanished[:0] = changed.vanished

    def keep_cohorts(self, ids: set[int]) -> None:
        """Cohorts dropped or redefined lose their tallies (an id is never used again)."""
        gone = [s for slot, s in self.scopes.items() if slot[0] == COHORT and slot[1] not in ids]
        for scope in gone:
            for tally in list(scope.tallies.values()):
                self._forget(tally)
            self.scopes.pop(scope.slot, None)
        if gone:
            lost = set(gone)
            for tier in self.buckets:
                for bucket in tier.values():
                    for tally in [t for t in bucket if t.scope in lost]:
                        del bucket[tally]

    def advance(self, now_ns: int) -> None:
        """Slide every window to ``now_ns``: each bucket that leaves one is taken off."""
        self._slide(0, now_ns // MINUTE_NS, ((0, 60), (1, 1440)))
        self._slide(1, now_ns // HOUR_NS, ((2, 168), (3, 720)))

    def _slide(self, tier: int, current: int, leaving: tuple[tuple[int, int], ...]) -> None:
        was = self.minute if tier == 0 else self.hour
        if current <= was:
            return
        buckets = self.buckets[tier]
        for window, n in leaving:
            # the buckets in (was - n, current - n] leave the window
            if current - was <= n:
                gone: Iterable[int] = range(was - n + 1, current - n + 1)
            else:
                gone = sorted(b for b in buckets if was - n < b <= current - n)
            for b in gone:
                bucket = buckets.get(b)
                if bucket is None:
                    continue
                for tally, entry in bucket.items():
                    tally.shift(window, -int(entry.real), -entry.imag)
                    if tally.scope.orders:
                        tally.scope.dirty.add(tally.entity)
        for b in [b for b in buckets if b <= current - _KEEP[tier]]:
            del buckets[b]
        if tier == 0:
            self.minute = current
        else:
            self.hour = current

    # -- boot ------------------------------------------------------------------

    def load(self, slot: Slot, entity: str, count: int, weight: float) -> Tally:
        """A tally as the aggregates table holds it (all-time), before its buckets."""
        scope = self.scopes.get(slot)
        if scope is None:
            scope = self.scopes[slot] = Scope(slot)
        tally = scope.tallies.get(entity)
        if tally is None:
            tally = scope.tallies[entity] = Tally(entity, scope, len(self.decay))
            self.by_entity.setdefault(entity, []).append(tally)
            self.tallies += 1
        tally.count += count
        tally.weight += weight
        return tally

    def load_bucket(self, tally: Tally, tier: int, bucket: int, count: int, weight: float) -> None:
        """A persisted bucket (tier 0, 1) or decayed sum (tier 2: ``bucket`` is the half-life)."""
        if tier == 2:
            for i, (hl, _) in enumerate(self.decay):
                if hl == bucket:
                    tally.trend[i] += weight
            return
        current = self.minute if tier == 0 else self.hour
        if bucket <= current - _KEEP[tier] or not count:
            return
        tier_buckets = self.buckets[tier]
        into = tier_buckets.get(bucket)
        if into is None:
            into = tier_buckets[bucket] = {}
        bump(into, tally, complex(count, weight))
        for window in (0, 1) if tier == 0 else (2, 3):
            if windows.holds(window, bucket, current):
                tally.shift(window, count, weight)


def from_row(row: Sequence[Any]) -> Contribution:
    """What a ledger row (seq, entity, kind, weight, forwarded, context, at_ns) adds."""
    _, entity, kind, weight, forwarded, context, at_ns = row
    communities, _, cohorts = ledger.decode(context if forwarded else None)
    return (entity, kind, 1, ledger.row_weight(weight), at_ns, cohorts, communities, True)


def fill(
    board: Board,
    aggregates: Iterable[tuple[str, int, int, str, str, int, float]],
    buckets: Iterable[tuple[str, int, int, str, str, int, int, int, float]],
    cohort_ids: set[int],
) -> None:
    """The board as the tables hold it at boot (dropped cohorts' rows left out)."""
    for entity, layer, cohort, name, kind, count, weight in aggregates:
        if not count or (layer == COHORT and cohort not in cohort_ids):
            continue
        board.load((layer, cohort if layer == COHORT else name, kind), entity, count, weight)
    scopes = board.scopes
    for entity, layer, cohort, name, kind, tier, bucket, count, weight in buckets:
        scope = scopes.get((layer, cohort if layer == COHORT else name, kind))
        tally = None if scope is None else scope.tallies.get(entity)
        if tally is not None:  # else emptied, or of a cohort dropped
            board.load_bucket(tally, tier, bucket, count, weight)
