"""The engine: requests change memory in the order they are read; replies wait for the disk.

Two promises meet here. *Zero window*: a request is applied the moment it is
read, so a signal read after a leave is gated even before the leave's reply is
sent. *Acknowledged means durable*: every reply that reveals a write waits, in
the committer, until the batch holding that write has committed.

This module builds the engine's parts and dispatches each request to its handler; the
signal path is in ``signalling``, what is done around each commit is the commit cycle's
participants (``cycle``, ``lineup``). The other writes are in
``changes``, the reads in ``reads``. The state they change lives in the sans-I/O core
(``tidal.server.core``: members, cohorts, keys, aggregates), each part recording its
changes in the open batch with their undo; the ledger row and the rule for what a signal
counts toward are in ``core.ledger``; group commit is in ``committer``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tidal.protocol import DEFAULT_MAX_MESSAGE_SIZE, ErrorCode
from tidal.protocol.errors import quoted
from tidal.protocol.limits import REPLY_ENVELOPE
from tidal.protocol.refusals import MethodNotFound, ServerError
from tidal.server.core import params, restore
from tidal.server.core.aggregates import CHECKPOINT_SECONDS, CHECKPOINT_SIGNALS, Aggregates
from tidal.server.core.board import Board
from tidal.server.core.budget import Budget
from tidal.server.core.chunks import Shelf
from tidal.server.core.cohorts import Registry
from tidal.server.core.keys import Ack, Keys
from tidal.server.core.members import Members
from tidal.server.core.owners import Owners, Router
from tidal.server.core.replies import Replier
from tidal.server.core.rewrites import CHUNK as REWRITE_CHUNK
from tidal.server.core.rewrites import Rewrites, Rule
from tidal.server.core.timeline import Timeline
from tidal.server.core.userrows import UserRows
from tidal.server.metrics import Metrics
from tidal.server.storage import groups_sql
from tidal.server.storage.interface import Snapshot, Storage

from .changes import Changes
from .committer import Committer
from .consumers import Groups
from .cycle import Cycle
from .dispatch import dispatch
from .event_retention import EventRetention
from .group_calls import GroupCalls
from .group_lead import LeadGroups
from .handlers import served
from .lineup import line_up
from .logged_feed import LoggedFeed
from .publisher import Feed
from .ranked import Ranked
from .reads import Reads
from .replica import Replica
from .retention import Retention
from .room import ReplyRoom
from .signalling import Seqs, SignalPath
from .surveys import Surveys
from .withdrawals import Past

log = logging.getLogger("tidal.engine")


class Engine:
    def __init__(
        self,
        storage: Storage,
        snapshot: Snapshot,
        *,
        clock: Callable[[], int] = time.time_ns,
        connections: Callable[[], int] = lambda: 0,
        checkpoint_signals: int = CHECKPOINT_SIGNALS,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        key_window_ns: int = 24 * 3600 * 10**9,
        max_keys: int = 1_000_000,
        metrics: Metrics | None = None,
        hold: Callable[[bool], None] = lambda on: None,
        max_reply: int = DEFAULT_MAX_MESSAGE_SIZE,
        ledger_retention: float = 0.0,
        event_retention: float = 0.0,
        heartbeat: float = 5.0,
        rewrite_chunk: int = REWRITE_CHUNK,
        owners: Owners | None = None,
        memory_budget: tuple[int, str] = (0, ""),
    ) -> None:
        self.storage = storage
        self.owners = owners
        #: who serves each user: every request about one is checked (``core.owners``)
        self.router: Router = Router() if owners is None else owners
        self.clock = clock
        self.connections = connections
        self.reply_budget = max_reply - REPLY_ENVELOPE
        self.metrics = metrics
        self._restore(snapshot, Keys(snapshot.keys, key_window_ns, max_keys), memory_budget)
        self.aggregates = Aggregates(
            every_signals=checkpoint_signals, every_seconds=checkpoint_seconds
        )
        self.aggregates.signals_committed(len(snapshot.ledger_tail))
        cycle = Cycle()
        self.committer = Committer(
            storage,
            self.seqs,
            cycle,
            metrics=metrics,
            hold=hold,
            room=ReplyRoom(self.budget),
            router=self.router,
        )
        leads = None if owners is None else (lambda: 0 in owners.owned)
        self.retention = Retention(ledger_retention, clock, self.committer, leads)
        timeline = Timeline(snapshot.last_event_ns, clock)  # of history lines and events
        surveys = Surveys(
            storage, self.committer, Rewrites(snapshot.rules, rewrite_chunk),
            lambda: self.board.decay, clock, self.keys, self.user_rows, timeline, owners,
        )  # fmt: skip
        self.past = Past(surveys, self.keys, self.user_rows, owners)
        # cluster mode: the events of every node's commits, from the log (``logged_feed``)
        self.feed = (Feed if owners is None else LoggedFeed)(
            snapshot.last_event_id, self.committer, clock,
            heartbeat=heartbeat, retention=event_retention,
        )  # fmt: skip
        self.event_retention = EventRetention(event_retention, self.feed, self.committer, clock)
        # cluster mode: partition 0's node serves them, taken with it (``group_lead``)
        self.groups: Groups
        if owners is None:
            self.groups = Groups(snapshot.groups, self.feed, self.committer, clock, heartbeat)
        else:
            assert isinstance(self.feed, LoggedFeed)
            self.groups = LeadGroups(self.feed, self.committer, clock, heartbeat, owners)
        self._serve(clock, timeline, owners)
        self.ledger = line_up(self, cycle, snapshot.ledger_rows)
        #: each method's handler and how many params it takes, from the method table
        self._dispatch = dispatch(self._methods)

    def _serve(self, clock: Callable[[], int], timeline: Timeline, owners: Owners | None) -> None:
        """The handlers of the method table; cluster mode: some decided against the log."""
        path = SignalPath(self.members, self.cohorts, self.keys, self.board, self.budget,
                          self.committer, self.seqs, clock, self.router)  # fmt: skip
        changes = Changes(self, timeline)
        ranked = Ranked(self, clock)
        reads = self._reads = Reads(self, ranked)
        self.health = reads.health_report
        calls = GroupCalls(self.groups, self.feed, self.committer, clock, reads.beside,
                           self.router)  # fmt: skip
        self._methods = served(path.signal, path.signal_batch, changes, self.feed, reads, ranked,
                               calls)  # fmt: skip
        #: cluster mode: the board and the cohorts of every node's commits (``replica``)
        self.replica = None
        if owners is not None:
            assert isinstance(self.feed, LoggedFeed)
            self.replica = Replica(self, owners.node, clock, self.feed)
            self.replica.route(self._methods)

    def _restore(self, snapshot: Snapshot, keys: Keys, memory_budget: tuple[int, str]) -> None:
        """What memory holds, from what boot read: users' leave state, cohorts, keys, the
        board (from its checkpoint and the ledger past it), the ledger's tail of users."""
        self.members = Members.adopt(snapshot.left, snapshot.rejoined)
        self.cohorts = Registry(snapshot.cohorts, snapshot.next_cohort_id)
        self.keys = keys
        on_disk = snapshot.board
        self.board = Board(on_disk.decay, self.clock())
        self.budget = Budget(self.board, *memory_budget)  # bytes (0: none), as set
        self.shelf = Shelf()
        cohort_ids = set(self.cohorts.names())
        restore.rebuild(self.board, self.shelf, on_disk, snapshot.ledger_tail, cohort_ids)
        self.user_rows = UserRows(snapshot.next_block, snapshot.users_tail)
        self.seqs = Seqs(snapshot.next_seq)

    @property
    def signals(self) -> int:
        """Signals committed since boot."""
        return self.ledger.signals

    @property
    def forwarded(self) -> int:
        """... and of those, forwarded to cohorts and communities."""
        return self.ledger.forwarded

    @property
    def ledger_rows(self) -> int:
        """Rows the ledger keeps now."""
        return self.ledger.rows

    @property
    def tallies(self) -> int:
        """Aggregates held (the metrics read it from their own thread)."""
        return self.board.tallies

    def start(self) -> None:
        self.committer.start()
        self.retention.start()
        self.feed.start()
        self.groups.start()
        self.event_retention.start()
        self.past.start()

    async def close(self) -> None:
        """Commit and answer everything already read, then stop the writer."""
        self.retention.stop()
        self.feed.stop()
        self.groups.stop()
        self.event_retention.stop()
        await self.past.close()  # every withdrawal read joins a batch, or is refused
        await self.committer.close()
        await self._reads.close()  # the reads beside the writer, whose writes are done

    def handle(self, conn: Replier, msgid: int | None, method: str, args: list[Any]) -> None:
        """Apply one request now; its reply goes out now or when its batch is durable.

        ``msgid`` is None for a notification: it is applied, never answered.
        """
        try:
            entry = self._dispatch.get(method)
            if entry is None:
                raise MethodNotFound(f"method not found: {quoted(method)}")
            handler, least, most, edge = entry
            if not least <= len(args) <= most:
                params.arity_of(method, args)
            handler(conn, msgid, args if edge is None else edge.parse(args))
        except ServerError as exc:
            conn.reply_error(msgid, exc.code, exc.message)
        except Exception:
            log.exception("internal error in %s", method)
            conn.reply_error(msgid, ErrorCode.INTERNAL_ERROR, f"internal error in {method}")

    # -- the seqs: the signal path's (``signalling``) ------------------------

    def next_seq(self) -> int:
        """The seq the next signal will take: a purge read now reaches the rows below it."""
        return self.seqs.next

    def rewind(self, first_seq: int) -> None:
        self.seqs.rewind(first_seq)

    # -- cluster mode -----------------------------------------------------

    def lead(self, groups: list[groups_sql.Loaded] | None) -> None:
        """Partition 0 taken, with the consumer groups as committed; or (None) what this
        node owns changed, and the groups go with partition 0 if it went."""
        assert isinstance(self.groups, LeadGroups)
        if groups is None:
            self.groups.follow()
        else:
            self.groups.adopt(groups)

    def adopt(
        self,
        ours: Callable[[int], bool],
        left: dict[int, int],
        rejoined: dict[int, int],
        keys: OrderedDict[str, Ack],
        first_seq: int,
        rules: dict[int, Rule],
    ) -> None:
        """Partitions taken over: their users' state as the database holds it (with the
        rules of purges and erasures whose rows are still to rewrite, which this node
        goes on with), and seqs from a block above any their previous owner used."""
        self.members.reload(ours, left, rejoined)
        self.keys.adopt(ours, keys)
        self.past.adopt(ours, rules)
        self.seqs.above(first_seq)
