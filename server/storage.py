"""SQLite storage through aiosqlite: the boot load and the group commit (``schema``: the rest).

One connection, one thread, one writer: every batch is one transaction and one
call on that thread, whatever number of requests and connections it carries.
SQLite's INTEGER is signed 64-bit, so user ids (unsigned 64-bit on the wire)
are stored in two's complement.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import aiosqlite
import msgpack

from . import past, schema, storage_past
from .aggregates import CountsRead
from .batch import Batch
from .config import Durability
from .errors import StorageFailure
from .sqlbulk import AGGREGATES, SET_META, Bulk, from_db, rows_of, table_watermark, to_db, write_all

log = logging.getLogger("tidal.storage")

T = TypeVar("T")


_LEDGER: Final = Bulk(
    "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context) VALUES ",
    8,
)
_MEMBERSHIPS: Final = Bulk(
    "INSERT INTO memberships (user_id, left, left_at_ns) VALUES ",
    3,
    " ON CONFLICT DO UPDATE SET left = excluded.left, left_at_ns = excluded.left_at_ns",
)
_KEYS: Final = Bulk("INSERT OR REPLACE INTO signal_keys (key, seq, forwarded, ts_ns) VALUES ", 4)
_SELECT_COUNTS: Final = """
    SELECT layer, key, kind, count, weight FROM aggregates
    WHERE entity = ? ORDER BY layer, key, kind LIMIT ?"""
_SELECT_COUNTS_AFTER: Final = """
    SELECT layer, key, kind, count, weight FROM aggregates
    WHERE entity = ? AND (layer, key, kind) > (?, ?, ?) ORDER BY layer, key, kind LIMIT ?"""
_ADD_META: Final = """
    INSERT INTO meta (key, value) VALUES (?, ?)
    ON CONFLICT DO UPDATE SET value = value + excluded.value"""
_LOAD_CHUNK: Final = 500_000
_SELECT_MEMBERS: Final = (
    "SELECT user_id, left_at_ns FROM memberships WHERE left = ? AND user_id >= 0"
)
_SELECT_HIGH_MEMBERS: Final = (
    "SELECT user_id, left_at_ns FROM memberships WHERE left = ? AND user_id < 0"
)
_UPSERT_COHORT: Final = (
    "INSERT INTO cohorts (id, name, predicate) VALUES (?, ?, ?)"
    " ON CONFLICT (name) DO UPDATE SET id = excluded.id, predicate = excluded.predicate"
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the server needs in memory before it accepts a connection."""

    #: users who have left, and users who left once and rejoined: user_id -> left_at_ns
    left: dict[int, int]
    rejoined: dict[int, int]
    cohorts: list[tuple[int, str, Any]]
    next_seq: int
    next_cohort_id: int
    #: the aggregates table holds every signal up to this seq; later ledger rows follow
    watermark: int
    ledger_tail: list[tuple[str, str, float, int, bytes | None]]
    #: idempotency key -> (seq, forwarded, ts_ns), oldest first
    keys: OrderedDict[str, tuple[int, bool, int]]
    ledger_rows: int
    last_event_ns: int  # the latest event in any user's history
    next_block: int  # the first seq that no block of ledger_users lists yet
    users_tail: list[int]  # the users of the rows from there on, in seq order


class _Connection(aiosqlite.Connection):
    """aiosqlite's connection and its one thread, plus what it does not expose: running a
    whole batch as a single call there. aiosqlite pays a thread round trip per call."""

    _stopping: asyncio.Future[Any] | None = None

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        result: T = await self._execute(fn, self._conn)  # type: ignore[no-untyped-call]
        return result

    def stop(self) -> asyncio.Future[Any] | None:
        # aiosqlite stops its thread when connecting fails, and drops the future that
        # the thread completes: kept here, so that a failed open can wait for it
        # rather than leave the thread to call into a closed loop.
        self._stopping = super().stop()
        return self._stopping


class Storage:
    def __init__(self, db: _Connection, reader: _Connection, location: str) -> None:
        self._db = db
        #: WAL lets a reader beside the writer: ``counts`` need not wait for a commit
        self._reader = reader
        self.location = location
        self.commits = 0

    @classmethod
    async def open(cls, path: str | Path, durability: Durability = "full") -> Storage:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability: must be 'full' or 'normal', got {durability!r}")
        location = str(path)
        schema.check_writable(location)

        def connector() -> sqlite3.Connection:
            return sqlite3.connect(location, isolation_level=None, check_same_thread=False)

        pending = _Connection(connector, iter_chunk_size=256)
        try:
            db = cast(_Connection, await pending)
        except sqlite3.Error as exc:
            if pending._stopping is not None:
                await pending._stopping
            raise schema.explain(location, exc) from None
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={durability.upper()}")
            # deleted content is overwritten, not left in free space: an erased user's
            # rows must not survive in the file
            await db.execute("PRAGMA secure_delete=ON")
            await schema.check(db, location)
            await schema.migrate(db, location)
        except sqlite3.Error as exc:
            await db.close()
            raise schema.explain(location, exc) from None
        except BaseException:
            await db.close()
            raise
        try:
            reader = cast(_Connection, await _Connection(connector, iter_chunk_size=256))
            await reader.execute("PRAGMA query_only=ON")
        except sqlite3.Error as exc:
            await db.close()
            raise schema.explain(location, exc) from None
        return cls(db, reader, location)

    async def load(self, keys_since_ns: int = 0, max_keys: int = 1_000_000) -> Snapshot:
        return await self._db.run(lambda db: _load(db, keys_since_ns, max_keys))

    async def commit(self, batch: Batch) -> None:
        """The batch's reads, then its writes in one transaction: one call on the thread.

        Reads come first so that a read never sees a checkpoint taken in its own batch
        (see ``CountsRead``). A batch that changes nothing costs no transaction.
        """
        try:
            wrote = await self._db.run(lambda db: _apply(db, batch))
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            raise StorageFailure(
                f"commit failed: {exc}", transient=code == sqlite3.SQLITE_FULL
            ) from exc
        if wrote:
            self.commits += 1

    async def read_counts(self, reads: list[CountsRead]) -> None:
        """The table's share of ``counts`` reads, beside the writer: one call on the reader's
        thread for them all (see ``reads``)."""

        def read_all(db: sqlite3.Connection) -> None:
            for read in reads:
                _read_counts(db, read)

        try:
            await self._reader.run(read_all)
        except sqlite3.Error as exc:
            raise StorageFailure(f"read failed: {exc}", transient=True) from exc

    def size(self) -> int:
        """Bytes on disk: the database file and its write-ahead log."""
        total = 0
        for path in (self.location, self.location + "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(path).st_size
        return total

    async def close(self) -> None:
        await self._reader.close()
        await self._db.close()


def _load(db: sqlite3.Connection, keys_since_ns: int, max_keys: int) -> Snapshot:
    # Straight from the cursor into the dicts the gate uses, built in C; only ids
    # of 2**63 and above (stored negative) take a turn through Python.
    left: dict[int, int] = {}
    rejoined: dict[int, int] = {}
    for is_left, members in ((1, left), (0, rejoined)):
        cursor = db.execute(_SELECT_MEMBERS, (is_left,))
        while True:  # in chunks, so that a long boot says how far it got; no lists of rows
            before = len(members)
            members.update(itertools.islice(cursor, _LOAD_CHUNK))
            if len(members) - before < _LOAD_CHUNK:
                break
            log.info("loading leave records: %d so far", len(left) + len(rejoined))
        for uid, at in db.execute(_SELECT_HIGH_MEMBERS, (is_left,)):
            members[from_db(uid)] = at
    cohorts = [
        (cid, name, msgpack.unpackb(blob, raw=False))
        for cid, name, blob in db.execute("SELECT id, name, predicate FROM cohorts ORDER BY id")
    ]
    ((max_seq,),) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM ledger")
    meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    watermark = int(meta.get("aggregates_seq", 0))
    tail = db.execute(
        "SELECT entity, kind, weight, forwarded, context FROM ledger WHERE seq > ? ORDER BY seq",
        (watermark,),
    ).fetchall()
    newest_keys = db.execute(
        "SELECT key, seq, forwarded, ts_ns FROM signal_keys WHERE ts_ns >= ?"
        " ORDER BY ts_ns DESC LIMIT ?",
        (keys_since_ns, max_keys),
    ).fetchall()
    keys = OrderedDict((key, (seq, bool(fwd), ts)) for key, seq, fwd, ts in reversed(newest_keys))
    last_event = db.execute("SELECT at_ns FROM history ORDER BY rowid DESC LIMIT 1").fetchone()
    next_seq = max(int(max_seq) + 1, int(meta.get("next_seq", 1)), watermark + 1)
    rows = next_seq - 1 - int(meta.get("ledger_deleted", 0))  # every seq was a row once
    next_block, users_tail = storage_past.catch_up_blocks(db, next_seq)
    return Snapshot(
        left,
        rejoined,
        cohorts,
        next_seq,
        int(meta.get("next_cohort_id", 1)),
        watermark,
        tail,
        keys,
        rows,
        last_event[0] if last_event else 0,
        next_block,
        users_tail,
    )


def _apply(db: sqlite3.Connection, batch: Batch) -> bool:
    """Runs on the storage thread. True if a transaction was committed."""
    for read in batch.reads:
        if isinstance(read, CountsRead):
            _read_counts(db, read)
        elif isinstance(read, past.HistoryRead):
            args = (to_db(read.user_id), read.after_ns, read.limit)
            read.rows = db.execute(storage_past.SELECT_HISTORY, args).fetchall()
        else:
            read.rows = storage_past.left_users(db, read.after, read.wanted())
    if not batch.writes and batch.checkpoint is None and batch.retire is None:
        return False
    db.execute("BEGIN IMMEDIATE")
    try:
        write_all(db, _LEDGER, batch.ledger)
        write_all(
            db,
            _MEMBERSHIPS,
            [(to_db(u), int(left), at) for u, (left, at) in batch.memberships.items()],
        )
        if batch.cohorts:
            _write_cohorts(db, batch)
        write_all(db, _KEYS, batch.keys)
        if batch.probe:
            db.execute(SET_META, ("health_probe_ns", time.time_ns()))
        if batch.forget_keys_before is not None:
            db.execute("DELETE FROM signal_keys WHERE ts_ns < ?", (batch.forget_keys_before,))
        if batch.checkpoint is not None:
            write_all(db, AGGREGATES, rows_of(batch.checkpoint))
            db.execute(SET_META, ("aggregates_seq", batch.checkpoint_seq))
        if batch.users_blocks:
            db.executemany(storage_past.PUT_BLOCK, batch.users_blocks)
        if batch.past or batch.retire is not None:
            # after the checkpoint: what it wrote is the table these rows are withdrawn from
            watermark = table_watermark(db)
            # rows are about to go, maybe the newest: a seq once acknowledged is never
            # given again, so the next boot must not take its next seq from what is left
            db.execute(SET_META, ("next_seq", batch.first_seq + len(batch.ledger)))
            for withdrawal in batch.past:
                storage_past.withdraw(db, withdrawal, watermark, batch.first_seq)
            if batch.retire is not None:
                storage_past.retire(db, batch, watermark)
            deleted = batch.retired + sum(w.signals for w in batch.past if w.erase)
            if deleted:  # so that boot knows how many rows there are without counting them
                db.execute(_ADD_META, ("ledger_deleted", deleted))
        if batch.history:
            lines = [(to_db(e.user_id), e.at_ns, e.event, e.signals()) for e in batch.history]
            write_all(db, storage_past.HISTORY, lines)
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
            db.execute("ROLLBACK")
        raise
    return True


def _read_counts(db: sqlite3.Connection, read: CountsRead) -> None:
    args: tuple[Any, ...]
    if read.after is None:
        query, args = _SELECT_COUNTS, (read.entity, read.limit + 1)
    else:
        query, args = _SELECT_COUNTS_AFTER, (read.entity, *read.after, read.limit + 1)
    read.rows = db.execute(query, args).fetchall()
    if read.flushing_to is not None:  # a checkpoint was committing when memory was read
        read.table_watermark = table_watermark(db)


def _write_cohorts(db: sqlite3.Connection, batch: Batch) -> None:
    dropped = [(name,) for name, c in batch.cohorts.items() if c is None]
    defined = [
        (c.id, c.name, msgpack.packb(c.predicate, use_bin_type=True))
        for c in batch.cohorts.values()
        if c is not None
    ]
    if dropped:
        db.executemany("DELETE FROM cohorts WHERE name = ?", dropped)
    if defined:
        db.executemany(_UPSERT_COHORT, defined)
    if batch.next_cohort_id is not None:
        db.execute(SET_META, ("next_cohort_id", batch.next_cohort_id))
