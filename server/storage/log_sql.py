"""Cluster mode's statements around a batch's transaction (``engine.clustered``): the fence
of the partitions it writes for, and the commit log's head and record (``core.log``),
first and last; the catch-up of a batch the cohorts changed under."""

from __future__ import annotations

from typing import Any, Final

from tidal.server.core import log as commit_log
from tidal.server.core.batch import Batch, Entry
from tidal.server.errors import CohortsChanged, PartitionsLost

from .plans import LEDGER
from .sqlbulk import HEAD_LOCK, Exec, Plan, Rows, unnested

#: cluster mode: the partitions a batch writes for, at the epochs this node took them at.
#: The share lock makes a node taking one of them over wait for this transaction, and this
#: one see its new epoch if it took it first: the batch then commits nothing.
_HELD: Final = """
    SELECT p.part FROM tidal_partitions p
    JOIN unnest(?::int[], ?::bigint[]) AS mine(part, epoch)
      ON p.part = mine.part AND p.epoch = mine.epoch
    FOR SHARE OF p"""
FENCE: Final = _HELD


# ... and for a batch with a record for the commit log (``core.log``), in the same
# statement: the log's next id, if every partition is held and the cohort version is
# still the one the batch's signals were matched against, and the record under it. The
# row's lock, held to COMMIT, orders every node's commits that carry a record: ids follow
# commit order, with no gaps. The batch's blocks of ``ledger_users`` (``userrows.runs``)
# go in the same statement: each round trip more per commit cost 2-3% of a signal's CPU.
_ROWS_DONE: Final = " AND (SELECT count(*) FROM rows_in) >= 0"


def _head(rows: str = "") -> str:
    """The statement's parts before the head's lock: the fence, then what it writes (its
    ``rows``, its blocks), each referenced by the head's condition so that it is done
    before the head's row is locked; then the head."""
    return f"""
    WITH held AS ({_HELD}),{rows}
    blocks AS (
        INSERT INTO ledger_users (first_seq, users) SELECT * FROM unnest(?::bigint[], ?::bytea[])
        ON CONFLICT (first_seq) DO UPDATE SET users = excluded.users RETURNING 1),
    head AS (
        UPDATE tidal_cluster SET log_id = log_id + 1, cohorts = ?, events = events + ?
        WHERE cohorts = ? AND (SELECT count(*) FROM held) = ?
            AND (SELECT count(*) FROM blocks) >= 0{_ROWS_DONE if rows else ""}
        RETURNING log_id, events)"""


_HEAD_READ: Final = """
    SELECT (SELECT array_agg(part) FROM held), (SELECT log_id FROM head),
        (SELECT events FROM head)"""
_RECORD_IN: Final = (
    ", logged AS (INSERT INTO tidal_log (id, node, record)"
    " SELECT log_id, ?::text, ?::bytea FROM head)"
)


def _rows_param(column: str) -> str:
    """The parameter of ``_LOGGED`` that holds the batch's ledger rows' ``column``: after
    the fence's two, one per column of ``LEDGER``."""
    i = LEDGER.head.split("(")[1].rstrip(")").split(", ").index(column)
    return f"${3 + i}::{LEDGER.types[i]}[]"


#: a batch of signals only: the same parameters as its ledger rows, once more, as the
#: log's row (``core.log.COLUMNS``): nothing is encoded for the log but the rows
_ROWS_LOGGED: Final = f""", logged AS (
    INSERT INTO tidal_log (id, node, record, entities, kinds, weights, ts, ats, forwarded, contexts)
    SELECT log_id, ?::text, ''::bytea, {
    ", ".join(
        map(_rows_param, ("entity", "kind", "weight", "ts_ns", "at_ns", "forwarded", "context"))
    )
} FROM head)"""
#: a batch of signals only (the most of them): its ledger rows in the same statement too,
#: one round trip for all of its writes but COMMIT's
_LOGGED: Final = _head(f" rows_in AS ({unnested(LEDGER)} RETURNING 1),") + _ROWS_LOGGED + _HEAD_READ
#: ... and for a batch with events, cohort changes, a purge or erase: taken first (its
#: events take their ids from it), its record in the same statement, or for a purge or erase
#: last, once the withdrawals have found what they take off
_LOG_FIRST: Final = _head() + _RECORD_IN + _HEAD_READ
_LOG_ID: Final = _head() + _HEAD_READ
_LOG_RECORD: Final = "INSERT INTO tidal_log (id, node, record) VALUES (?, ?, ?)"
#: _LOCK_ORDER: the locks a cluster's commits share are taken in one order, so that no two
#: wait for each other (PostgreSQL found deadlocks between ``meta`` and the head when a
#: batch rewriting a purge's rows took them the other way): the partitions it writes for
#: (shared), then the log's head (the row of ``tidal_cluster``), then the rows it updates
#: (``meta``, the keys it forgets, the rows and blocks a purge or erase rewrites). A batch
#: of signals only takes the head last, but updates no row before it: its rows are new.
#: the records of other nodes' commits before this one, that this node has not applied:
#: a statement of its own, its snapshot taken once the lock above is held
_LOG_EARLIER: Final = (
    f"SELECT {commit_log.COLUMNS} FROM tidal_log WHERE id > ? AND id < ? ORDER BY id"
)
_LOG_PAST: Final = f"SELECT {commit_log.COLUMNS} FROM tidal_log WHERE id > ? ORDER BY id"


def log_head(batch: Batch) -> Plan[None]:
    """Cluster mode, first: a batch the cohorts changed under takes the head's lock and
    catches up; every batch but one of signals only takes the log's head (its events' ids
    come from it), then updates rows (``_LOCK_ORDER``); one with nothing for the log is
    fenced by its partitions alone."""
    if batch.log is not None and batch.log.catch_up is not None:
        yield from _catch_up(batch.log)
    if batch.log is not None:
        if not commit_log.signals_only(batch):
            yield from _logged(batch, first=True)
    elif batch.parts:
        held = yield Rows(FENCE, (list(batch.parts), list(batch.parts.values())))
        if len(held) != len(batch.parts):
            raise PartitionsLost(frozenset(batch.parts) - {part for (part,) in held})
        if batch.rewrite is not None and batch.rewrite.erase:
            # a chunk of an erase with nothing for the log: it blanks entries in blocks of
            # ``ledger_users``, which a merge rewrites under the head's lock
            yield Rows(HEAD_LOCK)


def log_record(batch: Batch) -> Plan[None]:
    """Cluster mode, last: a batch with a purge or erase, its record now that the
    withdrawals have found what they take off; a batch of signals only, its rows and its
    record in one statement with the log's head (the lock held the least)."""
    if batch.log is not None and batch.past:
        batch.log.record = commit_log.encode(batch)
        yield Exec(_LOG_RECORD, (batch.log.id, batch.log.node, batch.log.record))
    elif batch.log is not None and commit_log.signals_only(batch):
        yield from _logged(batch, first=False)


def _logged(batch: Batch, *, first: bool) -> Plan[None]:
    """The fence and the batch's record into the commit log (``_LOGGED``); its events' ids;
    then the records before it this node has not applied (``engine.replica``), if any.
    ``first``: before the batch's other writes, its rows among them."""
    parts, entry, changes = batch.parts, batch.log, batch.changes
    assert entry is not None
    fence = (list(parts), list(parts.values()))
    blocks = ([first for first, _ in batch.users_blocks], [u for _, u in batch.users_blocks])
    head = (entry.after, len(changes), entry.before, len(parts))
    args: tuple[Any, ...]
    if batch.past:  # its record is written last (``apply``)
        sql, args = _LOG_ID, (*fence, *blocks, *head)
    elif first:
        entry.record = commit_log.encode(batch)
        sql, args = _LOG_FIRST, (*fence, *blocks, *head, entry.node, entry.record)
    else:  # its record: its rows
        rows = list(zip(*batch.ledger, strict=True)) or [()] * len(LEDGER.types)
        sql, args = _LOGGED, (*fence, *rows, *blocks, *head, entry.node)
    ((held, log_id, events),) = yield Rows(sql, args)
    if log_id is None:
        lost = frozenset(parts) - set(held or ())
        if lost:
            raise PartitionsLost(lost)
        raise CohortsChanged()
    entry.id = log_id
    for i, change in enumerate(changes, start=events - len(changes) + 1):
        change.id = i
    if log_id != entry.applied + 1:
        entry.earlier = yield Rows(_LOG_EARLIER, (entry.applied, log_id))


def _catch_up(entry: Entry) -> Plan[None]:
    """A batch a commit found the cohorts changed under: the head's lock first, which
    every change of the cohorts takes; then, no change can come between, the records
    this node has not applied, for it to apply and match the batch again by (a new
    ``batch.log``)."""
    assert entry.catch_up is not None
    yield Rows(HEAD_LOCK)
    entry.catch_up((yield Rows(_LOG_PAST, (entry.applied,))))
