"""Cluster mode's upkeep of the shared tables, after each tick of the node (``node``):
how far this node applied the commit log, a checkpoint of its board now and then (and
the log no node needs any more pruned), and the blocks of ``ledger_users`` merged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import asyncpg

from tidal.server.config import Config
from tidal.server.core import snapshot
from tidal.server.core.owners import Owners
from tidal.server.engine.engine import Engine
from tidal.server.storage.postgres import blocks
from tidal.server.storage.postgres import pg_cluster as tables

log = logging.getLogger("tidal.cluster")

#: log records past the newest checkpoint after which a node writes one of its own, and
#: the log below it is pruned: what a boot replays, and what the log holds, at most
CHECKPOINT_RECORDS: Final = 500
#: blocks of ``ledger_users`` a tick looks at to merge (``blocks.merge``): more than
#: the commits of a tick, so that merging keeps up
MERGE_HEADS: Final = 512


class Upkeep:
    def __init__(
        self, owners: Owners, engine: Engine, config: Config, clock: Callable[[], int]
    ) -> None:
        self.owners = owners
        self._engine = engine
        self._config = config
        self._clock = clock
        self._checkpointed = 0.0  # when this node last wrote one (time.monotonic)
        self._merged_after = 0  # where the next merge of blocks goes on (``merge_blocks``)

    async def keep_log(self, conn: asyncpg.Connection) -> None:
        """How far this node has applied the log, for the others to know; and once the
        newest checkpoint is ``CHECKPOINT_RECORDS`` behind it, one of its own board, and
        the log no node needs any more pruned."""
        engine = self._engine
        assert engine.replica is not None
        replica = engine.replica
        await tables.publish(conn, self.owners.node, replica.applied)
        newest = await tables.newest_checkpoint(conn)
        replica.checkpoint_at = newest + CHECKPOINT_RECORDS  # a tick then, not in 0.5 s
        if replica.applied < replica.checkpoint_at:
            return
        if time.monotonic() - self._checkpointed < self._config.checkpoint_seconds:
            # the board is packed whole, on the loop: at most this often per node
            replica.checkpoint_at = replica.applied + CHECKPOINT_RECORDS
            return
        self._checkpointed = time.monotonic()
        began = time.perf_counter()
        applied, now = replica.applied, self._clock()
        engine.board.advance(now)
        board = snapshot.pack(engine.board, engine.shelf, now)  # as of ``applied``, at once
        packed = time.perf_counter() - began
        replica.checkpoint_at = applied + CHECKPOINT_RECORDS
        pruned = await tables.checkpoint(conn, self.owners.node, applied, now, board)
        log.info(
            "checkpoint of the board to log record %d: %d bytes (packed in %.3fs, written in"
            " %.3fs); %d log records pruned",
            applied, len(board), packed, time.perf_counter() - began - packed, pruned,
        )  # fmt: skip

    async def merge_blocks(self, conn: asyncpg.Connection) -> None:
        """The node serving partition 0 merges the blocks of ``ledger_users`` that commits
        wrote, ``MERGE_HEADS`` a tick, going round: one node, so that merges never wait on
        each other, and a few milliseconds at most of the log head's lock, which every
        node's commits wait on meanwhile."""
        if 0 not in self.owners.owned:
            return
        self._merged_after, merged = await blocks.merge(conn, self._merged_after, MERGE_HEADS)
        if merged:
            log.debug("cluster: %d blocks of ledger_users merged", merged)
