"""The commit cycle's participants of one node (cluster mode swaps some for those of
``clustered``): the ledger and the gate's keys, user state, the board's checkpoint, the
past (purges and erasures), retention. The feed is one of its own (``feed.Feed``). Each
owns its part of the batch and its statements (``storage.plans``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.server.core import chunks, orders
from tidal.server.core.aggregates import Aggregates
from tidal.server.core.batch import Batch
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.chunks import Shelf, Written
from tidal.server.core.keys import Keys
from tidal.server.core.rewrites import Rewritten
from tidal.server.core.userrows import UserRows
from tidal.server.metrics import Metrics
from tidal.server.storage import plans
from tidal.server.storage.sqlbulk import Dialect, Plan

from .committer import Committer
from .cycle import Participant, mypyc_attr
from .retention import Retention
from .withdrawals import Past


@mypyc_attr(allow_interpreted_subclasses=True)  # cluster mode's ``LoggedLedger``
class Ledger(Participant):
    """Every signal's row, and the idempotency keys it used; what the ledger holds. The
    seqs are the signal path's (``Engine.next_seq``): a refused batch gives its back."""

    def __init__(self, rows: int, rewind: Callable[[int], None]) -> None:
        self.rows = rows  # kept now
        self.signals = self.forwarded = 0  # committed since boot, and of those, forwarded
        self._rewind = rewind

    def writes(self, batch: Batch) -> bool:
        # every request's write is counted here; old keys forgotten are a write of their own
        return batch.writes > 0 or batch.forget_keys_before is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from plans.ledger_rows(batch)

    def committed(self, batch: Batch, found: Any) -> None:
        self.rows += batch.signals
        self.signals += batch.signals
        self.forwarded += batch.forwarded

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        self._rewind(batch.first_seq)


class Users(Participant):
    """Who left and rejoined, the cohorts defined and dropped, and which user each row is
    (the blocks of ``ledger_users``, from the rows memory holds past them: ``userrows``)."""

    def __init__(self, user_rows: UserRows, metrics: Metrics | None) -> None:
        self._user_rows = user_rows
        self._metrics = metrics

    def prepare(self, batch: Batch) -> None:
        self._user_rows.prepare(batch)
        for w in batch.past:  # the rows of its user not yet in a block on disk
            w.recent = self._user_rows.recent(w.user_id, w.before_seq, batch.ledger)

    def writes(self, batch: Batch) -> bool:
        """A block the committed rows filled is written even in a batch of reads alone:
        once committed, memory lets go of its rows (``UserRows.committed``), and a block
        let go of and never written hid its rows from every later purge and erase."""
        return bool(batch.users_blocks)

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from plans.user_state(batch)

    def committed(self, batch: Batch, found: Any) -> None:
        self._user_rows.committed(batch)
        count(self._metrics, batch)


def count(metrics: Metrics | None, batch: Batch) -> None:
    if metrics is not None:
        metrics.leaves += batch.leaves
        metrics.rejoins += batch.rejoins
        for w in batch.past:
            if w.erase:
                metrics.erasures += 1
            else:
                metrics.purges += 1
            metrics.withdrawn += w.signals


class Checkpoint(Participant):
    """The board: what each batch adds to it (and its withdrawals take off) once committed,
    and now and then a checkpoint of what changed on it (``aggregates``, ``chunks``)."""

    def __init__(self, board: Board, shelf: Shelf, aggregates: Aggregates, budget: Budget,
                 keys: Keys, clock: Callable[[], int]) -> None:  # fmt: skip
        self._board, self._shelf, self._aggregates = board, shelf, aggregates
        self._budget, self._keys, self._clock = budget, keys, clock

    def prepare(self, batch: Batch) -> None:
        batch.decay = self._board.decay
        batch.now_ns = self._clock()
        if self._aggregates.due(self._board) or self._shelf.rewrite:
            self._take(batch)
            self._keys.forget_old(batch, self._clock())  # as often as a checkpoint

    def last(self, batch: Batch) -> bool:
        """One last checkpoint, so that the next boot replays nothing."""
        if not (self._board.dirty() or self._shelf.rewrite):
            return False
        self._take(batch)
        return True

    def _take(self, batch: Batch) -> None:
        """The board as it holds all committed before this batch (to first_seq - 1): it
        takes nothing in until the batch has committed."""
        self._aggregates.began()
        batch.decay = self._board.decay
        batch.now_ns = self._clock()
        batch.board_state = self._board
        batch.shelf = self._shelf
        batch.board_changed = self._board.take_dirty()

    def writes(self, batch: Batch) -> bool:
        return batch.board_changed is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[Written | None]:
        return (yield from plans.checkpoint(batch))

    def committed(self, batch: Batch, found: Written | None) -> None:
        """The board takes in what ``batch`` committed: its signals, then what its
        withdrawals took off (the next checkpoint writes what the transaction did not)."""
        board, budget = self._board, self._budget
        if found is not None:
            chunks.done(board, self._shelf, found)
        now = self._clock()
        board.advance(now)
        orders.evict(board, now)  # orders nobody reads stop costing each commit
        board.add(batch.board)
        if batch.past or batch.cohorts:
            held = budget.used()
            for w in batch.past:
                board.add(w.board)
            if batch.cohorts_gone:  # those it replaced: a later batch's changes are not yet
                board.drop_cohorts(set(batch.cohorts_gone))
            budget.freed(held - budget.used())
        else:
            budget.freed(0)
        orders.follow(board)  # the rankings read take the batch in now, not at their read
        settled(budget, self._aggregates, batch)

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        given_back(self._budget, batch, later)
        if batch.board_changed is not None:
            self._board.put_back(batch.board_changed)


def settled(budget: Budget, aggregates: Aggregates, batch: Batch) -> None:
    """A batch's aggregates are on the board now (cluster mode: on their way)."""
    budget.pending -= batch.growth
    batch.growth = 0
    aggregates.signals_committed(batch.signals)


def given_back(budget: Budget, batch: Batch, later: Batch) -> None:
    """Refused: the aggregates they would have created never reach the board."""
    budget.pending -= batch.growth + later.growth
    budget.freed(0)
    batch.growth = later.growth = 0


class Withdrawals(Participant):
    """Purges and erasures (``past``): each joins a batch once its rows were found, and
    takes effect in its transaction; a chunk of earlier ones' rows is rewritten with each
    batch, while there are any (``core.rewrites``)."""

    def __init__(self, past: Past, committer: Committer, ledger: Ledger) -> None:
        self._past, self._committer, self._ledger = past, committer, ledger

    def prepare(self, batch: Batch) -> None:
        if self._committer.outage.last_failed is None:  # after a refused commit, requests first
            batch.rewrite = self._past.chunk(batch)

    def busy(self) -> bool:
        return self._committer.outage.last_failed is None and self._past.rewrites.busy()

    def reads(self, batch: Batch) -> Plan[None]:
        yield from plans.past_reads(batch)

    def writes(self, batch: Batch) -> bool:
        return batch.rewrite is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[Rewritten | None]:
        return (yield from plans.withdrawals(d, batch))

    def committed(self, batch: Batch, found: Rewritten | None) -> None:
        self._ledger.rows -= sum(w.signals for w in batch.past if w.erase)  # gone from now on
        self._past.committed(batch, found)

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        self._past.failed((batch, later), unknown)

    def unknown(self, batch: Batch, message: str) -> None:
        self._past.unknown(batch, message)


class Retiring(Participant):
    """Ledger retention's chunk (``retention``), with the batch it rides in."""

    def __init__(self, retention: Retention, ledger: Ledger) -> None:
        self._retention, self._ledger = retention, ledger

    def writes(self, batch: Batch) -> bool:
        return batch.retire is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[int]:
        return (yield from plans.retired(batch))

    def committed(self, batch: Batch, found: int | None) -> None:
        if batch.retire is not None:
            gone = found or 0
            self._ledger.rows -= gone
            self._retention.done(gone)
