"""Cluster mode: this node's share of the partitions, taken, served and handed over.

Every ``TICK`` the node reads which nodes are alive (their writers hold their advisory
locks) and who owns each partition, then:

- forgets the partitions the table says another node has taken (its transactions for
  them are refused by their epochs anyway, ``log_sql.FENCE``);
- takes partitions no live node serves, up to its fair share (``core.shares``): bumps
  their epochs, loads their users' leave state and idempotency keys, takes a new block
  of seqs, and only then serves them (meanwhile their requests get ``starting``);
- past its share, while a live node is short of its own, hands partitions over: stops
  taking requests for them (``moved``), waits until every write already read has
  committed, then releases them for the other node to take.

A node killed, or cut off past the keepalives, loses its lock when its session ends,
and its partitions are served again within a tick and a load. A paused one keeps it
until ``--db-idle-timeout`` ends its silent session.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import asyncpg

from tidal.server.config import Config
from tidal.server.core import shares
from tidal.server.core.owners import LEAD, Owners
from tidal.server.core.snapshot import rows as snapshot_rows
from tidal.server.engine.engine import Engine
from tidal.server.logs import Throttle
from tidal.server.storage import groups_sql
from tidal.server.storage.interface import Snapshot, Storage
from tidal.server.storage.postgres import pg_cluster as tables
from tidal.server.storage.postgres.lock import AdvisoryLock
from tidal.server.storage.postgres.pg_storage import PgStorage
from tidal.server.storage.postgres.session import close_quietly

from .follow import Follower
from .upkeep import Upkeep

log = logging.getLogger("tidal.cluster")
_trouble = Throttle(log)

#: seconds between two reads of the partition table, at most
TICK: Final = 0.5
#: ... and past a read, how long what it confirmed holds: under the time another node
#: needs to take a partition over (this node's writer session ended: silent past
#: --db-idle-timeout, its probe coming every quarter of it, or cut off, about 4 s with the
#: keepalives)
LEASE_SHARE: Final = 0.5
LEASE_MAX: Final = 2.0


class Node:
    def __init__(
        self, storage: PgStorage, config: Config, owners: Owners, conn: asyncpg.Connection
    ) -> None:
        self._storage = storage
        self._config = config
        self.owners = owners
        self._conn: asyncpg.Connection | None = conn
        self._engine: Engine | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # a tick now: stopping, or a checkpoint due
        self._upkeep: Upkeep | None = None
        self._lease = min(config.db_idle_timeout * LEASE_SHARE, LEASE_MAX)
        self._tick_every = min(TICK, self._lease / 3)
        self.first_seq = 0  # where this run's seqs start: a block of its own
        self._shared: tables.Shared | None = None  # read at boot, replayed at start
        self._follower: Follower | None = None
        self._clock: Callable[[], int] = time.time_ns

    @classmethod
    async def join(cls, storage: Storage, config: Config) -> Node:
        """Name this node in the cluster's tables (made by its first node)."""
        assert config.cluster is not None and config.advertise is not None  # validity.check
        assert isinstance(storage, PgStorage)  # ... and PostgreSQL
        conn = await storage.connect()
        try:
            partitions = await tables.join(
                conn,
                storage.location,
                config.cluster,
                config.advertise,
                config.partitions,
                AdvisoryLock(storage.schema),
                storage.node_lock,
            )
            node = cls(storage, config, Owners(config.cluster, config.advertise, partitions), conn)
            node.first_seq = await tables.block(conn)
        except BaseException:
            await close_quietly(conn)
            raise
        log.info(
            "node %s of cluster %s (%d partitions)", config.advertise, config.cluster, partitions
        )
        return node

    async def load(self, half_lives: Sequence[int], now_ns: int) -> Snapshot:
        """What the engine starts from: no partition's state yet, seqs from this run's block,
        the cohorts and the commit log as of one snapshot."""
        snapshot = await self._storage.load_node(half_lives, now_ns, self.first_seq)
        assert self._conn is not None
        self._shared = await tables.shared(self._conn)
        shared = self._shared
        board = snapshot.board
        if shared.board is not None:  # the newest checkpoint: the log is replayed past it
            board = snapshot_rows(shared.board, board.decay)
        return dataclasses.replace(
            snapshot,
            cohorts=shared.cohorts,
            next_cohort_id=shared.next_cohort_id,
            last_event_id=shared.events,
            board=board,
        )

    def start(self, engine: Engine, clock: Callable[[], int]) -> None:
        """Before the engine serves: the board from the log; then the tick and the follower."""
        assert engine.replica is not None and self._shared is not None
        shared, self._shared = self._shared, None
        began = time.perf_counter()
        count = engine.replica.replay(shared.records, shared.head, shared.version)
        log.info("replayed %d commit log records in %.3fs", count, time.perf_counter() - began)
        self._engine = engine
        self._clock = clock
        self._upkeep = Upkeep(self.owners, engine, self._config, clock)
        self._wake = engine.replica.due  # set by the replica too: a checkpoint may be due
        self._follower = Follower(self._storage, engine.replica)
        self._follower.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-cluster")

    async def stop(self) -> None:
        """Serve nothing more; the partitions go when the writer's session (its lock) ends."""
        self._stopping.set()
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._follower is not None:
            await self._follower.stop()
        if self._conn is not None:
            await close_quietly(self._conn)
            self._conn = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                await self._tick()
            except Exception as exc:
                _trouble("tick", logging.WARNING, "cluster: reading the partitions failed: %s", exc)
                if self._conn is not None:
                    self._conn.terminate()
                    self._conn = None
            else:  # after the tick, apart: a failed checkpoint never costs the lease
                try:
                    assert self._upkeep is not None and self._conn is not None
                    await self._upkeep.keep_log(self._conn)
                    await self._upkeep.merge_blocks(self._conn)
                except Exception as exc:
                    _trouble("log", logging.WARNING, "cluster: checkpointing the board failed: %s",
                             exc)  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._tick_every)

    async def _tick(self) -> None:
        if self._conn is None:
            self._conn = await self._storage.connect()
        conn, owners, me = self._conn, self.owners, self.owners.node
        asked = time.monotonic()
        live, rows = await tables.read_map(conn)
        if me in live:
            owners.valid_until = asked + self._lease
        owners.map = [(node if node in live else None, epoch) for node, epoch in rows]
        for part, epoch in list(owners.owned.items()):
            if rows[part] != (me, epoch):
                del owners.owned[part]
                log.warning("partition %d was taken by %s: no longer served here", part,
                            rows[part][0] or "no node")  # fmt: skip
                if self._engine is not None:
                    self._engine.lead(None)
        if me not in live or self._stopping.is_set():
            return  # this node's writer is between sessions: it takes nothing meanwhile
        holders = [node for node, _ in rows]
        take, release = shares.plan(sorted(live), me, holders, set(owners.owned) | owners.loading)
        if release:
            await self._release(conn, {p: rows[p][1] for p in release})
        if take:
            await self._take(conn, take)

    async def _take(self, conn: asyncpg.Connection, parts: list[int]) -> None:
        owners, engine, config = self.owners, self._engine, self._config
        assert engine is not None
        began = time.perf_counter()
        taken = await tables.take(conn, owners.node, parts)
        if not taken:
            return
        owners.loading.update(taken)
        try:
            window_ns = int(config.idempotency_window * 1e9)
            state = await tables.load(
                conn,
                set(taken),
                owners.partitions,
                self._clock() - window_ns,
                config.idempotency_max_keys,
            )
            first_seq = await tables.block(conn)
            # partition 0's node serves the consumer groups: as committed, now that the
            # node before commits nothing more for them (``engine.group_lead``)
            groups = await self._storage.read(groups_sql.loaded) if LEAD in taken else None
        finally:
            owners.loading.difference_update(taken)

        def ours(user_id: int) -> bool:
            return owners.part(user_id) in taken

        engine.adopt(ours, state.left, state.rejoined, state.keys, first_seq, state.rules)
        owners.owned.update(taken)
        if groups is not None:
            engine.lead(groups)
        log.info(
            "took %d partitions in %.3fs (%d leave records): serving %d",
            len(taken), time.perf_counter() - began, len(state.left), len(owners.owned),
        )  # fmt: skip

    async def _release(self, conn: asyncpg.Connection, parts: dict[int, int]) -> None:
        """Hand over: no request for them from now on, every write read for them committed,
        then the table says nobody serves them, for the node short of its share to take."""
        owners, engine = self.owners, self._engine
        assert engine is not None
        held = {p: owners.owned.pop(p) for p in parts if p in owners.owned}
        owners.leaving.update(held)
        engine.lead(None)  # partition 0 going: so do its consumer groups
        try:
            await engine.committer.settled()
            await tables.release(conn, owners.node, {**parts, **held})
        finally:
            owners.leaving.difference_update(held)
        log.info("handed over %d partitions: serving %d", len(parts), len(owners.owned))
