"""The board on disk: each aggregate's minute and hour buckets, and its decayed sums.

Like the aggregates table, ``buckets`` is a view of the ledger, up to its own
watermark (``meta.board_seq``: the board holds what is committed, so a checkpoint
writes it up to the batch before its own). A checkpoint writes the buckets of the
tallies changed since the last as the board holds them, and a purge or erase
takes off, in its own transaction, what it withdrew from rows up to the
watermark. A row is (aggregate, tier, bucket):
tier 0 a minute, tier 1 an hour (buckets past the longest window that reads
them are deleted), tier 2 a forward-decayed sum, with the half-life in seconds
as its bucket and the sum in ``weight``. Boot reads it all back; a database
written before the table, or a half-life not seen before, is filled from the
ledger as it stands (rows that retention deleted cannot be).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final

from tidal.server.core import windows
from tidal.server.core.board import Board, Changed
from tidal.server.core.ledger import COHORT, COMMUNITY, LEDGER, Slot
from tidal.server.core.tallies import Contribution, Tally

from .sqlbulk import AGGREGATES_AS_HELD, Bulk, Exec, Many, Plan, put_aggregates, put_guarded

log = logging.getLogger("tidal.storage")

BUCKETS: Final = Bulk(
    "INSERT INTO buckets (entity, layer, cohort, name, kind, tier, bucket, count, weight)",
    ("text", "smallint", "bigint", "text", "text", "smallint", "bigint", "bigint", "float8"),
    " ON CONFLICT (entity, layer, cohort, name, kind, tier, bucket) DO UPDATE SET"
    " count = buckets.count + excluded.count, weight = buckets.weight + excluded.weight",
)
#: the checkpoint's: each row as the board holds it
BUCKETS_AS_HELD: Final = Bulk(
    BUCKETS.head,
    BUCKETS.types,
    " ON CONFLICT (entity, layer, cohort, name, kind, tier, bucket) DO UPDATE SET"
    " count = excluded.count, weight = excluded.weight",
)
_AGGREGATE: Final = "entity = ? AND layer = ? AND cohort = ? AND name = ? AND kind = ?"
_DROP: Final = f"DELETE FROM buckets WHERE {_AGGREGATE}"
_DROP_AGGREGATE: Final = f"DELETE FROM aggregates WHERE {_AGGREGATE}"
_DROP_ONE: Final = f"DELETE FROM buckets WHERE {_AGGREGATE} AND tier = ? AND bucket = ?"
TREND: Final = 2
#: every row, in one scan (the board skips the buckets no window reads): through the index
#: on time, each row would be a lookup, 4x slower for a million aggregates
SELECT: Final = "SELECT entity, layer, cohort, name, kind, tier, bucket, count, weight FROM buckets"
_GONE: Final = "DELETE FROM buckets WHERE tier = ? AND bucket <= ?"
#: after a withdrawal: the buckets it emptied, and the decayed sums of aggregates it emptied
_EMPTIED: Final = "DELETE FROM buckets WHERE entity = ? AND tier < 2 AND count = 0"
_ORPHANS: Final = """
    DELETE FROM buckets WHERE entity = ? AND tier = 2 AND NOT EXISTS (
        SELECT 1 FROM aggregates a WHERE a.entity = buckets.entity AND a.layer = buckets.layer
        AND a.cohort = buckets.cohort AND a.name = buckets.name AND a.kind = buckets.kind)"""


def horizons(now_ns: int) -> tuple[int, int]:
    """The newest minute and hour bucket no window reads any more."""
    (minute, minutes), (hour, hours) = windows.TIERS
    return now_ns // minute - minutes, now_ns // hour - hours


def rows(
    contributions: Iterable[Contribution], decay: Sequence[tuple[int, int]], now_ns: int,
    trends_only: Sequence[int] | None = None,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """``BUCKETS`` rows: the contributions summed per aggregate and bucket. With
    ``trends_only``, only those half-lives' decayed sums."""
    old_minute, old_hour = horizons(now_ns)
    sums: dict[tuple[Any, ...], list[Any]] = {}

    def add(key: tuple[Any, ...], count: int, weight: float) -> None:
        entry = sums.get(key)
        if entry is None:
            sums[key] = [count, weight]
        else:
            entry[0] += count
            entry[1] += weight

    for entity, kind, sign, weight, at_ns, cohorts, communities, ledger_too in contributions:
        columns = [(COHORT, cid, "") for cid in cohorts]
        columns += [(COMMUNITY, 0, name) for name in communities]
        if ledger_too:
            columns.append((LEDGER, 0, ""))
        m, h = at_ns // windows.MINUTE_NS, at_ns // windows.HOUR_NS
        decayed = [
            (hl, weight * windows.decay_factor(at_ns, base, hl))
            for hl, base in decay
            if trends_only is None or hl in trends_only
        ]
        for layer, cohort, name in columns:
            aggregate = (entity, layer, cohort, name, kind)
            if trends_only is None:
                if m > old_minute:
                    add((*aggregate, 0, m), sign, weight)
                if h > old_hour:
                    add((*aggregate, 1, h), sign, weight)
            for hl, value in decayed:
                add((*aggregate, TREND, hl), 0, value)
    return [(*key, count, weight) for key, (count, weight) in sums.items()]


def checkpoint(board: Board, changed: Changed, now_ns: int) -> Plan[None]:
    """A checkpoint: the aggregates changed since the last, with their buckets and decayed
    sums, as the board holds them (it takes nothing in while this batch commits: see
    ``engine``), and the aggregates gone; then the buckets no window reads any more, out.
    Written as they are, over what the table held: a purge's share written in between
    is in them too."""
    old_minute, old_hour = horizons(now_ns)
    rows: list[tuple[Any, ...]] = []
    gone: list[tuple[Any, ...]] = []
    done: set[tuple[Tally, int, int]] = set()

    def bucket(tally: Tally, aggregate: tuple[Any, ...], m: int) -> None:
        for tier, b in ((0, m), (1, m // 60)):
            if b <= (old_minute if tier == 0 else old_hour) or (tally, tier, b) in done:
                continue
            done.add((tally, tier, b))
            entry = board.entry(tally, tier, b)
            if entry is None:  # its last signal there withdrawn
                gone.append((*aggregate, tier, b))
            else:
                rows.append((*aggregate, tier, b, int(entry.real), entry.imag))

    aggregates: list[tuple[Any, ...]] = []
    for tally, m in changed.dirty.items():
        aggregate = _columns(tally.entity, tally.scope.slot)
        aggregates.append((*aggregate, tally.count, tally.weight))
        bucket(tally, aggregate, m)
        for (hl, _), value in zip(board.decay, tally.trend, strict=True):
            rows.append((*aggregate, TREND, hl, 0, value))
    for tally, m in changed.moved:
        if tally.count:  # else gone, and listed so
            bucket(tally, _columns(tally.entity, tally.scope.slot), m)
    vanished = [_columns(entity, slot) for entity, slot in changed.vanished]
    yield Many(_DROP_AGGREGATE, vanished)
    yield from put_aggregates(aggregates, AGGREGATES_AS_HELD)
    yield Many(_DROP, vanished)
    yield Many(_DROP_ONE, gone)
    yield from put(BUCKETS_AS_HELD, rows)
    yield Exec(_GONE, (0, old_minute))
    yield Exec(_GONE, (1, old_hour))


def put(bulk: Bulk, rows: list[tuple[Any, ...]]) -> Plan[None]:
    """Bucket rows in; one the database cannot store (a name written before tidal refused
    NUL, on PostgreSQL) is left out and logged, as its aggregate is (``put_aggregates``)."""
    for row, reason in (yield from put_guarded(bulk, rows)):
        log.error(
            "a bucket the database cannot store is left out (%s): entity %r, layer %d, cohort %d,"
            " name %r, kind %r",
            reason, *row[:5],
        )  # fmt: skip


def _columns(entity: str, slot: Slot) -> tuple[Any, ...]:
    layer, key, kind = slot
    cohort, name = (key, "") if layer == COHORT else (0, key)
    return (entity, layer, cohort, name, kind)


def _tidy(withdrawn: Iterable[str]) -> Plan[None]:
    """What withdrawals emptied goes, as from a recompute: buckets, and the decayed sums
    of aggregates that are gone (else a sum's rounding would outlive them)."""
    entities = [(entity,) for entity in withdrawn]
    if entities:
        yield Many(_EMPTIED, entities)
        yield Many(_ORPHANS, entities)


def withdraw(contributions: list[Contribution], decay: list[tuple[int, int]],
             now_ns: int) -> Plan[None]:  # fmt: skip
    """A purge's or erase's share, for rows up to the watermark; after the aggregates'."""
    if not contributions:
        return
    yield from put(BUCKETS, rows(contributions, decay, now_ns))
    yield from _tidy(dict.fromkeys(c[0] for c in contributions))
