"""The reads the board answers: ``top``, and ``counts`` in a window.

The board holds only what is committed, so such a read is answered at once,
unless it must show a write not yet committed: a purge or erase read before it
(zero window: what it withdraws is never shown, from any connection), or the
caller's own writes. Then it is answered once the open batch has committed, by
which time the board has taken it in.

A ``top`` whose order must first be built, or take in many changes, does that a
slice per turn of the event loop (``orders.prepare``): its reader waits, nobody
else does. Its connection applies nothing it sent after it meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from tidal.server.core import catalog, orders, ranking
from tidal.server.core.ledger import Slot
from tidal.server.core.replies import Later, Replier

from .shape import EngineState

#: seconds a read's preparation leaves half the event loop to everyone else
PACED: Final = 1.0
#: seconds of a read's preparation per turn of the event loop: under load a turn also
#: carries others' requests and a commit (10-20 ms), so a build of 200,000 entities
#: (about 100 ms of work) in steps of one turn each took a second
TURN: Final = 0.008


class Ranked:
    def __init__(self, engine: EngineState, clock: Callable[[], int]) -> None:
        self._engine = engine
        self._clock = clock
        #: orders being prepared, each with the reads waiting for it
        self._preparing: dict[tuple[Slot, int, int], list[Callable[[bool], None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def top(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        engine = self._engine
        names = {name: cid for cid, name in engine.cohorts.names().items()}
        request = ranking.top_request(args, names, engine.board.decay, engine.reply_budget)

        def answer() -> None:
            self._answer(conn, msgid, lambda: self._top(request))

        if msgid is None:  # a notification: nobody reads it
            answer()
            return
        self._prepared(conn, request, answer)

    def _prepared(self, conn: Replier, request: ranking.TopRequest, then: Callable[[], None],
                  held: bool = False) -> None:  # fmt: skip
        """``then``, once ``request``'s order needs little more work: now, or after the
        slices ``orders.prepare`` gives, one per turn of the loop. Readers of one order
        share its preparation, and each looks again once it is done: another's page may
        have built the deep segment past another cursor. ``held``: its connection waits
        for it already."""
        which = (request.slot, request.by, request.which)
        waiting = self._preparing.get(which)
        if waiting is None:
            now = self._clock()
            board = self._engine.board
            orders.evict(board, now)
            steps = orders.prepare(board, request.slot, request.by, request.which,
                                   request.after, request.limit, now)  # fmt: skip
            if steps is None:
                if held:
                    conn.hold(False)
                then()
                return
            waiting = self._preparing[which] = []
            task = asyncio.get_running_loop().create_task(self._prepare(which, steps))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        conn.hold(True)  # its later requests wait for this read

        def go_on(done: bool) -> None:
            if done:
                self._prepared(conn, request, then, held=True)
            else:  # stopped (the server is closing): answered as the order stands
                conn.hold(False)
                then()

        waiting.append(go_on)

    async def _prepare(self, which: tuple[Slot, int, int], steps: Iterator[None]) -> None:
        """Runs ``steps``, ``TURN`` seconds of them at a time, each run followed by as long
        again for everyone else: for its first ``PACED`` seconds a read takes at most half
        of the event loop (and of the GIL the writer's thread needs). After that, it takes
        turns with everyone else's work without pausing, so that it ends even while writers
        change its order as fast as half the loop can move their changes in."""
        done = False
        try:
            first = began = time.monotonic()
            for _ in steps:
                now = time.monotonic()
                if now - began < TURN:
                    continue  # a step is about 2 ms: a turn of the loop takes a few
                await asyncio.sleep(now - began if now - first < PACED else 0)
                began = time.monotonic()
            done = True
        finally:
            for go_on in self._preparing.pop(which):
                go_on(done)

    def _top(self, request: ranking.TopRequest) -> dict[str, Any]:
        now = self._clock()
        board = self._engine.board
        board.advance(now)
        slot, by, which, limit, after = request
        return ranking.top(board, slot, by, which, limit, after, now)

    def board_counts(
        self, conn: Replier, msgid: int | None, entity: str, window: int, after: Slot | None,
        limit: int,
    ) -> None:  # fmt: skip
        def read() -> dict[str, Any]:
            board = self._engine.board
            board.advance(self._clock())
            names = self._engine.cohorts.names()
            return ranking.window_counts(board, entity, window, names, after, limit)

        self._answer(conn, msgid, read)

    def catalog(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """A page of what the board holds (``core.catalog``), as committed once the
        connection's own writes before it are."""
        layer: int = args[0]
        after, limit = args[1]

        def read() -> dict[str, Any]:
            names = self._engine.cohorts.names()
            return catalog.page(self._engine.board, names, layer, after, limit)

        self._answer(conn, msgid, read)

    def _answer(self, conn: Replier, msgid: int | None, read: Callable[[], dict[str, Any]]) -> None:
        if msgid is None:
            conn.reply(None, None)
            return
        if (
            self._engine.past.surveys.waiting()
        ):  # a purge read before this one has yet to take effect
            self._engine.past.surveys.defer(conn, lambda: self._answer(conn, msgid, read))
            return
        committer = self._engine.committer
        batch, inflight = committer.open, committer.inflight
        if (
            batch.past
            or conn in batch.writers
            or (inflight is not None and (inflight.past or conn in inflight.writers))
        ):
            # answered once that batch has committed, from the board, which then holds the
            # batch's writes: the connection's later ones wait, so that none of them shows
            conn.hold(True)
            committer.later(conn, msgid, _Read(read, conn))
        else:
            conn.reply(msgid, read())
            conn.flush()  # a page of up to 1,000 entities must meet the peer's flow control now


class _Read(Later):
    """A read of the board, answered once the batch it waits on has committed; its
    connection applies nothing it sent after the read until then (``hold``)."""

    __slots__ = ("conn", "read")

    def __init__(self, read: Callable[[], dict[str, Any]], conn: Replier) -> None:
        self.read = read
        self.conn = conn

    def answer(self) -> dict[str, Any]:
        self.conn.hold(False)
        return self.read()

    def refused(self, message: str, batches: tuple[Any, ...]) -> str:
        self.conn.hold(False)
        return message
