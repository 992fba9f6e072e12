"""The board on disk: each aggregate's count and weight (``aggregates``), its minute and
hour buckets and its decayed sums (``buckets``), and what purges took off since the last
checkpoint (``withdrawals``).

Both tables are a view of the ledger, up to one watermark (``meta.aggregates_seq``,
and ``board_seq``: the board holds what is committed, so a checkpoint writes it up
to the batch before its own). A checkpoint writes the aggregates changed since
the last as the board holds them. A ``buckets`` row is (aggregate, tier, bucket):
tier 0 a minute, tier 1 an hour (buckets past the longest window that reads them
are deleted), tier 2 a forward-decayed sum, with the half-life in seconds as its
bucket and the sum in ``weight``.

A purge or erase does not rewrite them: what it withdrew from rows up to the
watermark, summed per aggregate and bucket, is one ``withdrawals`` record in its
own transaction. Boot takes the records off what the tables hold (marking those
aggregates changed); the next checkpoint writes them as the board then holds them
and deletes the records. A purge then costs one row however many buckets it
reaches, and an erased user's signals are kept nowhere but in the sums.

Boot reads it all back; a database written before the tables, or a half-life not
seen before, is filled from the ledger as it stands (rows that retention deleted
cannot be).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack

from tidal.server.core import windows
from tidal.server.core.board import Board, Changed
from tidal.server.core.ledger import COHORT, Slot
from tidal.server.core.sums import TREND, aggregate_rows, bucket_rows, horizons
from tidal.server.core.tallies import Contribution, Tally

from .sqlbulk import (
    AGGREGATES_AS_HELD,
    Bulk,
    Exec,
    Many,
    Plan,
    put_aggregates,
    put_guarded,
)

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
#: every row, in one scan (the board skips the buckets no window reads): through the index
#: on time, each row would be a lookup, 4x slower for a million aggregates
SELECT: Final = "SELECT entity, layer, cohort, name, kind, tier, bucket, count, weight FROM buckets"
_GONE: Final = "DELETE FROM buckets WHERE tier = ? AND bucket <= ?"
_WITHDRAWN: Final = (
    "INSERT INTO withdrawals (id, data)"
    " VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM withdrawals), ?)"
)


def checkpoint(board: Board, changed: Changed, now_ns: int) -> Plan[None]:
    """A checkpoint: the aggregates changed since the last, with their buckets and decayed
    sums, as the board holds them (it takes nothing in while this batch commits: see
    ``engine``), and the aggregates gone; then the buckets no window reads any more, out.
    Written as they are, over what the table held: a purge's share written in between
    is in them too."""
    yield Exec("DELETE FROM withdrawals")  # each was taken off the board: written below
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


def withdraw(contributions: list[Contribution], decay: list[tuple[int, int]],
             now_ns: int) -> Plan[None]:  # fmt: skip
    """A purge's or erase's share, for rows up to the watermark: one ``withdrawals`` record
    (see above), with the bases its decayed sums were taken at."""
    if not contributions:
        return
    record = {
        "decay": decay,
        "aggregates": aggregate_rows(contributions),
        "buckets": bucket_rows(contributions, decay, now_ns),
    }
    yield Exec(_WITHDRAWN, (msgpack.packb(record, use_bin_type=True),))


def withdrawn(
    records: Iterable[tuple[bytes]], decay: Sequence[tuple[int, int]]
) -> list[tuple[list[Any], list[Any]]]:
    """The ``withdrawals`` records, oldest first, as (aggregates, buckets) rows to take off
    at boot: decayed sums moved to the bases now in use (by powers of two: exact)."""
    now = dict(decay)
    out = []
    for (data,) in records:
        record = msgpack.unpackb(data, raw=False, strict_map_key=False)
        factors = {
            hl: windows.rebase_factor(base, now[hl], hl)
            for hl, base in record["decay"]
            if hl in now
        }
        kept = []
        for row in record["buckets"]:
            if row[5] == TREND:
                factor = factors.get(row[6])
                if factor is None:
                    continue  # a half-life no longer kept
                row[8] *= factor
            kept.append(row)
        out.append((record["aggregates"], kept))
    return out
