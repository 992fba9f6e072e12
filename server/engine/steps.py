"""What the engine does around each commit: the committer's ``Steps``.

Before a batch commits, what is due joins it (the feed's ids, a checkpoint of the
board, old keys to forget, the blocks of ``ledger_users``, a chunk of a purge's rows,
cluster mode's record in the log); once it is durable, memory takes in what it
changed; if it was refused, what it would have given back is. The engine's signal
path owns the seqs (``Engine.next_seq``, ``rewind``); everything else these read and
change is the engine's state, by its shape (``Stepped``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tidal.server.core import chunks, orders, userrows
from tidal.server.core.batch import Batch
from tidal.server.core.chunks import Shelf
from tidal.server.core.userrows import UserRows
from tidal.server.metrics import Metrics

from .replica import Replica
from .state import EngineState


class Stepped(EngineState, Protocol):
    """The engine as its commit steps see it."""

    shelf: Shelf
    user_rows: UserRows
    replica: Replica | None
    metrics: Metrics | None
    clock: Callable[[], int]

    def rewind(self, first_seq: int) -> None: ...


class CommitSteps:
    def __init__(self, engine: Stepped) -> None:
        self._e = engine

    def next_seq(self) -> int:
        return self._e.next_seq()

    def prepare(self, batch: Batch) -> None:
        e = self._e
        batch.decay = e.board.decay
        batch.now_ns = e.clock()
        if e.replica is not None:
            # cluster mode: the board, the cohorts and the feed through the commit log; no
            # checkpoint or user blocks on disk yet (docs/SCALING.md); old keys go as often
            # as a checkpoint would take them
            e.feed.prepare(batch)
            if e.aggregates.due(e.board):
                e.aggregates.began()
                e.keys.forget_old(batch, e.clock())
            e.replica.prepare(batch)
            batch.users_blocks = userrows.runs(batch.ledger)  # the survey's rows: all on disk
            if e.committer.last_failed is None:
                batch.rewrite = e.past.chunk(batch)
            return
        e.feed.prepare(batch)
        if e.aggregates.due(e.board) or e.shelf.rewrite:
            self._checkpoint(batch)
            e.keys.forget_old(batch, e.clock())
        e.user_rows.prepare(batch)
        for w in batch.past:
            w.recent = e.user_rows.recent(w.user_id, w.before_seq, batch.ledger)
        if e.committer.last_failed is None:  # after a refused commit, a request tries first
            batch.rewrite = e.past.chunk(batch)

    def busy(self) -> bool:
        return self._e.committer.last_failed is None and self._e.past.rewrites.busy()

    def last(self, batch: Batch) -> bool:
        """One last checkpoint, so that the next boot replays nothing."""
        e = self._e
        if e.owners is not None or not (e.board.dirty() or e.shelf.rewrite):
            return False
        self._checkpoint(batch)
        return True

    def _checkpoint(self, batch: Batch) -> None:
        """The board as it holds all committed before this batch (to first_seq - 1): it
        takes nothing in until the batch has committed."""
        e = self._e
        e.aggregates.began()
        batch.decay = e.board.decay
        batch.now_ns = e.clock()
        batch.board_state = e.board
        batch.shelf = e.shelf
        batch.board_changed = e.board.take_dirty()

    def committed(self, batch: Batch) -> None:
        e = self._e
        if e.replica is None:
            self._board_committed(batch)
            e.user_rows.committed(batch)
        else:  # cluster mode: no user blocks yet (``prepare``), so no tail to keep
            e.replica.committed(batch)
        e.budget.pending -= batch.growth  # on the board now, or (cluster) on its way
        batch.growth = 0
        e.aggregates.signals_committed(batch.signals)
        e.ledger_rows += batch.signals - batch.retired
        e.ledger_rows -= sum(w.signals for w in batch.past if w.erase)  # gone from now on
        e.past.committed(batch)
        if batch.retire is not None:
            e.retention.done(batch.retired)
        e.signals += batch.signals
        e.forwarded += batch.forwarded
        if e.metrics is not None:
            e.metrics.leaves += batch.leaves
            e.metrics.rejoins += batch.rejoins
        e.feed.committed(batch)  # before the replies: pushed before the ack

    def _board_committed(self, batch: Batch) -> None:
        """The board takes in what ``batch`` committed: its signals, then what its
        withdrawals took off (the next checkpoint writes what the transaction did not)."""
        e = self._e
        board = e.board
        if batch.board_written is not None:
            chunks.done(board, e.shelf, batch.board_written)
        now = e.clock()
        board.advance(now)
        orders.evict(board, now)  # orders nobody reads stop costing each commit
        board.add(batch.board)
        if not (batch.past or batch.cohorts):
            e.budget.freed(0)
            return
        held = e.budget.used()
        for w in batch.past:
            board.add(w.board)
        if batch.cohorts_gone:  # those it replaced: a later batch's changes are not yet
            board.drop_cohorts(set(batch.cohorts_gone))
        e.budget.freed(held - e.budget.used())

    def failed(self, batch: Batch, later: Batch, unknown: bool = False) -> None:
        e = self._e
        e.budget.pending -= batch.growth + later.growth  # never to reach the board
        e.budget.freed(0)
        batch.growth = later.growth = 0
        if batch.board_changed is not None:
            e.board.put_back(batch.board_changed)
        e.rewind(batch.first_seq)
        e.feed.failed(batch, later)
        e.past.failed((batch, later), unknown)

    def rematch(self, batch: Batch) -> bool:
        """Cluster mode: ``batch`` was refused for cohorts changed under it: it is matched
        again as it is committed anew (``replica.rematch``). False: not cluster mode."""
        e = self._e
        if e.replica is None or batch.log is None:
            return False
        e.replica.rematch(batch)
        return True

    def unknown(self, batch: Batch, message: str) -> None:
        self._e.past.unknown(batch, message)
