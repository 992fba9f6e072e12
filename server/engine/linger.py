"""A batch of the consumer groups' writes alone (acks, nacks, the counts of events sent)
waits a moment for another write to share its commit.

A commit that records an event pushes it to its consumers as it ends; their acks come
back at about the time the client whose write made the event sends its next one. Were
the acks committed at once, that next write would wait behind a commit of acks alone:
one sequential client's writes would each take two commits. Waiting up to ``SECONDS``
for a write to join, the acks ride in its commit (PostgreSQL's ``commit_delay``, for
one kind of write). An ack's reply still waits for its commit: it only comes later, by
``SECONDS`` at most, and only when nothing else is written meanwhile.

So does a commit of nothing but a chunk of rows to rewrite (``core.rewrites``). Made as
soon as the writer found the open batch empty, it held the writer while requests arrived
a moment later, and it escaped the chunks' pace: under a 16x16 load, paced chunks
rewrote 100,000 of 200,000 rows during the load without this wait, 57,000 with it.
Waiting, the chunk rides the next write's commit, if its pace allows.
"""

from __future__ import annotations

import asyncio
from typing import Final

from tidal.server.core.batch import Batch

#: how long a batch of the groups' writes, or of rewrites, alone waits for company
SECONDS: Final = 0.002


class Linger:
    def __init__(self, seconds: float = SECONDS) -> None:
        self.seconds = seconds
        self._waiting: asyncio.Future[None] | None = None
        self._waited: Batch | None = None  # the batch it last waited for: once each
        #: a batch of rewrites alone waited and nothing joined it: the writer is idle but
        #: for them, and they go on at its speed, without waiting, until a write comes
        self._quiet = False

    def wanted(self, batch: Batch) -> bool:
        """Whether ``batch`` holds the groups' writes alone, or nothing (the writer has
        rows to rewrite, and writes came of late), and has not waited yet."""
        if self.seconds <= 0 or batch is self._waited:
            return False
        if not batch.pending():
            return not self._quiet
        return batch.groups is not None and not batch.writes and not batch.reads

    async def wait(self, batch: Batch) -> None:
        """Until another write joins ``batch`` (``joined``), or ``seconds`` pass."""
        self._waited = batch
        loop = asyncio.get_running_loop()
        self._waiting = waiting = loop.create_future()
        timer = loop.call_later(self.seconds, self._over)
        try:
            await waiting
        finally:
            timer.cancel()
            self._waiting = None
        self._quiet = not batch.pending()

    def joined(self, batch: Batch | None = None) -> None:
        """A write joined ``batch`` (None: a read's reply waits on the writer); a write of
        the groups alone (which counts no write) is no company."""
        if batch is not None and not batch.writes:
            return
        self._quiet = False
        self._over()

    def _over(self) -> None:
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)
