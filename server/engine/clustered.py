"""Cluster mode's participants of the commit cycle, swapped in at start for those of one
node (``participants``): the commit log's head first and its record last, around every
batch that changes what every node keeps (``core.log``); the board taken in from the log
(``replica``), with no checkpoint of it in the batch; every row's block written with the
batch, in the log's statement where there is one (docs/SCALING.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tidal.server.core import log as commit_log
from tidal.server.core import userrows
from tidal.server.core.aggregates import Aggregates
from tidal.server.core.batch import Batch
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.keys import Keys
from tidal.server.metrics import Metrics
from tidal.server.storage import log_sql, plans
from tidal.server.storage.sqlbulk import Dialect, Plan

from .cycle import Participant
from .participants import Ledger, count, given_back, settled
from .replica import Replica


class LogHead(Participant):
    """First in the transaction: the fence, and the log's head for a batch with a record
    (``log_sql.log_head``). Its record, with the earlier ones it read, goes on the board
    before anything else takes the batch in."""

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    def prepare(self, batch: Batch) -> None:
        self._replica.prepare(batch)

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from log_sql.log_head(batch)

    def committed(self, batch: Batch, found: Any) -> None:
        self._replica.committed(batch)

    def rematch(self, batch: Batch) -> bool:
        if batch.log is None:
            return False
        self._replica.rematch(batch)
        return True


class LogRecord(Participant):
    """Last in the transaction: the batch's record, once its withdrawals have found what
    they take off, or a batch of signals only's rows and record with the head."""

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from log_sql.log_record(batch)


class LoggedLedger(Ledger):
    """A batch of signals only writes its rows in the log's statement (``LogRecord``)."""

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        logged = batch.log is not None and commit_log.signals_only(batch)
        yield from plans.ledger_rows(batch, rows=not logged)


class LoggedUsers(Participant):
    """Every row's block is written with its batch: in the log's statement, or on its own
    for a batch with no record."""

    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics

    def prepare(self, batch: Batch) -> None:
        batch.users_blocks = userrows.runs(batch.ledger)  # the survey's rows: all on disk

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from plans.user_state(batch, blocks=batch.log is None)

    def committed(self, batch: Batch, found: Any) -> None:
        count(self._metrics, batch)


class LoggedBoard(Participant):
    """The board comes from the log (``LogHead``): no checkpoint in the batch; old keys go
    as often as a checkpoint would take them."""

    def __init__(self, board: Board, aggregates: Aggregates, budget: Budget, keys: Keys,
                 clock: Callable[[], int]) -> None:  # fmt: skip
        self._board, self._aggregates, self._budget = board, aggregates, budget
        self._keys, self._clock = keys, clock

    def prepare(self, batch: Batch) -> None:
        batch.decay = self._board.decay
        batch.now_ns = self._clock()
        if self._aggregates.due(self._board):
            self._aggregates.began()
            self._keys.forget_old(batch, self._clock())

    def committed(self, batch: Batch, found: Any) -> None:
        settled(self._budget, self._aggregates, batch)

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        given_back(self._budget, batch, later)
