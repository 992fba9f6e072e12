"""PostgreSQL storage through asyncpg: the same plans as SQLite's, on a database server.

One writer connection holds a session-level advisory lock for the server's life:
one tidal per database. Every batch is one transaction on it, committed with
``synchronous_commit`` on, so an acknowledged write is on the database server's
disk. Reads are answered from memory, or read by the writer with its batch.

The database may go away (restarted, failed over, unreachable). Writes and the
reads that need it are then refused (error 2) and the writer reconnects, with
backoff, when asked to commit again (``writer.WriterSession``). Reconnecting
retakes the lock and checks that the database is as this server left it: each
transaction moves a batch id (``meta.batch_id``) from this server's last to its
next, and checks it in the transaction itself. The same id settles a COMMIT whose
answer was lost: committed if the database holds its id, not committed if it
holds the one before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import asyncpg

from tidal.server.config import Durability, redact
from tidal.server.errors import (
    CohortsChanged,
    CommitUnknown,
    DatabaseInUse,
    DatabaseUnusable,
    PartitionsLost,
    StorageFailure,
)
from tidal.server.storage import boot
from tidal.server.storage.interface import Snapshot
from tidal.server.storage.sqlbulk import POSTGRES, Dialect, Plan

from .execute import BatchIds, CommitLost, CommitUnreplicated, Fenced, answered, run
from .lock import AdvisoryLock
from .pg_cluster import cluster_of
from .pg_schema import migrate
from .session import (
    CONNECT_TIMEOUT,
    LOST,
    PROBE_SHARE,
    SESSION,
    STATEMENT_TIMEOUT,
    close_quietly,
    hold_lock,
    open_session,
    read_password,
    why,
)
from .writer import BATCH_ID, WriterSession

log = logging.getLogger("tidal.storage")
T = TypeVar("T")


#: ``--db-idle-timeout``: how long the writer's session may go silent before the database
#: ends it, and its lock with it (``session.hold_lock``)
IDLE_TIMEOUT: Final = 20.0
SIZE_EVERY: Final = 10.0  # seconds between measures of the database's size


class PgStorage:
    backend = "postgresql"

    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        writer: asyncpg.Connection,
        schema: str,
        idle_timeout: float = IDLE_TIMEOUT,
        node: str | None = None,
    ) -> None:
        #: seconds without a commit after which the writer probes its session (``probe``)
        self.probe_every: float | None = idle_timeout * PROBE_SHARE
        self.location = redact(url)
        self.schema = schema
        self._session = WriterSession(
            url, options, writer, schema, idle_timeout, self.location, node
        )
        self.commits = 0
        self._reader: asyncpg.Connection | None = None  # for reads beside the writer
        self._reading = asyncio.Lock()  # one at a time on it, as SQLite's thread runs them
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
        node: str | None = None,
    ) -> PgStorage:
        """The database, its lock taken and its tables made current. Another tidal holding
        the lock is an operator's mistake (``DatabaseInUse``), unless this one is a
        ``standby``: it is told who holds the lock, and it waits until that session ends.
        A cluster ``node`` takes its own node's lock instead (``cluster``)."""
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
        storage = cls(url, options, writer, schema, idle_timeout, node)
        session = storage._session
        try:
            if not await session.lock.take(writer):
                holder = await session.lock.holder(writer)
                if node is not None:
                    raise DatabaseInUse(
                        f"--db {location}: another tidal ({holder}) already serves as the node"
                        f" {node} of this database's cluster; stop it first, or advertise"
                        " this one at another address"
                    )
                if standby is None:
                    raise DatabaseInUse(
                        f"--db {location}: another tidal ({holder}) already serves this"
                        f" database's schema {schema} (it holds tidal's advisory lock); stop it"
                        " first, or give this one another database, or another schema"
                        " (?search_path=NAME in the URL), or start this one with --standby"
                    )
                standby(holder)
                writer = await session.wait(holder)
            await hold_lock(writer, idle_timeout)
            await migrate(writer, location, shared=node is not None)
            cluster = await cluster_of(writer)
            if cluster is not None and node is None:
                raise DatabaseUnusable(
                    f"--db {location} is the database of the cluster {cluster!r}: start each"
                    f" node with --cluster {cluster} --advertise HOST:PORT"
                )
        except (asyncpg.PostgresError, *LOST) as exc:  # a standby, no rights to create...
            await close_quietly(session.conn or writer)
            raise DatabaseUnusable(f"{location}: cannot set up tidal's tables: {exc}") from None
        except BaseException:
            await close_quietly(session.conn or writer)
            raise
        return storage

    async def load(
        self, keys_since_ns: int, max_keys: int, half_lives: Sequence[int], now_ns: int
    ) -> Snapshot:
        conn, ids = self._session.conn, self._session.ids
        assert conn is not None
        try:
            # the last batch id first: boot's own transactions are fenced by it too
            ids.last_id = await conn.fetchval(BATCH_ID, ids.key, timeout=STATEMENT_TIMEOUT)
            # boot reads the whole state: no statement timeout (TCP still notices a dead network)
            load = boot.load(POSTGRES, keys_since_ns, max_keys, half_lives, now_ns)
            snapshot = await run(conn, ids, load, timeout=None, alive=self._session.answers)
        except (asyncpg.PostgresError, *LOST) as exc:  # at boot: one line, no traceback
            raise DatabaseUnusable(f"{self.location}: cannot load: {why(exc)}") from None
        await self._measure(conn)
        return snapshot

    async def load_node(self, half_lives: Sequence[int], now_ns: int, first_seq: int) -> Snapshot:
        """Cluster mode's boot read (``boot.load_node``)."""
        conn, ids = self._session.conn, self._session.ids
        assert conn is not None
        try:
            ids.last_id = await conn.fetchval(BATCH_ID, ids.key, timeout=STATEMENT_TIMEOUT)
            snapshot = await run(conn, ids, boot.load_node(half_lives, now_ns, first_seq))
        except (asyncpg.PostgresError, *LOST) as exc:
            raise DatabaseUnusable(f"{self.location}: cannot load: {why(exc)}") from None
        return snapshot

    async def connect(self) -> asyncpg.Connection:
        """A session beside the writer's (cluster mode's own)."""
        return await self._session.connect()

    @property
    def node_lock(self) -> AdvisoryLock:
        return self._session.lock

    async def commit(self, transaction: Callable[[Dialect], Plan[bool]]) -> None:
        conn = await self._session.connection()
        try:
            session = self._session
            plan = transaction(POSTGRES)
            wrote = await run(conn, session.ids, plan, alive=session.answers)
        except CommitLost as exc:
            batch_id = self._session.ids.next_id
            raise CommitUnknown(
                f"the connection to the database was lost during COMMIT ({exc})",
                lambda: self._settle(batch_id),
                silent=exc.silent,
            ) from exc
        except Fenced as exc:
            raise StorageFailure(
                f"{exc}; this server stops writing", transient=False, fenced=True
            ) from exc
        except PartitionsLost as exc:
            raise StorageFailure(str(exc), transient=True, moved=exc.parts) from exc
        except CohortsChanged as exc:
            raise StorageFailure(
                "another node changed the cohorts while this batch was open",
                transient=True,
                stale=True,
                refusal="retry: another node changed the cohorts after this request's signals"
                " were matched against them; nothing of it was saved; send it again",
            ) from exc
        except CommitUnreplicated as exc:
            conn.terminate()  # settled on a new session, as a lost answer is
            batch_id = self._session.ids.next_id
            raise CommitUnknown(
                f"the COMMIT's wait for the synchronous standby was cancelled ({exc}): it holds"
                " on the primary, and may not on a standby",
                lambda: self._settle(batch_id),
            ) from exc
        except Exception as exc:
            raise self._session.failure("commit", exc, conn) from exc
        if wrote:
            self.commits += 1
        if time.monotonic() - self._sized_at > SIZE_EVERY:
            await self._measure(conn)

    async def read(self, plan: Callable[[Dialect], Plan[T]]) -> T:
        """On a second connection: one repeatable-read transaction, a snapshot. Reads from
        several tasks (a survey, a ``count_left``) take their turns."""
        async with self._reading:
            return await self._read(plan)

    async def _read(self, plan: Callable[[Dialect], Plan[T]]) -> T:
        conn = self._reader
        try:
            if conn is None or conn.is_closed():
                conn = self._reader = await self._session.connect()
            begin = conn.execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", timeout=STATEMENT_TIMEOUT
            )
            await answered(conn, begin, self._session.answers)
            try:
                return await run(conn, BatchIds(), plan(POSTGRES), alive=self._session.answers)
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
        conn = await self._session.connection()
        try:
            ping = conn.fetchval("SELECT 1", timeout=STATEMENT_TIMEOUT)
            await answered(conn, ping, self._session.answers)
        except Exception as exc:
            raise self._session.failure("probe", exc, conn) from exc

    def size(self) -> int:
        return self._size

    async def close(self) -> None:
        if self._reader is not None:
            await close_quietly(self._reader)
            self._reader = None
        await self._session.close()

    async def _settle(self, batch_id: int) -> None:
        """A COMMIT whose answer was lost: counted if it held (``WriterSession.find_out``)."""
        await self._session.find_out(batch_id)
        self.commits += 1

    async def _measure(self, conn: asyncpg.Connection) -> None:
        self._sized_at = time.monotonic()
        try:
            self._size = await conn.fetchval(
                "SELECT pg_database_size(current_database())", timeout=STATEMENT_TIMEOUT
            )
        except Exception as exc:  # a figure for stats: never a reason to fail a commit
            log.debug("could not measure the database: %s", exc)
