"""Group commit: writes fill the open batch; the writer commits it whole, then lets its replies go.

While one batch commits, the next one fills, so writes from every connection
share commits. A reply that reveals a write waits for the batch holding it. A
failed commit puts memory back (each change carries its own undo) and refuses
every reply that depended on it. The committer knows the batch, storage and the
commit cycle (``cycle``), not the state the engine keeps: the cycle's participants
prepare a batch, write their parts of it, and take in what committed or failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from tidal.protocol import ErrorCode
from tidal.server.core.batch import Batch
from tidal.server.core.owners import Router
from tidal.server.core.replies import NOTHING_SAVED, UNKNOWN_SAVED, Later, Replier
from tidal.server.errors import CommitUnknown, StorageFailure
from tidal.server.metrics import Metrics
from tidal.server.storage.interface import Storage

from .commit_times import CommitTimes
from .cycle import Cycle, Transaction
from .delivery import deliver, refusal, refuse
from .linger import Linger
from .outage import Outage, refusals
from .room import ReplyRoom

log = logging.getLogger("tidal.engine")
#: An open batch this large stops every connection until the writer takes it: what waits
#: for a commit (rows, tallies, replies) stays bounded, and so does the commit's length.
OPEN_SIGNALS: Final = 50_000
OPEN_FANOUT: Final = 500_000  # aggregates added to (each signal: its communities and cohorts)
#: seconds a graceful stop goes on rewriting withdrawn rows (``core.rewrites``); boot
#: resumes what is left
REWRITE_AT_STOP: Final = 5.0
#: cluster mode: how many times a batch is matched again against cohorts changed under it
#: before its requests are refused: once is enough, as it is matched under the lock that
#: orders the cohorts' changes (``replica.rematch``)
REMATCH_TRIES: Final = 2
#: a commit whose answer was lost on a path gone silent: its requests wait this long for its
#: outcome to be found out, then are told it is unknown (error 2), rather than wait for as
#: long as the path stays silent; memory still takes in the outcome once known. An answer
#: lost otherwise (the database restarted) is waited for: finding out takes seconds
UNKNOWN_PATIENCE: Final = 3.0


class Committer:
    def __init__(
        self,
        storage: Storage,
        next_seq: Callable[[], int],
        cycle: Cycle,
        *,
        metrics: Metrics | None = None,
        hold: Callable[[bool], None] = lambda on: None,
        room: ReplyRoom,
        router: Router,
    ) -> None:
        self._storage = storage
        self._router = router  # cluster mode: told of partitions a commit found taken
        self.room = room
        self._cycle = cycle
        self._next_seq = next_seq  # the seq the next signal takes: where a batch starts
        self.times = CommitTimes(metrics)
        #: back-pressure: stops (True) or lets go on (False) every connection
        self._hold = hold
        self.open = Batch(next_seq())
        self.inflight: Batch | None = None
        self._began = 0.0  # when the writer took ``inflight`` (time.monotonic)
        #: what it knows of the storage's failures, as writes, health and metrics see them
        self.outage = Outage(storage)
        self._idle: asyncio.Future[None] | None = None  # set while the writer waits for work
        self.linger = Linger()  # the groups' writes, or rewrites, alone wait for company
        self._closing = False
        self._rewrite_until = 0.0
        self._last_tried = False
        self._task: asyncio.Task[None] | None = None
        #: set when a batch was refused because another node changed what it was built on:
        #: cluster mode's follower, which waits on it, reads the commit log at once
        self.behind = asyncio.Event()
        self._settling: list[tuple[Batch, asyncio.Future[None]]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.outage.deposed = loop.create_future()
        self._task = loop.create_task(self._run(), name="tidal-writer")

    async def close(self) -> None:
        """Commit and answer everything already read, then stop the writer."""
        self._closing = True
        self._rewrite_until = time.monotonic() + REWRITE_AT_STOP
        self.wake()
        if self._task is not None:
            await self._task

    # -- what requests put in the open batch -------------------------------

    def writable(self) -> Batch:
        """The open batch, for a write; refused for good after a commit failed for good."""
        outage = self.outage
        if outage.failed_for_good is not None or outage.unknown is not None:
            outage.check_writable()  # raises: what the checks inline look for, said once
        return self.open

    def ack(self, conn: Replier, msgid: int | None, result: Any) -> None:
        """A write's reply: sent once the batch it joined has committed. A notification's
        write stays in flight until then too, so that notifications feel back-pressure."""
        batch = self.open
        batch.replies.append((conn, msgid, result))
        batch.writers.add(conn)
        self.linger.joined(batch)
        if self._idle is not None:
            self.wake()
        if batch.signals >= OPEN_SIGNALS or batch.fanout >= OPEN_FANOUT:
            self._hold(True)  # let go of when the writer takes this batch

    def answer(self, conn: Replier, msgid: int | None, result: Any) -> None:
        """A read's reply: now, unless it could show a write that is not yet on disk."""
        if msgid is None:
            conn.reply(None, None)
            return
        inflight = self.inflight
        if self.open.writes or (inflight is not None and inflight.writes):
            self.open.replies.append((conn, msgid, result))
            self.wake()
        else:
            conn.reply(msgid, result)

    def later(self, conn: Replier, msgid: int, result: Later) -> None:
        """A reply worked out after the writer's next round trip; few may wait per connection."""
        self.open.replies.append((conn, msgid, result))
        if result.is_read:
            self.room.take(conn, result)
        self.linger.joined()
        self.wake()

    def settled(self) -> asyncio.Future[None]:
        """Done once every write read so far has committed, or been refused: cluster mode
        hands a partition over only after that (``cluster``)."""
        done = asyncio.get_running_loop().create_future()
        batch = self.open if self.open.pending() else self.inflight
        if batch is None:
            done.set_result(None)
        else:
            self._settling.append((batch, done))
            self.wake()
        return done

    # -- the writer ------------------------------------------------------

    async def _run(self) -> None:
        while True:
            batch = self.open
            if not batch.pending() and not self._busy():
                if not self._closing:
                    self._idle = asyncio.get_running_loop().create_future()
                    await self.outage.idle(self._idle)
                    continue
                if self._last_tried or self.outage.failed_for_good or not self._cycle.last(batch):
                    return
                self._last_tried = True
            elif self.outage.failed_for_good is None:
                if self.linger.wanted(batch) and not self._closing:
                    await self.linger.wait(batch)
                    continue  # with what joined it meanwhile
                self._cycle.prepare(batch)
            self.open = Batch(self._next_seq())
            self.inflight = batch
            self._began = time.monotonic()
            self._hold(False)
            began = time.perf_counter()
            try:
                found = await self._commit_current(batch)
            except StorageFailure as exc:
                self._fail(batch, exc)
            except Exception as exc:  # a bug must not pass for a commit
                log.exception("writer failed")
                self._fail(batch, StorageFailure(f"writer failed: {exc!r}", transient=False))
            else:
                if batch.writes:
                    self.times.observe(time.perf_counter() - began, batch.writes)
                self._deliver(batch, found)
            finally:
                self.inflight = None
                if self._settling:
                    self._settle()

    def stalled(self) -> float:
        """Seconds the writer has been on its current commit (0 if it is on none)."""
        return 0.0 if self.inflight is None else time.monotonic() - self._began

    def _settle(self) -> None:
        waiting, self._settling = self._settling, []
        for batch, done in waiting:
            if batch is self.open:
                self._settling.append((batch, done))
            elif not done.done():
                done.set_result(None)

    async def _commit_current(self, batch: Batch) -> list[Any]:
        """Cluster mode: a batch refused because another change reached the cohorts first
        is matched again and committed, a few times at most, before its requests are told."""
        for _ in range(REMATCH_TRIES):
            try:
                return await self._commit(batch)
            except StorageFailure as exc:
                if not exc.stale or not self._cycle.rematch(batch):
                    raise
        return await self._commit(batch)

    async def _commit(self, batch: Batch) -> list[Any]:
        """Returns what each participant's statements found once ``batch`` has committed;
        raises ``StorageFailure`` if it has not.

        If the answer to its COMMIT was lost, the open batch, built on it, is refused at
        once (it cannot commit before the outcome is known, and may be wrong after), and so
        is every write until then; replies that depend on ``batch`` wait for the outcome.
        """
        found: list[Any] = []
        try:
            await self._storage.commit(Transaction(self._cycle, batch, found))
        except CommitUnknown as unknown:
            log.error("%s; writes are refused until its outcome is known", unknown)
            self.outage.unknown = str(unknown)
            later = self.open
            for change in reversed(later.undo):
                change.undo()
            self.open = Batch(later.first_seq)
            self._cycle.failed(later, self.open)
            self._hold(False)
            refuse(self.room, (later,), f"storage unavailable: {unknown}; {NOTHING_SAVED}")
            settle = asyncio.ensure_future(unknown.settle())
            try:
                patience = UNKNOWN_PATIENCE if unknown.silent else None
                if not (await asyncio.wait({settle}, timeout=patience))[0]:
                    message = f"storage unavailable: {unknown}; {UNKNOWN_SAVED}"
                    refuse(self.room, (batch,), message)
                    batch.replies.clear()  # answered: the outcome only changes memory now
                    self._cycle.unknown(batch, message)
                await settle
            except asyncio.CancelledError:
                settle.cancel()
                raise
            finally:
                self.outage.unknown = None
        return found

    def _busy(self) -> bool:
        if self.outage.failed_for_good is not None or not self._cycle.busy():
            return False
        return not self._closing or time.monotonic() < self._rewrite_until

    def wake(self) -> None:
        """Start the writer if it waits for work (it re-checks the open batch after each commit)."""
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    def _deliver(self, batch: Batch, found: list[Any]) -> None:
        batch.committed = True
        if batch.writes or batch.board_changed is not None:  # storage took a write
            self.outage.last_failed = None
        try:
            self._cycle.committed(batch, found)
        except Exception:  # a bug: memory may be off, but the replies still go out
            log.exception("taking in a committed batch failed")
        deliver(self.room, batch)

    def _fail(self, batch: Batch, exc: StorageFailure) -> None:
        """Undo in memory what the disk refused, and refuse every reply that depended on it.

        The open batch was built on top of the failed one (its signals were gated
        by its leaves), so it fails with it.
        """
        later = self.open  # its deltas, like the failed batch's, are simply dropped
        for failed in (later, batch):
            for change in reversed(failed.undo):
                change.undo()
        self.open = Batch(batch.first_seq)
        self._cycle.failed(batch, later, exc.outcome_unknown)
        if exc.refusal is not None:  # the database is fine: only these writes are refused
            refusals("refusal", logging.INFO, "%s", exc)
            self.behind.set()
            refuse(self.room, (batch, later), exc.refusal)
            return
        if exc.moved:  # cluster mode: another node serves these partitions now
            log.warning("%s; this node stops serving them", exc)
            self._router.lost(exc.moved)
            moved = f"moved: {exc} while this request was being committed; nothing of it was"
            refuse(self.room, (batch, later), f"{moved} saved; served by unknown", ErrorCode.MOVED)
            return
        self.outage.refused(exc)
        refuse(self.room, (batch, later), refusal(exc))
