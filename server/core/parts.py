"""The board's buckets on disk, as *parts*: per line, a tally's id, and a count and weight it
gained in one minute's or hour's bucket.

A checkpoint writes, for each bucket that gained since the last, one part with what
it gained: the log's lines not on disk, and what tallies gained in their newest
buckets since a checkpoint last wrote them (see ``tallies.Log``). A bucket is the sum
of its parts, and boot reads them back as its log (``reload``). A bucket whose parts
grew to twice the lines it was last written as is written again as one part, its
log summed too; a bucket no window reads any more goes whole. What it costs: one
checkpoint writes a line per bucket a tally gained in, and a bucket's lines are
written about twice in all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import msgpack

from .board import Board, Changed
from .sums import horizons
from .tallies import GONE, Log, Tally

#: a bucket is written again as one part once its parts hold more than twice the lines it
#: was last written as, and this many more
PART_SLACK: Final = 256
#: (tier, bucket, part, lines packed, how many)
Part: TypeAlias = tuple[int, int, int, bytes, int]


def part_rows(
    board: Board, shelf: dict[tuple[int, int], list[int]], slack: int, changed: Changed,
    now_ns: int,
) -> tuple[list[Part], list[tuple[int, int]]]:  # fmt: skip
    """A part per bucket that gained since the last checkpoint, or the bucket as one part
    where its parts grew long. ``shelf``: each bucket's [parts, lines in them, lines when
    last written as one part]."""
    old = horizons(now_ns)
    lines: dict[tuple[int, int], tuple[list[int], list[int], list[float]]] = {}
    for tier in (0, 1):  # what they gained in their newest buckets
        _newest(lines, changed.dirty, tier, old[tier])
    for tier, b in changed.touched:  # the logs' lines not on disk
        log = board.buckets[tier].get(b)
        if log is None or b <= old[tier]:
            continue
        ids, counts, weights = _lists(lines, tier, b)
        tallies = log.tallies
        for k in range(log.written, len(tallies)):
            if tallies[k].epoch != GONE:
                ids.append(tallies[k].id)
                counts.append(log.counts[k])
                weights.append(log.weights[k])
        for tally, count, weight in log.credit:
            if tally.epoch != GONE:
                ids.append(tally.id)
                counts.append(count)
                weights.append(weight)
        if not ids:  # nothing of it left to write: no part
            del lines[tier, b]
    parts: list[Part] = []
    merged: list[tuple[int, int]] = []
    for (tier, b), (ids, counts, weights) in lines.items():
        state = shelf.get((tier, b))
        log = board.buckets[tier].get(b)
        long = state is not None and state[1] + len(ids) > 2 * state[2] + slack
        if long and log is not None:
            merged.append((tier, b))
            parts.append(whole(tier, b, log))
            continue
        part = 0 if state is None else state[0]
        parts.append((tier, b, part, _pack((ids, counts, weights)), len(ids)))
    return parts, merged


def _newest(
    lines: dict[tuple[int, int], tuple[list[int], list[int], list[float]]], dirty: list[Tally],
    tier: int, horizon: int,
) -> None:  # fmt: skip
    """The lines of what ``dirty`` gained in their newest buckets of ``tier`` since last
    written. Most share one bucket: its lists are looked up once per run of it, and no
    tuple is made per tally (a checkpoint of 400,000 took 250 ms here, most of it so)."""
    last = -1
    ids: list[int] = []
    counts: list[int] = []
    weights: list[float] = []
    for tally in dirty:
        if tier == 0:
            b = tally.minute
            count = tally.minute_count - tally.minute_count_written
            weight = tally.minute_weight - tally.minute_weight_written
        else:
            b = tally.hour
            count = tally.hour_count - tally.hour_count_written
            weight = tally.hour_weight - tally.hour_weight_written
        if b <= horizon or not (count or weight):
            continue
        if b != last:
            last = b
            ids, counts, weights = _lists(lines, tier, b)
        ids.append(tally.id)
        counts.append(count)
        weights.append(weight)


def _lists(
    lines: dict[tuple[int, int], tuple[list[int], list[int], list[float]]], tier: int, b: int
) -> tuple[list[int], list[int], list[float]]:
    """The lists of bucket ``b``'s lines (ids, counts, weights), begun if there are none."""
    into = lines.get((tier, b))
    if into is None:
        into = lines[tier, b] = ([], [], [])
    return into


def whole(tier: int, b: int, log: Log) -> Part:
    """The bucket as one part: each live tally's lines summed, with what it holds itself
    while this is its newest bucket."""
    tallies, counts, weights = log.sums(tier, b)
    ids = [tally.id for tally in tallies]
    return (tier, b, 0, _pack((ids, counts, weights)), len(ids))


def summed(log: Log) -> None:
    """A log written as one part: its lines are now one per tally (all on disk), and the
    tallies it is the newest of hold what they gained themselves, as before."""
    log.tallies, log.counts, log.weights = log.sums()
    log.written = len(log.tallies)
    log.credit = []
    log.newest = [t for t in log.newest if t.epoch != GONE]


def _pack(entries: Sequence[list[Any]]) -> bytes:
    return bytes(msgpack.packb(list(entries), use_bin_type=True))
