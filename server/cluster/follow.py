"""Cluster mode: the commit log read as other nodes write it, and to its end before any read
that spans users (``engine.replica``).

Rounds: each reads every record past the last applied, in id order, and applies them.
Reads that span users wait for a round that began after they came: that round's
statement sees every commit acknowledged before, so their answer shows it. Between
rounds the log is read every ``POLL`` seconds, so that an idle node keeps up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import asyncpg

from tidal.protocol.refusals import Unavailable
from tidal.server.engine.replica import Replica
from tidal.server.logs import Throttle
from tidal.server.storage.postgres import pg_cluster as tables
from tidal.server.storage.postgres.pg_storage import PgStorage
from tidal.server.storage.postgres.session import close_quietly

log = logging.getLogger("tidal.cluster")
_trouble = Throttle(log)

#: seconds between two reads of the log while no read asks for one
POLL: Final = 0.2


class Follower:
    def __init__(self, storage: PgStorage, replica: Replica) -> None:
        self._storage = storage
        self._replica = replica
        self._conn: asyncpg.Connection | None = None
        #: set for a round now: by a read that waits for one, or by the writer, when a batch
        #: of this node's was built on cohorts another node changed (``Replica.wanted``)
        self._wake = replica.wanted
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._replica.following = True
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-follower")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._replica.following = False
        for waiting in self._replica.round_begins():
            if not waiting.done():
                waiting.set_exception(Unavailable("stopping: this node is shutting down"))
        if self._conn is not None:
            await close_quietly(self._conn)
            self._conn = None

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()  # a wake from here on asks for another round
            waiting = self._replica.round_begins()
            try:
                await self._round()
            except Exception as exc:
                _trouble("log", logging.WARNING, "cluster: reading the commit log failed: %s", exc)
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
                for w in waiting:
                    if not w.done():
                        w.set_exception(exc)
            else:
                for w in waiting:
                    if not w.done():
                        w.set_result(None)
            if not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL)

    async def _round(self) -> None:
        if self._conn is None:
            self._conn = await self._storage.connect()
        replica = self._replica
        while True:
            records = await tables.log_after(self._conn, replica.applied)
            for row in records:
                replica.apply(row)
            if len(records) < 10_000:
                return
