"""What each commit does, statement by statement, for both backends (see ``sqlbulk``).

A batch's writes in one transaction, each participant of the commit cycle's statements
written once, as a plan (``engine.cycle`` composes them, in order), and run by the SQLite
or the PostgreSQL runner. Boot's read is in ``boot``.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import msgpack

from tidal.server.core import ledger, past
from tidal.server.core.batch import Batch
from tidal.server.core.chunks import Written
from tidal.server.core.rewrites import Rewritten

from . import buckets, retention_sql
from . import past_sql as storage_past
from .sqlbulk import (
    ADD_META,
    SET_META,
    Bulk,
    Dialect,
    Exec,
    Many,
    Plan,
    Put,
    Rows,
    table_watermark,
    to_db,
)

log = logging.getLogger("tidal.storage")

LEDGER: Final = Bulk(
    "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context, at_ns)",
    ("bigint", "bigint", "text", "text", "float8", "bigint", "smallint", "bytea", "bigint"),
    values=("?", "?", "?", "?", "?", "?", "?", "?", f"NULLIF(?, {ledger.NOT_GIVEN})"),
)
_MEMBERSHIPS: Final = Bulk(
    'INSERT INTO memberships (user_id, "left", left_at_ns)',
    ("bigint", "smallint", "bigint"),
    ' ON CONFLICT (user_id) DO UPDATE SET "left" = excluded."left",'
    " left_at_ns = excluded.left_at_ns",
)
_KEYS: Final = Bulk(
    "INSERT INTO signal_keys (key, seq, forwarded, ts_ns)",
    ("text", "bigint", "smallint", "bigint"),
    " ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, forwarded = excluded.forwarded,"
    " ts_ns = excluded.ts_ns",
)
_UPSERT_COHORT: Final = (
    "INSERT INTO cohorts (id, name, predicate) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET id = excluded.id, predicate = excluded.predicate"
)


# -- each participant's statements in a batch's transaction (``engine.cycle``), in the
# order they run; cluster mode's first and last are in ``log_sql``


def ledger_rows(batch: Batch, *, rows: bool = True) -> Plan[None]:
    """The ledger's rows (``rows``: unless the log's statement writes them), the
    idempotency keys used and those forgotten, and a health check's write."""
    if rows:
        yield Put(LEDGER, batch.ledger)
    yield Put(_KEYS, [(key, seq, fwd, ts) for key, (seq, fwd, ts, _) in batch.keys.items()])
    if batch.probe:
        yield Exec(SET_META, ("health_probe_ns", time.time_ns()))
    if batch.forget_keys_before is not None:
        yield Exec("DELETE FROM signal_keys WHERE ts_ns < ?", (batch.forget_keys_before,))


def user_state(batch: Batch, *, blocks: bool = True) -> Plan[None]:
    """Who left and rejoined; the blocks of ``ledger_users`` (``blocks``: unless the log's
    statement writes them); cohorts defined and dropped."""
    memberships = batch.memberships.items()
    yield Put(_MEMBERSHIPS, [(to_db(u), int(left), at) for u, (left, at) in memberships])
    if blocks and batch.users_blocks:
        yield Many(storage_past.PUT_BLOCK, batch.users_blocks)
    if batch.cohorts:
        yield from _write_cohorts(batch)


def checkpoint(batch: Batch) -> Plan[Written | None]:
    """The board's tallies changed since the last checkpoint, as it holds them: the rows it
    wrote, or None with no checkpoint due."""
    board, shelf, changed = batch.board_state, batch.shelf, batch.board_changed
    if board is None or shelf is None or changed is None:
        return None
    written = yield from buckets.checkpoint(board, shelf, changed, batch.now_ns)
    yield Exec(SET_META, ("aggregates_seq", batch.first_seq - 1))
    yield Exec(SET_META, ("board_seq", batch.first_seq - 1))
    return written


def past_reads(batch: Batch) -> Plan[None]:
    """Before the transaction: pages of users' history, and of the users who have left."""
    for read in batch.reads:
        if isinstance(read, past.HistoryRead):
            args = (to_db(read.user_id), read.after_ns, read.limit)
            read.rows = yield Rows(storage_past.SELECT_HISTORY, args)
        else:
            read.rows = yield from storage_past.left_users(read.after, read.wanted())


def _rows_go(batch: Batch) -> Plan[int]:
    """Before rows are deleted or flipped, after the checkpoint (what it wrote is the table
    they are withdrawn from): its watermark. Rows may go, the newest among them: a seq once
    acknowledged is never given again, so the next boot must not take its next seq from
    what is left."""
    watermark = yield from table_watermark()
    yield Exec(SET_META, ("next_seq", batch.first_seq + len(batch.ledger)))
    return watermark


def withdrawals(d: Dialect, batch: Batch) -> Plan[Rewritten | None]:
    """A chunk of rows rewritten, then the batch's purges and erasures; then the users'
    history lines (``storage_past``). What the chunk's rewrite found, if there was one."""
    rewritten = None
    if batch.past or batch.rewrite is not None:
        watermark = yield from _rows_go(batch)
        if batch.rewrite is not None:  # before the withdrawals: one may write its rule anew
            rewritten = yield from storage_past.rewrite(d, batch.rewrite)
        yield from storage_past.withdraw(d, batch, watermark)
    if batch.history:
        lines = [(to_db(e.user_id), e.at_ns, e.event, e.signals()) for e in batch.history]
        yield Put(storage_past.HISTORY, lines)
    return rewritten


def retired(batch: Batch) -> Plan[int]:
    """Ledger retention's chunk: how many rows it deleted (``retention``)."""
    if batch.retire is None:
        return 0
    watermark = yield from _rows_go(batch)
    if batch.retire_ranges:  # cluster mode: the board is the log's, no table's
        gone = yield from retention_sql.retire_ranges(batch.retire)
    else:  # only rows the tables hold
        gone = yield from retention_sql.retire(batch.retire, watermark)
    if gone:  # so that boot knows how many rows there are without counting
        yield Exec(ADD_META, ("ledger_deleted", gone))
    return gone


def _write_cohorts(batch: Batch) -> Plan[None]:
    dropped = [(name,) for name, c in batch.cohorts.items() if c is None]
    defined = [
        (c.id, c.name, msgpack.packb(c.predicate, use_bin_type=True))
        for c in batch.cohorts.values()
        if c is not None
    ]
    if dropped:
        yield Many("DELETE FROM cohorts WHERE name = ?", dropped)
    if defined:
        yield Many(_UPSERT_COHORT, defined)
    if batch.next_cohort_id is not None:
        yield Exec(SET_META, ("next_cohort_id", batch.next_cohort_id))
