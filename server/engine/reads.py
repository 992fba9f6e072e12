"""The read handlers: status, cohorts, counts, stats, health, history, left_users and
count_left.

A read changes nothing. It is answered at once unless it could show a write not
yet on disk. ``counts`` is answered from the board with what is committed, as
``top`` is (``ranked``), unless it must show what is not yet (the caller's own
writes, a purge read before it): then it waits for that commit. ``health``
always waits for the writer's next round trip (proof that the writer is alive).
A read of the tables that would hold the writer up (a count) runs beside it
(``beside``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tidal.protocol import ErrorCode
from tidal.protocol.limits import (
    HISTORY_LINE_BYTES,
    LEFT_USER_BYTES,
    MAX_COHORTS,
    MAX_HISTORY,
    MAX_LEFT_USERS,
    NAME_MAX_BYTES,
    SLOT_REPLY_BYTES,
)
from tidal.protocol.refusals import ServerError
from tidal.server.core import orders, pages, params, ranking
from tidal.server.core.past import HistoryRead, LeftRead
from tidal.server.core.replies import Replier
from tidal.server.errors import StorageFailure
from tidal.server.storage import past_sql as storage_past
from tidal.server.storage.sqlbulk import Dialect, Plan
from tidal.server.version import VERSION, compiled

from .health import STALLED, HealthCheck, report
from .ranked import Ranked
from .shape import EngineState

log = logging.getLogger("tidal.engine")

#: a plan of reads of the tables, given the backend's dialect (``storage.sqlbulk``)
TableRead = Callable[[Dialect], Plan[Any]]


class Reads:
    def __init__(self, engine: EngineState, ranked: Ranked) -> None:
        self._engine = engine
        self._ranked = ranked
        self._started = time.monotonic()
        self._beside: set[asyncio.Task[None]] = set()  # reads of the tables, under way

    def ping(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        conn.reply(msgid, "pong")

    def partition_map(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        conn.reply(msgid, self._engine.router.wire())

    def status(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        user_id: int = args[0]  # checked and parsed at the edge (``core.edge``), as below
        self._engine.router.check(user_id)
        status = self._engine.members.status(user_id)
        self._engine.committer.answer(conn, msgid, status.wire())

    def cohorts(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        if args[0] is not None:
            page = pages.page(args[0], "cohorts", ("after", "limit"), MAX_COHORTS)
            after = page.get("after")
            if after is not None:
                after = params.text(after, "page.after", NAME_MAX_BYTES)
            listed = self._engine.cohorts.page(
                after, page.get("limit", MAX_COHORTS), self._engine.reply_budget
            )
        else:
            listed = self._engine.cohorts.every(self._engine.reply_budget)
        self._engine.committer.answer(conn, msgid, listed)
        conn.flush()  # a large reply made now must meet the peer's flow control at once

    def counts(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        entity: str = args[0]
        most = self._engine.reply_budget // SLOT_REPLY_BYTES
        page = pages.page(args[1], "counts", ("after", "limit", "window"), most)
        after = pages.cursor(page["after"]) if page.get("after") is not None else None
        window = ranking.window_option(page["window"]) if "window" in page else -1
        limit = page.get("limit", most)
        self._ranked.board_counts(conn, msgid, entity, window, after, limit)  # from the board

    def history(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """A user's leaves, rejoins, purges and erasures, oldest first, after ``after_ns``."""
        user_id, limit, after_ns = args
        most = min(MAX_HISTORY, self._engine.reply_budget // HISTORY_LINE_BYTES)
        limit = params.limit(limit, "limit", most)  # bounded by the reply budget too
        self._engine.router.check(user_id)
        if msgid is None:
            conn.reply(None, None)
            return
        if self._engine.past.surveys.waiting():  # its line is written as it takes effect
            self._engine.past.surveys.defer(conn, lambda: self.history(conn, msgid, args))
            return
        committer = self._engine.committer
        again = _again(conn, msgid, lambda: self.history(conn, msgid, args))
        if not committer.room.fits(conn, limit * HISTORY_LINE_BYTES, again):
            return
        mine = [e for e in committer.open.history if e.user_id == user_id]
        read = HistoryRead(user_id, after_ns, limit, mine)
        committer.open.reads.append(read)
        committer.later(conn, msgid, read)

    def left_users(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """A page of Left users in user_id order: for audits and for reconciling a copy."""
        after, limit = args
        most = min(MAX_LEFT_USERS, self._engine.reply_budget // LEFT_USER_BYTES)
        limit = params.limit(limit, "limit", most)  # bounded by the reply budget too
        if msgid is None:
            conn.reply(None, None)
            return
        committer = self._engine.committer
        again = _again(conn, msgid, lambda: self.left_users(conn, msgid, args))
        if not committer.room.fits(conn, limit * LEFT_USER_BYTES, again):
            return
        changes = {
            user_id: change
            for user_id, change in committer.open.memberships.items()
            if after is None or user_id > after
        }
        read = LeftRead(after, limit, changes)
        committer.open.reads.append(read)
        committer.later(conn, msgid, read)

    def count_left(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """How many users are Left: every user's (every node's, in cluster mode), counted
        in the table as committed once the connection's earlier writes were."""
        self.beside(conn, msgid, storage_past.count_left)

    def beside(self, conn: Replier, msgid: int | None, plan: TableRead) -> None:
        """A read of the tables, on storage's reader: the writer never waits on it. It
        answers as of its place in its connection's order: it reads once every write read
        before it has committed (or been refused), and the connection's later requests
        wait for its answer."""
        if msgid is None:
            conn.reply(None, None)
            return
        conn.hold(True)
        task = asyncio.get_running_loop().create_task(self._read(conn, msgid, plan))
        self._beside.add(task)
        task.add_done_callback(self._beside.discard)

    async def _read(self, conn: Replier, msgid: int, plan: TableRead) -> None:
        try:
            await self._engine.committer.settled()
            result = await self._engine.storage.read(plan)
        except StorageFailure as exc:
            conn.reply_error(msgid, ErrorCode.UNAVAILABLE, f"storage unavailable: {exc}")
        else:
            conn.reply(msgid, result)
        finally:
            conn.hold(False)
            conn.flush()

    async def close(self) -> None:
        """Once the writer has stopped: the reads under way are answered."""
        while self._beside:
            await asyncio.wait(set(self._beside))

    def stats(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        signals = self._engine.signals
        kept, ranked = orders.kept_orders(self._engine.board)
        times = self._engine.committer.times
        stats = {
            "version": VERSION,
            "compiled": compiled(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "connections": self._engine.connections(),
            "signals": signals,
            "forwarded": self._engine.forwarded,
            "gated": signals - self._engine.forwarded,
            "users_left": len(self._engine.members),
            "ledger_rows": self._engine.ledger_rows,
            "ledger_retired": self._engine.retention.retired,
            "ledger_rewriting": self._engine.past.rewrites.pending(),
            "backend": self._engine.storage.backend,
            "db_bytes": self._engine.storage.size(),
            "commits": self._engine.storage.commits,
            "commit_p50_ms": _ms(times.quantile(0.5)),
            "commit_p99_ms": _ms(times.quantile(0.99)),
            "storage": self.health_report()["storage"],
            "subscribers": len(self._engine.feed),
            "last_event_id": self._engine.feed.last_id,
            "aggregates": self._engine.board.tallies,
            "aggregates_bytes": self._engine.budget.used(),
            "memory_budget": self._engine.budget.limit if self._engine.budget.limit < 2**62 else 0,
            "writes_refused_full": self._engine.budget.refused,
            "rankings_kept": kept,
            "rankings_entities": ranked,
        }
        self._engine.committer.answer(conn, msgid, stats)

    def health(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Answered after a round trip through the writer: a stuck disk times it out.
        After a full disk, the round trip carries a small write, to see if space is back."""
        if msgid is None:
            conn.reply(None, None)
            return
        committer, outage = self._engine.committer, self._engine.committer.outage
        if outage.unknown is not None:  # the writer is busy finding out: say so now
            conn.reply(msgid, self.health_report())
            return
        stalled = committer.stalled()
        if stalled > STALLED:  # the database has not answered the writer for a while
            error = f"the database has not answered a commit for {stalled:.1f} s"
            conn.reply(msgid, report("unavailable", error))
            return
        batch = committer.open
        # the last commit failed, not for good: a small write tests whether the disk is back
        retrying = outage.last_failed is not None and outage.failed_for_good is None
        if retrying and not batch.probe:
            batch.probe = True
            batch.writes += 1
        batch.reach = True  # the round trip reaches the database, wherever it is
        committer.later(conn, msgid, HealthCheck(self.health_report))

    def health_report(self) -> dict[str, Any]:
        """Storage's state, and the memory budget's: ``memory`` is ``full`` once writes
        that would create aggregates are refused. That alone leaves ``status`` as it is:
        the server still serves, and a restart would load the same aggregates."""
        out = self._storage_health()
        engine = self._engine
        out["memory"] = "full" if engine.budget.full() else "ok"
        return out

    def _storage_health(self) -> dict[str, Any]:
        outage = self._engine.committer.outage
        failed, full = outage.failed_for_good, outage.last_failed
        if failed is not None:
            return report("failed", f"storage failed ({failed}); restart on a healthy disk")
        if outage.unknown is not None:
            return report("unavailable", f"{outage.unknown}; finding out whether it held")
        if full is not None:
            return report(
                outage.last_failed_state, f"the last commit failed ({full}); writes are refused"
            )
        return report("ok")


def _again(conn: Replier, msgid: int, read: Callable[[], None]) -> Callable[[], None]:
    """A read taken on again once there is room: what it refuses now (its user's partition
    gone meanwhile) is its reply, as it would have been when it came."""

    def again() -> None:
        try:
            read()
        except ServerError as exc:
            conn.reply_error(msgid, exc.code, exc.message)
            conn.flush()

    return again


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
