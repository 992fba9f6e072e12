"""Event retention: events older than ``--event-retention`` leave the events table, a chunk
a commit. No reader holds it back: a replay whose next events go is ended with the gap
(``Feed._too_old``), and a consumer group that had not read them is told what it lost
(``consumers``): the cap is the operator's, never a slow reader's.

A chunk rides in a group commit like any other write; while a full chunk comes back, the
next batch takes another, and once caught up a pass comes every tenth of the retention.
The last event id is kept apart from the rows (``storage.events``): deleting them all
never gives an id twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.storage import events
from tidal.server.storage.sqlbulk import Dialect, Plan

from .committer import Committer
from .cycle import Participant
from .publisher import Feed

#: between passes once caught up: a tenth of the retention, within these bounds
PASS_MIN_SECONDS: Final = 1.0
PASS_MAX_SECONDS: Final = 60.0


class EventRetention(Participant):
    def __init__(
        self, seconds: float, feed: Feed, committer: Committer, clock: Callable[[], int]
    ) -> None:
        self.seconds = seconds  # 0 keeps every event
        self._feed = feed
        self._committer = committer
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self.retired = 0  # events deleted since boot
        #: set once a pass finds less than a full chunk to delete
        self.caught_up = asyncio.Event()

    def start(self) -> None:
        if self.seconds > 0:
            self._timer = asyncio.get_running_loop().call_later(0.0, self._due)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def prepare(self, batch: Batch) -> None:
        if batch.retire_events is not None:  # what committed: no reader holds it back
            batch.retire_events = (batch.retire_events[0], self._feed.last_id)

    def writes(self, batch: Batch) -> bool:
        return batch.retire_events is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[int]:
        return (yield from events.retire(batch))

    def committed(self, batch: Batch, found: int | None) -> None:
        if batch.retire_events is not None and found is not None:
            self.retired += found
            if found >= feed.RETIRE_EVENTS:
                self.caught_up.clear()
                self._due()  # more to do: the next batch takes the next chunk
            else:
                self.caught_up.set()

    def _due(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        delay = min(PASS_MAX_SECONDS, max(PASS_MIN_SECONDS, self.seconds / 10))
        self._timer = asyncio.get_running_loop().call_later(delay, self._due)
        if self._committer.outage.failed_for_good is not None:
            return
        batch = self._committer.open
        if batch.retire_events is None:
            batch.retire_events = (self._clock() - int(self.seconds * 1e9), 0)
            self._committer.wake()
