"""What the writer (``committer``) knows of its storage's failures: whether writes are
refused (a commit failed for good, or one's outcome is being found out), the last
commit's failure as health reports it, and whether another tidal took the database
over; and the round trips that find out while the writer has nothing to commit. Health,
metrics and the participants read it; only the writer changes it.
"""

from __future__ import annotations

import asyncio
import logging

from tidal.protocol.refusals import Unavailable
from tidal.server.errors import StorageFailure
from tidal.server.logs import Throttle
from tidal.server.storage.interface import Storage

log = logging.getLogger("tidal.engine")
#: a refused commit, a line per cause at most every 10 s (a database away for a minute,
#: with clients retrying, refuses thousands of batches)
refusals = Throttle(log)


class Outage:
    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self.failed_for_good: str | None = None  # a commit failed for good: writes refused
        self.last_failed: str | None = None  # the last commit failed, and later ones may not
        self.last_failed_state = "full"  # ... as health reports it: full, or unavailable
        #: set while a commit's outcome is being found out (its answer was lost): writes refused
        self.unknown: str | None = None
        #: set, with why, once another tidal has taken the database over: the server stops
        self.deposed: asyncio.Future[str] | None = None

    def check_writable(self) -> None:
        """Raises ``Unavailable`` while writes are refused."""
        if self.failed_for_good is not None:
            raise Unavailable(
                f"storage failed ({self.failed_for_good}); writes are refused until the server"
                " is restarted on a healthy disk"
            )
        if self.unknown is not None:
            raise Unavailable(
                f"storage unavailable: {self.unknown}; writes are refused until its outcome is"
                " known; nothing of this request was saved"
            )

    async def idle(self, work: asyncio.Future[None]) -> None:
        """The writer waits for ``work``: every ``Storage.probe_every`` meanwhile, a round
        trip keeps the database session (and its lock) alive, and health true, as a commit
        would (``Storage.probe``)."""
        every = None if self.failed_for_good is not None else self._storage.probe_every
        if every is None:
            await work
        elif not (await asyncio.wait((work,), timeout=every))[0]:
            try:
                await self._storage.probe()
            except StorageFailure as exc:
                self._probed(exc)
            else:
                self._probed(None)

    def _probed(self, exc: StorageFailure | None) -> None:
        if exc is None:
            if self.last_failed is not None and self.last_failed_state == "unavailable":
                self.last_failed = None  # the database answers again
        elif exc.fenced or not exc.transient:
            self.latch(exc)
        elif self.last_failed is None or self.last_failed_state == exc.state:
            self.last_failed, self.last_failed_state = str(exc), exc.state
            refusals(exc.state, logging.ERROR, "%s; writes will be tried", exc)

    def refused(self, exc: StorageFailure) -> None:
        """A commit failed with the database at fault (not a refusal of its writes alone,
        nor partitions moved): said, and remembered as health reports it."""
        if exc.data:  # the database is fine: only these writes are refused
            refusals(
                "data", logging.ERROR, "%s; the writes in it were refused, later writes go on", exc
            )
        elif exc.transient:
            self.last_failed = str(exc)
            self.last_failed_state = exc.state
            refusals(
                exc.state, logging.ERROR,
                "%s; the writes in it were refused, later writes will be tried", exc,
            )  # fmt: skip
        else:
            self.latch(exc)

    def latch(self, exc: StorageFailure) -> None:
        self.failed_for_good = str(exc)
        log.critical("%s; refusing all writes until restarted", exc)
        if exc.fenced and self.deposed is not None and not self.deposed.done():
            self.deposed.set_result(str(exc))
