"""PostgreSQL storage through asyncpg: the same plans as SQLite's, on a database server.

One writer connection holds a session-level advisory lock for the server's life:
one tidal per database. Every batch is one transaction on it, committed with
``synchronous_commit`` on, so an acknowledged write is on the database server's
disk. Reads are answered from memory, or read by the writer with its batch.

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
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import asyncpg

from tidal.server.config import Durability, redact
from tidal.server.core.batch import Batch
from tidal.server.errors import CommitUnknown, DatabaseInUse, DatabaseUnusable, StorageFailure
from tidal.server.storage import boot, plans
from tidal.server.storage.interface import Snapshot
from tidal.server.storage.sqlbulk import POSTGRES, Dialect, Plan

from .execute import BatchIds, CommitLost, CommitUnreplicated, Fenced, run
from .lock import AdvisoryLock
from .schema import migrate
from .session import (
    CONNECT_TIMEOUT,
    LOST,
    PROBE_SHARE,
    SESSION,
    STATEMENT_TIMEOUT,
    close_quietly,
    connect,
    hold_lock,
    is_data_error,
    open_session,
    pin,
    read_password,
    why,
)

log = logging.getLogger("tidal.storage")
T = TypeVar("T")


#: ``--db-idle-timeout``: how long the writer's session may go silent before the database
#: ends it, and its lock with it (``session.hold_lock``)
IDLE_TIMEOUT: Final = 20.0
SIZE_EVERY: Final = 10.0  # seconds between measures of the database's size
#: a COMMIT whose answer was lost: how long to keep trying to find out what became of it
OUTCOME_WAIT: Final = 60.0
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0
_BATCH_ID: Final = "SELECT value FROM meta WHERE key = 'batch_id'"


class PgStorage:
    backend = "postgresql"

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        writer: asyncpg.Connection,
        schema: str,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self._url = url
        self._options = options
        self._idle_timeout = idle_timeout
        #: seconds without a commit after which the writer probes its session (``probe``)
        self.probe_every: float | None = idle_timeout * PROBE_SHARE
        self.location = redact(url)
        self._lock = AdvisoryLock(schema, writer.get_server_pid())
        self.commits = 0
        self._writer: asyncpg.Connection | None = writer
        self._reader: asyncpg.Connection | None = None  # for reads beside the writer
        self._ids = BatchIds()
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self._down: str = ""
        self._size = 0
        self._sized_at = 0.0

    @classmethod
    async def open(
        cls,
        url: str,
        durability: Durability = "full",
        password_file: str | None = None,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        standby: Callable[[str], None] | None = None,
    ) -> PgStorage:
        """The database, its lock taken and its tables made current. Another tidal holding
        the lock is an operator's mistake (``DatabaseInUse``), unless this one is a
        ``standby``: it is told who holds the lock, and it waits until that session ends."""
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
            options["password"] = read_password(password_file)
        writer, schema = await open_session(url, options, location)
        storage = cls(url, options, writer, schema, idle_timeout)
        try:
            if not await storage._lock.take(writer):
                holder = await storage._lock.holder(writer)
                if standby is None:
                    raise DatabaseInUse(
                        f"--db {location}: another tidal ({holder}) already serves this"
                        f" database's schema {schema} (it holds tidal's advisory lock); stop it"
                        " first, or give this one another database, or another schema"
                        " (?search_path=NAME in the URL), or start this one with --standby"
                    )
                standby(holder)
                writer = storage._writer = await storage._wait(writer, holder)
            await hold_lock(writer, idle_timeout)
            await migrate(writer, location)
        except (asyncpg.PostgresError, *LOST) as exc:  # a standby, no rights to create...
            await close_quietly(storage._writer or writer)
            raise DatabaseUnusable(f"{location}: cannot set up tidal's tables: {exc}") from None
        except BaseException:
            await close_quietly(storage._writer or writer)
            raise
        return storage

    async def _wait(self, writer: asyncpg.Connection, holder: str) -> asyncpg.Connection:
        """A standby's wait: blocked in ``pg_advisory_lock`` until the holder's session ends,
        which the database sees at once when a tidal is killed, and within its keepalives
        or ``--db-idle-timeout`` when one is cut off or paused. A lost connection (the
        database restarted, failed over) is opened again, with backoff, and waits again."""
        delay = BACKOFF_FIRST
        while True:
            log.warning(
                "standby: waiting for %s, served by another tidal (%s)", self.location, holder
            )
            try:
                await writer.fetchval("SELECT pg_advisory_lock($1, $2)", *self._lock.key)
                self._lock.writer_pid = writer.get_server_pid()
                log.warning("standby: took %s over", self.location)
                return writer
            except LOST as exc:
                log.warning("standby: lost the database (%s); connecting again", why(exc))
            writer.terminate()
            while True:
                await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation
                delay = min(BACKOFF_MAX, delay * 2)
                try:
                    writer = self._writer = await self._connect()
                except (asyncpg.PostgresError, *LOST) as exc:
                    log.debug("standby: cannot connect yet: %s", why(exc))
                    continue
                delay = BACKOFF_FIRST
                break
            if await self._lock.take(writer):
                self._lock.writer_pid = writer.get_server_pid()
                return writer
            holder = await self._lock.holder(writer)

    async def load(
        self, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
    ) -> Snapshot:
        assert self._writer is not None
        try:
            # boot reads the whole state: no statement timeout (TCP still notices a dead network)
            # the last batch id first: boot's own transactions are fenced by it too
            self._ids.last_id = await self._writer.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
            load = boot.load(POSTGRES, keys_since_ns, max_keys, half_lives, now_ns)
            snapshot = await run(self._writer, self._ids, load, timeout=None)
        except (asyncpg.PostgresError, *LOST) as exc:  # at boot: one line, no traceback
            raise DatabaseUnusable(f"{self.location}: cannot load: {why(exc)}") from None
        await self._measure(self._writer)
        return snapshot

    async def commit(self, batch: Batch) -> None:
        conn = await self._connection()
        try:
            wrote = await run(conn, self._ids, plans.apply(POSTGRES, batch))
        except CommitLost as exc:
            batch_id = self._ids.next_id
            raise CommitUnknown(
                f"the connection to the database was lost during COMMIT ({exc})",
                lambda: self._find_out(batch_id),
            ) from exc
        except Fenced as exc:
            raise StorageFailure(
                f"{exc}; this server stops writing", transient=False, fenced=True
            ) from exc
        except CommitUnreplicated as exc:
            self.commits += 1
            raise StorageFailure(
                f"the COMMIT's wait for the synchronous standby was cancelled by someone else"
                f" ({exc}): it holds on the primary but may not survive a failover; restart"
                " tidal to load what is on disk",
                transient=False,
                outcome_unknown=True,
            ) from exc
        except Exception as exc:
            raise self._failure("commit", exc, conn) from exc
        if wrote:
            self.commits += 1
        if time.monotonic() - self._sized_at > SIZE_EVERY:
            await self._measure(conn)

    async def read(self, plan: Callable[[Dialect], Plan[T]]) -> T:
        """On a second connection: one repeatable-read transaction, a snapshot."""
        conn = self._reader
        try:
            if conn is None or conn.is_closed():
                conn = self._reader = await self._connect()
            await conn.execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", timeout=STATEMENT_TIMEOUT
            )
            try:
                return await run(conn, BatchIds(), plan(POSTGRES))
            finally:
                if not conn.is_closed():
                    await conn.execute("ROLLBACK", timeout=STATEMENT_TIMEOUT)
        except StorageFailure:
            raise
        except Exception as exc:
            if conn is not None:
                conn.terminate()
            self._reader = None
            raise StorageFailure(
                f"read failed: {why(exc)}", transient=True, state="unavailable"
            ) from exc

    async def probe(self) -> None:
        """A round trip on the writer's session while no commit makes one: the database ends
        a silent one (``--db-idle-timeout``), and this server finds out early that its
        database went away, or that another tidal took it over."""
        conn = await self._connection()
        try:
            await conn.fetchval("SELECT 1", timeout=STATEMENT_TIMEOUT)
        except Exception as exc:
            raise self._failure("probe", exc, conn) from exc

    def size(self) -> int:
        return self._size

    async def close(self) -> None:
        if self._reader is not None:
            await close_quietly(self._reader)
            self._reader = None
        if self._writer is not None:
            await close_quietly(self._writer)  # the session ends: the lock goes with it
        self._writer = None

    # -- the connections, and getting them back -------------------------------

    async def _connection(self) -> asyncpg.Connection:
        """The writer's connection, reconnected if it was lost (retaking the lock, and
        checking the database is as it left it). While the database cannot be reached,
        tries are spaced out (doubling, up to ``BACKOFF_MAX``)."""
        conn = self._writer
        if conn is not None and not conn.is_closed():
            return conn
        if time.monotonic() < self._retry_at:
            raise StorageFailure(self._down, transient=True, state="unavailable")
        try:
            conn = await self._connect()
        except Exception as exc:
            self._down = f"database unreachable ({why(exc)})"
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(BACKOFF_MAX, self._backoff * 2)
            raise StorageFailure(self._down, transient=True, state="unavailable") from exc
        self._backoff = BACKOFF_FIRST
        try:
            await self._fence(conn)
        except BaseException:
            await close_quietly(conn)
            raise
        self._writer = conn
        log.warning("reconnected to %s", self.location)
        return conn

    async def _fence(self, conn: asyncpg.Connection) -> None:
        """Retake the lock; then the database must hold this server's last batch id, or
        another server has written since (memory would no longer be what is on disk)."""
        if not await self._lock.retake(conn):
            raise StorageFailure(
                f"another tidal ({await self._lock.holder(conn)}) took the database while this"
                " server's connection was lost; this server stops writing",
                transient=False,
                fenced=True,
            )
        last = await conn.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
        if last != self._ids.last_id:
            raise StorageFailure(
                "the database changed while this server's connection was lost (another"
                " server wrote to it, or it was restored); this server stops writing",
                transient=False,
                fenced=True,
            )
        await hold_lock(conn, self._idle_timeout)

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
                        f" ({why(exc)}); restart tidal to load what is on disk",
                        transient=False,
                        outcome_unknown=True,
                    ) from exc
                await asyncio.sleep(delay)  # a schedule, not a synchronisation
                delay = min(BACKOFF_MAX, delay * 2)
        try:
            if not await self._lock.retake(conn):
                raise StorageFailure(
                    f"another tidal ({await self._lock.holder(conn)}) took the database while a"
                    " COMMIT's outcome was unknown; this server stops writing",
                    transient=False,
                    outcome_unknown=True,
                    fenced=True,
                )
            last = await conn.fetchval(_BATCH_ID, timeout=STATEMENT_TIMEOUT)
            await hold_lock(conn, self._idle_timeout)
        except BaseException:
            await close_quietly(conn)
            raise
        self._writer = conn
        if last == batch_id:
            log.warning("the COMMIT held: reconnected to %s", self.location)
            self._ids.last_id = batch_id
            self.commits += 1
            return
        if last == self._ids.last_id:
            log.warning("the COMMIT did not hold: reconnected to %s", self.location)
            raise StorageFailure(
                "the connection to the database was lost before COMMIT held", transient=True,
                state="unavailable",
            )  # fmt: skip
        await close_quietly(conn)
        self._writer = None
        raise StorageFailure(
            "the database changed while a COMMIT's outcome was unknown (another server wrote"
            " to it, or it was restored); this server stops writing",
            transient=False,
            outcome_unknown=True,
            fenced=True,
        )

    async def _connect(self) -> asyncpg.Connection:
        conn = await connect(self._url, self._options)
        try:
            await pin(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    def _failure(self, what: str, exc: Exception, conn: asyncpg.Connection) -> StorageFailure:
        if isinstance(exc, StorageFailure):
            return exc
        if is_data_error(exc):
            return StorageFailure(f"{what} refused: {exc}", transient=True, data=True)
        if isinstance(exc, LOST) or conn.is_closed():
            if isinstance(exc, asyncpg.exceptions.DiskFullError):
                return StorageFailure(f"{what} failed: {exc}", transient=True)
            self._down = f"database unreachable ({why(exc)})"
            message = f"{what} failed: {why(exc)}"
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
