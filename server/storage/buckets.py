"""The board on disk: its chunks and parts (``board_chunks``, ``board_parts``: see
``core.chunks``), and what purges took off since the last checkpoint (``withdrawals``).

Both are a view of the ledger, up to one watermark (``meta.aggregates_seq``, and
``board_seq``: the board holds what is committed, so a checkpoint writes it up to
the batch before its own). A checkpoint writes the tallies it changed, and the
buckets they changed, as the board holds them.

A purge or erase does not rewrite them: what it withdrew from rows up to the
watermark, summed per aggregate and bucket, is one ``withdrawals`` record in its
own transaction. Boot takes the records off what the chunks hold (marking those
aggregates changed); the next checkpoint writes them as the board then holds them
and deletes the records. A purge then costs one row however many buckets it
reaches, and an erased user's signals are kept nowhere but in the sums.

Before the chunks, the board was kept a row per aggregate (``aggregates``) and per
bucket (``buckets``): such a database is read from those, and its first checkpoint
writes it all as chunks and empties them. A database written before the tables, or
a half-life not seen before, is filled from the ledger as it stands (rows that
retention deleted cannot be).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgpack

from tidal.server.core import chunks, windows
from tidal.server.core.board import Board, Changed
from tidal.server.core.chunks import Shelf, Written
from tidal.server.core.sums import TREND

from .sqlbulk import SET_META, Bulk, Exec, Many, Plan, put_guarded

log = logging.getLogger("tidal.storage")

#: the row tables of before (see above), filled from the ledger where they lacked buckets
BUCKETS: Final = Bulk(
    "INSERT INTO buckets (entity, layer, cohort, name, kind, tier, bucket, count, weight)",
    ("text", "smallint", "bigint", "text", "text", "smallint", "bigint", "bigint", "float8"),
    " ON CONFLICT (entity, layer, cohort, name, kind, tier, bucket) DO UPDATE SET"
    " count = buckets.count + excluded.count, weight = buckets.weight + excluded.weight",
)
#: every row, in one scan (the board skips the buckets no window reads): through the index
#: on time, each row would be a lookup, 4x slower for a million aggregates
SELECT: Final = "SELECT entity, layer, cohort, name, kind, tier, bucket, count, weight FROM buckets"
SELECT_AGGREGATES: Final = "SELECT entity, layer, cohort, name, kind, count, weight FROM aggregates"
#: newest first: a tally's first record is its own
SELECT_CHUNKS: Final = "SELECT chunk, decay, records FROM board_chunks ORDER BY chunk DESC"
SELECT_DECAYS: Final = "SELECT DISTINCT decay FROM board_chunks"
SELECT_PARTS: Final = "SELECT tier, bucket, entries FROM board_parts ORDER BY tier, bucket, part"
_PUT_CHUNK: Final = "INSERT INTO board_chunks (chunk, decay, records) VALUES (?, ?, ?)"
_PUT_PART: Final = "INSERT INTO board_parts (tier, bucket, part, entries) VALUES (?, ?, ?, ?)"
_GONE: Final = "DELETE FROM board_parts WHERE tier = ? AND bucket <= ?"
_EVERYTHING: Final = (
    "DELETE FROM board_chunks",
    "DELETE FROM board_parts",
    "DELETE FROM aggregates",
    "DELETE FROM buckets",
)
_WITHDRAWN: Final = (
    "INSERT INTO withdrawals (id, data)"
    " VALUES ((SELECT COALESCE(MAX(id), 0) + 1 FROM withdrawals), ?)"
)


def checkpoint(board: Board, shelf: Shelf, changed: Changed, now_ns: int) -> Plan[Written]:
    """A checkpoint: the records of the tallies changed since the last, burials of those
    gone, the oldest chunks cleaned, a part for each bucket changed (``chunks``); then the
    buckets no window reads any more, out. It writes the board as it holds all committed
    before its batch (it takes nothing in while this commits: see ``engine``): a purge's
    share written in between is in it too."""
    yield Exec("DELETE FROM withdrawals")  # each was taken off the board: written below
    written = chunks.checkpoint(board, shelf, changed, now_ns)
    if written.everything:  # the row tables of before go too
        for statement in _EVERYTHING:
            yield Exec(statement)
    else:
        yield Many("DELETE FROM board_chunks WHERE chunk = ?", [(c,) for c in written.cleaned])
        yield Many("DELETE FROM board_parts WHERE tier = ? AND bucket = ?", written.merged)
    yield Many(_PUT_CHUNK, written.chunks)
    yield Many(_PUT_PART, [part[:4] for part in written.parts])
    old_minute, old_hour = written.old
    yield Exec(_GONE, (0, old_minute))
    yield Exec(_GONE, (1, old_hour))
    yield Exec(SET_META, ("next_tally_id", shelf.next_id))
    return written


def missing_half_lives(decays: Iterable[tuple[bytes]], half_lives: Sequence[int]) -> list[int]:
    """The half-lives some chunk has no decayed sums of (a half-life not seen before)."""
    missing: set[int] = set()
    for (data,) in decays:
        taken = {hl for hl, _ in msgpack.unpackb(data)}
        missing.update(hl for hl in half_lives if hl not in taken)
    return sorted(missing)


def put(bulk: Bulk, rows: list[tuple[Any, ...]]) -> Plan[None]:
    """Bucket rows in; one the database cannot store (a name written before tidal refused
    NUL, on PostgreSQL) is left out and logged, as its aggregate is (``put_aggregates``)."""
    for row, reason in (yield from put_guarded(bulk, rows)):
        log.error(
            "a bucket the database cannot store is left out (%s): entity %r, layer %d, cohort %d,"
            " name %r, kind %r",
            reason, *row[:5],
        )  # fmt: skip


def withdraw(
    aggregates: list[Any], bucket_rows: list[Any], decay: list[tuple[int, int]]
) -> Plan[None]:
    """A purge's or erase's share, for rows up to the watermark, summed (``sums``): one
    ``withdrawals`` record (see above), with the bases its decayed sums were taken at."""
    if not aggregates:
        return
    record = {"decay": decay, "aggregates": aggregates, "buckets": bucket_rows}
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
