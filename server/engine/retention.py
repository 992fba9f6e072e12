"""Ledger retention: rows older than the retention leave the ledger, a chunk at a time.

The aggregates keep counting them (a retired row is only ever one below the
aggregates' watermark, already in the table), but nothing can withdraw them any
more: a purge or an erase reaches the rows that are still kept.

A chunk rides in a group commit like any other write, so it is bounded to hold
the writer briefly; while a full chunk comes back, the next batch takes another.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .committer import Committer

log = logging.getLogger("tidal.engine")

#: rows deleted per chunk: about 11 ms of the writer's time here (old rows lie together)
RETIRE_ROWS: Final = 10_000
#: ... in cluster mode, where the chunk holds the log head's lock, which every node's
#: commits wait on: fewer, more often
CLUSTER_RETIRE_ROWS: Final = 2_000
#: between passes once caught up: a tenth of the retention, within these bounds
PASS_MIN_SECONDS: Final = 1.0
PASS_MAX_SECONDS: Final = 60.0


class Retention:
    def __init__(
        self,
        seconds: float,
        clock: Callable[[], int],
        committer: Committer,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        """``leads``: cluster mode, whether this node is the one that retires rows now (it
        serves partition 0): one node retires every node's rows, by seq range
        (``storage.retention.retire_ranges``)."""
        self.seconds = seconds
        self._clock = clock
        self._committer = committer
        self._leads = leads
        self.rows = RETIRE_ROWS if leads is None else CLUSTER_RETIRE_ROWS
        self._timer: asyncio.TimerHandle | None = None
        self.retired = 0  # rows deleted since boot
        #: set once a pass finds less than a full chunk to delete
        self.caught_up = asyncio.Event()

    def start(self) -> None:
        if self.seconds > 0:
            self._schedule(0.0)  # at boot: a restart after a long stop finds the most

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, delay: float) -> None:
        self.stop()
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._committer.outage.failed_for_good is not None:
            return
        if self._leads is not None and not self._leads():  # another node retires now
            self._schedule(PASS_MIN_SECONDS)  # ... or none does yet: this one may soon
            return
        batch = self._committer.open
        if batch.retire is None:
            before_ns = self._clock() - int(self.seconds * 1e9)
            batch.retire = (before_ns, self.rows)
            batch.retire_ranges = self._leads is not None
            self._committer.wake()
        self._schedule(min(PASS_MAX_SECONDS, max(PASS_MIN_SECONDS, self.seconds / 10)))

    def done(self, retired: int) -> None:
        """A chunk committed, deleting ``retired`` rows. (One that failed is tried again at
        the next pass.)"""
        self.retired += retired
        if retired >= self.rows:
            self.caught_up.clear()
            self._due()  # more to do: the next batch takes the next chunk
        else:
            log.debug("ledger retention: %d rows deleted since boot", self.retired)
            self.caught_up.set()
