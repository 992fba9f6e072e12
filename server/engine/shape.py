"""The engine's state as its handlers see it: a shape, so that ``reads`` and
``changes`` need not import the ``Engine`` that holds them (and be imported by it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tidal.server.core.aggregates import Aggregates
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.cohorts import Registry
from tidal.server.core.keys import Keys
from tidal.server.core.members import Members
from tidal.server.core.owners import Owners, Router
from tidal.server.storage.interface import Storage

from .committer import Committer
from .publisher import Feed
from .retention import Retention
from .withdrawals import Past


class EngineState(Protocol):
    storage: Storage
    committer: Committer
    retention: Retention
    feed: Feed
    past: Past
    members: Members
    #: cluster mode: the partitions this node serves (None: one node serves every user)
    owners: Owners | None
    router: Router  # ``owners`` in cluster mode
    cohorts: Registry
    keys: Keys
    aggregates: Aggregates
    board: Board  # what is committed, for ranked and windowed reads
    budget: Budget  # how much memory the board may take
    #: what a reply may take, after its envelope
    reply_budget: int

    @property
    def signals(self) -> int:
        """Signals committed since boot."""

    @property
    def forwarded(self) -> int:
        """... and of those, forwarded."""

    @property
    def ledger_rows(self) -> int:
        """Rows the ledger keeps now."""

    connections: Callable[[], int]

    def next_seq(self) -> int:
        """The seq the next signal will take: a purge read now reaches the rows below it."""
        ...
