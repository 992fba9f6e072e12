"""The writer's session: the one that holds tidal's advisory lock, and every transaction.

It is opened again when lost, with backoff; each time the lock is retaken and the
database checked to be as this server left it (the batch id), and a COMMIT whose
answer was lost is settled the same way. A standby's writer session waits for the
lock before any of this (``wait``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import asyncpg

from tidal.server.errors import StorageFailure

from .execute import BatchIds, CommitUnreplicated, Fenced, barrier
from .lock import AdvisoryLock
from .session import (
    LOST,
    STATEMENT_TIMEOUT,
    close_quietly,
    connect,
    hold_lock,
    is_data_error,
    pin,
    why,
)

log = logging.getLogger("tidal.storage")

#: a COMMIT whose answer was lost: how long to keep trying to find out what became of it
OUTCOME_WAIT: Final = 60.0
#: ``answers``: how long a new session may take to connect and answer ``SELECT 1``
PROBE_TIMEOUT: Final = 2.0
BACKOFF_FIRST: Final = 0.05
BACKOFF_MAX: Final = 2.0
BATCH_ID: Final = "SELECT value FROM meta WHERE key = $1"


class WriterSession:
    def __init__(
        self,
        url: str,
        options: dict[str, Any],
        conn: asyncpg.Connection,
        schema: str,
        idle_timeout: float,
        location: str,
        node: str | None = None,
    ) -> None:
        self.url = url
        self.options = options
        self.location = location
        #: ``--db-idle-timeout``: the database ends this session after so long silent
        self.idle_timeout = idle_timeout
        self.lock = AdvisoryLock(schema, node)
        self.conn: asyncpg.Connection | None = conn
        self.ids = BatchIds() if node is None else BatchIds(key=f"batch_id:{node}")
        self._retry_at = 0.0
        self._backoff = BACKOFF_FIRST
        self.down: str = ""

    async def wait(self, holder: str) -> asyncpg.Connection:
        """A standby's wait: blocked in ``pg_advisory_lock`` until the holder's session ends,
        which the database sees at once when a tidal is killed, and within its keepalives
        or ``--db-idle-timeout`` when one is cut off or paused. A lost connection (the
        database restarted, failed over) is opened again, with backoff, and waits again."""
        writer = self.conn
        assert writer is not None
        delay = BACKOFF_FIRST
        while True:
            log.warning(
                "standby: waiting for %s, served by another tidal (%s)", self.location, holder
            )
            try:
                await self.lock.take(writer, wait=True)
                log.warning("standby: took %s over", self.location)
                return writer
            except LOST as exc:
                log.warning("standby: lost the database (%s); connecting again", why(exc))
            writer.terminate()
            while True:
                await asyncio.sleep(delay)  # backoff: a pace, not a synchronisation
                delay = min(BACKOFF_MAX, delay * 2)
                try:
                    writer = self.conn = await self.connect()
                except (asyncpg.PostgresError, *LOST) as exc:
                    log.debug("standby: cannot connect yet: %s", why(exc))
                    continue
                delay = BACKOFF_FIRST
                break
            try:
                if await self.lock.take(writer):
                    return writer
                holder = await self.lock.holder(writer)
            except LOST as exc:  # lost again: the wait on it fails too, and reconnects
                log.debug("standby: lost the database again: %s", why(exc))

    async def connection(self) -> asyncpg.Connection:
        """The writer's connection, reconnected if it was lost (retaking the lock, and
        checking the database is as it left it). While the database cannot be reached,
        tries are spaced out (doubling, up to ``BACKOFF_MAX``)."""
        conn = self.conn
        if conn is not None and not conn.is_closed():
            return conn
        if time.monotonic() < self._retry_at:
            raise StorageFailure(self.down, transient=True, state="unavailable")
        try:
            conn = await self.connect()
        except Exception as exc:
            self.down = f"database unreachable ({why(exc)})"
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(BACKOFF_MAX, self._backoff * 2)
            raise StorageFailure(self.down, transient=True, state="unavailable") from exc
        self._backoff = BACKOFF_FIRST
        try:
            await self.fence(conn)
        except BaseException:
            await close_quietly(conn)
            raise
        self.conn = conn
        log.warning("reconnected to %s", self.location)
        return conn

    async def fence(self, conn: asyncpg.Connection) -> None:
        """Retake the lock; then the database must hold this server's last batch id, or
        another server has written since (memory would no longer be what is on disk)."""
        await self._retake(conn, "this server's connection was lost", unknown=False)
        last = await conn.fetchval(BATCH_ID, self.ids.key, timeout=STATEMENT_TIMEOUT)
        if last != self.ids.last_id:
            raise StorageFailure(
                "the database changed while this server's connection was lost (another"
                " server wrote to it, or it was restored); this server stops writing",
                transient=False,
                fenced=True,
            )
        await hold_lock(conn, self.idle_timeout)

    async def _retake(self, conn: asyncpg.Connection, when: str, *, unknown: bool) -> None:
        """The lock again, on a new session; another tidal holding it fences this one."""
        if not await self.lock.retake(conn):
            raise StorageFailure(
                f"another tidal ({await self.lock.holder(conn)}) took the database while {when};"
                " this server stops writing",
                transient=False,
                outcome_unknown=unknown,
                fenced=True,
            )

    async def find_out(self, batch_id: int) -> None:
        """Whether the COMMIT whose answer was lost (or whose wait for a standby was cancelled)
        happened, and is on the synchronous standbys: returns if so, raises ``StorageFailure``
        if it did not happen, or if that cannot be found out in time."""
        deadline = time.monotonic() + OUTCOME_WAIT
        delay = BACKOFF_FIRST
        while True:
            try:
                conn = await self.connect()
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
            await self._retake(conn, "a COMMIT's outcome was unknown", unknown=True)
            last = await conn.fetchval(BATCH_ID, self.ids.key, timeout=STATEMENT_TIMEOUT)
            await hold_lock(conn, self.idle_timeout)
        except BaseException:
            await close_quietly(conn)
            raise
        self.conn = conn
        if last == batch_id:
            # visible here is not yet on a synchronous standby: its wait may still be going
            # on, or have been cancelled; a later synchronous commit settles it
            try:
                await barrier(conn, self.ids.key, batch_id, self.answers)
            except (Fenced, CommitUnreplicated, *LOST) as exc:
                await close_quietly(conn)
                self.conn = None
                raise StorageFailure(
                    f"the COMMIT held on {self.location}, and whether a synchronous standby has"
                    f" it could not be found out ({why(exc)}); restart tidal to load what is on"
                    " disk",
                    transient=False,
                    outcome_unknown=True,
                ) from exc
            log.warning("the COMMIT held: reconnected to %s", self.location)
            self.ids.last_id = batch_id
            return
        if last == self.ids.last_id:
            log.warning("the COMMIT did not hold: reconnected to %s", self.location)
            raise StorageFailure(
                "the connection to the database was lost before COMMIT held", transient=True,
                state="unavailable",
            )  # fmt: skip
        await close_quietly(conn)
        self.conn = None
        raise StorageFailure(
            "the database changed while a COMMIT's outcome was unknown (another server wrote"
            " to it, or it was restored); this server stops writing",
            transient=False,
            outcome_unknown=True,
            fenced=True,
        )

    async def answers(self) -> bool:
        """Whether the database answers anything on a new session within ``PROBE_TIMEOUT``
        (a refusal counts): asked when a statement or COMMIT has gone unanswered for a while
        (``execute.answered``), to tell a path gone silent from a database that is slow."""
        try:
            conn = await asyncio.wait_for(connect(self.url, self.options), PROBE_TIMEOUT)
        except TimeoutError:
            return False
        except Exception:  # refused, too many clients...: it answered
            return True
        try:
            await conn.fetchval("SELECT 1", timeout=PROBE_TIMEOUT)
        except TimeoutError:
            return False
        except Exception:
            return True
        finally:
            conn.terminate()
        return True

    async def connect(self) -> asyncpg.Connection:
        conn = await connect(self.url, self.options)
        try:
            await pin(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    def failure(self, what: str, exc: Exception, conn: asyncpg.Connection) -> StorageFailure:
        if isinstance(exc, StorageFailure):
            return exc
        if is_data_error(exc):
            return StorageFailure(f"{what} refused: {exc}", transient=True, data=True)
        if isinstance(exc, LOST) or conn.is_closed():
            if isinstance(exc, asyncpg.exceptions.DiskFullError):
                return StorageFailure(f"{what} failed: {exc}", transient=True)
            self.down = f"database unreachable ({why(exc)})"
            message = f"{what} failed: {why(exc)}"
            return StorageFailure(message, transient=True, state="unavailable")
        return StorageFailure(f"{what} failed: {exc}", transient=False)

    async def close(self) -> None:
        if self.conn is not None:
            await close_quietly(self.conn)  # the session ends: the lock goes with it
        self.conn = None
