"""The commit cycle's participants, in the one order every step runs them (``cycle``):
for one node, and for cluster mode, which swaps in its own (``clustered``) around the
batch and for the ledger, the users and the board.

    one node:  Ledger, Users, Checkpoint, Withdrawals, Retiring, Feed, Groups,
               EventRetention
    cluster:   LogHead, LoggedLedger, LoggedUsers, LoggedBoard, Withdrawals, Retiring,
               Feed, Groups, EventRetention, LogRecord

The order is what the statements need: the log's head first (its lock orders every
node's commits, and events take their ids from it), the checkpoint before the rows a
purge withdraws from the tables it wrote, the events after the withdrawals whose counts
they carry, the consumer groups after the feed whose ids their sends record (and each
user's opt-outs, for receipts), event retention after them; the board before the feed
pushes what it shows. A new participant is a class and a place here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tidal.server.core.aggregates import Aggregates
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.chunks import Shelf
from tidal.server.core.keys import Keys
from tidal.server.core.userrows import UserRows
from tidal.server.metrics import Metrics

from .clustered import LoggedBoard, LoggedLedger, LoggedUsers, LogHead, LogRecord
from .committer import Committer
from .consumers import Groups
from .cycle import Cycle, Participant
from .event_retention import EventRetention
from .participants import Checkpoint, Ledger, Retiring, Users, Withdrawals
from .publisher import Feed
from .replica import Replica
from .retention import Retention
from .withdrawals import Past


class Parts(Protocol):
    """What the participants are made over: the engine's parts, by their shape."""

    board: Board
    shelf: Shelf
    aggregates: Aggregates
    budget: Budget
    keys: Keys
    user_rows: UserRows
    metrics: Metrics | None
    clock: Callable[[], int]
    committer: Committer
    past: Past
    retention: Retention
    feed: Feed
    groups: Groups
    event_retention: EventRetention
    replica: Replica | None

    def rewind(self, first_seq: int) -> None: ...


def line_up(e: Parts, cycle: Cycle, ledger_rows: int) -> Ledger:
    """Declares ``cycle``'s participants; returns the ledger's, which counts the rows."""
    board, aggregates, budget, keys = e.board, e.aggregates, e.budget, e.keys
    if e.replica is None:
        ledger = Ledger(ledger_rows, e.rewind)
        users: Participant = Users(e.user_rows, e.metrics)
        held: Participant = Checkpoint(board, e.shelf, aggregates, budget, keys, e.clock)
        head: list[Participant] = []
        tail: list[Participant] = []
    else:
        ledger = LoggedLedger(ledger_rows, e.rewind)
        users = LoggedUsers(e.metrics)
        held = LoggedBoard(board, aggregates, budget, keys, e.clock)
        head, tail = [LogHead(e.replica)], [LogRecord()]
    past = Withdrawals(e.past, e.committer, ledger)
    retiring = Retiring(e.retention, ledger)
    parts = [ledger, users, held, past, retiring, e.feed, e.groups, e.event_retention]
    cycle.declare([*head, *parts, *tail])
    return ledger
