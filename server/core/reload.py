"""The board read back at boot from its chunks and parts (``chunks``, ``parts``): a million
tallies and two million bucket lines, so built with as few and as cheap steps as can be
(records come entity by entity; ids index a list; a bucket's log is its parts' lists)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack

from . import windows
from .board import Board
from .chunks import CHUNK, Shelf, unpack_records
from .ledger import COHORT
from .tallies import Log, Scope, Tally
from .windows import KEEP


def load_chunks(
    board: Board,
    shelf: Shelf,
    rows: Iterable[tuple[int, bytes, bytes]],
    cohort_ids: set[int],
    missing: Sequence[int],
    next_id: int,
) -> Ids:
    """The tallies as the chunks hold them, ``rows`` newest chunk first (see ``chunks``):
    each id's first record is its own, and a burial or a dropped cohort's record hides
    the older ones. Decayed sums are moved to the board's bases, exactly (powers of two),
    but for the half-lives in ``missing``: filled from the ledger instead. Returns the
    tallies by id, for ``load_parts``. A million tallies: each is built here with its
    indexes, its scope found once per chunk."""
    rows = list(rows)
    by_id = Ids(next_id, len(rows) * CHUNK)
    top = 0
    for chunk, decay_data, data in rows:
        top = max(
            top, _load_chunk(board, shelf, by_id, chunk, decay_data, data, cohort_ids, missing)
        )
    shelf.next_id = max(next_id, top + 1)
    return by_id


def _rebased(
    bases: Sequence[tuple[int, int]], decay_data: bytes, missing: Sequence[int]
) -> tuple[list[tuple[int, int, float]], int, bool]:
    """Where each of the board's half-lives is among a chunk's sums, and the factor that
    moves it to the board's base: (board's place, chunk's place, factor); how many sums a
    record holds; and whether they are as the board keeps them (its half-lives, in its
    order, at its bases, none missing)."""
    taken: dict[int, int] = dict(msgpack.unpackb(decay_data))
    order = list(taken)
    places = [
        (i, order.index(hl), windows.rebase_factor(taken[hl], base, hl))
        for i, (hl, base) in enumerate(bases)
        if hl in taken and hl not in missing
    ]
    as_is = order == [hl for hl, _ in bases] and all(f == 1.0 for _, _, f in places)
    return places, len(order), as_is and len(places) == len(bases)


def _scopes(board: Board, slots: list[list[Any]], cohort_ids: set[int]) -> list[Scope | None]:
    """Each slot of a chunk: its scope (None: a cohort dropped)."""
    return [
        board.scope_for((layer, key, kind)) if layer != COHORT or key in cohort_ids else None
        for layer, key, kind in slots
    ]


def _load_chunk(
    board: Board,
    shelf: Shelf,
    by_id: Ids,
    chunk: int,
    decay_data: bytes,
    data: bytes,
    cohort_ids: set[int],
    missing: Sequence[int],
) -> int:
    """One chunk's records onto the board (``load_chunks``); returns its highest id."""
    table = by_id.table
    half_lives = len(board.decay)
    index = board.by_entity
    places, width, as_is = _rebased(board.decay, decay_data, missing)
    slots, ids, entities, where, counts, weights, trends, buried = unpack_records(data)
    for place in by_id.places(buried):
        if table[place] is None:
            table[place] = GONE_TALLY
    spots = by_id.places(ids)
    scopes = _scopes(board, slots, cohort_ids)
    members: list[Tally] = []
    last: str | None = None  # records are written entity by entity: its newest at hand
    first: Tally | None = None
    for j in range(len(ids)):
        place = spots[j]
        if table[place] is not None:
            continue  # a newer record, or buried
        s = where[j]
        scope = scopes[s]
        count = counts[j]
        if scope is None or not count:
            table[place] = GONE_TALLY
            continue
        entity = entities[j]
        if entity == last and last is not None:
            entity = last  # one str per entity, not per tally
        else:
            first = index.get(entity)
            if first is not None:
                entity = first.entity
            last = entity
        if entity in scope.tallies:  # not written so, but never counted twice
            table[place] = GONE_TALLY
            continue
        tally = scope.tallies[entity] = Tally(entity, scope, half_lives, count, weights[j])
        if as_is and width:
            tally.decayed = trends[j * width]
            if width > 1:
                tally.more = trends[j * width + 1 : (j + 1) * width]
        else:
            for i, k, factor in places:
                tally.add_trend(i, trends[j * width + k] * factor)
        board.chain(tally, first)
        first = tally
        tally.id = ids[j]
        tally.chunk = chunk
        table[place] = tally
        members.append(tally)
    board.tallies += len(members)
    shelf.members[chunk] = members
    shelf.sizes[chunk] = len(ids) + len(buried)
    shelf.next_chunk = max(shelf.next_chunk, chunk + 1)
    return max(max(ids, default=0), max(buried, default=0))


#: what ``Ids`` holds for an id seen and gone (buried, of a cohort dropped)
GONE_TALLY: Final = Tally("", Scope((0, "", "")), 0)


class Ids:
    """Tallies by id, at boot: a list indexed by id, as ids are given in order and few go
    unused; where they are sparse (many tallies made and gone since the ids began), by a
    place given to each id as it is first seen."""

    __slots__ = ("remap", "table")

    def __init__(self, next_id: int, records: int) -> None:
        dense = next_id <= 8 * records + 1_000_000
        self.remap: dict[int, int] | None = None if dense else {}
        self.table: list[Tally | None] = [None] * (next_id + 1 if dense else 0)

    def places(self, ids: list[int]) -> list[int]:
        remap = self.remap
        if remap is not None:
            ids = [remap.setdefault(i, len(remap)) for i in ids]
        top = max(ids, default=-1) + 1
        if top > len(self.table):
            self.table.extend([None] * (top - len(self.table)))
        return ids

    def find(self, ids: list[int]) -> tuple[list[Tally], list[int] | None]:
        """The live tally of each id, and where some are not (gone, or never seen), the
        places in ``ids`` of those that are."""
        found = list(map(self.table.__getitem__, self.places(ids)))
        tallies = [t for t in found if t is not None and t is not GONE_TALLY]
        if len(tallies) == len(found):
            return tallies, None
        keep = [k for k in range(len(found)) if found[k] is not None and found[k] is not GONE_TALLY]
        return tallies, keep


def load_parts(
    board: Board,
    shelf: Shelf,
    rows: Iterable[tuple[int, int, bytes]],
    by_id: Ids,
) -> None:
    """The buckets' logs as their parts hold them, ``rows`` (tier, bucket, entries), and
    each window's totals from the buckets it holds. Two million lines: each log is built
    from its parts' lists as they are, its tallies found in C (``map``)."""
    for tier, b, data in rows:
        ids: list[int]
        counts: list[int]
        weights: list[float]
        ids, counts, weights = msgpack.unpackb(data)
        state = shelf.parts.get((tier, b))
        if state is None:
            state = shelf.parts[tier, b] = [0, 0, 0]
        state[0] += 1
        state[1] += len(ids)
        state[2] = state[1]  # as if written as one: parts so far are not written again soon
        current = board.minute if tier == 0 else board.hour
        if b <= current - KEEP[tier]:
            continue  # the next checkpoint deletes it
        tallies, keep = by_id.find(ids)
        if keep is not None:  # lines of tallies gone, or of cohorts dropped
            counts = [counts[k] for k in keep]
            weights = [weights[k] for k in keep]
        first, second = (0, 1) if tier == 0 else (2, 3)
        _windows(tallies, counts, weights, tier, windows.holds(first, b, current),
                 windows.holds(second, b, current))  # fmt: skip
        kept = board.buckets[tier]
        log = kept.get(b)
        if log is None:
            log = kept[b] = Log()
        if log.tallies:
            log.tallies += tallies
            log.counts += counts
            log.weights += weights
        else:  # the common case: no copy
            log.tallies, log.counts, log.weights = tallies, counts, weights
        log.written = len(log.tallies)


def _windows(
    tallies: list[Tally], counts: list[int], weights: list[float], tier: int, one: bool,
    two: bool,
) -> None:  # fmt: skip
    """A bucket's lines added to the windows that hold it: the shorter of its tier
    (``one``) and the longer (``two``)."""
    if not (one or two):
        return
    for k in range(len(tallies)):
        tally = tallies[k]
        count = counts[k]
        weight = weights[k]
        if tier == 0:
            if one:
                tally.count_1h += count
                tally.weight_1h += weight
            if two:
                tally.count_24h += count
                tally.weight_24h += weight
        else:
            if one:
                tally.count_7d += count
                tally.weight_7d += weight
            if two:
                tally.count_30d += count
                tally.weight_30d += weight
