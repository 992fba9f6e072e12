"""The board on disk, in few and large rows: boot reads a million aggregates from a few
dozen rows rather than four million, and a checkpoint writes what changed as a few blobs.

Two kinds of row, each msgpack, columns of plain lists (packed and unpacked in C):

*Chunks* hold tallies' records: per tally its id, entity, slot, all-time count and
weight, and decayed sums, with the bases they were taken at (so that a base moved
at boot converts them exactly). The chunks are a log. A checkpoint appends the
records of the tallies it changed, ``CHUNK`` to a row. A tally's record in the
newest chunk that holds it is its own; an older one is dead; an id listed as
buried is a tally gone. While the log holds more than ``SLACK`` times the live
records (plus a chunk), a checkpoint also takes its oldest chunks out, their live
records copied into its own. Oldest first, so that a burial goes only once no
older chunk is left that could hold the tally it buries.

*Parts* hold buckets: see ``parts``.

A tally takes an id when it is first written, and no id is given twice: an entry
whose id no live tally has is of one gone (or of a cohort dropped), and is passed
over. Memory: a tally's id and chunk, and its place in the chunk's list.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import msgpack

from .board import Board, Changed
from .parts import PART_SLACK, Part, part_rows, summed, whole
from .sums import horizons
from .tallies import GONE, Scope, Tally, siblings

#: records per chunk row (about 2 MB)
CHUNK: Final = 50_000
#: the log is cleaned while it holds more than this many times the live records
SLACK: Final = 1.5


class Shelf:
    """What is on disk of the board: the chunks, the tallies each holds records of (live
    while the tally's ``chunk`` is still that chunk), and each bucket's parts."""

    __slots__ = ("chunk", "members", "next_chunk", "next_id", "part_slack", "parts", "rewrite",
                 "sizes")  # fmt: skip

    def __init__(self, chunk: int = CHUNK, part_slack: int = PART_SLACK) -> None:
        self.chunk = chunk  # records per chunk row
        self.part_slack = part_slack
        self.next_id = 1
        self.next_chunk = 1
        self.members: dict[int, list[Tally]] = {}
        self.sizes: dict[int, int] = {}  # records per chunk, burials included
        #: (tier, bucket) -> [parts, lines in them, lines when last written as one part]
        self.parts: dict[tuple[int, int], list[int]] = {}
        #: write all of the board again at the next checkpoint (a database in the row
        #: tables of before, or a half-life filled from the ledger), the old rows out
        self.rewrite = False

    def records(self) -> int:
        return sum(self.sizes.values())


class Written(NamedTuple):
    """One checkpoint's rows, and what ``Shelf.done`` notes once it has committed."""

    chunks: list[tuple[int, bytes, bytes]]  # (chunk, decay, records)
    dirty: list[Tally]  # the tallies written: what they hold of their newest buckets too
    cleaned: list[int]  # chunks taken out
    placed: list[tuple[int, list[Tally], int]]  # (chunk, the tallies written, records)
    parts: list[Part]
    merged: list[tuple[int, int]]  # buckets whose parts all go before their new one
    everything: bool  # all chunks and parts replaced (``Shelf.rewrite``)
    old: tuple[int, int]  # the newest minute and hour no window reads: their parts go


def checkpoint(board: Board, shelf: Shelf, changed: Changed, now_ns: int) -> Written:
    """The rows of one checkpoint: the records of the tallies changed, burials of those gone,
    the oldest chunks cleaned, and a part for each bucket changed. The board holds still
    while it commits (see ``engine``)."""
    if shelf.rewrite:
        return everything(board, shelf, now_ns)
    writing = list(changed.dirty)
    for tally in writing:
        if not tally.id:
            tally.id = shelf.next_id
            shelf.next_id += 1
    buried = [t.id for t in changed.vanished]
    copied, cleaned = _clean(board, shelf, changed, len(writing) + len(buried))
    chunks, placed = _chunks(board, shelf, writing + copied, buried)
    parts, merged = part_rows(board, shelf.parts, shelf.part_slack, changed, now_ns)
    return Written(chunks, writing, cleaned, placed, parts, merged, False, horizons(now_ns))


def everything(board: Board, shelf: Shelf, now_ns: int) -> Written:
    """All of the board as new rows, in place of all there were: entity by entity, as boot
    reads them best (``restore.load_chunks``)."""
    tallies = [t for first in board.by_entity.values() for t in siblings(first)]
    for tally in tallies:
        if not tally.id:
            tally.id = shelf.next_id
            shelf.next_id += 1
    chunks, placed = _chunks(board, shelf, tallies, [])
    parts = []
    merged = []
    for tier, kept in enumerate(board.buckets):
        for b, log in kept.items():
            merged.append((tier, b))
            parts.append(whole(tier, b, log))
    return Written(
        chunks, tallies, sorted(shelf.sizes), placed, parts, merged, True, horizons(now_ns)
    )


def done(board: Board, shelf: Shelf, written: Written) -> None:
    """A checkpoint committed: where each tally's record now is, which rows are left, and
    which lines are on disk (the board held still meanwhile, so they are the lines it
    wrote)."""
    for tally in written.dirty:
        tally.minute_count_written = tally.minute_count
        tally.minute_weight_written = tally.minute_weight
        tally.hour_count_written = tally.hour_count
        tally.hour_weight_written = tally.hour_weight
    for tier, b, _, _, _ in written.parts:
        log = board.buckets[tier].get(b)
        if log is not None:
            log.written = len(log.tallies)
            log.credit = []
    for tier, b in written.merged:  # its lines summed in memory too
        log = board.buckets[tier].get(b)
        if log is not None:
            summed(log)
    for chunk in written.cleaned:
        del shelf.members[chunk], shelf.sizes[chunk]
    if written.everything:
        shelf.parts.clear()
        shelf.rewrite = False
    for chunk, tallies, records in written.placed:
        for tally in tallies:
            tally.chunk = chunk
        shelf.members[chunk] = tallies
        shelf.sizes[chunk] = records
        shelf.next_chunk = max(shelf.next_chunk, chunk + 1)
    for key in written.merged:
        shelf.parts[key] = [0, 0, 0]
    for tier, b, _, _, entries in written.parts:
        state = shelf.parts.get((tier, b))
        if state is None:
            state = shelf.parts[tier, b] = [0, 0, 0]
        state[0] += 1
        state[1] += entries
    for key in written.merged:
        state = shelf.parts.get(key)
        if state is not None:
            state[2] = state[1]
    old_minute, old_hour = written.old  # no window reads them: their rows went
    for tier, b in [k for k in shelf.parts if k[1] <= (old_minute if k[0] == 0 else old_hour)]:
        del shelf.parts[tier, b]


def _clean(
    board: Board, shelf: Shelf, changed: Changed, adding: int
) -> tuple[list[Tally], list[int]]:
    """The oldest chunks taken out while the log is too long: their live records (but of
    tallies written anyway) to copy. At most about as many as this checkpoint writes, so
    that its cost stays in proportion."""
    total = shelf.records() + adding
    live = board.tallies
    budget = max(shelf.chunk, adding)
    copied: list[Tally] = []
    cleaned: list[int] = []
    if total <= SLACK * live + shelf.chunk:
        return copied, cleaned
    writing = set(changed.dirty)
    for chunk in sorted(shelf.sizes):
        if total <= SLACK * live + shelf.chunk or budget <= 0:
            break
        keep = [
            t
            for t in shelf.members[chunk]
            if t.chunk == chunk and t.epoch != GONE and t not in writing
        ]
        copied += keep
        cleaned.append(chunk)
        total += len(keep) - shelf.sizes[chunk]
        budget -= len(keep)
    return copied, cleaned


def _chunks(
    board: Board, shelf: Shelf, tallies: list[Tally], buried: list[int]
) -> tuple[list[tuple[int, bytes, bytes]], list[tuple[int, list[Tally], int]]]:
    decay = msgpack.packb(board.decay)
    rows: list[tuple[int, bytes, bytes]] = []
    placed: list[tuple[int, list[Tally], int]] = []
    chunk = shelf.next_chunk
    size = shelf.chunk
    for start in range(0, max(len(tallies), 1 if buried else 0), size):
        some = tallies[start : start + size]
        burials = buried if start == 0 else []
        rows.append((chunk, decay, _records(some, burials)))
        placed.append((chunk, some, len(some) + len(burials)))
        chunk += 1
    return rows, placed


def _records(tallies: list[Tally], buried: list[int]) -> bytes:
    """A chunk's records: a list per field, a tally's scope as its place among the chunk's
    (found by the scope itself: a slot's tuple would be hashed per tally)."""
    slots: dict[Scope, int] = {}
    ids: list[int] = []
    entities: list[str] = []
    where: list[int] = []
    counts: list[int] = []
    weights: list[float] = []
    trends: list[float] = []
    for tally in tallies:
        scope = tally.scope
        i = slots.get(scope)
        if i is None:
            i = slots[scope] = len(slots)
        ids.append(tally.id)
        entities.append(tally.entity)
        where.append(i)
        counts.append(tally.count)
        weights.append(tally.weight)
        trends.append(tally.decayed)
        if tally.more is not None:
            trends.extend(tally.more)
    places = [scope.slot for scope in slots]
    record = [places, ids, entities, where, counts, weights, trends, buried]
    return bytes(msgpack.packb(record, use_bin_type=True))


class Records(NamedTuple):
    """One chunk's records, as ``_records`` packed them."""

    slots: list[list[Any]]
    ids: list[int]
    entities: list[str]
    where: list[int]
    counts: list[int]
    weights: list[float]
    trends: list[float]
    buried: list[int]


def unpack_records(data: bytes) -> Records:
    return Records(*msgpack.unpackb(data, raw=False, use_list=True))
