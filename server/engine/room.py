"""Room for replies being built: a read that waits for its batch (a page of left users,
a user's history, a ranking read after a write) holds part of the memory budget from
the moment it is taken on until its reply is written out.

Such reads are answered together, when their batch commits: twelve connections that
each pipelined 64 pages of 5,000 left users had every page's rows and answer in memory
at once (RSS from 39 MB to 326 MB, past an 8 MiB budget). So each read holds what its
reply may take while built (``Later.bound()`` wire bytes, times ``BUILD_FACTOR``) in
the budget (``Budget.replies``), and one that does not fit waits, its connection
applying nothing after it, until others are written out. One read may always go
when none is held, so that reads go on, one at a time, under a full budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from tidal.server.core.budget import Budget
from tidal.server.core.replies import BUILD_FACTOR, Later, Replier


class ReplyRoom:
    def __init__(self, budget: Budget) -> None:
        self._budget = budget
        #: reads that did not fit, first come first: (bytes, their connection, the retry)
        self._waiting: deque[tuple[int, Replier, Callable[[], None]]] = deque()
        self._waking = False
        self._admitting = False  # a waiting read is being retried: it goes

    @staticmethod
    def cost(wire_bytes: int) -> int:
        return wire_bytes * BUILD_FACTOR

    def fits(self, conn: Replier, wire_bytes: int, retry: Callable[[], None]) -> bool:
        """Whether a read whose reply takes up to ``wire_bytes`` may be taken on now; if
        not, ``retry`` runs once it may, and ``conn`` applies nothing more until then."""
        cost = self.cost(wire_bytes)
        if self._admitting or (not self._waiting and self._room(cost)):
            return True
        conn.hold(True)
        self._waiting.append((cost, conn, retry))
        return False

    def take(self, conn: Replier, later: Later) -> None:
        """A read joins its batch: its connection and the budget hold room for its reply."""
        bound = later.bound()
        conn.reading(bound)
        self._budget.replies += self.cost(bound)

    def give(self, conn: Replier, later: Later) -> None:
        """Its reply is written (or refused): the room is free again."""
        bound = later.bound()
        conn.reading(-bound)
        self._budget.replies -= self.cost(bound)
        if self._waiting and not self._waking:
            self._waking = True  # after the batch's replies are all out, not within them
            asyncio.get_running_loop().call_soon(self._wake)

    def _room(self, cost: int) -> bool:
        return self._budget.replies == 0 or cost <= self._budget.room()

    def _wake(self) -> None:
        self._waking = False
        while self._waiting and self._room(self._waiting[0][0]):
            _, conn, retry = self._waiting.popleft()
            conn.hold(False)
            self._admitting = True
            try:
                retry()  # takes its room (``take``) before the next is judged
            finally:
                self._admitting = False
