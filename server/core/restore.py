"""The board rebuilt at boot: from its chunks and parts (``load_chunks``, ``load_parts``;
``fill`` for the row tables of before), less what purges and erases took off since they
were written (``take_off``), then the ledger rows past their watermark (``from_row``, as
``Board.add`` takes them). Per aggregate and bucket, so compiled."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import ledger, windows
from .board import Board
from .chunks import Shelf
from .ledger import COHORT, LEDGER, Slot
from .reload import load_chunks, load_parts
from .tallies import Contribution, Log, Tally
from .windows import KEEP


@dataclass(slots=True)
class BoardRows:
    """The board as the database holds it (see ``storage.buckets``), for ``rebuild``."""

    decay: list[tuple[int, int]]  # (half-life s, base ns) of each trend (``core.windows``)
    next_tally_id: int
    chunks: list[tuple[int, bytes, bytes]] = field(default_factory=list)  # newest first
    parts: list[tuple[int, int, bytes]] = field(default_factory=list)  # in order
    #: half-lives some chunk lacks: their decayed sums come from the ledger (``trends``)
    missing: list[int] = field(default_factory=list)
    trends: list[tuple[Any, ...]] = field(default_factory=list)
    #: the row tables of before, if they hold the board (read once, then written as chunks)
    aggregates: list[tuple[str, int, int, str, str, int, float]] = field(default_factory=list)
    buckets: list[tuple[str, int, int, str, str, int, int, int, float]] = field(
        default_factory=list
    )
    #: what purges and erases took off since the board was written, to take off it:
    #: (aggregates rows, buckets rows), oldest first
    withdrawn: list[tuple[list[Any], list[Any]]] = field(default_factory=list)


def rebuild(
    board: Board, shelf: Shelf, rows: BoardRows, tail: Iterable[Sequence[Any]],
    cohort_ids: set[int],
) -> None:  # fmt: skip
    """The board at boot, and what is on disk of it: the chunks and parts (or the row
    tables of before: then all is written as chunks at the first checkpoint, as it is
    when a half-life is filled from the ledger), less the withdrawals, then the ledger's
    tail (counted, and written by the next checkpoint)."""
    if rows.aggregates or rows.buckets:
        fill(board, rows.aggregates, rows.buckets, cohort_ids)
        shelf.rewrite = True
        shelf.next_id = rows.next_tally_id
    else:
        by_id = load_chunks(board, shelf, rows.chunks, cohort_ids, rows.missing, rows.next_tally_id)
        load_parts(board, shelf, rows.parts, by_id)
    if rows.missing:
        refill(board, rows.trends)
        shelf.rewrite = True
    for aggregate_rows, bucket_rows in rows.withdrawn:
        take_off(board, aggregate_rows, bucket_rows)
    board.add(from_row(row) for row in tail)


def refill(board: Board, trends: Iterable[Sequence[Any]]) -> None:
    """Decayed sums of half-lives the chunks lack, summed from the ledger (``sums``)."""
    for entity, layer, cohort, name, kind, tier, bucket, count, weight in trends:
        tally = find(board, entity, (layer, cohort if layer == COHORT else name, kind))
        if tally is not None:
            load_bucket(board, tally, tier, bucket, count, weight)


def load(board: Board, slot: Slot, entity: str, count: int, weight: float) -> Tally:
    """A tally as the row tables of before hold it (all-time), before its buckets."""
    tally = board.tally_for(slot, entity)
    tally.count += count
    tally.weight += weight
    return tally


def load_bucket(
    board: Board, tally: Tally, tier: int, bucket: int, count: int, weight: float
) -> None:
    """A persisted bucket (tier 0, 1) or decayed sum (tier 2: ``bucket`` is the half-life)."""
    if tier == 2:
        for i, (hl, _) in enumerate(board.decay):
            if hl == bucket:
                tally.add_trend(i, weight)
        return
    current = board.minute if tier == 0 else board.hour
    if bucket <= current - KEEP[tier] or not count:
        return
    kept = board.buckets[tier]
    log = kept.get(bucket)
    if log is None:
        log = kept[bucket] = Log()
    log.add(tally, count, weight)  # not on disk in parts yet
    board.touched.add((tier, bucket))
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
    """The board as the row tables of before hold it (dropped cohorts' rows left out)."""
    for entity, layer, cohort, name, kind, count, weight in aggregates:
        if not count or (layer == COHORT and cohort not in cohort_ids):
            continue
        load(board, (layer, cohort if layer == COHORT else name, kind), entity, count, weight)
    for entity, layer, cohort, name, kind, tier, bucket, count, weight in buckets:
        tally = find(board, entity, (layer, cohort if layer == COHORT else name, kind))
        if tally is not None:  # else emptied, or of a cohort dropped
            load_bucket(board, tally, tier, bucket, count, weight)


def take_off(
    board: Board,
    aggregates: Iterable[Sequence[Any]],
    buckets: Iterable[Sequence[Any]],
) -> None:
    """What a purge or erase took off the board on disk, at boot, once that is read: the
    aggregates it changed are marked, and the lines it took off are not on disk, so that
    the next checkpoint writes them (see ``storage.buckets``)."""
    for entity, layer, cohort, name, kind, tier, bucket, count, weight in buckets:
        tally = find(board, entity, (layer, cohort if layer == COHORT else name, kind))
        if tally is not None:
            load_bucket(board, tally, tier, bucket, count, weight)
            board.mark(tally)
    for entity, layer, cohort, name, kind, count, weight in aggregates:
        tally = find(board, entity, (layer, cohort if layer == COHORT else name, kind))
        if tally is not None:
            shrink(board, tally, count, weight)


def find(board: Board, entity: str, slot: Slot) -> Tally | None:
    layer, key, kind = slot
    return board.find(entity, kind, None if layer == LEDGER else key)


def shrink(board: Board, tally: Tally, count: int, weight: float) -> None:
    """All-time totals taken off (``take_off``); a tally left with no signal goes."""
    tally.count += count
    tally.weight += weight
    board.mark(tally)
    if not tally.count:
        board.drop(tally)
