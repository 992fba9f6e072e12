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
import json
import logging
import secrets
import socket
import time
import zlib
from pathlib import Path
from typing import Any, Final, TypeVar, cast

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
    Try,
)
from .storage import Snapshot

log = logging.getLogger("tidal.storage")

T = TypeVar("T")

#: pg_advisory_lock's key for "one tidal per schema": the bytes of "tida", then the CRC-32
#: of the schema tidal's tables are in (advisory locks are per database; tidal's tables are
#: per schema, so two tidals in two schemas of one database are two databases to tidal)
LOCK_CLASS: Final = 0x7469_6461
#: a COMMIT whose answer was lost: how long to keep trying to find out what became of it
OUTCOME_WAIT: Final = 60.0
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0
CONNECT_TIMEOUT: Final = 5.0
SIZE_EVERY: Final = 10.0  # seconds between measures of the database's size
#: A database that stops answering, network and all (a host's power lost, a partition:
#: packets dropped, no reset), is noticed by TCP: keepalive probes after a second idle,
#: and ``TCP_USER_TIMEOUT`` ends the connection once sent data or probes go unacknowledged
#: this long. So a statement or COMMIT on a dead network fails within about
#: ``KEEPALIVE_IDLE + USER_TIMEOUT`` seconds, and the writer reconnects (a lost COMMIT is
#: settled by its batch id).
KEEPALIVE_IDLE: Final = 1
KEEPALIVE_INTERVAL: Final = 1
KEEPALIVE_COUNT: Final = 3
USER_TIMEOUT: Final = 4.0
#: A database that answers TCP but not a statement (a lock held by another session, a
#: stalled disk): every statement but COMMIT is given up after this long, its connection
#: closed, and the batch refused as unavailable. COMMIT waits as long as the database
#: takes (a synchronous standby may hold it); TCP still bounds it on a dead network.
STATEMENT_TIMEOUT: Final = 30.0
#: What tidal relies on in its sessions, whatever the database or role sets by default
#: (``ALTER ROLE ... SET statement_timeout``): given when each connection starts, which takes
#: precedence over those defaults (and so applies to the first statement too) ...
SESSION: Final = {
    "statement_timeout": "0",  # tidal times its statements itself, COMMIT apart
    "lock_timeout": "0",
    "idle_in_transaction_session_timeout": "0",
    "default_transaction_isolation": "read committed",
    "default_transaction_read_only": "off",
    "client_encoding": "UTF8",
}
#: ... and those that only newer servers have, set where the server has them
LATER_SESSION: Final = {
    "idle_session_timeout": "0",  # PostgreSQL 14+: the writer's session holds the lock
    "transaction_timeout": "0",  # PostgreSQL 17+
}
_PIN: Final = """
    SELECT count(set_config(name, ($1::jsonb) ->> name, false)), current_setting('server_encoding'),
           current_schema()
    FROM pg_settings WHERE ($1::jsonb) ? name"""

_BATCH_ID: Final = "SELECT value FROM meta WHERE key = 'batch_id'"
_HOLDER: Final = """
    SELECT a.pid, a.client_addr, a.application_name FROM pg_locks l
    JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2
      AND l.objsubid = 2"""
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

    def __init__(
        self, url: str, options: dict[str, Any], writer: asyncpg.Connection, schema: str
    ) -> None:
        self._url = url
        self._options = options
        self.location = redact(url)
        crc = zlib.crc32(schema.encode("utf-8"))
        self._lock_key = (LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc)
        self.commits = 0
        self._writer: asyncpg.Connection | None = writer
        #: the backend of this server's last writer session: on a network that went silent,
        #: the database may not know yet that it is gone, and it still holds the lock
        self._writer_pid: int = writer.get_server_pid()
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
                **SESSION,
            },
        }
        if password_file:
            options["password"] = _read_password(password_file)
        try:
            writer = await _connect(url, options)
        except Exception as exc:
            raise DatabaseUnusable(f"{location}: cannot connect: {_why(exc)}") from None
        try:
            encoding, schema = await _pin(writer)
            if encoding != "UTF8":
                raise DatabaseUnusable(
                    f"--db {location}: the database's encoding is {encoding}, and tidal needs"
                    " UTF8 (names are Unicode: one not in the database's encoding could never"
                    " be stored); create it with ENCODING 'UTF8'"
                )
            if schema is None:
                raise DatabaseUnusable(
                    f"--db {location}: no schema of the search_path exists to hold tidal's tables"
                )
        except (asyncpg.PostgresError, *_LOST) as exc:
            await _close(writer)
            raise DatabaseUnusable(f"{location}: cannot set up the session: {_why(exc)}") from None
        except BaseException:
            await _close(writer)
            raise
        storage = cls(url, options, writer, schema)
        try:
            if not await storage._lock(writer):
                raise DatabaseInUse(
                    f"--db {location}: another tidal ({await storage._holder(writer)}) already"
                    f" serves this database's schema {schema} (it holds tidal's advisory lock);"
                    " stop it first, or give this one another database, or another schema"
                    " (?search_path=NAME in the URL)"
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
            # boot reads the whole state: no statement timeout (TCP still notices a dead network)
            load = plans.load(POSTGRES, keys_since_ns, max_keys)
            snapshot = await self._run(self._writer, load, timeout=None)
            self._last_id = await self._writer.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
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

    async def _run(
        self, conn: asyncpg.Connection, plan: Plan[T], timeout: float | None = STATEMENT_TIMEOUT
    ) -> T:
        """A plan, statement by statement, each but COMMIT within ``timeout``; a transaction
        it began and did not commit is rolled back, as the database does when the session
        ends. A statement that times out closes its connection: a later one may not wait
        behind it, and the next commit reconnects."""
        in_transaction = False
        result: Any = None
        t = timeout
        try:
            while True:
                op = plan.send(result)
                result = None
                if isinstance(op, Put):
                    if op.rows:
                        columns = zip(*op.rows, strict=True)
                        await conn.execute(_unnest(op.bulk), *columns, timeout=t)
                elif isinstance(op, Try):
                    result = await _try(conn, op, t)
                elif isinstance(op, Rows):
                    rows = await conn.fetch(_numbered(op.sql), *op.args, timeout=t)
                    result = [tuple(row) for row in rows]
                elif isinstance(op, Exec):
                    await conn.execute(_numbered(op.sql), *op.args, timeout=t)
                elif isinstance(op, Many):
                    await conn.executemany(_numbered(op.sql), op.rows, timeout=t)
                elif isinstance(op, Changed):
                    status = await conn.execute(_numbered(op.sql), *op.args, timeout=t)
                    result = int(status.rsplit(" ", 1)[1])
                elif isinstance(op, Fill):
                    rows = await conn.fetch(_numbered(op.sql), *op.args, timeout=t)
                    op.into.update({row[0]: row[1] for row in rows})
                elif isinstance(op, Begin):
                    await conn.execute("BEGIN", timeout=t)
                    in_transaction = True
                else:
                    self._next_id += 1
                    await conn.execute(_numbered(SET_META), "batch_id", self._next_id, timeout=t)
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
        except TimeoutError:
            conn.terminate()  # the session ends, and the transaction with it
            raise
        except BaseException:
            if in_transaction and not conn.is_closed():
                try:
                    await conn.execute("ROLLBACK", timeout=t)
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
        if not await self._relock(conn):
            raise StorageFailure(
                f"another tidal ({await self._holder(conn)}) took the database while this"
                " server's connection was lost; this server stops writing: restart it once"
                " the other is stopped",
                transient=False,
            )
        last = await conn.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
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
            if not await self._relock(conn):
                raise StorageFailure(
                    f"another tidal ({await self._holder(conn)}) took the database while a"
                    " COMMIT's outcome was unknown; restart this one once the other is stopped",
                    transient=False,
                    outcome_unknown=True,
                )
            last = await conn.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
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
        conn = await _connect(self._url, self._options)
        try:
            await _pin(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def _lock(self, conn: asyncpg.Connection) -> bool:
        locked: bool = await conn.fetchval(
            "SELECT pg_try_advisory_lock($1, $2)", *self._lock_key, timeout=STATEMENT_TIMEOUT
        )
        return locked

    async def _relock(self, conn: asyncpg.Connection) -> bool:
        """Retake the lock on a new connection. If the session holding it is this server's
        own previous one (abandoned when its network went silent, and still alive on the
        database's side), end it and take the lock: it can commit nothing more."""
        if await self._lock(conn):
            self._writer_pid = conn.get_server_pid()
            return True
        row = await self._holder_row(conn)
        if row is None or row["pid"] != self._writer_pid:
            return False
        log.warning("ending this server's previous session (backend pid %d)", row["pid"])
        await conn.fetchval(
            "SELECT pg_terminate_backend($1, $2)",
            row["pid"],
            int(STATEMENT_TIMEOUT * 1000),
            timeout=STATEMENT_TIMEOUT + 1,
        )
        if not await self._lock(conn):
            return False
        self._writer_pid = conn.get_server_pid()
        return True

    async def _holder_row(self, conn: asyncpg.Connection) -> asyncpg.Record | None:
        """The lock holder's backend pid and address, if a session holds it."""
        classid, objid = self._lock_key
        row: asyncpg.Record | None = await conn.fetchrow(
            _HOLDER, classid, objid & 0xFFFF_FFFF, timeout=STATEMENT_TIMEOUT
        )
        return row

    async def _holder(self, conn: asyncpg.Connection) -> str:
        row = await self._holder_row(conn)
        if row is None:
            return "a session that has just ended"
        return f"backend pid {row['pid']} from {row['client_addr'] or 'a local socket'}"

    def _failure(self, what: str, exc: Exception, conn: asyncpg.Connection) -> StorageFailure:
        if isinstance(exc, StorageFailure):
            return exc
        if is_data_error(exc):
            return StorageFailure(f"{what} refused: {exc}", transient=True, data=True)
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
            self._size = await conn.fetchval(
                "SELECT pg_database_size(current_database())", timeout=STATEMENT_TIMEOUT
            )
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


#: SQLSTATE classes of what the database refuses for the data it is given, not for its own
#: state: cardinality (21), data exceptions (22: a NUL, a character not in the encoding, a
#: number out of range), integrity constraints (23), program limits (54: an index row too large)
_DATA_CLASSES: Final = frozenset({"21", "22", "23", "54"})


def is_data_error(exc: BaseException) -> bool:
    return isinstance(exc, asyncpg.PostgresError) and (exc.sqlstate or "")[:2] in _DATA_CLASSES


async def _try(conn: asyncpg.Connection, op: Try, timeout: float | None) -> str | None:
    await conn.execute("SAVEPOINT tidal_try", timeout=timeout)
    try:
        await conn.execute(_unnest(op.bulk), *zip(*op.rows, strict=True), timeout=timeout)
    except asyncpg.PostgresError as exc:
        if not is_data_error(exc):
            raise
        await conn.execute("ROLLBACK TO SAVEPOINT tidal_try", timeout=timeout)
        reason: str | None = str(exc)
    else:
        reason = None
    await conn.execute("RELEASE SAVEPOINT tidal_try", timeout=timeout)
    return reason


async def _connect(url: str, options: dict[str, Any]) -> asyncpg.Connection:
    """A connection whose socket notices a dead network in seconds (see ``USER_TIMEOUT``)."""
    conn: asyncpg.Connection = await asyncpg.connect(url, **options)
    # asyncpg sets TCP_NODELAY and nothing else; its transport is private, and pinned (0.32)
    transport: asyncio.Transport = cast(Any, conn)._transport
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(USER_TIMEOUT * 1000))
    return conn


async def _pin(conn: asyncpg.Connection) -> tuple[str, str | None]:
    """Set what tidal relies on in this session that only newer servers have
    (``LATER_SESSION``); the database's encoding and the schema tidal's tables are in."""
    row = await conn.fetchrow(_PIN, json.dumps(LATER_SESSION), timeout=STATEMENT_TIMEOUT)
    assert row is not None  # an aggregate: one row
    return row[1], row[2]


async def _close(conn: asyncpg.Connection) -> None:
    try:
        await conn.close(timeout=2)
    except Exception:  # gone already, or not answering: the socket goes either way
        conn.terminate()
