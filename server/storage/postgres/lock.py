"""One tidal per schema: a session-level advisory lock, held by the writer's session
for the server's life, and retaken on each reconnect (see ``runner``)."""

from __future__ import annotations

import logging
import zlib
from typing import Final

import asyncpg

from .session import STATEMENT_TIMEOUT

log = logging.getLogger("tidal.storage")

#: pg_advisory_lock's key for "one tidal per schema": the bytes of "tida", then the CRC-32
#: of the schema tidal's tables are in (advisory locks are per database; tidal's tables are
#: per schema, so two tidals in two schemas of one database are two databases to tidal)
LOCK_CLASS: Final = 0x7469_6461
#: ... and for "one process per cluster node", of the schema and the node's name: "tidn"
NODE_CLASS: Final = 0x7469_646E
_HOLDER: Final = """
    SELECT a.pid, a.client_addr, a.application_name, a.backend_start FROM pg_locks l
    JOIN pg_stat_activity a USING (pid)
    WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1 AND l.objid = $2
      AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


#: taking the lock, and which session took it: a backend's pid and start time name it
#: (a pid alone may be another session's on another server, after a failover)
_TAKE: Final = """
    SELECT {}($1, $2), backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"""


class AdvisoryLock:
    def __init__(self, schema: str, node: str | None = None) -> None:
        """Cluster mode (``node``): each node's writer holds a lock of its own, which also
        tells the other nodes it is alive (``cluster``)."""
        name = schema if node is None else f"{schema}\0{node}"
        crc = zlib.crc32(name.encode("utf-8"))
        self.key = (
            LOCK_CLASS if node is None else NODE_CLASS,
            crc - (1 << 32) if crc >= 1 << 31 else crc,
        )
        #: the backend of this server's last writer session, (pid, start): on a network that
        #: went silent, the database may not know yet that it is gone, and it still holds
        #: the lock
        self.writer: tuple[int, object] | None = None

    async def take(self, conn: asyncpg.Connection, *, wait: bool = False) -> bool:
        """``pg_try_advisory_lock``, or with ``wait``, ``pg_advisory_lock``: blocked until
        the session holding it ends (a standby's wait, with no timeout)."""
        sql = _TAKE.format("pg_advisory_lock" if wait else "pg_try_advisory_lock")
        row = await conn.fetchrow(sql, *self.key, timeout=None if wait else STATEMENT_TIMEOUT)
        assert row is not None  # this session's own row
        if wait or row[0]:
            self.writer = (conn.get_server_pid(), row[1])
            return True
        return False

    async def retake(self, conn: asyncpg.Connection) -> bool:
        """Retake the lock on a new connection. If the session holding it is this server's
        own previous one (abandoned when its network went silent, and still alive on the
        database's side), end it and take the lock: it can commit nothing more."""
        if await self.take(conn):
            return True
        row = await self.holder_row(conn)
        if row is None or (row["pid"], row["backend_start"]) != self.writer:
            return False
        log.warning("ending this server's previous session (backend pid %d)", row["pid"])
        await conn.fetchval(
            "SELECT pg_terminate_backend($1, $2)",
            row["pid"],
            int(STATEMENT_TIMEOUT * 1000),
            timeout=STATEMENT_TIMEOUT + 1,
        )
        return await self.take(conn)

    async def holder_row(self, conn: asyncpg.Connection) -> asyncpg.Record | None:
        """The lock holder's backend pid and address, if a session holds it."""
        classid, objid = self.key
        row: asyncpg.Record | None = await conn.fetchrow(
            _HOLDER, classid, objid & 0xFFFF_FFFF, timeout=STATEMENT_TIMEOUT
        )
        return row

    async def holder(self, conn: asyncpg.Connection) -> str:
        row = await self.holder_row(conn)
        if row is None:
            return "a session that has just ended"
        return f"backend pid {row['pid']} from {row['client_addr'] or 'a local socket'}"
