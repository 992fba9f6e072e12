"""SQLite storage through aiosqlite: the embedded default, a file beside the server.

One connection, one thread, one writer: every batch is one transaction and one
call on that thread (its plan run whole there), whatever number of requests and
connections it carries. Reads are answered from memory, or read by the writer
with its batch (``history``, ``left_users``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import aiosqlite

from tidal.server.config import Durability
from tidal.server.errors import StorageFailure
from tidal.server.storage import boot
from tidal.server.storage.interface import Snapshot
from tidal.server.storage.sqlbulk import (
    SQLITE,
    Begin,
    Bulk,
    Changed,
    Commit,
    Dialect,
    Exec,
    Fill,
    Many,
    Plan,
    Put,
    Rows,
    Try,
    Turn,
    unknown,
)

from . import sqlite_schema

log = logging.getLogger("tidal.storage")

T = TypeVar("T")

BULK_ROWS: Final = 512  # rows per statement: 512 x 8 parameters, well under SQLite's 32766
_LOAD_CHUNK: Final = 500_000


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


class SqliteStorage:
    backend = "sqlite"

    def __init__(self, db: _Connection, location: str) -> None:
        self._db = db
        self._reader: _Connection | None = None  # opened by the first read beside the writer
        self.location = location
        self.commits = 0

    @classmethod
    async def open(cls, path: str | Path, durability: Durability = "full") -> SqliteStorage:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability: must be 'full' or 'normal', got {durability!r}")
        location = str(path)
        sqlite_schema.check_writable(location)

        pending = _Connection(functools.partial(_connect, location), iter_chunk_size=256)
        try:
            db = cast(_Connection, await pending)
        except sqlite3.Error as exc:
            if pending._stopping is not None:
                await pending._stopping
            raise sqlite_schema.explain(location, exc) from None
        try:
            await sqlite_schema.refuse_foreign(
                db, location
            )  # before WAL mode: that writes the file
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={durability.upper()}")
            # deleted content is overwritten, not left in free space: an erased user's
            # rows must not survive in the file
            await db.execute("PRAGMA secure_delete=ON")
            await sqlite_schema.check(db, location)
            await sqlite_schema.migrate(db, location)
        except sqlite3.Error as exc:
            await db.close()
            raise sqlite_schema.explain(location, exc) from None
        except BaseException:
            await db.close()
            raise
        return cls(db, location)

    async def load(
        self, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
    ) -> Snapshot:
        load = boot.load(SQLITE, keys_since_ns, max_keys, half_lives, now_ns)
        return await self._db.run(lambda db: run(db, load))

    async def commit(self, transaction: Callable[[Dialect], Plan[bool]]) -> None:
        """The batch's plan, as one call on the thread."""
        try:
            wrote = await self._db.run(lambda db: run(db, transaction(SQLITE)))
        except sqlite3.Error as exc:
            if is_data_error(exc):
                raise StorageFailure(f"commit refused: {exc}", transient=True, data=True) from exc
            code = getattr(exc, "sqlite_errorcode", None)
            raise StorageFailure(
                f"commit failed: {exc}", transient=code == sqlite3.SQLITE_FULL
            ) from exc
        if wrote:
            self.commits += 1

    async def read(self, plan: Callable[[Dialect], Plan[T]]) -> T:
        """On a second connection and thread: a snapshot that commits meanwhile leave as
        it was (a deferred transaction, in write-ahead-log mode), the writer not waiting."""

        def snapshot(db: sqlite3.Connection) -> T:
            db.execute("BEGIN")
            try:
                return run(db, plan(SQLITE))
            finally:
                db.execute("ROLLBACK")

        try:
            if self._reader is None:
                pending = _Connection(functools.partial(_connect, self.location), 256)
                self._reader = cast(_Connection, await pending)
            return await self._reader.run(snapshot)
        except sqlite3.Error as exc:
            raise StorageFailure(f"read failed: {exc}", transient=True) from exc

    probe_every: float | None = None  # one process on one file: no session to keep alive

    async def probe(self) -> None:
        return None

    def size(self) -> int:
        """Bytes on disk: the database file and its write-ahead log."""
        total = 0
        for path in (self.location, self.location + "-wal"):
            with contextlib.suppress(OSError):
                total += os.stat(path).st_size
        return total

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()
        await self._db.close()


def _connect(location: str) -> sqlite3.Connection:
    return sqlite3.connect(location, isolation_level=None, check_same_thread=False)


def run(db: sqlite3.Connection, plan: Plan[T]) -> T:
    """A plan, statement by statement, on the storage thread. A transaction it began and
    did not commit is rolled back, whatever stopped it."""
    in_transaction = False
    result: Any = None
    try:
        while True:
            op = plan.send(result)
            result = None
            if isinstance(op, Put):
                if op.rows:
                    _write_all(db, op.bulk, op.rows)
            elif isinstance(op, Try):
                result = _try(db, op)
            elif isinstance(op, Rows):
                result = db.execute(op.sql, op.args).fetchall()
            elif isinstance(op, Exec):
                db.execute(op.sql, op.args)
            elif isinstance(op, Many):
                db.executemany(op.sql, op.rows)
            elif isinstance(op, Changed):
                result = db.execute(op.sql, op.args).rowcount
            elif isinstance(op, Fill):
                _fill(db.execute(op.sql, op.args), op.into)
            elif isinstance(op, Begin):
                db.execute("BEGIN IMMEDIATE")
                in_transaction = True
            elif isinstance(op, Commit):
                db.execute("COMMIT")
                in_transaction = False
            elif isinstance(op, Turn):
                pass  # a thread of its own: the loop runs beside it
            else:  # a kind this runner does not know: never taken for a COMMIT
                unknown(op)
    except StopIteration as done:
        return cast(T, done.value)
    except BaseException:
        if in_transaction:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                db.execute("ROLLBACK")
        raise


def _try(db: sqlite3.Connection, op: Try) -> str | None:
    db.execute("SAVEPOINT tidal_try")
    try:
        _write_all(db, op.bulk, op.rows)
        reason = None
    except sqlite3.Error as exc:
        if not is_data_error(exc):
            raise  # the transaction is rolled back whole
        db.execute("ROLLBACK TO tidal_try")
        reason = str(exc)
    db.execute("RELEASE tidal_try")
    return reason


#: what SQLite refuses for the data it is given, not for the state of the disk
_DATA_ERRORS: Final = {sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH, sqlite3.SQLITE_TOOBIG}


def is_data_error(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _DATA_ERRORS


def _fill(cursor: sqlite3.Cursor, into: dict[Any, Any]) -> None:
    """Straight from the cursor into the dict, built in C, in chunks so that a long boot
    says how far it got."""
    while True:
        before = len(into)
        into.update(itertools.islice(cursor, _LOAD_CHUNK))
        if len(into) - before < _LOAD_CHUNK:
            return
        log.info("loading leave records: %d so far", len(into))


def _write_all(db: sqlite3.Connection, bulk: Bulk, rows: Sequence[tuple[Any, ...]]) -> None:
    """``executemany`` without its cost here: it binds and steps one row at a time and
    takes the GIL back for every row, and with the event loop busy each of those is a
    wait (measured: 84-265 ms for 128 ledger rows, against 14 ms in one statement).
    Rows go in statements of a power-of-two size, so a handful of shapes stay cached."""
    done, total = 0, len(rows)
    while done < total:
        size = min(BULK_ROWS, 1 << ((total - done).bit_length() - 1))
        flat = list(itertools.chain.from_iterable(rows[done : done + size]))
        db.execute(_statement(bulk, size), flat)
        done += size


@functools.lru_cache(maxsize=128)
def _statement(bulk: Bulk, rows: int) -> str:
    row = "(" + ", ".join(bulk.values or "?" * len(bulk.types)) + ")"
    return bulk.head + " VALUES " + ", ".join([row] * rows) + bulk.tail
