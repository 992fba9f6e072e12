"""PostgreSQL storage through asyncpg: the same plans as SQLite's, on a database server.

One writer connection holds a session-level advisory lock for the server's life:
one tidal per database. Every batch is one transaction on it, committed with
``synchronous_commit`` on, so an acknowledged write is on the database server's
disk. A second connection reads ``counts`` beside the writer.

The database may go away (restarted, failed over, unreachable). Writes and the
reads that need it are then refused (error 2) and the writer reconnects, with
backoff, when asked to commit again. Reconnecting retakes the lock and checks
that the database is as this server left it: each transaction writes a batch id
(``meta.batch_id``), which must still be the last one this server committed.
The same id settles a COMMIT whose answer was lost: committed if the database
holds its id, not committed if it holds the one before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from pathlib import Path
from typing import Any, Final, TypeVar

import asyncpg

from . import plans, schema_pg
from .aggregates import CountsRead
from .batch import Batch
from .config import Durability, redact
from .errors import CommitUnknown, DatabaseInUse, DatabaseUnusable, StorageFailure
from .sqlbulk import (
    POSTGRES,
    SET_META,
    Begin,
    Bulk,
    Changed,
    Exec,
    Fill,
    Many,
    Plan,
    Put,
    Rows,
)
from .storage import Snapshot

log = logging.getLogger("tidal.storage")

T = TypeVar("T")

#: pg_advisory_lock's key for "one tidal per database" (the bytes of "tidal", then 1)
LOCK_KEY: Final = 0x7469_6461_6C00_0001
#: a COMMIT whose answer was lost: how long to keep trying to find out what became of it
OUTCOME_WAIT: Final = 60.0
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0
CONNECT_TIMEOUT: Final = 5.0
SIZE_EVERY: Final = 10.0  # seconds between measures of the database's size

_BATCH_ID: Final = "SELECT value FROM meta WHERE key = 'batch_id'"
_HOLDER: Final = """
    SELECT a.pid, a.client_addr, a.application_name FROM pg_locks l
    JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2"""
#: a failure to reach the database, or a session it ended: worth trying again
_LOST: Final = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)


class _CommitUnknown(Exception):
    """The connection was lost while COMMIT was on its way: it may or may not have happened."""


class PgStorage:
    backend = "postgresql"

    def __init__(self, url: str, options: dict[str, Any], writer: asyncpg.Connection) -> None:
        self._url = url
        self._options = options
        self.location = redact(url)
        self.commits = 0
        self._writer: asyncpg.Connection | None = writer
        self._reader: asyncpg.Connection | None = None
        self._last_id: int | None = None  # the batch id of this server's last transaction
        self._next_id = secrets.randbits(62)  # ids no other server will write
        self._retry_at = {"writer": 0.0, "reader": 0.0}
        self._backoff = {"writer": BACKOFF_FIRST, "reader": BACKOFF_FIRST}
        self._down: str = ""
        self._size = 0
        self._sized_at = 0.0

    @classmethod
    async def open(
        cls, url: str, durability: Durability = "full", password_file: str | None = None
    ) -> PgStorage:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability: must be 'full' or 'normal', got {durability!r}")
        location = redact(url)
        options: dict[str, Any] = {
            "timeout": CONNECT_TIMEOUT,
            "server_settings": {
                "application_name": "tidal",
                # full: COMMIT returns once the WAL is on disk (and on synchronous standbys)
                "synchronous_commit": "on" if durability == "full" else "off",
            },
        }
        if password_file:
            options["password"] = _read_password(password_file)
        try:
            writer = await asyncpg.connect(url, **options)
        except Exception as exc:
            raise DatabaseUnusable(f"{location}: cannot connect: {_why(exc)}") from None
        storage = cls(url, options, writer)
        try:
            if not await storage._lock(writer):
                raise DatabaseInUse(
                    f"--db {location}: another tidal ({await storage._holder(writer)}) already"
                    " serves this database (it holds tidal's advisory lock); stop it first, or"
                    " give this one another database"
                )
            await schema_pg.migrate(writer, location)
        except (asyncpg.PostgresError, *_LOST) as exc:  # a standby, no rights to create...
            await _close(writer)
            raise DatabaseUnusable(f"{location}: cannot set up tidal's tables: {exc}") from None
        except Exception:
            await _close(writer)
            raise
        return storage

    async def load(self, keys_since_ns: int = 0, max_keys: int = 1_000_000) -> Snapshot:
        assert self._writer is not None
        try:
            snapshot = await self._run(self._writer, plans.load(POSTGRES, keys_since_ns, max_keys))
            self._last_id = await self._writer.fetchval(_BATCH_ID)
        except (asyncpg.PostgresError, *_LOST) as exc:  # at boot: one line, no traceback
            raise DatabaseUnusable(f"{self.location}: cannot load: {_why(exc)}") from None
        await self._measure(self._writer)
        return snapshot

    async def commit(self, batch: Batch) -> None:
        conn = await self._connection("writer")
        try:
            wrote = await self._run(conn, plans.apply(POSTGRES, batch))
        except _CommitUnknown as exc:
            batch_id = self._next_id
            raise CommitUnknown(
                f"the connection to the database was lost during COMMIT ({exc})",
                lambda: self._find_out(batch_id),
            ) from exc
        except Exception as exc:
            raise self._failure("commit", exc, conn) from exc
        if wrote:
            self.commits += 1
        if time.monotonic() - self._sized_at > SIZE_EVERY:
            await self._measure(conn)

    async def read_counts(self, reads: list[CountsRead]) -> None:
        conn = await self._connection("reader")
        try:
            for read in reads:
                await self._run(conn, plans.read_counts(read))
        except Exception as exc:
            raise self._failure("read", exc, conn) from exc

    def size(self) -> int:
        return self._size

    async def close(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None:
                await _close(conn)  # the writer's session ends: the lock goes with it
        self._reader = self._writer = None

    # -- running plans -------------------------------------------------------

    async def _run(self, conn: asyncpg.Connection, plan: Plan[T]) -> T:
        """A plan, statement by statement; a transaction it began and did not commit is
        rolled back, as the database does when the session ends."""
        in_transaction = False
        result: Any = None
        try:
            while True:
                op = plan.send(result)
                result = None
                if isinstance(op, Put):
                    if op.rows:
                        await conn.execute(_unnest(op.bulk), *zip(*op.rows, strict=True))
                elif isinstance(op, Rows):
                    result = [tuple(row) for row in await conn.fetch(_numbered(op.sql), *op.args)]
                elif isinstance(op, Exec):
                    await conn.execute(_numbered(op.sql), *op.args)
                elif isinstance(op, Many):
                    await conn.executemany(_numbered(op.sql), op.rows)
                elif isinstance(op, Changed):
                    status = await conn.execute(_numbered(op.sql), *op.args)
                    result = int(status.rsplit(" ", 1)[1])
                elif isinstance(op, Fill):
                    rows = await conn.fetch(_numbered(op.sql), *op.args)
                    op.into.update({row[0]: row[1] for row in rows})
                elif isinstance(op, Begin):
                    await conn.execute("BEGIN")
                    in_transaction = True
                else:
                    self._next_id += 1
                    await conn.execute(_numbered(SET_META), "batch_id", self._next_id)
                    in_transaction = False
                    try:
                        await conn.execute("COMMIT")
                    except _LOST as exc:
                        if conn.is_closed():
                            raise _CommitUnknown(str(exc)) from exc
                        raise
                    self._last_id = self._next_id
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except BaseException:
            if in_transaction and not conn.is_closed():
                try:
                    await conn.execute("ROLLBACK")
                except Exception:  # the session is gone, and its transaction with it
                    conn.terminate()
            raise

    # -- the connections, and getting them back -------------------------------

    async def _connection(self, role: str) -> asyncpg.Connection:
        """The writer's or the reader's connection, reconnected if it was lost (the writer
        retaking the lock, and checking the database is as it left it). While the database
        cannot be reached, tries are spaced out (doubling, up to ``BACKOFF_MAX``)."""
        conn = self._writer if role == "writer" else self._reader
        if conn is not None and not conn.is_closed():
            return conn
        if time.monotonic() < self._retry_at[role]:
            raise StorageFailure(self._down, transient=True, state="unavailable")
        try:
            conn = await self._connect()
        except Exception as exc:
            self._down = f"database unreachable ({_why(exc)})"
            self._retry_at[role] = time.monotonic() + self._backoff[role]
            self._backoff[role] = min(BACKOFF_MAX, self._backoff[role] * 2)
            raise StorageFailure(self._down, transient=True, state="unavailable") from exc
        self._backoff[role] = BACKOFF_FIRST
        if role == "reader":
            self._reader = conn
            return conn
        try:
            await self._fence(conn)
        except BaseException:
            await _close(conn)
            raise
        self._writer = conn
        log.warning("reconnected to %s", self.location)
        return conn

    async def _fence(self, conn: asyncpg.Connection) -> None:
        """Retake the lock; then the database must hold this server's last batch id, or
        another server has written since (memory would no longer be what is on disk)."""
        if not await self._lock(conn):
            raise StorageFailure(
                f"another tidal ({await self._holder(conn)}) took the database while this"
                " server's connection was lost; this server stops writing: restart it once"
                " the other is stopped",
                transient=False,
            )
        last = await conn.fetchval(_BATCH_ID)
        if last != self._last_id:
            raise StorageFailure(
                "the database changed while this server's connection was lost (another"
                " server wrote to it, or it was restored); restart tidal to load it again",
                transient=False,
            )

    async def _find_out(self, batch_id: int) -> None:
        """Whether the COMMIT whose answer was lost happened: returns if it did, raises
        ``StorageFailure`` if it did not, or if that cannot be found out in time."""
        deadline = time.monotonic() + OUTCOME_WAIT
        delay = BACKOFF_FIRST
        while True:
            try:
                conn = await self._connect()
                break
            except Exception as exc:
                if time.monotonic() + delay > deadline:
                    raise StorageFailure(
                        f"the connection was lost during COMMIT and the database could not be"
                        f" reached for {OUTCOME_WAIT:.0f}s to find out whether it held"
                        f" ({_why(exc)}); restart tidal to load what is on disk",
                        transient=False,
                        outcome_unknown=True,
                    ) from exc
                await asyncio.sleep(delay)  # a schedule, not a synchronisation
                delay = min(BACKOFF_MAX, delay * 2)
        try:
            if not await self._lock(conn):
                raise StorageFailure(
                    f"another tidal ({await self._holder(conn)}) took the database while a"
                    " COMMIT's outcome was unknown; restart this one once the other is stopped",
                    transient=False,
                    outcome_unknown=True,
                )
            last = await conn.fetchval(_BATCH_ID)
        except BaseException:
            await _close(conn)
            raise
        self._writer = conn
        if last == batch_id:
            log.warning("the COMMIT held: reconnected to %s", self.location)
            self._last_id = batch_id
            self.commits += 1
            return
        if last == self._last_id:
            raise StorageFailure(
                "the connection to the database was lost before COMMIT held", transient=True,
                state="unavailable",
            )  # fmt: skip
        await _close(conn)
        self._writer = None
        raise StorageFailure(
            "the database changed while a COMMIT's outcome was unknown (another server wrote"
            " to it, or it was restored); restart tidal to load it again",
            transient=False,
            outcome_unknown=True,
        )

    async def _connect(self) -> asyncpg.Connection:
        conn: asyncpg.Connection = await asyncpg.connect(self._url, **self._options)
        return conn

    async def _lock(self, conn: asyncpg.Connection) -> bool:
        locked: bool = await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        return locked

    async def _holder(self, conn: asyncpg.Connection) -> str:
        row = await conn.fetchrow(_HOLDER, LOCK_KEY >> 32, LOCK_KEY & 0xFFFF_FFFF)
        if row is None:
            return "a session that has just ended"
        return f"backend pid {row['pid']} from {row['client_addr'] or 'a local socket'}"

    def _failure(self, what: str, exc: Exception, conn: asyncpg.Connection) -> StorageFailure:
        if isinstance(exc, StorageFailure):
            return exc
        if isinstance(exc, _LOST) or conn.is_closed():
            if isinstance(exc, asyncpg.exceptions.DiskFullError):
                return StorageFailure(f"{what} failed: {exc}", transient=True)
            self._down = f"database unreachable ({_why(exc)})"
            message = f"{what} failed: {_why(exc)}"
            return StorageFailure(message, transient=True, state="unavailable")
        return StorageFailure(f"{what} failed: {exc}", transient=False)

    async def _measure(self, conn: asyncpg.Connection) -> None:
        self._sized_at = time.monotonic()
        try:
            self._size = await conn.fetchval("SELECT pg_database_size(current_database())")
        except Exception as exc:  # a figure for stats: never a reason to fail a commit
            log.debug("could not measure the database: %s", exc)


@functools.lru_cache(maxsize=256)
def _numbered(sql: str) -> str:
    """``?`` placeholders as PostgreSQL numbers them: ``$1``, ``$2``..."""
    parts = sql.split("?")
    return parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))


@functools.lru_cache(maxsize=64)
def _unnest(bulk: Bulk) -> str:
    """Many rows in one statement: one array per column, unnested side by side."""
    arrays = ", ".join(f"${i}::{kind}[]" for i, kind in enumerate(bulk.types, 1))
    return f"{bulk.head} SELECT * FROM unnest({arrays}){bulk.tail}"


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _read_password(path: str) -> str:
    """A mounted secret: a small file, read once at start."""
    try:
        return Path(path).read_text("utf-8").strip()
    except OSError as exc:
        raise DatabaseUnusable(
            f"--db-password-file {path}: cannot read it: {exc.strerror or exc}"
        ) from None


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await conn.close(timeout=2)
    except Exception:  # gone already, or not answering: the socket goes either way
        conn.terminate()
