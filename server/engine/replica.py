"""Cluster mode: the state every node keeps whole, the board and the cohorts, applied from
the commit log (``core.log``) in id order: this node's own commits with everyone's.

Own records are applied as their batches commit, with the earlier records their
transaction read; the others', by ``cluster``'s follower as it reads the log, and before
any read that spans users (``synced``): such a read first reads the log to its end, so
it shows every write acknowledged anywhere before it was sent, and nothing uncommitted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from tidal.protocol import ErrorCode
from tidal.protocol.methods import TABLE
from tidal.protocol.refusals import ServerError
from tidal.server.core import log as commit_log
from tidal.server.core import orders
from tidal.server.core.batch import Batch, Entry
from tidal.server.core.feed import Change
from tidal.server.core.rematch import rematch
from tidal.server.core.replies import Replier
from tidal.server.core.tallies import Contribution

from .logged_feed import LoggedFeed
from .shape import EngineState

log = logging.getLogger("tidal.engine")

Handler = Callable[[Replier, int | None, list[Any]], None]
#: a consumer group's, decided against the log's end too: where it starts (``from``)
AT_END = ("group_create", "group_reset")


class Replica:
    def __init__(
        self, engine: EngineState, node: str, clock: Callable[[], int], feed: LoggedFeed
    ) -> None:
        self._engine = engine
        self._feed = feed
        self._node = node
        self._clock = clock
        self.applied = 0  # the last log id applied
        self.version = 0  # cohort changes ever committed: what signals are matched against
        #: reads that span users, each waiting for a round of the log, read to its end, that
        #: began after it came; the follower (``cluster``) reads the log at once when this
        #: is set (the writer sets it too: ``Committer.behind``), and resolves them
        self.wanted = engine.committer.behind
        self._waiting: list[asyncio.Future[None]] = []
        self.following = False  # set once the follower runs: until then none waits
        #: set once the log is applied to ``checkpoint_at``: a checkpoint may be due (the
        #: node's tick waits on it, ``cluster``)
        self.due = asyncio.Event()
        self.checkpoint_at = 1 << 62

    def _gap(self, log_id: int) -> None:
        """The log past what this node applied is gone: it was away (paused, cut off) while
        the others checkpointed and pruned it. It cannot catch up by the log: it stops
        (``Outage.deposed``), and a restart boots it from the newest checkpoint."""
        deposed = self._engine.committer.outage.deposed
        if deposed is not None and not deposed.done():
            deposed.set_result(
                f"cluster: this node had applied the commit log to {self.applied}, and the"
                f" next record kept is {log_id}: it was away while the others pruned the log;"
                " restart it (it boots from the newest checkpoint)"
            )

    def round_begins(self) -> list[asyncio.Future[None]]:
        """The follower begins a round: the reads it answers once it has read the log to
        its end (their futures, for it to resolve, or to fail if the round does)."""
        waiting, self._waiting = self._waiting, []
        return waiting

    def replay(self, records: Iterable[commit_log.Row], head: int, version: int) -> int:
        """At boot: the board from every record (cohorts come from their table, as of the
        same snapshot). How many records."""
        board = self._engine.board
        count = 0
        for row in records:
            contributions, _, _ = commit_log.decode(row)
            board.add(contributions)
            count += 1
        board.keep_cohorts(set(self._engine.cohorts.names()))  # ids are never given twice
        self.applied, self.version = head, version
        return count

    # -- a batch of this node's --------------------------------------------

    def prepare(self, batch: Batch) -> None:
        # its record is encoded by the transaction (``plans``): a batch of signals only
        # has none, and a withdrawal's part is known once the writer has found its rows
        if not commit_log.shared(batch):
            return
        before = self.version  # what its signals were matched against (``rematch``)
        batch.log = Entry(self._node, before, before + len(batch.cohorts), self.applied)

    def rematch(self, batch: Batch) -> None:
        """``batch``'s commit found the cohorts changed under it: its next transaction
        takes the log's head first, and holding it, which orders every change of the
        cohorts, applies the records this node has not, then matches the batch again
        and makes its record anew (``log_sql._catch_up``). Nothing can change between."""
        assert batch.log is not None

        def caught_up(rows: list[commit_log.Row]) -> None:
            for row in rows:
                self.apply(row)
            engine = self._engine
            rematch(batch, engine.cohorts, engine.board, engine.budget)
            self.prepare(batch)

        batch.log.catch_up = caught_up

    def committed(self, batch: Batch) -> None:
        entry = batch.log
        if entry is None:
            return
        for row in entry.earlier:
            self.apply(row)
        if entry.id > self.applied:  # else the follower has read it from the log already
            contributions = commit_log.board(batch)
            self._apply(entry.id, contributions, self._changes(batch), batch.changes)

    @staticmethod
    def _changes(batch: Batch) -> list[commit_log.CohortChange]:
        return [(name,) if c is None else (name, c) for name, c in batch.cohorts.items()]

    # -- any node's records ---------------------------------------------------

    def apply(self, row: commit_log.Row) -> None:
        """A row of the log (``core.log.COLUMNS``), any node's, in id order."""
        log_id = row[0]
        if log_id <= self.applied:
            return
        if log_id != self.applied + 1:  # the records between were pruned: never applied
            self._gap(log_id)
            return
        contributions, changes, events = commit_log.decode(row)
        built = [(c[0],) if len(c) == 1 else (c[0], commit_log.cohort(c)[1]) for c in changes]
        pushed = commit_log.changes(events, self._feed.last_id + 1) if events else []
        self._apply(log_id, contributions, built, pushed)

    def _apply(
        self,
        log_id: int,
        contributions: Iterable[Contribution],
        changes: list[tuple[Any, ...]],
        events: list[Change],
    ) -> None:
        if log_id != self.applied + 1:
            log.error("commit log: record %d applied after %d", log_id, self.applied)
        engine = self._engine
        if changes:
            for change in changes:
                engine.cohorts.applied(change[0], change[1] if len(change) > 1 else None)
            self.version += len(changes)
            # what was read before these is matched again: the open batch commits after
            # them (the one committing, if it was matched before them, is refused by the
            # version it carries, and the writer matches it again: ``Engine.rematch``)
            rematch(engine.committer.open, engine.cohorts, engine.board, engine.budget)
        board = engine.board
        now = self._clock()
        board.advance(now)
        board.add(contributions)
        if changes:  # dropped or redefined: applied from the log, so committed, all of them
            board.keep_cohorts(set(engine.cohorts.names()))
        orders.evict(board, now)  # orders nobody reads stop costing each record
        orders.follow(board)  # those read take the record in now, not at their read
        self.applied = log_id
        if log_id >= self.checkpoint_at:
            self.due.set()
        if events:
            self._feed.applied(events)

    # -- reads that span users ----------------------------------------------

    def route(self, methods: dict[str, Handler]) -> None:
        """Reads that span users, and cohort changes: each ``log`` method of the table is
        decided against the log's end (``synced``), and so is a feed's subscription."""
        for method in TABLE:
            if (method.route == "log" and method.name != "subscribe") or method.name in AT_END:
                methods[method.name] = self.synced(method.name, methods[method.name])
        self._feed.resync = self.synced("subscribe", self._feed.synced_subscribe)

    def synced(self, method: str, handler: Handler) -> Handler:
        """``handler``, once the log has been read to its end after the request came."""

        def after_sync(conn: Replier, msgid: int | None, args: list[Any]) -> None:
            if msgid is None or not self.following:
                handler(conn, msgid, args)
                return
            done = asyncio.get_running_loop().create_future()
            self._waiting.append(done)
            self.wanted.set()
            conn.hold(True)  # its later requests wait: it answers as of its place among them

            def answer(_: asyncio.Future[None]) -> None:
                conn.hold(False)
                failed = None if done.cancelled() else done.exception()
                try:
                    if failed is not None:
                        raise failed
                    handler(conn, msgid, args)
                except ServerError as exc:
                    conn.reply_error(msgid, exc.code, exc.message)
                except Exception as exc:
                    if failed is None:
                        log.exception("internal error in %s", method)
                        conn.reply_error(
                            msgid, ErrorCode.INTERNAL_ERROR, f"internal error in {method}"
                        )
                    else:
                        conn.reply_error(
                            msgid, ErrorCode.UNAVAILABLE,
                            f"storage unavailable: reading the commit log failed ({exc})",
                        )  # fmt: skip
                conn.flush()

            done.add_done_callback(answer)

        return after_sync
